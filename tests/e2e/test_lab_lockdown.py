"""Lockdown on the lab, seen from a third machine on the same network that is in no inventory.

The outsider cannot open a worker's RPC port (but can reach the worker's sshd, so it is the firewall
that stops it, not the network); the coordinator can. Without the API key llama-server refuses the
outsider, with it it answers. A worker reboot keeps the rule, once. A new key replaces the old one and
is never printed, not even by pyinfra --diff.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import time

import pytest

from lab import lab
from llama_rpc_deploy import client
from llama_rpc_deploy.loading import offline_cluster
from llama_rpc_deploy.loadtest import until_serving
from llama_rpc_deploy.cluster import api_key
from llama_rpc_deploy.roles import FIREWALL_CHAIN

from .lab_helpers import INVENTORY, WORKERS, needs_docker, on, operations, pyinfra

pytestmark = needs_docker


@pytest.fixture(scope="module")
def cluster():
    lab.up(workers=WORKERS)
    operations(pyinfra("--json"))  # deployed (a no-op when test_lab.py just deployed)
    lab.outsider()
    return offline_cluster(INVENTORY)


def outsider(command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", "exec", lab.OUTSIDER, "bash", "-c", command], capture_output=True, text=True)


def opens(run, address: str, port: int) -> bool:
    """A TCP connection from that machine to address:port succeeds within 3 s."""
    return run(f"timeout 3 bash -c '>/dev/tcp/{address}/{port}'").returncode == 0


def http(run, cluster, path: str, key: str | None = None) -> str:
    """The HTTP status code that machine gets for a completion request."""
    auth = f"-H 'Authorization: Bearer {key}'" if key else ""
    return run(
        f"curl -s -o /dev/null -w '%{{http_code}}' --max-time 60 {auth} -H 'Content-Type: application/json' "
        f'-d \'{{"prompt": "hi", "n_predict": 2}}\' {client.server_url(cluster)}{path}'
    ).stdout


def test_outsider_cannot_open_the_rpc_port_but_the_coordinator_can(cluster):
    """The port a worker opens (the tunnel's) is firewalled; rpc-server's own is not even on the network."""
    for worker, index in zip(cluster.workers, range(1, WORKERS + 1)):
        assert opens(outsider, lab.ip_of(index), 22)  # the network reaches the worker ...
        assert not opens(outsider, lab.ip_of(index), worker.exposed_port)  # ... the firewall stops the RPC port
        assert not opens(outsider, lab.ip_of(index), worker.settings["rpc_port"])
        # the coordinator is let in: its connection is held (by llama-server, or by the tunnel's end for it; a
        # second one would wait behind it, and the worker's watchdog takes a waiting connection for a sign that
        # the served one is dead)
        assert on(0, f"ss -Htn state established dst {worker.rpc_remote}").stdout.strip()


def test_outsider_needs_the_api_key(cluster):
    key = api_key(cluster)
    assert http(outsider, cluster, "/completion") == "401"
    assert http(outsider, cluster, "/completion", key="wrong" + key) == "401"
    assert http(outsider, cluster, "/completion", key=key) == "200"


def rules(index: int) -> list[str]:
    return [r for r in on(index, "iptables -S INPUT").stdout.splitlines() if FIREWALL_CHAIN in r]


def test_worker_reboot_keeps_the_rule_once_and_the_cluster_serves_again(cluster):
    container = f"{lab.PREFIX}-{lab.host_names(WORKERS)[1]}"
    assert len(rules(1)) == len(cluster.workers[0].firewalled_ports)
    subprocess.run(["docker", "restart", container], check=True, capture_output=True)
    lab.wait_ready(container)
    deadline = time.monotonic() + 60
    while on(1, "systemctl is-active rpc-server").stdout.strip() != "active" and time.monotonic() < deadline:
        time.sleep(1)
    assert len(rules(1)) == len(cluster.workers[0].firewalled_ports)
    assert not opens(outsider, lab.ip_of(1), cluster.workers[0].exposed_port)
    assert until_serving(cluster, 180, expect_down=False).seconds is not None


def test_a_new_key_replaces_the_old_one_and_is_never_printed(cluster):
    path = cluster.settings["llama_api_key_file"]
    old = open(path).read().strip()
    new = secrets.token_hex(32)
    with open(path, "w") as f:
        f.write(new + "\n")
    os.chmod(path, 0o600)
    result = pyinfra("--diff", "-v")
    assert result.returncode == 0, result.stderr[-3000:]
    assert new not in result.stdout + result.stderr and old not in result.stdout + result.stderr
    assert http(outsider, cluster, "/completion", key=old) == "401"
    assert http(outsider, cluster, "/completion", key=new) == "200"
