"""The locked-down setup (threats and the checks that cover them are listed in docs/security.md):
the RPC port only from the coordinator, the API behind its key, no secret in sight, containers unprivileged."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from llama_rpc_deploy import client, roles, tunnel
from llama_rpc_deploy.cluster import SERVICE_USER, allowed_clients, api_key


def _firewall(worker_plan):
    if not worker_plan.settings["rpc_firewall"]:
        pytest.skip("rpc_firewall = False: the user firewalls the RPC port")


def test_rpc_port_admits_only_the_allowed_clients(worker, worker_plan, deployment):
    """Exactly our rules: one jump a port (the tunnel's and rpc-server's, or rpc-server's when plain), first in
    INPUT, for what comes from the network (not loopback), to a chain that accepts the coordinator and resets the rest."""
    _firewall(worker_plan)
    chain = roles.FIREWALL_CHAIN
    rules = [r for r in worker.check_output("iptables -S INPUT").splitlines() if r.startswith("-A INPUT")]
    jumps = [r for r in rules if f"-j {chain}" in r]
    expected = [f"-A INPUT ! -i lo -p tcp -m tcp --dport {port} -j {chain}" for port in worker_plan.firewalled_ports]
    assert sorted(jumps) == sorted(expected), rules  # once each, however often deployed
    assert sorted(rules[: len(jumps)]) == sorted(jumps), "another INPUT rule comes before the RPC ports'"
    accept = [
        f"-A {chain} -s {s if '/' in s else s + '/32'} -j ACCEPT"
        for s in allowed_clients(deployment.cluster, worker_plan)
        if ":" not in s
    ]
    assert worker.check_output(f"iptables -S {chain}").splitlines() == [
        f"-N {chain}",
        *accept,
        f"-A {chain} -p tcp -j REJECT --reject-with tcp-reset",
    ]
    if worker.exists("ip6tables"):
        assert set(expected) <= set(worker.check_output("ip6tables -S INPUT").splitlines())


def test_firewall_unit_enabled_and_required_by_rpc_server(worker, worker_plan):
    """Re-applied at boot, and rpc-server never starts without it."""
    _firewall(worker_plan)
    unit = worker.service(roles.FIREWALL_UNIT.removesuffix(".service"))
    assert unit.is_enabled and unit.is_running
    requires = worker.check_output(f"systemctl show -p Requires --value {roles.WORKER_UNIT}")
    assert roles.FIREWALL_UNIT in requires.split()


def _tunnelled(worker_plan):
    if not worker_plan.tunnelled:
        pytest.skip("rpc_transport = 'plain': no tunnel (the firewall rule alone guards rpc-server)")


def test_rpc_server_is_reached_only_through_the_tunnel(worker, worker_plan):
    """rpc-server listens on loopback alone; on the network, only stunnel, at the tunnel's port."""
    _tunnelled(worker_plan)
    listening = worker.check_output(f"ss -Hltnp 'sport = :{worker_plan.settings['rpc_port']}'").splitlines()
    assert listening and all(
        line.split()[3] == f"127.0.0.1:{worker_plan.settings['rpc_port']}" for line in listening
    ), listening
    tls = worker.check_output(f"ss -Hltnp 'sport = :{worker_plan.settings['rpc_tunnel_port']}'").splitlines()
    assert [line.split()[3] for line in tls] == [worker_plan.rpc_remote] and '"stunnel4"' in tls[0], tls


@pytest.mark.parametrize("role", ["coordinator", "workers"])
def test_tunnel_keys_readable_only_by_the_service_user(role, coordinator, worker, worker_plan):
    _tunnelled(worker_plan)
    host = coordinator if role == "coordinator" else worker
    folder = host.file(roles.TUNNEL_DIR)
    assert (folder.user, folder.group, folder.mode) == (SERVICE_USER, SERVICE_USER, 0o700)
    for name in tunnel.HOST_FILES:
        f = host.file(f"{roles.TUNNEL_DIR}/{name}")
        assert (f.user, f.group, f.mode) == (SERVICE_USER, SERVICE_USER, 0o400), name
    unit = host.service(roles.TUNNEL_UNIT.removesuffix(".service"))
    assert unit.is_enabled and unit.is_running
    assert host.check_output(f"systemctl show -p User --value {roles.TUNNEL_UNIT}") == SERVICE_USER


@pytest.mark.parametrize("role", ["coordinator", "workers"])
def test_containers_run_unprivileged(role, coordinator, worker):
    host, container = (coordinator, "llama-server") if role == "coordinator" else (worker, "rpc-server")
    config = json.loads(host.check_output(f"docker inspect {container}"))[0]
    hc = config["HostConfig"]
    assert hc["Privileged"] is False
    assert hc["NetworkMode"] == "host" and not hc.get(
        "PortBindings"
    )  # no Docker port publishing to bypass the firewall
    assert "ALL" in (hc.get("CapDrop") or []) and not hc.get("CapAdd")
    assert "no-new-privileges" in (hc.get("SecurityOpt") or [])
    assert hc["ReadonlyRootfs"] is True
    uid = host.check_output(f"id -u {SERVICE_USER}")
    assert config["Config"]["User"].split(":")[0] == uid != "0"
    assert host.check_output(f"docker exec {container} id -u") == uid
    if role == "coordinator":
        models = [m for m in config["Mounts"] if m["Destination"] == "/models"]
        assert models and models[0]["RW"] is False


# --- the API key (when llama_api_key_file is set) ---


@pytest.fixture(scope="module")
def key(deployment):
    if not deployment.cluster.settings["llama_api_key_file"]:
        pytest.skip("llama_api_key_file = None: llama-server has no API key")
    return api_key(deployment.cluster)


def _status(deployment, path, token=None, body=None):
    request = urllib.request.Request(
        client.server_url(deployment.cluster) + path,
        data=json.dumps(body).encode() if body else None,
        headers={"Authorization": f"Bearer {token}"} if token else {},
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_requests_without_the_key_are_refused(deployment, key):
    body = {"prompt": "no key", "n_predict": 1}
    assert _status(deployment, "/completion", body=body) == 401
    assert _status(deployment, "/completion", token=key[::-1], body=body) == 401
    assert _status(deployment, "/completion", token=key, body=body) == 200
    assert _status(deployment, "/health") == 200  # public, so health checks need no secret


def test_metrics_only_when_asked(deployment, key):
    expected = 200 if deployment.cluster.settings["llama_metrics"] else 501
    assert _status(deployment, "/metrics", token=key) == expected


def test_key_file_readable_only_by_the_service_user(coordinator, key):
    f = coordinator.file(roles.API_KEY_PATH)
    assert f.is_file and f.mode == 0o400 and f.user == SERVICE_USER and f.group == SERVICE_USER
    assert coordinator.file(roles.API_KEY_PATH.rsplit("/", 1)[0]).mode == 0o700
    assert f.content_string.strip() == key


def test_key_appears_in_no_script_unit_process_or_log(coordinator, deployment, key):
    s = deployment.cluster.settings
    places = {
        "rendered files": f"cat {s['deploy_dir']}/* /etc/systemd/system/llama-server.service 2>/dev/null",
        "ps": "ps -eww -o args",
        "docker inspect": "docker inspect llama-server",
        "journal": f"journalctl -u {roles.COORDINATOR_UNIT} --no-pager -o cat -n 20000",
    }
    for place, command in places.items():
        text = coordinator.check_output(command)
        assert text, f"{place}: nothing to search"
        assert key not in text, f"the API key appears in {place}"
