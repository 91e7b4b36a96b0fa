"""The front, run for real: HAProxy (/usr/sbin/haproxy) with front.cfg as render.front_files renders it, the
shipped front.lua and front-drain.sh, in front of a fake llama-server (a Python HTTP server on
llama_server_port) that the tests start, SIGKILL and start again. Each case asserts what a client sees.

What differs from the rendered files, and only that: the admin socket and front.lua live in a scratch folder
of the test's own, the hold's abstract socket has a name of its own (two runs on one machine do not meet), and
without root the user and group lines go (haproxy cannot switch users then). front-drain.sh runs from the
scratch folder with its rendered env file beside it, SOCKET and NO_DRAIN_FLAG pointed there.

Settings: llama_front_hold_seconds 6, llama_front_replay_kib 16, llama_port and llama_server_port free ports.
Every wait is bounded; every process is killed in the fixture's teardown. HAProxy and socat must be installed
(scripts/setup-machine.sh): without them these tests fail, they do not skip.
"""

import csv
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import openai
import pytest

from lab.lab import free_ports
from llama_rpc_deploy import programs, render, roles, status

from ..unit.helpers import cluster

HAPROXY = "/usr/sbin/haproxy"
HOLD = 6  # llama_front_hold_seconds
REPLAY_KIB = 16  # llama_front_replay_kib
DEPLOY_DIR = "/opt/llama-rpc"

# The fake llama-server: /health 200 (503 while "loading", its first LOADING seconds); any other GET 200; a POST
# answers a JSON body {"delay": s, "stream": bool, "tag": str, ...}: after `delay` s, or, streamed, one SSE chunk
# every 0.1 s for `delay` s then [DONE]; 503 while loading. Each request that reaches it (/health aside) is one
# JSON line in LOG: its pid, time, method, path, tag, body size, whether it came while loading (answered 503).
FAKE = r"""
import http.server, json, os, sys, threading, time

port, log_path, loading = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
ready_at = time.monotonic() + loading
lock = threading.Lock()
LOADING = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}


def note(**fields):
    with lock, open(log_path, "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "at": time.time(), **fields}) + "\n")


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        loading = time.monotonic() < ready_at
        if self.path != "/health":
            note(method="GET", path=self.path, loading=loading)
        if loading:
            return self.reply(503, LOADING)
        self.reply(200, {"status": "ok"} if self.path == "/health" else {"object": "list", "data": [{"id": "fake"}]})

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.loads(raw or b"{}")
        loading = time.monotonic() < ready_at
        note(method="POST", path=self.path, tag=body.get("tag"), bytes=len(raw), loading=loading,
             front_header=self.headers.get("X-Llama-Front-Since"))
        if loading:
            return self.reply(503, LOADING)
        delay = float(body.get("delay", 0.1))
        if body.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            def send(data):
                event = b"data: " + data + b"\n\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.wfile.flush()
            for i in range(int(delay * 10)):
                send(json.dumps({"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "fake",
                                 "choices": [{"index": 0, "delta": {"content": f"w{i} "},
                                              "finish_reason": None}]}).encode())
                time.sleep(0.1)
            send(b"[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            return
        time.sleep(delay)
        self.reply(200, {"pid": os.getpid(), "tag": body.get("tag"), "bytes": len(raw), "object": "chat.completion",
                         "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                      "finish_reason": "stop"}]})


class Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass  # HAProxy's health check resets its connection once it has the status line


Server(("127.0.0.1", port), Handler).serve_forever()
"""


def wait_until(predicate, timeout, what):
    """Poll predicate every 50 ms until it returns something true (returned), at most timeout s."""
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.05)


def accepts(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


# --- a client ---------------------------------------------------------------------------------------------


@dataclass
class Answer:
    status: int | None  # None: no HTTP answer at all (error says why)
    headers: dict
    body: bytes
    took: float  # seconds from the request to the whole answer
    done_at: float  # time.monotonic() when it came
    error: str | None = None

    def json(self):
        return json.loads(self.body)


def call(port, method="POST", path="/v1/chat/completions", body=None, timeout=30):
    """One request on a connection of its own; body: a dict (sent as JSON) or bytes."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    start = time.monotonic()
    try:
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
        response = conn.getresponse()
        payload = response.read()
        return Answer(
            response.status,
            {k.lower(): v for k, v in response.getheaders()},
            payload,
            time.monotonic() - start,
            time.monotonic(),
        )
    except (OSError, http.client.HTTPException) as e:
        return Answer(None, {}, b"", time.monotonic() - start, time.monotonic(), error=repr(e))
    finally:
        conn.close()


@dataclass
class Call:
    """A request in the background: start(), then answer(timeout) (bounded: a hang fails the test)."""

    port: int
    kwargs: dict
    result: list = field(default_factory=list)

    def start(self):
        self.thread = threading.Thread(target=lambda: self.result.append(call(self.port, **self.kwargs)), daemon=True)
        self.thread.start()
        return self

    def done(self):
        return bool(self.result)

    def answer(self, timeout) -> Answer:
        self.thread.join(timeout)
        assert self.result, f"no answer within {timeout} s: {self.kwargs}"
        return self.result[0]


# --- the front and its llama-server -----------------------------------------------------------------------


class Front:
    """HAProxy with the rendered front in a scratch folder of /tmp, the fake llama-server(s) it sends to, and
    front-drain.sh beside its env file there."""

    def __init__(self):
        assert os.access(HAPROXY, os.X_OK), (
            f"{HAPROXY} is missing: apt-get install haproxy socat (scripts/setup-machine.sh installs both); "
            "the front's tests run the real HAProxy"
        )
        assert shutil.which("socat"), "socat is missing: apt-get install socat (scripts/setup-machine.sh does)"
        self.dir = Path(tempfile.mkdtemp(prefix="front-", dir="/tmp"))  # short: a socket's path has 107 bytes at most
        self.port, self.server_port = free_ports(2)
        c = cluster(
            coordinator={"address": "127.0.0.1"},
            all_data={
                "llama_port": self.port,
                "llama_server_port": self.server_port,
                "llama_front_hold_seconds": HOLD,
                "llama_front_replay_kib": REPLAY_KIB,
            },
        )
        files = render.front_files(c)
        self.socket, self.flag = self.dir / "admin.sock", self.dir / "llama-rpc-no-drain"
        cfg = files[f"{DEPLOY_DIR}/front.cfg"]
        for old, new in (
            (f"stats socket {roles.FRONT_SOCKET} ", f"stats socket {self.socket} "),
            (f"lua-load {DEPLOY_DIR}/front.lua\n", f"lua-load {self.dir}/front.lua\n"),
            ("abns@llama-front-hold ", f"abns@llama-front-hold-test-{os.getpid()}-{self.port} "),
        ):
            assert old in cfg, old
            cfg = cfg.replace(old, new)
        if os.geteuid() != 0:
            cfg = re.sub(r"(?m)^\s*(user|group) haproxy\n", "", cfg)
        (self.dir / "front.cfg").write_text(cfg)
        (self.dir / "front.lua").write_text(files[f"{DEPLOY_DIR}/front.lua"])
        assert files[f"{DEPLOY_DIR}/front.lua"] == (programs.FILES / "front.lua").read_text()
        drain = self.dir / "front-drain.sh"
        drain.write_text(files[f"{DEPLOY_DIR}/front-drain.sh"])
        drain.chmod(0o755)
        env = files[f"{DEPLOY_DIR}/front-drain.env"]
        for key, value in (("SOCKET", self.socket), ("NO_DRAIN_FLAG", self.flag), ("DRAIN_SECONDS", 20)):
            env, n = re.subn(rf"(?m)^{key}=.*$", f"{key}={value}", env)
            assert n == 1, key
        (self.dir / "front-drain.env").write_text(env)
        self.haproxy = None
        self.fakes: list[subprocess.Popen] = []
        (self.dir / "fake.py").write_text(FAKE)

    # processes

    def start(self):
        with open(self.dir / "haproxy.log", "wb") as log:  # its own log lines too (log stdout)
            # master-worker, as llama-front.service runs it (-Ws): reload() sends the master SIGUSR2
            self.haproxy = subprocess.Popen(
                [HAPROXY, "-W", "-db", "-f", str(self.dir / "front.cfg")],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        wait_until(
            lambda: self.haproxy.poll() is not None or (self.socket.exists() and accepts(self.port)),
            10,
            "haproxy listening",
        )
        assert self.haproxy.poll() is None, f"haproxy exited: {self.log()}"

    def reload(self):
        """As systemctl reload llama-front: new workers on the same files, the old ones finish what they hold."""
        self.haproxy.send_signal(signal.SIGUSR2)
        wait_until(
            lambda: "Former worker" in self.log() or self.log().count("Loading success") >= 2,
            10,
            f"the reload: {self.log()[-2000:]}",
        )

    def stop(self):
        for p in [*self.fakes, self.haproxy]:
            if p is not None and p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)  # haproxy's master and its workers; a fake alone
                except ProcessLookupError:
                    pass
                p.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)

    def log(self):
        return (self.dir / "haproxy.log").read_text(errors="replace")

    def start_llama(self, loading=0.0, wait_up=True):
        """The fake llama-server, on llama_server_port; with wait_up, until the front finds it UP."""
        p = subprocess.Popen(
            [
                sys.executable,
                str(self.dir / "fake.py"),
                str(self.server_port),
                str(self.dir / "llama.log"),
                str(loading),
            ],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.fakes.append(p)
        wait_until(lambda: p.poll() is not None or accepts(self.server_port), 10, "the fake llama-server listening")
        assert p.poll() is None, "the fake llama-server exited"
        if wait_up:
            self.wait_status("UP")
        return p

    def kill_llama(self):
        """SIGKILL, as a crash: no answer to what it was answering."""
        for p in self.fakes:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait(5)

    def llama_log(self):
        path = self.dir / "llama.log"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def arrived(self, tag):
        """The requests tagged tag that reached llama-server."""
        return [r for r in self.llama_log() if r.get("tag") == tag]

    # the admin socket, as front-drain.sh reaches it

    def admin(self, command):
        result = subprocess.run(
            ["socat", "-t", "5", "stdio", f"unix-connect:{self.socket}"],
            input=command + "\n",
            capture_output=True,
            text=True,
            timeout=10,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    def server_stat(self):
        """llama-server's line in `show stat` (HAProxy's CSV), by column name."""
        out = self.admin(f"show stat {render.FRONT_BACKEND} 4 -1").splitlines()
        columns = out[0].removeprefix("# ").split(",")
        rows = [dict(zip(columns, line.split(","))) for line in out[1:] if line]
        (row,) = [r for r in rows if r["svname"] == render.FRONT_SERVER]
        return row

    def wait_status(self, status, timeout=5):
        wait_until(lambda: self.server_stat()["status"] == status, timeout, f"llama-server {status} in the front")

    def show_front(self):
        pairs = (line.split(None, 1) for line in self.admin("show front").splitlines() if line)
        return {k: int(v) if v.strip().isdigit() else v.strip() for k, v in pairs}

    def drain(self, word):
        return subprocess.Popen(
            [str(self.dir / "front-drain.sh"), word],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={"PATH": "/usr/bin:/bin"},
        )

    # clients

    def call(self, **kwargs):
        return call(self.port, **kwargs)

    def background(self, **kwargs):
        return Call(self.port, kwargs).start()


@pytest.fixture
def front():
    f = Front()
    try:
        f.start()
        yield f
        assert f.haproxy.poll() is None, f"haproxy exited during the test: {f.log()}"
    finally:
        f.stop()


def ok(answer: Answer, tag=None):
    assert answer.status == 200, answer
    if tag is not None:
        assert answer.json()["tag"] == tag, answer
    return answer.json()


# --- the cases --------------------------------------------------------------------------------------------


def test_while_llama_server_is_up_requests_go_straight_to_it(front):
    """One hop: the hold (HAProxy's frontend hold, the backup server) sees no request while llama-server is up,
    streamed or not; what HAProxy does per token is then one read and one write."""

    def requests():  # by frontend (the readiness probe's bare connection counts as one at api)
        lines = front.admin("show stat -1 1 -1").splitlines()
        return {
            r["pxname"]: int(r["req_tot"]) for r in csv.DictReader([lines[0].lstrip("# "), *filter(None, lines[1:])])
        }

    front.start_llama()
    before = requests()
    ok(front.call(body={"tag": "plain"}), "plain")
    streamed = front.call(body={"tag": "streamed", "stream": True, "delay": 0.3})
    assert streamed.status == 200 and b"data: [DONE]" in streamed.body, streamed
    after = requests()
    assert after["api"] - before["api"] == 2 and after["hold"] == before["hold"] == 0, (before, after)
    assert front.show_front()["held"] == 0


def test_requests_while_llama_server_is_down_then_loading_are_held_and_answered(front):
    """Down (nothing listens), then loading (/health 503): requests wait in the front and are answered once
    llama-server is up; none reaches it before (none gets its 503)."""
    front.wait_status("DOWN")
    calls = [front.background(body={"tag": f"held{i}", "delay": 0.1}) for i in range(3)]
    calls.append(front.background(method="GET", path="/v1/models"))
    time.sleep(1)
    assert not any(c.done() for c in calls)
    front.start_llama(loading=1.5, wait_up=False)
    up_at = time.time() + 1.5
    answers = [c.answer(HOLD + 5) for c in calls]
    for i, a in enumerate(answers[:3]):
        ok(a, f"held{i}")
        assert 2.3 < a.took < HOLD, a
    assert answers[3].status == 200 and answers[3].json()["data"] == [{"id": "fake"}], answers[3]
    log = front.llama_log()
    assert len(log) == 4 and not any(r["loading"] for r in log) and all(r["at"] >= up_at for r in log), log
    assert all(r.get("front_header") is None for r in log), "the front's own header reached llama-server"
    assert front.show_front()["held"] >= 4


def test_streamed_requests_while_llama_server_is_down_are_held_and_streamed_whole(front):
    """Streamed requests are held the same way, then streamed whole, without the front's header."""
    front.wait_status("DOWN")
    calls = [front.background(body={"tag": f"s{i}", "delay": 0.3, "stream": True}) for i in range(2)]
    time.sleep(1)
    assert not any(c.done() for c in calls)
    front.start_llama(loading=1, wait_up=False)
    for c in calls:
        a = c.answer(HOLD + 5)
        assert a.status == 200 and a.body.rstrip().endswith(b"data: [DONE]"), a
        assert a.body.count(b"data: ") > 2, a
    log = front.llama_log()
    assert len(log) == 2 and not any(r["loading"] for r in log), log
    assert all(r.get("front_header") is None for r in log), "the front's own header reached llama-server"


def test_requests_held_through_a_reload_are_answered_once_llama_server_is_back(front):
    """A reload (a deploy changed the front's files) while requests are held: the old process no longer checks
    llama-server's health, so its held requests move to the new one, and are answered when llama-server is
    back, not at the end of the hold."""
    front.wait_status("DOWN")
    calls = [
        front.background(body={"tag": "r0", "delay": 0.1}),
        front.background(body={"tag": "r1", "delay": 0.1, "stream": True}),
    ]
    time.sleep(1)
    assert not any(c.done() for c in calls)
    front.reload()
    time.sleep(0.5)
    front.start_llama()
    for c in calls:
        a = c.answer(HOLD + 5)
        assert a.status == 200 and a.took < HOLD, a


def test_a_request_cut_by_a_crash_is_replayed(front):
    """Not streamed: llama-server dies while answering (SIGKILL); the front sends the same request again once
    it is back (here after 1 s down and 1 s loading), and the client gets the new one's answer."""
    first = front.start_llama()
    c = front.background(body={"tag": "cut", "delay": 2})
    wait_until(lambda: front.arrived("cut"), 5, "the request at llama-server")
    front.kill_llama()
    time.sleep(1)
    second = front.start_llama(loading=1, wait_up=False)
    body = ok(c.answer(HOLD + 5), "cut")
    assert body["pid"] == second.pid != first.pid
    # answered by each once: no second answer for the client to miss. (A try may also reach the new one while it
    # loads, and get its 503, then be held: the front finds a crash by its health check, up to 0.5 s late.)
    assert [r["pid"] for r in front.arrived("cut") if not r["loading"]] == [first.pid, second.pid]
    # what `llama-rpc status` shows, read from this HAProxy as it reads the coordinator's
    figures = status.front_figures(front.admin("show front").splitlines(), front.admin("show stat").splitlines())
    assert figures["requests"] >= 1 and figures["replays"] >= 1 and figures["failed"] == 0, figures
    assert figures["held"] >= 1 and figures["llama_server"] == "UP" and figures["in_flight"] == 0, figures


def openai_client(front):
    """As an application calls the front: OpenAI's client, its own retries off, its keep-alive pool (one connection
    to the front, used again by each request)."""
    return openai.OpenAI(base_url=f"http://127.0.0.1:{front.port}/v1", api_key="x", max_retries=0, timeout=30)


def ask(client, tag, delay=0.1):
    """A non-streamed chat completion: (status, the fake's JSON answer), or (None, the client's error)."""
    try:
        raw = client.chat.completions.with_raw_response.create(
            model="fake", messages=[{"role": "user", "content": "hi"}], extra_body={"tag": tag, "delay": delay}
        )
        return raw.http_response.status_code, raw.http_response.json()
    except openai.APIError as e:  # APIConnectionError: the front closed the connection with no answer
        return None, repr(e)


def served(answer, tag, pid, front):
    """ask's answer: a 200 to this request (tag) from this llama-server (pid)."""
    code, body = answer
    assert code == 200 and body["tag"] == tag and body["pid"] == pid, (answer, front.log()[-3000:])


def client_connections(front):
    """Connections clients opened to the front (frontend api's conn_tot in `show stat`)."""
    lines = front.admin("show stat -1 1 -1").splitlines()
    rows = csv.DictReader([lines[0].lstrip("# "), *filter(None, lines[1:])])
    return next(int(r["conn_tot"]) for r in rows if r["pxname"] == "api")


def test_a_kept_alive_request_cut_by_a_crash_is_replayed(front):
    """The crash gap (issue 37): as the cut request above, but from an application's client, which sends its
    second request on the connection of its first. HAProxy 2.6 then took llama-server's idle connection too, and a
    retry after a reused connection skips the 1 s wait between tries: the 3 retries went in milliseconds, before
    the health check saw the crash, and the client got its connection closed with no answer (log: 503 SC--)."""
    first = front.start_llama()
    client = openai_client(front)
    opened = client_connections(front)
    served(ask(client, "warm"), "warm", first.pid, front)
    result = []
    thread = threading.Thread(target=lambda: result.append(ask(client, "cut", delay=2)), daemon=True)
    thread.start()
    wait_until(lambda: front.arrived("cut"), 5, "the request at llama-server")
    front.kill_llama()
    time.sleep(1)
    second = front.start_llama(loading=1, wait_up=False)
    thread.join(HOLD + 5)
    assert result, f"no answer within {HOLD + 5} s"
    served(result[0], "cut", second.pid, front)
    assert client_connections(front) - opened == 1  # both requests on one connection to the front
    assert " SC-- " not in front.log(), front.log()[-3000:]
    assert front.server_stat()["reuse"] == "0"  # option http-server-close: never an idle connection to llama-server


def test_a_kept_alive_request_just_after_a_crash_is_held(front):
    """A warm client (its connection to the front kept alive) asks 0.2 s after llama-server died, before the health
    check saw it: held, and answered by the llama-server that comes back."""
    first = front.start_llama()
    client = openai_client(front)
    opened = client_connections(front)
    served(ask(client, "warm"), "warm", first.pid, front)
    front.kill_llama()
    time.sleep(0.2)
    result = []
    thread = threading.Thread(target=lambda: result.append(ask(client, "after")), daemon=True)
    thread.start()
    time.sleep(0.8)
    second = front.start_llama(loading=1, wait_up=False)
    thread.join(HOLD + 5)
    assert result, f"no answer within {HOLD + 5} s"
    served(result[0], "after", second.pid, front)
    assert client_connections(front) - opened == 1
    assert " SC-- " not in front.log(), front.log()[-3000:]


def test_a_streamed_answer_cut_by_a_crash_ends_in_an_error_at_once(front):
    """Part of the answer was sent: it cannot be replayed. The client (OpenAI's, as clients are) must see an
    error promptly, not a hang until its timeout, and not a clean end of a cut answer."""
    front.start_llama()
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{front.port}/v1", api_key="none", max_retries=0, timeout=30)
    stream = client.chat.completions.create(
        model="fake",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        extra_body={"delay": 5, "tag": "streamed"},
    )
    got, killed_at, error = [], None, None
    try:
        for chunk in stream:
            got.append(chunk.choices[0].delta.content)
            if len(got) == 3:
                front.kill_llama()
                killed_at = time.monotonic()
    except openai.APIError as e:  # APIConnectionError: the chunked answer ends unfinished (no last chunk)
        error = e
    ended_at = time.monotonic()
    assert killed_at is not None and got[:3] == ["w0 ", "w1 ", "w2 "]
    assert error is not None, f"the cut stream ended as if complete after {len(got)} chunks"
    assert ended_at - killed_at < 3, f"the error came {ended_at - killed_at:.1f} s after the crash"
    assert len(got) < 10
    assert len(front.arrived("streamed")) == 1  # not replayed


def test_health_answers_503_at_once_while_llama_server_is_down(front):
    front.start_llama()
    up = front.call(method="GET", path="/health")
    assert up.status == 200 and up.json() == {"status": "ok"}
    front.kill_llama()
    front.wait_status("DOWN")
    down = front.call(method="GET", path="/health")
    assert down.status == 503 and down.took < 1, down
    assert down.headers["retry-after"] == str(HOLD) and down.headers["content-type"] == "application/json"
    assert down.json()["status"] == "unavailable" and down.json()["error"]["code"] == 503
    # loading: llama-server's own 503 keeps it down in the front; the front answers for it at once too
    front.start_llama(loading=3, wait_up=False)
    time.sleep(1)
    loading = front.call(method="GET", path="/health")
    assert loading.status == 503 and loading.took < 1 and loading.json()["status"] == "unavailable", loading


def test_past_the_hold_the_client_gets_503_with_retry_after(front):
    front.wait_status("DOWN")
    answer = front.call(body={"tag": "late"}, timeout=HOLD + 10)
    assert answer.status == 503, answer
    assert HOLD - 0.3 < answer.took < HOLD + 3, answer
    assert answer.headers["retry-after"] == str(HOLD) and answer.headers["content-type"] == "application/json"
    error = answer.json()["error"]
    assert error["code"] == 503 and error["type"] == "unavailable_error"
    assert f"within {HOLD} s (llama_front_hold_seconds)" in error["message"]
    counts = front.show_front()
    assert counts["held"] >= 1 and counts["expired"] >= 1 and counts["holding"] == 0, counts


def big(tag, size, delay=0.1):
    """A request body of exactly size bytes."""
    body = {"tag": tag, "delay": delay, "pad": ""}
    body["pad"] = "x" * (size - len(json.dumps(body).encode()))
    data = json.dumps(body).encode()
    assert len(data) == size
    return data


def test_a_body_over_the_replay_limit_is_served(front):
    front.start_llama()
    size = REPLAY_KIB * 1024 * 4
    answer = front.call(body=big("big", size))
    assert ok(answer, "big")["bytes"] == size


@pytest.mark.parametrize(
    "size,replayed", [(REPLAY_KIB * 1024 - 512, True), (REPLAY_KIB * 1024 + 1, False)], ids=["under", "over"]
)
def test_only_a_body_within_the_replay_limit_is_replayed(front, size, replayed):
    """llama_front_replay_kib decides: the same crash while answering, a body just under it (room left for the
    request's headers, which share the buffer: about 250 bytes here) is replayed (200), one just over it is
    not: the client gets an error at once (HAProxy's 502), and llama-server saw it once."""
    first = front.start_llama()
    tag = f"body{size}"
    c = front.background(body=big(tag, size, delay=2))
    wait_until(lambda: front.arrived(tag), 5, "the request at llama-server")
    front.kill_llama()
    time.sleep(0.5)
    second = front.start_llama(wait_up=False)
    answer = c.answer(HOLD + 5)
    if replayed:
        assert ok(answer, tag)["pid"] == second.pid
        assert [r["pid"] for r in front.arrived(tag) if not r["loading"]] == [first.pid, second.pid]
    else:
        assert answer.status == 502, answer
        assert answer.took < 3, answer  # at once, not after the hold
        time.sleep(1)
        assert [r["pid"] for r in front.arrived(tag)] == [first.pid]


def test_drain_lets_requests_in_flight_finish_and_holds_new_ones_until_ready(front):
    front.start_llama()
    long = front.background(body={"tag": "long", "delay": 2.5})
    wait_until(lambda: front.arrived("long"), 5, "the long request at llama-server")
    drain = front.drain("drain")
    drain_started = time.monotonic()
    front.wait_status("DRAIN", timeout=3)
    new = front.background(body={"tag": "new", "delay": 0.1})
    try:
        out, err = drain.communicate(timeout=10)
    finally:
        if drain.poll() is None:
            drain.kill()
    drained_at = time.monotonic()
    assert drain.returncode == 0 and out == "front-drain: drained, new requests are held\n", (out, err)
    first = ok(long.answer(1), "long")
    assert long.result[0].done_at <= drained_at and drained_at - drain_started > 1.5  # it waited for it
    assert first["pid"] == front.fakes[0].pid
    time.sleep(1)  # the new request waits, llama-server up all along
    assert not new.done() and front.arrived("new") == []
    assert front.server_stat()["status"] == "DRAIN"
    ready = front.drain("ready")
    assert ready.wait(10) == 0 and "requests go to llama-server" in ready.stdout.read()
    ready_at = time.monotonic()
    answer = new.answer(5)
    ok(answer, "new")
    assert answer.done_at > ready_at and answer.done_at - ready_at < 2
    assert len(front.arrived("new")) == 1


def test_show_front_counts_the_held_requests(front):
    assert front.show_front() == {"held": 0, "holding": 0, "expired": 0, "activity": 0, "answered": 0, "asleep": 0}
    front.wait_status("DOWN")
    sent = time.time()
    c = front.background(body={"tag": "counted"})
    wait_until(lambda: front.show_front()["holding"] == 1, 3, "the request held")
    front.start_llama()
    ok(c.answer(5), "counted")
    counts = front.show_front()
    assert counts["held"] >= 1 and counts["holding"] == 0 and counts["expired"] == 0, counts
    # the idle clock's marks (docs/sleep.md), on the wall clock: its arrival, and llama-server's answer
    assert sent - 1 < counts["activity"] / 1000 < counts["answered"] / 1000 < time.time() + 1, counts
    front.call(method="GET", path="/health")  # a status path: no mark
    assert front.show_front()["activity"] == counts["activity"]
