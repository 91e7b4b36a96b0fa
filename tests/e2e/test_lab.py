"""End to end on the local lab: a coordinator and two workers, real systemd, SSH, Docker and llama.cpp.

lab up -> deploy -> the testinfra verification suite -> a second deploy changes nothing and sends no image.
The lab is reused when it is already up (its images survive), so one worker's image is removed first:
every run then proves the transfer, and that a worker which has the image is left alone.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from lab import lab
from llama_rpc_deploy import roles
from llama_rpc_deploy.paths import PROJECT
from llama_rpc_deploy.deployment import from_cluster
from llama_rpc_deploy.loading import offline_cluster

from .lab_helpers import INVENTORY, WORKERS, changed, needs_docker, on, operations, pyinfra

pytestmark = needs_docker


@pytest.fixture(scope="module")
def deployed():
    lab.up(workers=WORKERS)
    d = from_cluster(offline_cluster(INVENTORY), with_key=False)
    worker2 = d.cluster.workers[1].name
    on(2, f"systemctl stop rpc-server 2>/dev/null; docker rmi --force {d.image} >/dev/null 2>&1; true")
    first = pyinfra("--json")
    return d, worker2, first


def test_deploy_succeeds_and_sends_the_image_where_it_is_missing(deployed):
    d, worker2, first = deployed
    ops = operations(first)
    assert changed(ops, f"Send {d.image} to {worker2}") == [d.cluster.coordinator.name]  # runs on the coordinator
    # worker2's rpc-server restarted, so llama-server must have (re)started in this run, one way or the other
    assert d.cluster.coordinator.name in (
        changed(ops, "llama-server running and enabled")
        + changed(ops, "Restart llama-server after its workers restarted")
    )
    have = on(2, f"docker image inspect --format '{{{{.Id}}}}' {d.image}").stdout.strip()
    assert have == on(0, f"docker image inspect --format '{{{{.Id}}}}' {d.image}").stdout.strip()


def test_verification_suite_passes(deployed):
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/verify", "--inventory", str(INVENTORY)],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-6000:]
    assert " passed" in result.stdout and "failed" not in result.stdout


def test_second_deploy_changes_nothing_and_sends_no_image(deployed):
    ops = operations(pyinfra("--json"))
    made_changes = {op["name"]: op["success"] for op in ops if op["success"]}
    assert made_changes == {}
    assert not any(
        op["name"].startswith(
            ("Carry the image to the workers | Send", "Build the image once, on the coordinator | Build llama")
        )
        for op in ops
    )


def test_dry_run_shows_no_change(deployed):
    result = pyinfra("--dry", "--json")
    assert result.returncode == 0, result.stderr[-4000:]
    plan = json.loads(result.stdout).get("plan", [])
    assert [step for step in plan if step.get("hosts_with_change")] == []


def test_interrupted_transfer_tags_nothing(deployed):
    """A stream cut off half way (as when the deploy is killed mid-transfer) is refused, and no tag appears."""
    d, _, _ = deployed
    image_id = on(1, f"docker image inspect --format '{{{{.Id}}}}' {d.image}").stdout.strip()
    bogus = "llama-rpc:interrupted-test"
    result = on(
        1,
        f"docker save {image_id} | head -c 20000000 | zstd -q -c | "
        f"SSH_ORIGINAL_COMMAND='receive {image_id} {bogus}' /opt/llama-rpc/receive-image.sh",
    )
    assert result.returncode != 0
    assert "nothing tagged" in result.stderr or "did not contain" in result.stderr
    assert on(1, f"docker image inspect {bogus}").returncode != 0


def test_receiver_refuses_anything_but_an_image_load(deployed):
    result = on(1, "SSH_ORIGINAL_COMMAND='rm -rf /' /opt/llama-rpc/receive-image.sh </dev/null")
    assert result.returncode == 64 and "usage: receive" in result.stderr


def test_a_server_setting_restarts_only_llama_server(deployed):
    d, _, _ = deployed
    coordinator = d.cluster.coordinator.name
    ops = operations(pyinfra("--json", "--data", "llama_parallel=1"))
    assert changed(ops, "rpc-server running and enabled") == []
    assert changed(ops, "Send ") == []
    assert changed(ops, "llama-server running and enabled") == [coordinator]
    assert "--parallel 1 " in on(0, "cat /opt/llama-rpc/llama-server.sh").stdout
    assert "--parallel 2 " in on(0, "cat /opt/llama-rpc/llama-server.sh.previous").stdout  # the last working one
    # and back: the group_data value again, llama-server restarted once more, the workers still untouched
    ops = operations(pyinfra("--json"))
    assert changed(ops, "rpc-server running and enabled") == []
    assert changed(ops, "llama-server running and enabled") == [coordinator]
    assert "--parallel 2 " in on(0, "cat /opt/llama-rpc/llama-server.sh").stdout


def test_two_workers_changed_in_different_ways_deploy_in_one_run(deployed, tmp_path):
    """pyinfra orders every host's operations in one graph: a worker whose launch script changed beside a worker
    whose units changed once stopped the deploy with "Cycle detected in operation ordering DAG". Worker 1 gets
    rpc_threads: 2 in its host data (its rpc-server.sh changes); worker 2 is in a group of its own, `small_cache`,
    with rpc_cache_max_gib: 7 in group_data beside the inventory (its cache-prune env and units change)."""
    d, _, _ = deployed
    worker1, worker2 = (w.name for w in d.cluster.workers)
    lab_inventory = INVENTORY.read_text()
    line = f'("{worker1}", {{**SSH, **LAB_WORKER}})'
    assert line in lab_inventory
    variant = tmp_path / "inventory.py"
    variant.write_text(
        lab_inventory.replace(line, f'("{worker1}", {{**SSH, **LAB_WORKER, "rpc_threads": 2}})')
        + f"\nsmall_cache = [{worker2!r}]\n"
    )
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "small_cache.py").write_text((PROJECT / "group_data" / "workers.py").read_text())
    (tmp_path / "group_data" / "small_cache.yml").write_text("rpc_cache_max_gib: 7\n")

    ops = operations(
        subprocess.run(
            ["pyinfra", "-y", "--json", str(variant), "deploy.py"],
            cwd=PROJECT,
            capture_output=True,
            text=True,
            timeout=1200,
        )
    )
    assert changed(ops, "Install /opt/llama-rpc/rpc-server.sh") == [worker1]
    assert changed(ops, "Keep /opt/llama-rpc/rpc-server.sh as") == [worker1]
    assert set(changed(ops, "Install /etc/systemd/system/rpc-cache-prune")) == {worker2}
    assert changed(ops, "rpc-server running and enabled") == [worker1]  # only the launch script restarts rpc-server
    assert "--threads 2" in on(1, "cat /opt/llama-rpc/rpc-server.sh").stdout
    assert "7 GiB" in on(2, f"cat /etc/systemd/system/{roles.CACHE_PRUNE_TIMER}").stdout
    # and back to the lab's own inventory: each worker puts back what it changed, nothing else
    ops = operations(pyinfra("--json"))
    assert changed(ops, "Install /opt/llama-rpc/rpc-server.sh") == [worker1]
    assert set(changed(ops, "Install /etc/systemd/system/rpc-cache-prune")) == {worker2}
