"""Rendering of the locked-down setup: firewall rule, API key as a file, unprivileged containers."""

import os
import shlex

import pytest

from llama_rpc_deploy import client
from llama_rpc_deploy.cluster import SERVICE_USER
from llama_rpc_deploy.render import coordinator_files, firewall_files, worker_files
from llama_rpc_deploy.roles import API_KEY_PATH, FIREWALL_UNIT, WORKER_UNIT
from llama_rpc_deploy.settings import SettingsError

from .helpers import IMAGE, cluster, flag, server_script, words

KEY = "0123456789abcdef0123456789abcdef"


def key_file(tmp_path, mode=0o600, key=KEY):
    path = tmp_path / "api_key"
    path.write_text(key + "\n")
    os.chmod(path, mode)
    return str(path)


def _env(text: str) -> dict[str, str]:
    """A program's environment file (KEY=value lines, values quoted for the shell) as a dict."""
    return dict(line.split("=", 1) for line in shlex.split(text, comments=True))


def test_firewall_admits_the_coordinator_only_by_default():
    c = cluster()
    assert c.coordinator.address == "10.0.0.10"
    files = firewall_files(c, c.workers[0])
    env = _env(files["/opt/llama-rpc/rpc-firewall.env"])
    # exactly the coordinator's address: no other source, no network, nothing over IPv6
    assert (env["ALLOW_IPV4"].split(), env["ALLOW_IPV6"].split()) == (["10.0.0.10"], []), (
        f"the default firewall admits {env['ALLOW_IPV4']!r} (IPv4) and {env['ALLOW_IPV6']!r} (IPv6), not the coordinator only"
    )
    assert env["RPC_PORTS"] == "50053 50052"  # the tunnel's port, and rpc-server's own on loopback
    script = worker_files(c, c.workers[0], IMAGE)["/opt/llama-rpc/rpc-server.sh"]
    assert (
        "listens on 127.0.0.1 only, and only the tunnel (llama-rpc-tunnel.service, mutual TLS on port 50053)" in script
    )
    plain = cluster(workers=[{"rpc_transport": "plain"}])
    assert _env(firewall_files(plain, plain.workers[0])["/opt/llama-rpc/rpc-firewall.env"])["RPC_PORTS"] == "50052"
    assert (
        "rpc-firewall.sh admits only 10.0.0.10.\n"
        in worker_files(plain, plain.workers[0], IMAGE)["/opt/llama-rpc/rpc-server.sh"]
    )
    unit = files[f"/etc/systemd/system/{FIREWALL_UNIT}"]
    assert "Before=network-pre.target rpc-server.service" in unit and "WantedBy=multi-user.target" in unit
    rpc_unit = worker_files(c, c.workers[0], IMAGE)[f"/etc/systemd/system/{WORKER_UNIT}"]
    assert f"Requires=docker.service {FIREWALL_UNIT}" in rpc_unit


def test_firewall_off_when_asked():
    off = cluster(workers=[{"rpc_firewall": False}])
    assert firewall_files(off, off.workers[0]) == {}
    assert FIREWALL_UNIT not in worker_files(off, off.workers[0], IMAGE)[f"/etc/systemd/system/{WORKER_UNIT}"]


def test_firewall_needs_an_ip_address_for_the_coordinator():
    with pytest.raises(
        SettingsError, match=r"inventory.py \(host desktop.lan\): address = 'desktop.lan'.*expected an IP"
    ):
        cluster(names=["desktop.lan", "10.0.0.20"])
    cluster(names=["desktop.lan", "10.0.0.20"], coordinator={"address": "10.0.0.10"})  # fine with its IP
    cluster(names=["desktop.lan", "10.0.0.20"], workers=[{"rpc_firewall": False}])


@pytest.mark.parametrize("role", ["server", "rpc"])
def test_containers_unprivileged(role):
    c = cluster()
    script = (
        server_script(c) if role == "server" else worker_files(c, c.workers[0], IMAGE)["/opt/llama-rpc/rpc-server.sh"]
    )
    argv = words(script)
    assert flag(argv, "--user") == f"$(id -u {SERVICE_USER}):$(id -g {SERVICE_USER})"  # expanded by the shell
    assert '--user "$(id -u llama-rpc):$(id -g llama-rpc)"' in script
    assert flag(argv, "--cap-drop") == "ALL" and flag(argv, "--security-opt") == "no-new-privileges"
    assert "--read-only" in argv and flag(argv, "--network") == "host"
    assert "--privileged" not in argv and "--publish" not in argv and "-p" not in argv


def test_api_key_reaches_llama_server_as_a_file_only(tmp_path):
    c = cluster(all_data={"llama_api_key_file": key_file(tmp_path), "llama_metrics": True})
    files = coordinator_files(c, IMAGE)
    argv = words(files["/opt/llama-rpc/llama-server.sh"])
    assert f"{API_KEY_PATH}:/run/secrets/llama-api-key:ro" in argv
    assert flag(argv, "--api-key-file") == "/run/secrets/llama-api-key" and "--api-key" not in argv
    assert "--metrics" in argv
    assert all(KEY not in content for content in files.values())
    assert client.headers(c)["Authorization"] == f"Bearer {KEY}"
    plain = words(server_script(cluster()))
    assert (
        "--api-key-file" not in plain and "--metrics" not in plain and "Authorization" not in client.headers(cluster())
    )


@pytest.mark.parametrize(
    "mode,key,words_",
    [
        (0o644, KEY, "has mode 644: expected 600 or 400"),
        (0o640, KEY, "has mode 640: expected 600 or 400"),
        (0o600, "short", "expected one key of at least 16 characters"),
        (0o600, "two words here and more", "expected one key of at least 16 characters"),
    ],
)
def test_api_key_file_checked(tmp_path, mode, key, words_):
    with pytest.raises(SettingsError, match=words_):
        cluster(all_data={"llama_api_key_file": key_file(tmp_path, mode, key)})
    cluster(all_data={"llama_api_key_file": key_file(tmp_path, 0o400)})
