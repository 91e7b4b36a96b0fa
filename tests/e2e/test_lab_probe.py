"""`llama-rpc probe` against the lab (read-only: no deploy): a stand-in nvidia-smi on worker2 answers the deploy's
exact query as an RTX 4080 does, and the probe names that card with its memory and compute capability, the hosts'
system, and the inventory line to paste; the other hosts have no card. The stand-in is removed afterwards, whatever
happened."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lab import lab
from llama_rpc_deploy import gpus

from .lab_helpers import WORKERS, needs_docker

ROOT = Path(__file__).resolve().parents[2]
INVENTORY = ROOT / ".lab" / "inventory.py"
STAND_IN = "/usr/local/bin/nvidia-smi"
# what nvidia-smi on a host with one RTX 4080 prints for the query (the deploy's facts.NvidiaGpus and probe.py)
ANSWER = "NVIDIA GeForce RTX 4080, 16376, 8.9"
SCRIPT = f"""#!/bin/sh
# a stand-in for tests/e2e/test_lab_probe.py: answers the one query the deploy sends, fails on anything else
if [ "$*" = "{gpus.nvidia_smi_query().removeprefix("nvidia-smi ")}" ]; then
  echo "{ANSWER}"
  exit 0
fi
echo "stand-in nvidia-smi: unexpected arguments: $*" >&2
exit 9
"""

pytestmark = needs_docker


@pytest.fixture(scope="module", autouse=True)
def lab_up():
    """The lab's hosts up (as `lab up` makes them; no deploy needed): CI collects this module before any lab exists."""
    lab.up(workers=WORKERS)


def lab_hosts() -> dict[str, str]:
    """Lab host name (coordinator, worker1, ...) -> its address, from the lab's inventory (coordinator first)."""
    namespace: dict = {}
    exec(INVENTORY.read_text(), namespace)  # the lab's own inventory: groups of (address, data)
    hosts = [h[0] for h in namespace["coordinator"]] + [h[0] for h in namespace["workers"]]
    return dict(zip(["coordinator"] + [f"worker{i}" for i in range(1, len(hosts))], hosts))


@pytest.fixture
def stand_in_on_worker2():
    try:
        lab.put_file("worker2", STAND_IN, SCRIPT)
        lab.run_on("worker2", f"chmod 755 {STAND_IN}")
        yield
    finally:
        lab.run_on("worker2", f"rm -f {STAND_IN}", check=False)


def probe(inventory=INVENTORY) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "llama_rpc_deploy", "probe", "-i", str(inventory)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_the_stand_in_answers_only_the_query():
    """The stand-in itself: the query's answer, and a failure on other arguments (as a real card would not help)."""
    try:
        lab.put_file("worker2", STAND_IN, SCRIPT)
        lab.run_on("worker2", f"chmod 755 {STAND_IN}")
        assert lab.run_on("worker2", gpus.nvidia_smi_query()).strip() == ANSWER
        assert "unexpected arguments" in lab.run_on("worker2", "nvidia-smi -L 2>&1; echo rc=$?")
        assert "rc=9" in lab.run_on("worker2", "nvidia-smi -L 2>/dev/null; echo rc=$?")
    finally:
        lab.run_on("worker2", f"rm -f {STAND_IN}", check=False)
    assert lab.run_on("worker2", f"test -e {STAND_IN} && echo there || echo gone").strip() == "gone"


def test_probe_names_worker2s_card_and_no_other(stand_in_on_worker2):
    hosts = lab_hosts()
    result = probe()
    assert result.returncode == 0, result.stderr
    out = result.stdout
    blocks = {}  # host address -> its lines, up to the paste lines
    current = None
    for line in out.split("inventory lines")[0].splitlines():
        if not line.startswith(" "):
            current = line.split()[0]
            blocks[current] = []
        else:
            blocks[current].append(line.strip())
    assert set(blocks) == set(hosts.values())
    pretty = lab.run_on("worker2", "sed -n 's/^PRETTY_NAME=//p' /etc/os-release").strip().strip('"')
    assert pretty.startswith("Debian GNU/Linux")
    for name, address in hosts.items():
        assert f"system {pretty}" in blocks[address], (name, blocks[address])
        assert any(line.startswith("NIC eth") and "link up" in line for line in blocks[address]), blocks[address]
        cards = [line for line in blocks[address] if line.startswith("GPU ")]
        if name == "worker2":
            assert cards == [
                "GPU NVIDIA GeForce RTX 4080, 16376 MiB, compute capability 8.9 (nvidia-smi; RTX 4080 in gpus.py)"
            ]
        else:
            assert cards == [] and "no GPU (neither nvidia-smi nor vulkaninfo lists one)" in blocks[address]
    paste = out.split("inventory lines")[1]
    # the lab's hosts are image_backend 'cpu': the card needs cuda, which the line says
    assert f'("{hosts["worker2"]}", {{"gpus": ["RTX 4080"], "image_backend": "cuda"}}),' in paste
    for name in ("coordinator", "worker1"):
        assert f'("{hosts[name]}", {{"gpus": []}}),' in paste


def test_probe_says_which_host_does_not_answer(tmp_path):
    """A host that does not answer: one line naming it, exit status 1 (an inventory with a worker at a closed port)."""
    text = INVENTORY.read_text()
    hosts = lab_hosts()
    broken = tmp_path / "inventory.py"
    broken.write_text(text + '\nworkers = [(workers[0][0], {**workers[0][1], "ssh_port": 1})] + workers[1:]\n')
    result = probe(broken)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: probe: {hosts['worker1']} (workers): no answer over SSH")


def test_the_deploy_learns_the_card_from_the_host(stand_in_on_worker2, tmp_path):
    """The deploy's own learning (checks.learn_gpus, facts.NvidiaGpus over SSH) on worker2 made a cuda host with no
    gpus: it takes the stand-in's RTX 4080, says so, and then refuses the host in one line, before any change,
    because the lab's Docker has no nvidia runtime (a real card's host would get one from the prepare phase; the
    lab's bus shows no NVIDIA card, so the phase does not set it up here)."""
    from .lab_helpers import pyinfra

    hosts = lab_hosts()
    inventory = tmp_path / "inventory.py"
    inventory.write_text(
        INVENTORY.read_text()
        + f'\nworkers = [(a, {{**d, "image_backend": "cuda"}}) if a == "{hosts["worker2"]}" else (a, d) for a, d in workers]\n'
    )
    result = pyinfra(timeout=600, inventory=inventory)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"{hosts['worker2']}: gpus not set: nvidia-smi lists RTX 4080 (16376 MiB)" in output, output[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        f"{hosts['worker2']}: image_backend = 'cuda' ({inventory} (host {hosts['worker2']})) and gpus not set and "
        "nvidia-smi lists RTX 4080 but Docker has no nvidia runtime: expected the NVIDIA Container Toolkit "
        "(nvidia-ctk runtime configure --runtime=docker)"
    )
    assert "Starting operation" not in output  # refused while loading: nothing ran
