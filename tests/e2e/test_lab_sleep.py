"""The workers' sleep and wake on the lab: deployed with sleep_idle_seconds, the workers fall asleep while status is
polled, a request wakes them by Wake-on-LAN and is answered, `status` shows it all without waking anyone, and a
redeploy while they sleep wakes them first and changes nothing.

A container cannot suspend a kernel, so the lab stands in for the two hardware edges (lab.wake_listener, run here in
a thread): a worker's sleep command (the lab inventory's sleep_command) freezes its container, and the magic packet
for its MAC, sent by the coordinator's llama-sleep to the lab's broadcast address, thaws it. The rest is the deploy's
own: the idle clock in the front, the SSH command with the sleep key, the packets, the HELLO wait, the hold.
The lab's own settings (sleep off) are deployed again at the end: llama-sleep.service and the sleep key go.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

from lab import lab
from llama_rpc_deploy import roles
from llama_rpc_deploy.loadtest import until_serving

from .lab_helpers import INVENTORY, WORKERS, api, changed, needs_docker, on, operations, pyinfra

pytestmark = [needs_docker]
IDLE = 10  # sleep_idle_seconds
SLEEPY = ("--data", f"sleep_idle_seconds={IDLE}")


def state() -> dict:
    text = on(0, f"cat {roles.SLEEP_STATE} 2>/dev/null").stdout
    return json.loads(text) if text.strip() else {}


def asleep() -> bool:
    s = state()
    return s.get("asleep_since") is not None and all(w["asleep"] for w in s["workers"].values())


def paused(index: int) -> bool:
    name = f"{lab.PREFIX}-{lab.host_names(WORKERS)[index]}"
    return (
        subprocess.run(
            ["docker", "inspect", "--format", "{{.State.Paused}}", name], capture_output=True, text=True
        ).stdout.strip()
        == "true"
    )


def wait(predicate, bound: float, what: str):
    end = time.monotonic() + bound
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.5)
    pytest.fail(f"not within {bound} s: {what}; the daemon's state: {state()}")


@pytest.fixture(scope="module")
def sleepy(cluster):
    stop, events = threading.Event(), []
    listener = threading.Thread(target=lab.wake_listener, args=(stop, events), daemon=True)
    listener.start()
    try:
        ops = operations(pyinfra("--json", *SLEEPY))
        assert changed(ops, "(llama-sleep)") == [cluster.coordinator.name]
        assert sorted(changed(ops, "Accept the coordinator's sleep key")) == sorted(w.name for w in cluster.workers)
        yield events
    finally:
        back = pyinfra("--json")  # the lab's own settings: sleep off (wakes the workers first, if they sleep)
        stop.set()
        removed = changed(operations(back), "No sleep (sleep_idle_seconds is None)")
        assert removed == [cluster.coordinator.name], removed
        assert on(0, f"systemctl is-active {roles.SLEEP_UNIT}").stdout.strip() != "active"
        assert "llama-rpc-deploy-sleep" not in on(1, "cat /root/.ssh/authorized_keys").stdout
        assert until_serving(cluster, 120, expect_down=False).seconds is not None


def status(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "llama_rpc_deploy", "status", "-i", str(INVENTORY), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_idle_workers_sleep_status_polls_do_not_wake_them_and_a_request_does(cluster, sleepy):
    client = api(cluster)
    # polled as a monitor would (health, model list): they fall asleep all the same, IDLE s after the last request
    end = time.monotonic() + IDLE + 40
    while time.monotonic() < end and not asleep():
        on(0, f"curl -s -o /dev/null --max-time 5 http://{cluster.coordinator.address}:8080/health")
        try:
            client.models.list()
        except Exception:  # 503 once they sleep: the front answers for them
            pass
        time.sleep(1)
    assert asleep(), f"the workers still awake {IDLE + 40} s after the last request: {state()}"
    assert paused(1) and paused(2)  # the stand-in for their suspend
    frozen = [e for e in sleepy if e[1] == "frozen"]
    assert len(frozen) == 2, sleepy

    # status sees it without waking them, and says all is well
    shown = status()
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert shown.stdout.count("asleep since") >= 2 and "API asleep" in shown.stdout
    time.sleep(3)
    assert asleep() and paused(1) and not [e for e in sleepy if e[1] == "thawed"]

    # a request wakes them: magic packets, HELLO, llama-server, the answer
    began = time.monotonic()
    stream = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Two computers"}], max_tokens=8, stream=True
    )
    first = None
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.monotonic() - began
    assert first is not None and first < 60, first
    assert not paused(1) and not paused(2)
    s = state()
    assert s["asleep_since"] is None and len(s["wakes"]) == 1 and s["last_wake"]["ready_s"] < 60, s
    assert {e[2] for e in sleepy if e[1] == "thawed"} == {f"{lab.PREFIX}-worker1", f"{lab.PREFIX}-worker2"}
    assert "wakes in the last 24 h: 1" in status().stdout


def test_a_redeploy_while_they_sleep_wakes_them_first_and_changes_nothing(cluster, sleepy):
    wait(asleep, IDLE + 60, "the workers asleep again")
    again = pyinfra("--json", *SLEEPY)
    assert "the workers slept: woken" in again.stderr, again.stderr[-2000:]
    totals = json.loads(again.stdout)["results"]["totals"]
    assert totals["success"] == 0 and totals["error"] == 0, totals
    assert not paused(1) and not paused(2)
    assert state()["keep_awake_until"] > time.time()  # they stay up a while: the deploy's own checks need them
