"""Which reverse proxy can be the front of llama-server: measured, not assumed.

    python3 benchmarks/front_candidates.py [--out docs/front-candidates.md]

Needs Debian's haproxy (2.6, with Lua) and caddy (2.6) on this machine; everything listens on
127.0.0.1 (ports from the OS) and each case is bounded in time (the whole run takes about 3 minutes).

A fake llama-server (a Python subprocess) stands behind each candidate: GET /health is 200, or 503
"Loading model" while it loads (seconds on its command line); a POST of {"delay": s, "stream": b}
answers JSON after s seconds, or streams SSE events every 0.1 s for s seconds then `data: [DONE]`;
during loading a POST gets the same 503. Candidates: haproxy-plain (L7 retries only), haproxy-hold
(the product's design: replay backend -> Lua hold -> health-checked llama backend) and caddy
(reverse_proxy with active health checks, lb_try_duration as the hold, lb_retry_match for POSTs).
Each case runs against each candidate with a fresh fake and a fresh candidate:

  A  down 3 s, then 3 s loading; a request at 0.5 s        status, seconds to the answer
  B  crash (SIGKILL) 0.7 s into a 2 s non-streamed answer;  status (200 from the new process =
     restart 3 s later with 2 s loading                     replayed), seconds
  C  crash 1 s into a 3 s stream; restart 2 s later         how and when the client's read ends
  D  down for good (past the 10 s hold)                     status, Retry-After, seconds
  E  4 clients in a loop for 12 s; crash at 3 s,            requests ok / failed
     restart at 5 s with 2 s loading
  F  200 KB body (more than haproxy's 64 KiB buffer): once  status; then what a crash does to it
     with the fake up, once with a crash at 0.7 s (restart 1 s later)

The client is http.client, one connection per request, 30 s timeout. The tables are printed, and
written with HAProxy's log lines between the markers of docs/front-candidates.md; the prose around
them (the router mode, the conclusion) is written by hand from a run whose checklist is EXPECTED
below, and the report says so when a run's checklist differs.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from lab.lab import free_ports  # noqa: E402

HOLD = 10          # seconds every candidate holds a request while llama-server is not up
TIMEOUT = 30       # the client's timeout
BIG = 200_000      # case F's body, bytes

FAKE = r'''
import http.server, json, os, socketserver, sys, time
LOADING = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *args): pass
    def reply(self, code, obj):
        data = json.dumps(obj).encode()
        self.send_response(code); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data))); self.end_headers(); self.wfile.write(data)
    def body(self):
        if "chunked" not in self.headers.get("Transfer-Encoding", ""):
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))
        data = b""
        while True:
            size = int(self.rfile.readline().split(b";")[0], 16); data += self.rfile.read(size)
            self.rfile.readline()
            if size == 0: return data
    def do_GET(self):
        if self.path != "/health": return self.reply(404, {"error": {"code": 404}})
        if time.monotonic() < READY_AT: return self.reply(503, LOADING)
        self.reply(200, {"status": "ok"})
    def do_POST(self):
        raw = self.body()
        if time.monotonic() < READY_AT: return self.reply(503, LOADING)
        try: req = json.loads(raw)
        except ValueError: return self.reply(400, {"error": {"code": 400, "message": "not JSON", "got": len(raw)}})
        delay = float(req.get("delay", 0))
        if not req.get("stream"):
            time.sleep(delay); return self.reply(200, {"pid": os.getpid(), "got": len(raw)})
        self.send_response(200); self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked"); self.end_headers()
        for i in range(int(delay * 10) + 1):
            event = b"data: [DONE]\n\n" if i == int(delay * 10) else b'data: {"i": %d}\n\n' % i
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event)); self.wfile.flush(); time.sleep(0.1)
        self.wfile.write(b"0\r\n\r\n")
class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True; allow_reuse_address = True
server = Server(("127.0.0.1", int(sys.argv[1])), Handler)
READY_AT = time.monotonic() + float(sys.argv[2])
server.serve_forever()
'''

LUA = r'''
-- llama_hold BACKEND SERVER SECONDS: wait while SERVER is not UP by its health check, until SECONDS
-- after the front first received the request (X-Llama-Front-Since, ms, kept across replays).
local held, holding = 0, 0
local function now_ms() local t = core.now(); return t.sec * 1000 + t.usec // 1000 end
core.register_action("llama_hold", {"http-req"}, function(txn, backend, name, seconds)
  local server = core.backends[backend].servers[name]
  local function up() return server:get_stats()["status"] == "UP" end
  if up() then return end
  local deadline = (tonumber(txn.sf:req_hdr("x-llama-front-since")) or now_ms()) + tonumber(seconds) * 1000
  if now_ms() >= deadline then return end  -- a replay of a request whose time is up
  held, holding = held + 1, holding + 1
  while not up() and now_ms() < deadline do core.msleep(100) end
  holding = holding - 1
end, 3)
-- an AppletTCP: it has send(), no write() (2.6.12: "attempt to call a nil value (method 'write')")
core.register_cli({"show", "llama"}, "show llama: requests held, and held now", function(applet)
  applet:send(string.format("held %d\nholding %d\n", held, holding))
end)
'''

HAPROXY_COMMON = """global
  log stderr format raw local0 info
  stats socket {tmp}/haproxy.sock mode 600 level admin
{extra}
defaults
  mode http
  log global
  option httplog
  option dontlognull
  timeout connect 1s
  timeout client 60s
  timeout server 60s
"""

HAPROXY_PLAIN = HAPROXY_COMMON + """
frontend front
  bind 127.0.0.1:{port}
  default_backend llama
backend llama
  retries 20
  retry-on conn-failure empty-response 503
  server llama-server 127.0.0.1:{up}
"""

HAPROXY_HOLD = HAPROXY_COMMON + """
frontend front
  bind 127.0.0.1:{port}
  option http-buffer-request
  http-request set-header X-Llama-Front-Since %[date(0,ms)]
  default_backend replay
backend replay
  retries 20
  retry-on conn-failure empty-response 502 503 504
  server hold abns@front-hold-{port} send-proxy-v2
frontend hold
  bind abns@front-hold-{port} accept-proxy
  http-request lua.llama_hold llama llama-server {hold}
  default_backend llama
backend llama
  option httpchk GET /health
  http-check expect status 200
  retries 2
  retry-on conn-failure
  http-error status 503 content-type application/json file {tmp}/503.json hdr Retry-After 5
  server llama-server 127.0.0.1:{up} check inter 500 fall 1 rise 1
"""

CADDYFILE = """{{
\tadmin off
\tauto_https off
}}
:{port} {{
\tbind 127.0.0.1
\treverse_proxy 127.0.0.1:{up} {{
\t\thealth_uri /health
\t\thealth_interval 500ms
\t\tlb_try_duration {hold}s
\t\tlb_try_interval 250ms
\t\tlb_retry_match {{
\t\t\tmethod POST
\t\t}}
\t\tbuffer_requests
\t\tflush_interval -1
\t}}
\thandle_errors {{
\t\t@unavailable expression {{err.status_code}} in [502, 503]
\t\theader @unavailable Retry-After 5
\t\trespond "{{err.status_code}} {{err.status_text}}" {{err.status_code}}
\t}}
}}
"""


def haproxy(template: str, extra: str):
    def command(tmp: Path, port: int, up: int) -> list[str]:
        (tmp / "front.lua").write_text(LUA)
        (tmp / "503.json").write_text(json.dumps({"error": {"code": 503, "message": "llama-server is not back",
                                                            "type": "unavailable_error"}}))
        cfg = tmp / "haproxy.cfg"
        cfg.write_text(template.format(tmp=tmp, port=port, up=up, hold=HOLD, extra=extra.format(tmp=tmp)))
        return ["haproxy", "-db", "-f", str(cfg)]
    return command


def caddy(tmp: Path, port: int, up: int) -> list[str]:
    (tmp / "Caddyfile").write_text(CADDYFILE.format(port=port, up=up, hold=HOLD))
    return ["caddy", "run", "--config", str(tmp / "Caddyfile"), "--adapter", "caddyfile"]


CANDIDATES = {
    "haproxy-plain": haproxy(HAPROXY_PLAIN, ""),
    "haproxy-hold": haproxy(HAPROXY_HOLD, "  lua-load {tmp}/front.lua\n  tune.bufsize 65536\n  tune.maxrewrite 1024"),
    "caddy": caddy,
}


def wait_port(port: int, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.02)
    raise RuntimeError(f"nothing listens on {port} after {seconds} s")


class Procs:
    """Every process a case starts; all are killed at the end of the case."""

    def __init__(self, tmp: Path):
        self.tmp, self.all, self.fake = tmp, [], None

    def spawn(self, argv: list[str], log: str) -> subprocess.Popen:
        env = {**os.environ, "XDG_DATA_HOME": str(self.tmp), "XDG_CONFIG_HOME": str(self.tmp)}
        with open(self.tmp / log, "ab") as out:
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=out, env=env)
        self.all.append(proc)
        return proc

    def start_fake(self, port: int, loading: float = 0) -> None:
        self.fake = self.spawn([sys.executable, str(self.tmp / "fake.py"), str(port), str(loading)], "fake.log")
        wait_port(port)

    def kill_fake(self) -> None:
        self.fake.kill()
        self.fake.wait()

    def close(self) -> None:
        for proc in self.all:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def post(port: int, body: dict, stream: bool = False) -> dict:
    """One request on its own connection; what the client saw, and when."""
    start, out = time.monotonic(), {"status": None, "events": 0, "done": False, "end": "ok"}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps({**body, "stream": stream}),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        out.update(status=resp.status, retry_after=resp.getheader("Retry-After"))
        if stream:
            while chunk := resp.read1(65536):  # counted as they come: a cut stream raises
                out["events"] += chunk.count(b"data: ")
                out["done"] = out["done"] or b"[DONE]" in chunk
        else:
            data = resp.read()
            out["json"] = json.loads(data) if data.startswith(b"{") else data[:80]
    except Exception as error:  # the client's view of a failure is the point here
        out["end"] = type(error).__name__
    finally:
        conn.close()
    out["seconds"] = time.monotonic() - start
    return out


def later(fn, *args, at: float):
    """Run fn(*args) in a thread from monotonic time `at`; returns a Future."""
    def run():
        time.sleep(max(0.0, at - time.monotonic()))
        return fn(*args)
    pool = ThreadPoolExecutor(1)
    future = pool.submit(run)
    pool.shutdown(wait=False)
    return future


def crash(procs: Procs, up: int, t0: float, kill: float, restart: float | None = None, loading: float = 0) -> None:
    """SIGKILL the fake `kill` s after t0; start a new one (loading for `loading` s) `restart` s after t0."""
    time.sleep(max(0.0, t0 + kill - time.monotonic()))
    procs.kill_fake()
    if restart is not None:
        time.sleep(max(0.0, t0 + restart - time.monotonic()))
        procs.start_fake(up, loading)


def answer(r: dict, pid: int | None = None) -> str:
    if r["status"] is None:
        return f"{r['end']} after {r['seconds']:.1f} s"
    text = f"{r['status']} in {r['seconds']:.1f} s"
    if r.get("retry_after"):
        text += f", Retry-After: {r['retry_after']}"
    if r["status"] == 200 and pid is not None:
        text += ", new process" if r["json"].get("pid") != pid else ", same process"
    return text


def case_a(procs: Procs, port: int, up: int) -> tuple[str, bool]:
    t0 = time.monotonic()
    client = later(post, port, {"delay": 0.2}, at=t0 + 0.5)
    crash(procs, up, t0, kill=0, restart=3, loading=3)
    r = client.result()
    return answer(r), r["status"] == 200


def case_b(procs: Procs, port: int, up: int) -> tuple[str, bool]:
    t0, pid = time.monotonic(), procs.fake.pid
    client = later(post, port, {"delay": 2}, at=t0)
    crash(procs, up, t0, kill=0.7, restart=3.7, loading=2)
    r = client.result()
    return answer(r, pid), r["status"] == 200 and r["json"].get("pid") != pid


def case_c(procs: Procs, port: int, up: int) -> tuple[str, bool]:
    t0 = time.monotonic()
    client = later(post, port, {"delay": 3}, True, at=t0)
    crash(procs, up, t0, kill=1, restart=3)
    r = client.result()
    cut = r["end"] != "ok" and r["seconds"] < 5  # the client can tell, at once, that it was cut
    if r["status"] is None:
        return f"no answer: {r['end']} after {r['seconds']:.1f} s", cut
    end = r["end"] if r["end"] != "ok" else "clean end, " + ("with [DONE]" if r["done"] else "no [DONE]")
    return f"{r['status']}, {r['events']} events, then {end} at {r['seconds']:.1f} s", cut


def case_d(procs: Procs, port: int, up: int) -> tuple[str, bool]:
    procs.kill_fake()
    r = post(port, {"delay": 0.2})
    good = r["status"] == 503 and bool(r.get("retry_after")) and r["seconds"] < HOLD + 3
    return answer(r) + ("" if r.get("retry_after") else ", no Retry-After"), good


def case_e(procs: Procs, port: int, up: int) -> tuple[str, bool]:
    t0, results, lock = time.monotonic(), [], threading.Lock()

    def loop():
        while time.monotonic() < t0 + 12:
            r = post(port, {"delay": 0.3})
            with lock:
                results.append(r)

    clients = [threading.Thread(target=loop) for _ in range(4)]
    for thread in clients:
        thread.start()
    crash(procs, up, t0, kill=3, restart=5, loading=2)
    for thread in clients:
        thread.join()
    failed = [r["status"] or r["end"] for r in results if r["status"] != 200]
    kinds = ", ".join(f"{failed.count(k)}x {k}" for k in sorted(set(failed), key=str))
    slowest = max(r["seconds"] for r in results)
    return f"{len(results) - len(failed)} ok / {len(failed)} failed" + (f" ({kinds})" if kinds else "") + \
        f", slowest {slowest:.1f} s", not failed


def case_f(procs: Procs, port: int, up: int) -> tuple[str, bool]:
    pad = "x" * BIG
    r = post(port, {"delay": 0.2, "pad": pad})
    first = answer(r) + (f", fake got {r['json']['got']} B" if r["status"] == 200 else "")
    t0, pid = time.monotonic(), procs.fake.pid
    client = later(post, port, {"delay": 2, "pad": pad}, at=t0)
    crash(procs, up, t0, kill=0.7, restart=1.7)
    cut = client.result()
    second = answer(cut, pid)
    if cut["status"] == 200:
        second += f", fake got {cut['json']['got']} B"
    elif isinstance(cut.get("json"), dict):
        second += f" ({json.dumps(cut['json'])[:60]})"
    good = r["status"] == 200 and (cut["status"] == 200 or cut["seconds"] < 3)
    return f"up: {first}; crash: {second}", good


CASES = {
    "A down 3 s + loading 3 s": case_a,
    "B crash mid non-streamed": case_b,
    "C crash mid stream": case_c,
    f"D down past the {HOLD} s hold": case_d,
    "E 4 clients through a crash": case_e,
    "F 200 KB body": case_f,
}


def show_llama(sock: Path) -> str:
    """haproxy-hold's Lua CLI command on the admin socket: what the hold counted."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(5)
        s.connect(str(sock))
        s.sendall(b"show llama\n")
        data = b""
        while chunk := s.recv(4096):
            data += chunk
    return " ".join(data.decode().split())


def run_case(candidate: str, case) -> tuple[str, bool, str]:
    """One case against a fresh fake and a fresh candidate: (cell, as wanted?, evidence from logs)."""
    tmp = Path(tempfile.mkdtemp(prefix="front-candidates-"))
    procs = Procs(tmp)
    try:
        (tmp / "fake.py").write_text(FAKE)
        up, port = free_ports(2)
        procs.start_fake(up)
        front = procs.spawn(CANDIDATES[candidate](tmp, port, up), "front.log")
        wait_port(port)
        time.sleep(1)  # the health checks see the fake up
        if front.poll() is not None:
            raise RuntimeError(f"{candidate} exited: {(tmp / 'front.log').read_text()[-2000:]}")
        cell, good = case(procs, port, up)
        time.sleep(0.3)  # haproxy logs a request once it is closed
        # haproxy's public frontend: the requests that were retried or not answered 200
        log = [line for line in (tmp / "front.log").read_text(errors="replace").splitlines() if "] front " in line]
        odd = [line for line in log if not re.search(r" 200 \d+ - - ---- \d+/\d+/\d+/\d+/0 ", line)]
        evidence = odd[:4] + (["..."] if len(odd) > 4 else [])
        if len(log) > len(odd):
            evidence.append(f"({len(log) - len(odd)} more answered 200 without a retry)")
        if candidate == "haproxy-hold":
            evidence.append("show llama: " + show_llama(tmp / "haproxy.sock"))
        return cell, good, "\n".join(evidence)
    finally:
        procs.close()
        shutil.rmtree(tmp, ignore_errors=True)


# what each case asks of a front (the checklist), and what the run this report's prose was written from gave
WANTED = {
    "A": "holds the request through down + loading, then 200",
    "B": "replays the crashed non-streamed request: 200 from the new process",
    "C": "ends the cut stream with a transport error the client sees, within 5 s",
    "D": f"503 with Retry-After, about the {HOLD} s hold after the request",
    "E": "no request of the 4 clients fails",
    "F": "serves the 200 KB body; after a crash, 200 or a prompt (< 3 s) error",
}
EXPECTED = {"haproxy-plain": "nnynny", "haproxy-hold": "yyyyyy", "caddy": "ynnnnn"}


def versions() -> dict:
    def first_line(*argv):
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout.splitlines()[0]
        except (OSError, IndexError, subprocess.SubprocessError):
            return "not found"
    release = Path("/etc/os-release").read_text() if Path("/etc/os-release").exists() else ""
    os_name = dict(line.split("=", 1) for line in release.splitlines() if "=" in line).get("PRETTY_NAME", "?")
    return {"haproxy": first_line("haproxy", "-v"), "caddy": first_line("caddy", "version"),
            "machine": f"{os.cpu_count()} cores, {os_name.strip(chr(34))}, Python {platform.python_version()}"}


def tables(results: dict) -> tuple[str, str]:
    names = list(CANDIDATES)
    head = ["| case | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    measured = [f"| {case} | " + " | ".join(results[n][case][0] for n in names) + " |" for case in CASES]
    checklist = [f"| {case[0]}: {WANTED[case[0]]} | " + " | ".join(
        "yes" if results[n][case][1] else "no" for n in names) + " |" for case in CASES]
    return "\n".join(head + measured), "\n".join(head + checklist)


BEGIN, END = "<!-- begin: written by benchmarks/front_candidates.py -->", "<!-- end -->"


def write_report(out: Path, results: dict, elapsed: float) -> None:
    """Replace the measured part of the report (between BEGIN and END); the prose around it stays."""
    measured, checklist = tables(results)
    got = {n: "".join("y" if results[n][c][1] else "n" for c in CASES) for n in CANDIDATES}
    differs = [f"{n} in case {c}" for n in CANDIDATES for c, g, e in zip("ABCDEF", got[n], EXPECTED[n]) if g != e]
    warning = f"\n**This run differs from the run the prose was written from ({', '.join(differs)}): trust the " \
        "tables, not the prose.**\n" if differs else ""
    evidence = "\n\n".join(f"{n}, {case}:\n{results[n][case][2]}" for n in CANDIDATES for case in CASES
                           if results[n][case][2])
    v = versions()
    block = f"""{BEGIN}
`python3 benchmarks/front_candidates.py`, {time.strftime("%Y-%m-%d %H:%M %Z")}, {elapsed:.0f} s in all.
Machine: {v["machine"]}.
{v["haproxy"]}; Caddy {v["caddy"]}.

Hold: {HOLD} s for every candidate. Times are from the client's request, not from the start of the case.
Case F's body is {BIG} bytes; "fake got" is how much of it reached the fake.

{measured}

What each candidate did of what the front must do:

{checklist}
{warning}
HAProxy's log lines for the public frontend (requests retried or not answered 200 at once; timers
Tq/Tw/Tc/Tr/Ta in ms; the last of actconn/feconn/beconn/srv_conn/retries counts the retries), and the
Lua hold's own `show llama` on the admin socket (requests held, held now):

```
{evidence}
```
{END}"""
    text = out.read_text() if out.exists() else "# The front: which proxy, measured\n\n" + BEGIN + END + "\n"
    if BEGIN not in text or END not in text:
        text += "\n" + BEGIN + END + "\n"
    head, rest = text.split(BEGIN, 1)
    out.write_text(head + block + rest.split(END, 1)[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "front-candidates.md")
    args = parser.parse_args()
    for tool in ("haproxy", "caddy"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is missing: apt-get install -y haproxy caddy")
    started, results = time.monotonic(), {}
    for name in CANDIDATES:
        results[name] = {}
        for case, fn in CASES.items():
            results[name][case] = run_case(name, fn)
            print(f"{name:14} {case:30} {results[name][case][0]}", flush=True)
    elapsed = time.monotonic() - started
    measured, checklist = tables(results)
    print(f"\n{measured}\n\n{checklist}")
    write_report(args.out, results, elapsed)
    print(f"\nwritten {args.out} ({elapsed:.0f} s)")


if __name__ == "__main__":
    main()
