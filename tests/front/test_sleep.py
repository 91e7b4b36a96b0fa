"""The workers' sleep and wake, run for real on this machine: files/llama-sleep.py (as it ships) against the real
front (HAProxy with front.cfg and front.lua, tests/front/test_front.py's Front), its fake llama-server stopped and
started by the daemon's own commands (with front-drain.sh around them, as llama-server.service does), and two fake
workers: processes that answer the RPC HELLO as rpc-server does. What stands in for the hardware: a worker's
"sleep" command stops its process (SIGSTOP: it answers nothing), and a listener on a UDP port of 127.0.0.1 that
sees a magic packet for its MAC continues it (SIGCONT), as the lab's wake listener does with whole hosts.

Each case asserts what a client sees, and the daemon's state file, which `llama-rpc status` shows. Small bounds:
idle 2 s, a wake 4 s at most. Every process is killed in the teardown.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from lab.lab import free_ports
from llama_rpc_deploy import programs, render
from llama_rpc_deploy.sleep import WAKE_RETRY_AFTER

from .test_front import Front, wait_until

IDLE = 2  # sleep_idle_seconds
WAKE_TIMEOUT = 4  # sleep_wake_timeout

# A fake rpc-server: answers HELLO (command 14) with protocol 3.0.0, as many clients as come, one at a time.
WORKER = r"""
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(16)
while True:
    c, _ = s.accept()
    try:
        c.settimeout(2)
        data = b""
        while len(data) < 33:
            chunk = c.recv(33 - len(data))
            if not chunk:
                break
            data += chunk
        if data[:1] == bytes([14]):
            c.sendall((3).to_bytes(8, "little") + bytes([3, 0, 0]))
    except OSError:
        pass
    finally:
        c.close()
"""


class Cluster:
    """The front, the daemon, its workers and the wake listener, all in Front's scratch folder."""

    def __init__(self, front: Front, wake_deaf: set[str] = frozenset(), retry_after: int = WAKE_RETRY_AFTER):
        self.front, self.dir = front, front.dir
        self.wake_deaf = wake_deaf  # workers whose NIC ignores the magic packets
        (self.dir / "worker.py").write_text(WORKER)
        ports = free_ports(3)
        self.wol_port = ports[0]
        self.workers = {}
        for i, port in enumerate(ports[1:]):
            p = subprocess.Popen([sys.executable, str(self.dir / "worker.py"), str(port)], start_new_session=True)
            self.workers[f"worker{i + 1}"] = {"port": port, "mac": f"02:00:00:00:00:0{i + 1}", "process": p}
        self.events = []
        self.stop_listening = threading.Event()
        self.listener = threading.Thread(target=self.listen, daemon=True)
        self.listener.start()
        self.pidfile = self.dir / "llama.pid"
        self.state = self.dir / "state.json"
        fake = f"{sys.executable} {self.dir / 'fake.py'} {front.server_port} {self.dir / 'llama.log'} 0"
        drain = self.dir / "front-drain.sh"
        config = {
            "idle_seconds": IDLE,
            "wake_timeout": WAKE_TIMEOUT,
            "retry_after": retry_after,
            "keep_awake": 600,
            "ready_timeout": 10,
            "socket": str(front.socket),
            "backends": [render.FRONT_BACKEND, render.FRONT_HELD],
            "server": render.FRONT_SERVER,
            "state": str(self.state),
            # as llama-server.service: its stop drains the front, its start lets requests go again
            "stop_server": ["sh", "-c", f"{drain} drain >/dev/null; kill $(cat {self.pidfile})"],
            "start_server": ["sh", "-c", f"{drain} ready >/dev/null; setsid {fake} & echo $! > {self.pidfile}"],
            "server_running": ["sh", "-c", f"kill -0 $(cat {self.pidfile})"],
            "workers": [
                {
                    "name": name,
                    "mac": w["mac"],
                    "broadcast": "127.0.0.1",
                    "wol_port": self.wol_port,
                    "endpoint": f"127.0.0.1:{w['port']}",
                    "sleep": ["kill", "-STOP", str(w["process"].pid)],
                }
                for name, w in self.workers.items()
            ],
        }
        (self.dir / "llama-sleep.json").write_text(json.dumps(config))
        (self.dir / "llama-sleep.py").write_text(programs.text(programs.SLEEPER))
        subprocess.run(config["start_server"], check=True)
        front.wait_status("UP")
        self.daemon = subprocess.Popen(
            [sys.executable, str(self.dir / "llama-sleep.py"), "run"],
            env={**os.environ, "LLAMA_SLEEP_CONFIG": str(self.dir / "llama-sleep.json")},
            stdout=open(self.dir / "daemon.log", "w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def listen(self):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("127.0.0.1", self.wol_port))
            s.settimeout(0.2)
            while not self.stop_listening.is_set():
                try:
                    data = s.recv(1024)
                except TimeoutError:
                    continue
                mac = ":".join(f"{b:02x}" for b in data[6:12])
                for name, w in self.workers.items():
                    if data[:6] == b"\xff" * 6 and data[6:102] == data[6:12] * 16 and w["mac"] == mac:
                        self.events.append((time.time(), "magic", name))
                        if name not in self.wake_deaf:
                            os.kill(w["process"].pid, signal.SIGCONT)

    def read_state(self):
        return json.loads(self.state.read_text()) if self.state.exists() else {}

    def asleep(self):
        s = self.read_state()
        return s.get("asleep_since") is not None and all(w["asleep"] for w in s["workers"].values())

    def log(self):
        return (self.dir / "daemon.log").read_text()

    def stop(self):
        self.stop_listening.set()
        for p in [self.daemon, *(w["process"] for w in self.workers.values())]:
            try:
                os.kill(p.pid, signal.SIGCONT)
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(5)
        if self.pidfile.exists():
            try:
                os.kill(int(self.pidfile.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass


@pytest.fixture
def make_cluster():
    made = []

    def make(**kwargs):
        front = Front()
        front.start()
        made.append(front)
        c = Cluster(front, **kwargs)
        made.append(c)
        return c

    yield make
    for thing in reversed(made):
        thing.stop()


def poll_status_paths(front, seconds):
    """Health checks, status polls and a metrics scrape, every 0.2 s for seconds: the answers' codes."""
    codes, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        for path in ("/health", "/v1/models", "/metrics", "/props"):
            codes.append(front.call(method="GET", path=path, timeout=5).status)
        time.sleep(0.2)
    return codes


def test_status_polls_neither_keep_the_workers_awake_nor_wake_them(make_cluster):
    c = make_cluster()
    front = c.front
    codes = poll_status_paths(front, IDLE + 6)  # polled all along: they fall asleep all the same
    assert c.asleep(), f"still awake after {IDLE + 6} s of status polls only: {c.log()}"
    assert 200 in codes and 503 in codes  # answered by llama-server at first, then by the front: asleep
    # asleep: the same paths are answered at once (503, 'asleep'), and nobody wakes up
    asleep_answers = [front.call(method="GET", path=p, timeout=5) for p in ("/v1/models", "/metrics", "/health")]
    assert [a.status for a in asleep_answers] == [503, 503, 503]
    assert all(a.took < 1 for a in asleep_answers), [a.took for a in asleep_answers]
    assert all(b"asleep" in a.body for a in asleep_answers)
    poll_status_paths(front, 2)
    assert c.asleep() and not [e for e in c.events if e[1] == "magic"], c.events
    assert front.show_front()["asleep"] == 1


def test_the_first_request_wakes_the_workers_and_is_answered(make_cluster):
    c = make_cluster()
    wait_until(c.asleep, IDLE + 10, f"the workers asleep: {c.log()}")
    with pytest.raises(socket.timeout):  # asleep: rpc-server answers nothing
        with socket.create_connection(("127.0.0.1", c.workers["worker1"]["port"]), timeout=1) as s:
            s.settimeout(1)
            s.sendall(bytes([14]) + (24).to_bytes(8, "little") + bytes(24))
            s.recv(11)
    answers = [c.front.background(body={"tag": f"t{i}", "stream": i % 2 == 1, "delay": 0.3}) for i in range(4)]
    got = [a.answer(20) for a in answers]
    assert [a.status for a in got] == [200] * 4, got
    state = c.read_state()
    assert state["asleep_since"] is None and not any(w["asleep"] for w in state["workers"].values())
    assert len(state["wakes"]) == 1 and state["last_wake"]["ready_s"] < WAKE_TIMEOUT + 5, state
    assert {name for _, what, name in c.events if what == "magic"} == {"worker1", "worker2"}
    wait_until(lambda: c.read_state()["last_wake"]["first_answer_s"] is not None, 5, "the first answer noted")
    assert 0 < c.read_state()["last_wake"]["first_answer_s"] < 10


def test_no_sleep_while_a_request_is_in_flight(make_cluster):
    c = make_cluster()
    long = c.front.background(body={"tag": "long", "delay": IDLE * 3})  # in flight for 3 idle periods
    time.sleep(IDLE * 2.5)
    assert not c.read_state().get("asleep_since"), c.log()
    assert long.answer(10).status == 200
    wait_until(c.asleep, IDLE + 10, "asleep once the request ended and the idle time passed")


def test_a_worker_that_does_not_wake_gets_a_clear_503_naming_it(make_cluster):
    c = make_cluster(wake_deaf={"worker2"})
    wait_until(c.asleep, IDLE + 10, f"the workers asleep: {c.log()}")
    answer = c.front.call(body={"tag": "in vain"}, timeout=WAKE_TIMEOUT + 20)
    assert answer.status == 503, answer
    assert answer.headers["retry-after"] == str(WAKE_RETRY_AFTER)
    assert "worker2 did not wake within 4 s" in answer.json()["error"]["message"]
    assert answer.took < WAKE_TIMEOUT + 5
    state = c.read_state()
    assert state["failed"]["workers"] == ["worker2"] and state["asleep_since"] is not None
    # meanwhile, a new request is told at once, not held
    again = c.front.call(body={"tag": "again"}, timeout=10)
    assert again.status == 503 and again.took < 1, again


def test_after_a_failed_wake_only_a_new_request_tries_again(make_cluster):
    deaf = {"worker2"}
    c = make_cluster(wake_deaf=deaf, retry_after=2)
    wait_until(c.asleep, IDLE + 10, f"the workers asleep: {c.log()}")
    assert c.front.call(body={"tag": "in vain"}, timeout=WAKE_TIMEOUT + 20).status == 503
    packets = len(c.events)
    time.sleep(2 + 3)  # past the retry window, nobody asking: no new wake
    assert len(c.events) == packets, c.events[packets:]
    deaf.clear()  # its NIC wakes now
    answer = c.front.call(body={"tag": "later"}, timeout=WAKE_TIMEOUT + 20)
    assert answer.status == 200, answer
    assert c.read_state()["failed"] is None and len(c.read_state()["wakes"]) == 2
