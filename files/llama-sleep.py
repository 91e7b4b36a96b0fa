#!/usr/bin/env python3
"""llama-sleep: the workers sleep when nobody asks, and wake on the next request.
Shipped as is by llama-rpc-deploy (files/); run by llama-sleep.service on the coordinator (as root: it stops
and starts llama-server.service and holds the key the workers accept for their sleep command only).

    llama-sleep.py run          the daemon
    llama-sleep.py wake         wake every worker now and keep them up for KEEP_AWAKE seconds (a redeploy runs
                                it before it connects to the workers); exit 0 once each answers, 1 if one does not
    llama-sleep.py state        the state, as JSON (`llama-rpc status` reads it)

The idle clock: the front (front.lua) notes the arrival of every request except health checks, status polls
and /metrics (`show front`: activity), and HAProxy counts the requests at llama-server (in flight) and
held by the front. SLEEP_IDLE_SECONDS after the last of them ends, with none in flight or held:
  1. llama-server.service stops (its stop drains the front: requests in flight finish, new ones are held);
  2. each worker is told to sleep over SSH (its authorized_keys runs sleep-now.sh for this key, nothing else);
  3. the front answers the status paths itself ("asleep") and holds everything else.
The first request after that (held by the front) wakes them: magic packets to each worker's MAC every
2 s, until each rpc-server answers the RPC HELLO (through the tunnel); then llama-server starts, the front's
health check passes and the held requests go on. A worker that does not answer within WAKE_TIMEOUT s:
the held requests, and new ones for RETRY_AFTER s, get 503 with Retry-After naming it; the next request
after that tries again.

Settings: llama-sleep.json beside this script (or the file LLAMA_SLEEP_CONFIG), written by llama-rpc-deploy
(render.sleep_files): the front's socket, the idle and wake bounds, the commands that stop, start and ask after
llama-server, and per worker its sleep command (ssh with the sleep key), MAC, broadcast address and RPC endpoint.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

CONFIG = os.environ.get("LLAMA_SLEEP_CONFIG") or os.path.splitext(os.path.abspath(__file__))[0] + ".json"
POLL = 0.25  # seconds between two looks at the front
PACKET_EVERY = 2.0  # seconds between two rounds of magic packets while waiting for the workers
SLEEP_SETTLES = 15  # seconds a worker's rpc-server may go on answering after its sleep command
DAY = 86400


def log(message: str) -> None:
    print(f"llama-sleep: {message}", flush=True)


def now() -> float:
    return time.time()


class Front:
    """HAProxy's admin socket: front.lua's `show front` and `set front ...`, and the statistics."""

    def __init__(self, path: str, backends: list[str], server: str):
        self.path, self.backends, self.server = path, backends, server

    def ask(self, command: str) -> str:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect(self.path)
            s.sendall(command.encode() + b"\n")
            chunks = []
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")

    def figures(self) -> dict:
        """front.lua's counters (held, holding, expired, activity, answered, asleep) and the requests that count at
        llama-server, in flight and queued (HAProxy's scur and qcur of its server line in each of BACKENDS: straight
        from the front, and released by the hold; the status paths have a backend of their own, not counted)."""
        out = {}
        for line in self.ask("show front").splitlines():
            parts = line.split(None, 1)
            if len(parts) == 2 and parts[1].strip().lstrip("-").isdigit():
                out[parts[0]] = int(parts[1])
        out["in_flight"] = 0
        for line in self.ask("show stat -1 4 -1").splitlines():
            fields = line.split(",")
            if len(fields) > 17 and fields[0] in self.backends and fields[1] == self.server:
                out["in_flight"] += int(fields[4] or 0) + int(fields[2] or 0)
                if fields[0] == self.backends[0]:
                    out["server_up"] = fields[17].startswith("UP")
        return out


def magic_packet(mac: str) -> bytes:
    """Six 0xff bytes, then the MAC 16 times: what a NIC set to wake on 'g' (magic) listens for."""
    return b"\xff" * 6 + bytes.fromhex(mac.replace(":", "")) * 16


def send_magic(mac: str, broadcast: str, port: int = 9) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
        s.sendto(magic_packet(mac), (broadcast, port))


def hello(endpoint: str, timeout: float = 2.0) -> str | None:
    """The RPC protocol version rpc-server at HOST:PORT answers to HELLO, or None (no answer yet). A tunnel's
    end on this host accepts at once while its worker sleeps: only the answer counts."""
    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as s:
            s.settimeout(timeout)
            # RPC_CMD_HELLO (14), its input size (24, uint64 little-endian), 24 bytes of capabilities: none
            s.sendall(bytes([14]) + (24).to_bytes(8, "little") + bytes(24))
            reply = b""
            while len(reply) < 11:
                chunk = s.recv(11 - len(reply))
                if not chunk:
                    return None
                reply += chunk
        return ".".join(str(b) for b in reply[8:11])
    except OSError:
        return None


class Sleeper:
    def __init__(self, config: dict):
        self.c = config
        self.front = Front(config["socket"], config["backends"], config["server"])
        self.state = self.load()
        self.last_busy = now()  # the idle clock starts with the daemon

    # --- the state file: what `status` shows, and what a restarted daemon starts from ---
    def load(self) -> dict:
        try:
            with open(self.c["state"]) as f:
                state = json.load(f)
        except (OSError, ValueError):
            state = {}
        state.setdefault("asleep_since", None)  # the cluster: llama-server stopped, the workers told to sleep
        state.setdefault("workers", {})
        for w in self.c["workers"]:
            state["workers"].setdefault(w["name"], {"asleep": False, "since": now()})
        state.setdefault("wakes", [])  # when each wake began, the last day's
        state.setdefault("last_wake", None)
        state.setdefault("failed", None)  # the last wake that failed: when, and the workers that did not answer
        state.setdefault("keep_awake_until", 0)
        return state

    def save(self) -> None:
        self.state["wakes"] = [t for t in self.state["wakes"] if t > now() - DAY]
        self.state["idle_seconds"] = self.c["idle_seconds"]
        tmp = self.c["state"] + ".new"
        with open(tmp, "w") as f:
            json.dump(self.state, f, indent=1, sort_keys=True)
        os.replace(tmp, self.c["state"])

    # --- the two moves ---
    def sleep(self) -> None:
        began = now()
        self.state["asleep_since"] = began
        self.save()
        log(f"no request for {self.c['idle_seconds']} s: llama-server stops, the workers sleep")
        self.front.ask("set front asleep 1")  # first: a status poll during the drain is answered, not held
        subprocess.run(self.c["stop_server"], check=False)
        told = []
        for w in self.c["workers"]:
            done = subprocess.run(w["sleep"], capture_output=True, text=True, timeout=60, check=False)
            if done.returncode == 0:
                told.append(w)
                log(f"{w['name']}: told to sleep ({done.stdout.strip() or 'its sleep command runs'})")
            else:  # an SSH that ends as the host suspends ends so too: the wake sends it packets all the same
                log(f"{w['name']}: its sleep command failed ({done.returncode}): {done.stderr.strip()[-300:]}")
        # asleep once its rpc-server stops answering (its sleep comes 2 s after the command returned): a wake before
        # that must not count on a worker about to go
        deadline = now() + SLEEP_SETTLES
        for w in told:
            while (answers := hello(w["endpoint"], timeout=1.0)) and now() < deadline:
                time.sleep(0.5)
            gone = not answers
            self.state["workers"][w["name"]] = {"asleep": gone, "since": now()}
            log(f"{w['name']}: " + ("asleep" if gone else f"still answers {SLEEP_SETTLES} s after its sleep command"))
        self.save()

    def wake(self, since_ms: int | None = None) -> bool:
        """Magic packets to every sleeping worker until each rpc-server answers HELLO, then llama-server starts
        and the front lets the held requests go. False (and the front answers 503 for RETRY_AFTER s) when a
        worker did not answer within WAKE_TIMEOUT."""
        began = now()
        asked = since_ms / 1000 if since_ms else None  # the first request that waited for this wake (None: a deploy's)
        self.state["wakes"].append(began)
        self.front.ask("clear front wake-failed")
        pending = {w["name"]: w for w in self.c["workers"]}
        answered, next_packets = {}, 0.0
        log(f"waking {', '.join(n for n, s in self.state['workers'].items() if s['asleep']) or 'no worker'}")
        while pending and now() < began + self.c["wake_timeout"]:
            if now() >= next_packets:  # to every worker not answering yet, whatever became of its sleep command
                for w in pending.values():
                    send_magic(w["mac"], w["broadcast"], w.get("wol_port", 9))
                next_packets = now() + PACKET_EVERY
            for name, w in list(pending.items()):
                if hello(w["endpoint"]):
                    answered[name] = round(now() - began, 2)
                    self.state["workers"][name] = {"asleep": False, "since": now()}
                    del pending[name]
            if pending:
                time.sleep(0.5)
        if pending:
            names = ", ".join(sorted(pending))
            message = f"worker {names} did not wake within {self.c['wake_timeout']} s (sleep_wake_timeout)"
            log(message)
            self.state["failed"] = {"at": began, "workers": sorted(pending), "message": message}
            self.save()
            self.front.ask(f"set front wake-failed {self.c['retry_after']} {message}: retry later")
            return False
        hello_s = round(now() - began, 2)
        subprocess.run(self.c["start_server"], check=False)
        deadline = now() + self.c["ready_timeout"]
        while now() < deadline and not self.front.figures().get("server_up"):
            time.sleep(0.1)
        ready = now()
        if not self.front.figures().get("server_up"):
            message = (
                f"every worker woke, but llama-server was not up within {self.c['ready_timeout']} s "
                f"(journalctl -u llama-server on the coordinator)"
            )
            log(message)
            self.state["failed"] = {"at": began, "workers": [], "message": message}
            self.save()
            self.front.ask(f"set front wake-failed {self.c['retry_after']} {message}: retry later")
            return False
        self.front.ask("set front asleep 0")
        self.state.update(
            asleep_since=None,
            failed=None,
            last_wake={
                "at": began,
                "workers_answered_s": answered,  # from the first magic packet
                "hello_s": hello_s,
                "ready_s": round(ready - (asked or began), 2),  # from the first held request's arrival to llama-server up
                "first_answer_s": None,  # ... to its first answer (front.lua's `answered`), filled in below
                "asked": asked,
            },
        )
        self.last_busy = now()
        self.save()
        log(f"awake: every rpc-server answered in {hello_s} s, llama-server up {ready - (asked or began):.1f} s later")
        return True

    # --- the loop ---
    def step(self) -> None:
        f = self.front.figures()
        t = now()
        asleep = self.state["asleep_since"] is not None
        if f.get("asleep", 0) != int(asleep):  # a reloaded front starts afresh: it learns the state again
            self.front.ask(f"set front asleep {int(asleep)}")
        busy = f.get("in_flight", 0) > 0 or f.get("holding", 0) > 0
        activity = f.get("activity", 0) / 1000
        wake = self.state.get("last_wake")
        if wake and wake.get("asked") and wake.get("first_answer_s") is None and f.get("answered", 0) / 1000 >= wake["asked"]:
            wake["first_answer_s"] = round(f["answered"] / 1000 - wake["asked"], 2)
            self.save()
        if asleep:
            failed = self.state["failed"]
            if failed and t < failed["at"] + self.c["wake_timeout"] + self.c["retry_after"]:
                return  # the front answers 503 meanwhile
            since = max(self.state["asleep_since"], failed["at"] if failed else 0)  # a request not answered yet
            if busy or activity > since or t < self.state["keep_awake_until"]:
                self.wake(f.get("activity") if activity > since else None)
            return
        if busy or t < self.state["keep_awake_until"]:
            self.last_busy = t
        if subprocess.run(self.c["server_running"], capture_output=True).returncode != 0:
            self.last_busy = t  # stopped or failing for another reason (a deploy, a lost worker): not idle
        if t - max(self.last_busy, activity) >= self.c["idle_seconds"]:
            self.sleep()

    def run(self) -> None:
        log(f"idle after {self.c['idle_seconds']} s; workers: {', '.join(w['name'] for w in self.c['workers'])}")
        self.save()
        while True:
            try:
                self.step()
            except (OSError, ValueError, subprocess.SubprocessError) as error:
                log(f"{type(error).__name__}: {error}")  # the front restarting, say: look again
            wake_request = self.c["state"] + ".wake"
            if os.path.exists(wake_request):
                os.unlink(wake_request)
                self.state["keep_awake_until"] = now() + self.c["keep_awake"]
                self.state["failed"] = None
                self.save()
            time.sleep(POLL)


def ask_wake(config: dict) -> int:
    """For a redeploy: the daemon wakes the workers and keeps them up KEEP_AWAKE s; wait until they answer."""
    try:
        with open(config["state"]) as f:
            was_asleep = json.load(f).get("asleep_since") is not None
    except (OSError, ValueError):
        was_asleep = False
    open(config["state"] + ".wake", "w").close()
    deadline = now() + config["wake_timeout"] + config["ready_timeout"] + 30
    while now() < deadline:
        time.sleep(0.5)
        if os.path.exists(config["state"] + ".wake"):
            continue  # not taken yet
        with open(config["state"]) as f:
            state = json.load(f)
        if state.get("failed"):
            print(state["failed"]["message"])
            return 1
        if state.get("asleep_since") is None:
            print("the workers slept: woken" if was_asleep else "the workers are awake")
            return 0
    print(f"the workers did not wake within {config['wake_timeout'] + config['ready_timeout'] + 30} s")
    return 1


def main(argv: list[str]) -> int:
    with open(CONFIG) as f:
        config = json.load(f)
    command = argv[1] if len(argv) > 1 else ""
    if command == "run":
        Sleeper(config).run()
    elif command == "wake":
        return ask_wake(config)
    elif command == "state":
        with open(config["state"]) as f:
            print(f.read())
    else:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
