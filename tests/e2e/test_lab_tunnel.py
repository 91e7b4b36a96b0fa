"""The RPC tunnel on the lab (rpc_transport: tunnel, the default; threats in docs/security.md).

An impostor that takes the coordinator's address (the coordinator taken off the lab network, the outsider
given its address: what ARP spoofing does on a home LAN) passes the firewall rule, which knows addresses
only, and still completes no RPC HELLO with any worker: not in clear, not with TLS and a certificate of its
own. The same probe from the real coordinator, through its tunnels, gets the answer, so the probe can
succeed. Raising rpc_tunnel_key_generation puts new keys on every host without failing a request, and the
new keys carry llama-server's next connections.
"""

from __future__ import annotations

import hashlib
import json
import subprocess

import pytest

from lab import lab
from llama_rpc_deploy import roles, tunnel
from llama_rpc_deploy.loadtest import run_load, until_serving
from llama_rpc_deploy.paths import STATE

from .lab_helpers import WORKERS, changed, needs_docker, on, operations, pyinfra, snapshot

pytestmark = [needs_docker, pytest.mark.usefixtures("serving_afterwards")]

# The probe an impostor runs (python3 on a lab host): for each HOST:PORT, whether a TCP connection opens, and
# what comes back for an RPC HELLO sent in clear, over TLS without a certificate, and over TLS with a
# certificate of its own that names itself the coordinator (made here by openssl, as an attacker would).
PROBE = r"""
import json, socket, ssl, subprocess, sys
HELLO = bytes([14]) + (24).to_bytes(8, "little") + bytes(24)
subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-subj", "/CN=" + sys.argv[1], "-keyout", "/tmp/impostor.key", "-out", "/tmp/impostor.crt",
                "-days", "1"], check=True, capture_output=True)
def hello(host, port, tls=None):
    reply = b""
    try:
        with socket.create_connection((host, port), timeout=5) as raw:
            conn = raw
            if tls is not None:
                context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
                context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
                if tls:
                    context.load_cert_chain("/tmp/impostor.crt", "/tmp/impostor.key")
                conn = context.wrap_socket(raw)
            conn.sendall(HELLO)
            while len(reply) < 36:
                chunk = conn.recv(64)
                if not chunk:
                    break
                reply += chunk
    except OSError as error:
        return "no answer (%s)" % type(error).__name__ if not reply else reply.hex()
    return reply.hex() or "no answer (closed)"
def opens(host, port):
    try:
        socket.create_connection((host, port), timeout=3).close()
        return True
    except OSError:
        return False
out = {}
for target in sys.argv[3:]:
    host, port = target.rsplit(":", 1)
    port = int(port)
    out[target] = {"opens": opens(host, port), "clear": hello(host, port)}
    if sys.argv[2] == "all":  # (not at a tunnel's end on the coordinator: the TLS bytes would go on to rpc-server)
        out[target].update(tls=hello(host, port, False), tls_own_cert=hello(host, port, True))
print(json.dumps(out))
"""
ANSWERED = (28).to_bytes(8, "little").hex()  # rpc-server's reply to HELLO starts with its size, 28


def probe(container: str, mode: str, *targets: str) -> dict:
    """mode: 'clear' (HELLO in clear only) or 'all'."""
    result = subprocess.run(
        ["docker", "exec", container, "python3", "-c", PROBE, tunnel.tunnel_name(lab.ip_of(0)), mode, *targets],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def network(*args: str) -> None:
    subprocess.run(["docker", "network", *args], check=True, capture_output=True)


def test_an_impostor_with_the_coordinators_address_completes_no_rpc_hello(cluster):
    coordinator = f"{lab.PREFIX}-coordinator"
    outsider = lab.outsider()
    # rpc-server serves one client at a time: with llama-server stopped, a HELLO that got through is answered
    assert on(0, "systemctl stop llama-server-watchdog llama-server").returncode == 0
    try:
        # the real coordinator, through its tunnels' ends: answered (the probe can succeed)
        own = probe(coordinator, "clear", *cluster.rpc_endpoints)
        assert all(r["clear"].startswith(ANSWERED) for r in own.values()), own
        # the impostor: the coordinator off the network, its address on the outsider
        network("disconnect", lab.NETWORK, coordinator)
        network("disconnect", lab.NETWORK, outsider)
        network("connect", "--ip", lab.ip_of(0), lab.NETWORK, outsider)
        for index in range(1, WORKERS + 1):
            on(index, "ip neigh flush all")  # the workers forget the coordinator's hardware address
        targets = [w.rpc_remote for w in cluster.workers] + [
            f"{w.settings['rpc_host'] or w.address}:{w.settings['rpc_port']}" for w in cluster.workers
        ]
        seen = probe(outsider, "all", *targets)
        for w in cluster.workers:
            tls = seen[w.rpc_remote]
            assert tls["opens"], f"the firewall should admit the coordinator's address to {w.rpc_remote}: {seen}"
            assert tls["clear"].startswith("no answer"), seen  # RPC in clear at the TLS port
            assert tls["tls"].startswith("no answer"), seen  # TLS without a certificate
            assert tls["tls_own_cert"].startswith("no answer"), seen  # a certificate the deploy's CA did not sign
            rpc = seen[f"{w.settings['rpc_host'] or w.address}:{w.settings['rpc_port']}"]
            assert not rpc["opens"], seen  # rpc-server itself is not on the network
        # the workers' tunnels said why
        log = on(1, "journalctl -u llama-rpc-tunnel --since '-2min' --no-pager").stdout
        assert "certificate" in log.lower() or "peer did not return a certificate" in log.lower(), log[-2000:]
    finally:
        subprocess.run(["docker", "network", "disconnect", lab.NETWORK, outsider], capture_output=True)
        subprocess.run(
            ["docker", "network", "connect", "--ip", lab.ip_of(lab.OUTSIDER_IP_INDEX), lab.NETWORK, outsider],
            capture_output=True,
        )
        lab.reconnect(coordinator, lab.ip_of(0))
        for index in range(1, WORKERS + 1):
            on(index, "ip neigh flush all")
        on(0, "systemctl start llama-server llama-server-watchdog")
    assert until_serving(cluster, 240, expect_down=False).seconds is not None


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_keys_rotate_with_one_setting_and_no_request_fails(cluster):
    """rpc_tunnel_key_generation 2: a new CA and keys on every host, the tunnels reloaded (the connections
    open stay up: no request fails, nothing restarts); llama-server's next start goes through the new keys.
    Then back to the inventory's generation."""
    result = {}

    def rotate():
        result["deploy"] = pyinfra("--json", "--data", "rpc_tunnel_key_generation=2")

    load = run_load(cluster, clients=2, requests_each=15, n_predict=16, timeout=300, during=rotate)
    ops = operations(result["deploy"])
    assert load.failed == [], load.summary()
    new_ca = sha256(STATE / "tunnel" / "2" / "ca.crt")
    assert new_ca != sha256(STATE / "tunnel" / "1" / "ca.crt")
    for index in range(WORKERS + 1):
        assert on(index, f"sha256sum {roles.TUNNEL_DIR}/ca.crt").stdout.split()[0] == new_ca
    assert sorted(changed(ops, "new keys or peers read again")) == sorted(
        [cluster.coordinator.name] + [w.name for w in cluster.workers]
    )
    assert changed(ops, "restarted") == []  # neither llama-server, nor rpc-server, nor a tunnel
    # the next connections use the new keys: llama-server restarted, through the tunnels, serves
    assert on(0, "systemctl restart llama-server").returncode == 0
    assert until_serving(cluster, 240, expect_down=False).seconds is not None
    log = on(1, "journalctl -u llama-rpc-tunnel --since '-1min' --no-pager").stdout
    assert "Certificate accepted" in log, log[-2000:]
    # back to generation 1 (the inventory sets none): the old keys again, still no restart
    ops = operations(pyinfra("--json"))
    assert changed(ops, "restarted") == []
    assert on(1, f"sha256sum {roles.TUNNEL_DIR}/ca.crt").stdout.split()[0] == sha256(STATE / "tunnel" / "1" / "ca.crt")


def test_a_tunnel_key_others_can_read_stops_the_deploy_before_any_host_is_touched(cluster):
    key = tunnel.folder(STATE, 1) / f"{tunnel.tunnel_name(cluster.workers[0].name)}.key"
    before = snapshot()
    key.chmod(0o640)
    try:
        result = pyinfra()
    finally:
        key.chmod(0o600)
    output = result.stdout + result.stderr
    assert result.returncode == 1 and f"{key} has mode 640: expected 600" in output, output[-3000:]
    assert "Connecting" not in output  # refused before pyinfra connected to any host
    assert snapshot() == before


def test_a_worker_that_cannot_get_stunnel_is_refused_before_any_change(cluster):
    """No stunnel4 and no apt-get to install it on a worker: the checks stop the deploy, every host as it was."""
    hide = "mv /usr/bin/stunnel4 /usr/bin/stunnel4.hidden && mv /usr/bin/apt-get /usr/bin/apt-get.hidden"
    before = snapshot()
    assert on(2, hide).returncode == 0
    try:
        result = pyinfra()
    finally:
        on(2, "mv /usr/bin/stunnel4.hidden /usr/bin/stunnel4; mv /usr/bin/apt-get.hidden /usr/bin/apt-get")
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    assert (
        f"{cluster.workers[1].name}: rpc_transport = 'tunnel' ({cluster.workers[1].origins['rpc_transport']}) "
        "needs stunnel4, which is "
        "not installed, and there is no apt-get to install it"
    ) in output, output[-3000:]
    assert snapshot() == before
