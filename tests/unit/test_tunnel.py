"""The RPC tunnel with Debian's real stunnel on this machine: the configurations render.tunnel_files writes,
with the keys tunnel.ensure makes, carry rpc-server's HELLO from the coordinator's end to the worker's
rpc-server; a client without the coordinator's certificate gets nothing through."""

from __future__ import annotations

import shutil
import socket
import ssl
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

from lab.lab import free_ports
from llama_rpc_deploy import render, roles, tunnel
from llama_rpc_deploy.settings import SettingsError

from .helpers import cluster

pytestmark = pytest.mark.skipif(
    not shutil.which("stunnel4"), reason="stunnel4 is missing: apt-get install stunnel4 (scripts/setup-machine.sh does)"
)

HELLO = bytes([14]) + (24).to_bytes(8, "little") + bytes(24)  # RPC_CMD_HELLO as llama.cpp sends it
COORDINATOR, WORKER = "127.0.0.1", "127.0.0.2"  # both this machine's loopback, as two hosts


def rpc_server(port: int) -> list[bytes]:
    """A stand-in for rpc-server on 127.0.0.1:port: answers each HELLO with protocol 7.0.0. Returns what it got."""
    listener = socket.create_server(("127.0.0.1", port))
    got = []

    def serve():
        while True:
            conn, _ = listener.accept()
            with conn:
                data = b""
                while len(data) < len(HELLO) and (chunk := conn.recv(64)):
                    data += chunk
                got.append(data)
                if data == HELLO:
                    conn.sendall(struct.pack("<Q", 28) + bytes([7, 0, 0, 0]) + bytes(24))

    threading.Thread(target=serve, daemon=True).start()
    return got


def hello(address: str, port: int, wrap=None) -> bytes:
    """Send HELLO to address:port (through wrap, an SSL context, when given); what came back (b'' for nothing)."""
    reply = b""
    with socket.create_connection((address, port), timeout=5) as raw:
        try:  # TLS 1.3: a server that refuses the client's certificate says so after the client's handshake
            conn = wrap.wrap_socket(raw) if wrap else raw
            conn.sendall(HELLO)
            while len(reply) < 36 and (chunk := conn.recv(64)):
                reply += chunk
        except OSError:  # ssl.SSLError is one
            pass
    return reply


def start(config: str, keys: dict[str, Path], folder: Path) -> subprocess.Popen:
    """stunnel on a rendered configuration, its TUNNEL_DIR files taken from here instead."""
    folder.mkdir()
    for dest, src in keys.items():
        shutil.copy(src, folder / Path(dest).name)
    path = folder / "stunnel.conf"
    path.write_text(config.replace(roles.TUNNEL_DIR, str(folder)))
    return subprocess.Popen(["stunnel4", str(path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_listening(address: str, port: int, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stdout.read()
        # ss, not a connection: one to the coordinator's end would open a tunnel to rpc-server
        if subprocess.run(["ss", "-Hltn", f"src {address} and sport = :{port}"], capture_output=True, text=True).stdout:
            return
        time.sleep(0.05)
    raise AssertionError(f"stunnel does not listen on {address}:{port}")


@pytest.fixture
def pair(tmp_path):
    """A coordinator's and a worker's stunnel as the deploy renders them, and a stand-in rpc-server behind the worker."""
    rpc_port, tls_port, local_port = free_ports(3)
    c = cluster(
        names=[COORDINATOR, WORKER],
        coordinator={"gpus": []},
        workers=[{"rpc_port": rpc_port, "rpc_tunnel_port": tls_port, "gpus": []}],
        all_data={"rpc_tunnel_local_port": local_port, "image_backend": "cpu"},
    )
    state = tmp_path / "state"
    keys = tunnel.ensure(state, 1, [COORDINATOR, WORKER], "test")
    got = rpc_server(rpc_port)
    worker = c.workers[0]
    config = f"{worker.settings['deploy_dir']}/{roles.TUNNEL_CONFIG}"
    processes = [
        start(render.tunnel_files(c, worker)[config], tunnel.host_sources(keys, WORKER), tmp_path / "worker"),
        start(
            render.tunnel_files(c, c.coordinator)[config],
            tunnel.host_sources(keys, COORDINATOR),
            tmp_path / "coordinator",
        ),
    ]
    try:
        wait_listening(WORKER, tls_port, processes[0])
        wait_listening(COORDINATOR, local_port, processes[1])
        yield c, keys, got
    finally:
        for p in processes:
            p.terminate()
            p.wait(5)


def client_context(crt: Path, key: Path, ca: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.load_verify_locations(ca)
    context.load_cert_chain(crt, key)
    return context


ANSWER = struct.pack("<Q", 28) + bytes([7, 0, 0, 0]) + bytes(24)


def test_the_coordinators_end_reaches_rpc_server(pair):
    c, _, got = pair
    host, port = c.rpc_endpoints[0].split(":")
    assert hello(host, int(port)) == ANSWER
    assert got == [HELLO]


def test_the_worker_end_admits_no_one_without_the_coordinators_certificate(pair, tmp_path):
    c, keys, got = pair
    worker = c.workers[0]
    tls_port = worker.settings["rpc_tunnel_port"]
    # an impostor speaking RPC to the TLS port: no answer, and nothing reaches rpc-server
    assert hello(WORKER, tls_port) == b""
    # TLS without a client certificate
    anonymous = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    anonymous.check_hostname, anonymous.verify_mode = False, ssl.CERT_NONE
    assert hello(WORKER, tls_port, anonymous) == b""
    # a certificate of another CA, naming the coordinator
    other = tunnel.ensure(tmp_path / "other-state", 1, [COORDINATOR], "test")
    name = tunnel.tunnel_name(COORDINATOR)
    assert hello(WORKER, tls_port, client_context(other / f"{name}.crt", other / f"{name}.key", keys / "ca.crt")) == b""
    # the deploy's own CA, but the worker's certificate, not the coordinator's (checkHost)
    name = tunnel.tunnel_name(WORKER)
    assert hello(WORKER, tls_port, client_context(keys / f"{name}.crt", keys / f"{name}.key", keys / "ca.crt")) == b""
    assert got == []
    # and the coordinator's certificate does get through: the probes above could have succeeded
    name = tunnel.tunnel_name(COORDINATOR)
    assert (
        hello(WORKER, tls_port, client_context(keys / f"{name}.crt", keys / f"{name}.key", keys / "ca.crt")) == ANSWER
    )
    assert got == [HELLO]


def test_keys_are_made_once_per_host_and_rotate_with_the_generation(tmp_path):
    first = tunnel.ensure(tmp_path, 1, ["a", "b"], "test")
    before = {p.name: p.read_bytes() for p in first.iterdir()}
    assert tunnel.ensure(tmp_path, 1, ["a", "b", "c"], "test") == first  # a new host: its own, from the same CA
    after = {p.name: p.read_bytes() for p in first.iterdir()}
    assert {k: after[k] for k in before} == before and len(after) == len(before) + 2
    second = tunnel.ensure(tmp_path, 2, ["a"], "test")
    assert (second / "ca.crt").read_bytes() != (first / "ca.crt").read_bytes()
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in second.iterdir()) and second.stat().st_mode & 0o777 == 0o700


def test_a_key_others_can_read_is_refused(tmp_path):
    where = tunnel.ensure(tmp_path, 1, ["a"], "group_data/coordinator.yml")
    key = where / f"{tunnel.tunnel_name('a')}.key"
    key.chmod(0o644)
    with pytest.raises(SettingsError, match=rf"group_data/coordinator.yml: {key} has mode 644: expected 600"):
        tunnel.ensure(tmp_path, 1, ["a"], "group_data/coordinator.yml")


def test_names_stay_apart_and_dns_safe():
    names = {tunnel.tunnel_name(n) for n in ("10.0.0.1", "10-0-0-1", "Desktop.lan", "desktop.lan")}
    assert len(names) == 4
    assert all(n.endswith(".llama-rpc.invalid") and n.replace(".", "").replace("-", "").isalnum() for n in names)
