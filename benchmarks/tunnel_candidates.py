"""The RPC tunnel's candidates side by side: plain TCP, stunnel (the deploy's own configuration), SSH forwarding.

    python3 benchmarks/tunnel_candidates.py [--rounds 3] [--pings 2000] [--mib 200] [--rate 1gbit] [--out docs/tunnel-candidates.md]

The lab up and deployed with rpc_transport: tunnel (the default); about 3 minutes. Between the coordinator and
worker1, pinned (`lab pin`) and with every link shaped to --rate (tc tbf), three ways to one server on worker1's
127.0.0.1 (a Python echo: it answers a 33-byte request, RPC's HELLO size, with 36 bytes; a bulk stream it reads
to the end and acknowledges):
  plain   the same server also on worker1's address (what rpc_transport: plain is);
  stunnel the configuration render.tunnel_files writes, on other ports, with the hosts' installed keys;
  ssh     `ssh -N -L` from the coordinator, with a key of its own that worker1 accepts for that forward only.
Per way: the median round trip of --pings request/reply pairs (what every RPC message waits for), and the MiB/s
of a --mib MiB stream (what a model load is), alternated over --rounds rounds. WireGuard is not measured: the
lab's kernel has no module for it (docs/security.md). Writes --out and its .json beside it.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lab import lab  # noqa: E402
from llama_rpc_deploy import render  # noqa: E402
from llama_rpc_deploy.deployment import offline_cluster  # noqa: E402

from benchmarks.rpc_tunnel import log, on, shape  # noqa: E402

INVENTORY = lab.LAB_DIR / "inventory.py"
ECHO, PLAIN, TLS, LOCAL_TLS, LOCAL_SSH = 47001, 47002, 47003, 47004, 47005
WORKER = "worker1"

SERVER = r'''
import socket, sys, threading
def serve(conn):
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        kind = conn.recv(1)
        if kind == b"p":  # ping-pong: 33 bytes in, 36 out
            while True:
                data = b""
                while len(data) < 33:
                    chunk = conn.recv(33 - len(data))
                    if not chunk:
                        return
                    data += chunk
                conn.sendall(bytes(36))
        else:  # bulk: 8-byte length, then that many bytes; one byte back at the end
            need = int.from_bytes(conn.recv(8), "little")
            while need > 0:
                need -= len(conn.recv(min(need, 1 << 20)))
            conn.sendall(b"k")
def listen(host, port):
    s = socket.create_server((host, port))
    while True:
        conn, _ = s.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()
for host, port in zip(sys.argv[1::2], sys.argv[2::2]):
    threading.Thread(target=listen, args=(host, int(port)), daemon=True).start()
threading.Event().wait()
'''

CLIENT = r'''
import json, socket, sys, time
host, port, pings, mib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
c = socket.create_connection((host, port)); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
c.sendall(b"p")
times = []
for _ in range(pings):
    t = time.perf_counter(); c.sendall(bytes(33)); got = 0
    while got < 36:
        got += len(c.recv(36 - got))
    times.append(time.perf_counter() - t)
c.close()
b = socket.create_connection((host, port)); block = bytes(1 << 20)
t = time.perf_counter(); b.sendall(b"b" + (mib << 20).to_bytes(8, "little"))
for _ in range(mib):
    b.sendall(block)
b.recv(1); seconds = time.perf_counter() - t; b.close()
times.sort()
print(json.dumps({"rtt_us": times[len(times) // 2] * 1e6, "mib_per_s": mib / seconds}))
'''


def background(host: str, name: str, command: str) -> None:
    """command in the background on a lab host, its PID in /tmp/bench-NAME.pid (for stop())."""
    subprocess.run(["docker", "exec", "-d", f"{lab.PREFIX}-{host}", "sh", "-c",
                    f"echo $$ > /tmp/bench-{name}.pid; exec {command}"], check=True)


def stop(host: str, *names: str) -> None:
    for name in names:
        subprocess.run(["docker", "exec", f"{lab.PREFIX}-{host}", "sh", "-c",
                        f"[ -f /tmp/bench-{name}.pid ] && kill $(cat /tmp/bench-{name}.pid); rm -f /tmp/bench-{name}.pid"],
                       capture_output=True)


def setup(cluster) -> None:
    worker = cluster.workers[0]
    teardown()
    on(WORKER, f"cat > /tmp/bench-echo.py <<'EOF'\n{SERVER}\nEOF")
    on("coordinator", f"cat > /tmp/bench-client.py <<'EOF'\n{CLIENT}\nEOF")
    background(WORKER, "echo", f"python3 /tmp/bench-echo.py 127.0.0.1 {ECHO} {worker.address} {PLAIN}")
    # the deploy's own stunnel configuration, on the benchmark's ports
    view = offline_cluster(INVENTORY, overrides={"rpc_port": ECHO, "rpc_tunnel_port": TLS, "rpc_tunnel_local_port": LOCAL_TLS})
    for host, plan in ((WORKER, view.workers[0]), ("coordinator", view.coordinator)):
        config = next(text for path, text in render.tunnel_files(view, plan).items() if path.endswith(render.TUNNEL_CONFIG))
        if host == "coordinator":  # the tunnel to worker1 only
            config = config.split(f"\n[{view.workers[1].name}]")[0] + "\n"
        on(host, f"cat > /tmp/bench-stunnel.conf <<'EOF'\n{config}EOF")
        background(host, "stunnel", "stunnel4 /tmp/bench-stunnel.conf")
    # ssh: a key of its own, accepted by worker1 for this one forward
    on("coordinator", "rm -f /tmp/bench-ssh-key*; ssh-keygen -q -t ed25519 -N '' -f /tmp/bench-ssh-key")
    public = on("coordinator", "cat /tmp/bench-ssh-key.pub").strip()
    on(WORKER, f"echo 'restrict,port-forwarding,permitopen=\"127.0.0.1:{ECHO}\" {public} bench-ssh' >> /root/.ssh/authorized_keys")
    background("coordinator", "ssh", f"ssh -N -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
                              f"-i /tmp/bench-ssh-key -L 127.0.0.1:{LOCAL_SSH}:127.0.0.1:{ECHO} root@{worker.address}")
    time.sleep(3)


def teardown() -> None:
    stop(WORKER, "echo", "stunnel")
    stop("coordinator", "stunnel", "ssh")
    on(WORKER, "sed -i '/ bench-ssh$/d' /root/.ssh/authorized_keys")
    on("coordinator", "rm -f /tmp/bench-ssh-key* /tmp/bench-client.py")


def measure(target: str, pings: int, mib: int) -> dict:
    host, port = target.rsplit(":", 1)
    out = on("coordinator", f"python3 /tmp/bench-client.py {host} {port} {pings} {mib}")
    return json.loads(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pings", type=int, default=2000)
    parser.add_argument("--mib", type=int, default=200)
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "tunnel-candidates.md")
    args = parser.parse_args()
    cluster = offline_cluster(INVENTORY)
    ways = {"plain": f"{cluster.workers[0].address}:{PLAIN}", "stunnel": f"127.0.0.1:{LOCAL_TLS}",
            "ssh": f"127.0.0.1:{LOCAL_SSH}"}
    results = {w: [] for w in ways}
    lab.pin()
    shape(args.rate)
    try:
        setup(cluster)
        for r in range(args.rounds):
            for way in (list(ways) if r % 2 == 0 else list(ways)[::-1]):
                results[way].append(measure(ways[way], args.pings, args.mib))
                log(f"round {r + 1} {way}: {results[way][-1]}")
    finally:
        teardown()
        shape(None)
        lab.pin(unpin=True)
    table = {w: {"rtt_us": round(statistics.median(x["rtt_us"] for x in v), 1),
                 "mib_per_s": round(statistics.median(x["mib_per_s"] for x in v), 1)} for w, v in results.items()}
    args.out.with_suffix(".json").write_text(json.dumps({"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                                         "args": vars(args) | {"out": str(args.out)}, "median": table,
                                                         "data": results}, indent=1) + "\n")
    plain = table["plain"]
    lines = ["# The RPC tunnel's candidates: plain TCP, stunnel, SSH forwarding", "",
             f"`python3 benchmarks/tunnel_candidates.py --rounds {args.rounds} --pings {args.pings} --mib {args.mib} "
             f"--rate {args.rate}`, one run, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: coordinator to "
             "worker1 on the lab, pinned, links shaped to the rate; medians over the rounds.", "",
             "| way | round trip of a 33-byte request, µs | added to plain, µs | bulk stream, MiB/s | / plain |",
             "| --- | --- | --- | --- | --- |"]
    for way, t in table.items():
        lines.append(f"| {way} | {t['rtt_us']} | {t['rtt_us'] - plain['rtt_us']:+.1f} | {t['mib_per_s']} | "
                     f"{t['mib_per_s'] / plain['mib_per_s']:.3f} |")
    args.out.write_text("\n".join(lines) + "\n")
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
