"""No request lost (issue 23): the front (HAProxy) holds requests while llama-server restarts or loads,
replays the non-streamed ones a crash cut, ends the streamed ones with an error, and drains llama-server
before a deploy restarts it.

The figures for every fault (a worker's reboot, network cuts, an upgrade, the wake from sleep, the
front's cost) come from benchmarks/no_request_lost.py, in docs/results/no-request-lost.md; these tests check
the behaviour, each from a serving lab, and leave one behind.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request

import pytest
from openai import OpenAI

from llama_rpc_deploy import client
from llama_rpc_deploy.cluster import api_key
from llama_rpc_deploy.loadtest import run_load, until_serving
from llama_rpc_deploy.roles import FRONT_SOCKET

from .lab_helpers import changed, needs_docker, on, operations, pyinfra

pytestmark = [needs_docker, pytest.mark.usefixtures("serving_afterwards")]
COORDINATOR, WORKER1 = 0, 1
KILL_RPC_SERVER = "docker kill --signal KILL rpc-server"  # the server (systemctl kill would hit the docker client)


def front_counters() -> dict[str, int]:
    """front.lua's `show front` on the coordinator: held, holding, expired."""
    out = on(COORDINATOR, f"echo 'show front' | socat -t 5 stdio unix-connect:{FRONT_SOCKET}").stdout
    return {k: int(v) for k, v in (line.split() for line in out.splitlines() if len(line.split()) == 2)}


def api(cluster) -> OpenAI:
    key = api_key(cluster) if cluster.settings["llama_api_key_file"] else None
    return OpenAI(
        base_url=client.server_url(cluster) + "/v1", api_key=key or "no-key-needed", timeout=120, max_retries=0
    )


def stream(cluster, max_tokens: int, first_chunk: threading.Event | None = None) -> int:
    """One streamed chat completion through the front; the number of chunks with text."""
    chunks = 0
    for chunk in api(cluster).chat.completions.create(
        model="lab",
        messages=[{"role": "user", "content": "Tell me about computers"}],
        max_tokens=max_tokens,
        stream=True,
        extra_body={"ignore_eos": True},
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            chunks += 1
            if first_chunk is not None:
                first_chunk.set()
    return chunks


def test_rpc_server_killed_under_load_fails_no_request(cluster):
    """4 clients; rpc-server SIGKILLed on a worker 3 s in: llama-server aborts and restarts, and the front
    holds and replays, so every one of the 160 requests is answered (before the front: 48 failed)."""
    before = front_counters()
    killed = {}

    def kill():
        time.sleep(3)
        killed["at"] = time.monotonic()
        assert on(WORKER1, KILL_RPC_SERVER).returncode == 0

    start = time.monotonic()
    load = run_load(cluster, clients=4, requests_each=40, n_predict=16, timeout=300, during=kill)
    slowest = max(r.seconds for r in load.requests)
    print(
        f"\n[front] rpc-server killed at {killed['at'] - start:.1f} s: {load.summary()}; slowest request {slowest:.1f} s; "
        f"front {before} -> {front_counters()}"
    )
    assert len(load.requests) == 160
    assert load.failed == [], load.summary()
    assert front_counters()["held"] > before.get("held", 0)  # the requests waited in the front: the crash was real


def test_a_streamed_answer_cut_by_a_crash_raises_in_the_client(cluster):
    """A streamed answer already under way cannot be replayed: the client gets an error, promptly, and no
    socket hangs; the next request is answered."""
    first_chunk, outcome = threading.Event(), {}

    def consume():
        begin = time.monotonic()
        try:
            outcome["chunks"] = stream(cluster, 900, first_chunk)
        except Exception as error:  # what the OpenAI client raises for a cut stream
            outcome["error"] = f"{type(error).__name__}: {error}"
        outcome["seconds"] = time.monotonic() - begin

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    assert first_chunk.wait(60), "the stream never started"
    assert on(WORKER1, KILL_RPC_SERVER).returncode == 0
    thread.join(150)
    print(f"\n[front] streamed answer at a crash: {outcome}")
    assert not thread.is_alive(), "the streamed request hangs past the client's timeout"
    assert "error" in outcome, f"the stream ended as if complete: {outcome}"
    assert outcome["seconds"] < 100  # ended by the cut, not by the client's 120 s timeout
    assert until_serving(cluster, 180, expect_down=False).seconds is not None


def test_a_redeploy_that_restarts_llama_server_fails_no_request(cluster):
    """A deploy that changes llama_ctx_size restarts llama-server only: the front drains it first (the
    answers in flight finish, streamed ones too), holds what comes meanwhile, and nothing fails."""
    stop, streamed, errors = threading.Event(), [], []

    def streaming_client():
        while not stop.is_set():
            try:
                streamed.append(stream(cluster, 48))
            except Exception as error:
                errors.append(f"{type(error).__name__}: {error}")

    def redeploy():
        time.sleep(2)
        deploy["ops"] = operations(pyinfra("--json", "--data", "llama_ctx_size=4096", timeout=900))
        stop.set()

    deploy = {}
    thread = threading.Thread(target=streaming_client, daemon=True)
    thread.start()
    try:
        load = run_load(cluster, clients=3, requests_each=30, n_predict=16, timeout=300, during=redeploy)
    finally:
        stop.set()
        thread.join(300)
        back = operations(pyinfra("--json", timeout=900))  # the lab's own settings again
    print(
        f"\n[front] redeploy with llama_ctx_size 4096 under load: {load.summary()}; streamed {len(streamed)} "
        f"answers, errors {errors}"
    )
    ops = deploy["ops"]
    assert changed(ops, "llama-server running and enabled: restarted") == [cluster.coordinator.name]
    assert changed(ops, "rpc-server running and enabled: restarted") == []
    assert changed(back, "llama-server running and enabled: restarted")
    assert load.failed == [] and errors == [], (load.summary(), errors)
    assert len(streamed) > 0 and all(n == 48 for n in streamed), streamed  # each stream whole
    log = on(COORDINATOR, "journalctl -u llama-server -n 400 --no-pager").stdout
    assert "front-drain: drained, new requests are held" in log


def test_held_past_the_hold_the_client_gets_503_with_retry_after(cluster):
    """llama_front_hold_seconds = 5 (a change the front takes by a reload: llama-server is not restarted);
    llama-server stopped: /health answers 503 at once, a completion is held 5 s, then 503 with Retry-After."""
    ops = operations(pyinfra("--json", "--data", "llama_front_hold_seconds=5", timeout=900))
    try:
        assert changed(ops, "llama-server running and enabled: restarted") == []
        assert changed(ops, "The front reloaded on its new files")
        assert on(COORDINATOR, "systemctl stop llama-server").returncode == 0
        url = client.server_url(cluster)
        begin = time.monotonic()
        with pytest.raises(urllib.error.HTTPError) as health:
            urllib.request.urlopen(url + "/health", timeout=10)
        assert health.value.code == 503 and time.monotonic() - begin < 2
        begin = time.monotonic()
        with pytest.raises(urllib.error.HTTPError) as held:
            client.complete(cluster, "anyone there?", 4, timeout=60)
        waited = time.monotonic() - begin
        body = held.value.read().decode()
        print(
            f"\n[front] held {waited:.1f} s, then {held.value.code} Retry-After {held.value.headers.get('Retry-After')}: {body}"
        )
        assert held.value.code == 503 and held.value.headers.get("Retry-After") == "5"
        assert "llama_front_hold_seconds" in body
        assert 4 <= waited < 15
    finally:
        on(COORDINATOR, "systemctl start llama-server")
        operations(pyinfra("--json", timeout=900))
