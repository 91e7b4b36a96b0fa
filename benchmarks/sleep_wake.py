"""Sleep and wake on the lab: the workers fall asleep when idle, and 4 clients arriving at random times, some while
they sleep, are all answered.

    python3 -m benchmarks.sleep_wake [--cycles 5] [--idle 20] [--out docs/results/sleep-wake.md]

The lab up (`python3 -m llama_rpc_deploy lab up --workers 2`); this deploys it with sleep_idle_seconds=IDLE (the
lab's inventory sets the stand-ins: sleep_command freezes a worker's container, wol_check_nic False) and runs the
lab's wake listener (lab.wake_listener) in this process: it freezes a worker on its sleep command and thaws it on
the magic packet the coordinator sends to its MAC. Everything between runs as on real hosts: the idle clock in the
front, llama-sleep on the coordinator, the SSH command, the packets on the lab's bridge, the HELLO wait, the hold.

Each cycle: wait until every worker sleeps (the coordinator's state), then 4 clients (OpenAI's Python client,
retries off, a connection each kept alive, half streaming, 16 tokens) each send one request at a random time in
the next 0-12 s, and a second one 0-8 s after their first answer; then the next cycle waits for sleep again. A
request counts as answered only with its whole answer (a stream: a finish_reason and [DONE]).

Reports per cycle: the requests and failures, which arrived while the workers slept, the wake's parts as
llama-sleep measured them (first magic packet to every rpc-server answering HELLO; the first request to llama-server
up; to its first answer) and the first client's time to first token (its first streamed token, or its whole
answer). With the estimate for the real pair, from the parts the lab measures and those it cannot (stated).
Writes docs/results/sleep-wake.md and .json; the lab's own settings are deployed again at the end.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import threading
import time
from pathlib import Path

from benchmarks import labkit
from benchmarks.client_load import OPENAI_TOKENS, OpenAILoad, Req
from lab import lab
from llama_rpc_deploy import roles
from llama_rpc_deploy.loading import offline_cluster

CLIENTS = 4
FIRST_WITHIN, SECOND_WITHIN = 12.0, 8.0  # seconds: the random arrival windows
SLEEP_BOUND = 300  # seconds a cycle waits for the workers to fall asleep


def state() -> dict:
    text = labkit.on("coordinator", f"cat {roles.SLEEP_STATE} 2>/dev/null || true", check=False)
    try:
        return json.loads(text) if text else {}
    except ValueError:
        return {}


def all_asleep(s: dict) -> bool:
    return s.get("asleep_since") is not None and all(w["asleep"] for w in s.get("workers", {}).values())


def wait_asleep(bound: float = SLEEP_BOUND) -> float:
    began = time.monotonic()
    while time.monotonic() - began < bound:
        if all_asleep(state()):
            return time.monotonic() - began
        time.sleep(0.5)
    raise RuntimeError(f"the workers did not fall asleep within {bound} s: {state()}")


def cycle(load: OpenAILoad, rng: random.Random, number: int) -> dict:
    """One cycle's clients, from the moment every worker sleeps."""
    requests: list[tuple[Req, bool]] = []  # (the request, whether it was sent while the workers slept)
    lock = threading.Lock()
    load.t0, load.wall0 = time.monotonic(), time.time()

    def one(index: int) -> None:
        time.sleep(rng.uniform(0, FIRST_WITHIN))
        for i in range(2):
            asleep = all_asleep(state())
            begin = load.now()
            req = load.ask(index, number * 10 + i, None, begin, load.kind(index))
            with lock:
                requests.append((req, asleep))
            if i == 0:
                time.sleep(rng.uniform(0, SECOND_WITHIN))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s = state()
    wake = s.get("last_wake") or {}
    first = min((r for r, _ in requests), key=lambda r: r.start)
    first_token = first.ttft if first.ttft is not None else first.end - first.start
    return {
        "cycle": number,
        "requests": len(requests),
        "failed": sum(not r.ok for r, _ in requests),
        "failed_streamed": sum(not r.ok for r, _ in requests if r.kind == "stream"),
        "sent_while_asleep": sum(asleep for _, asleep in requests),
        "errors": [r.error for r, _ in requests if not r.ok],
        "hello_s": wake.get("hello_s"),
        "workers_answered_s": wake.get("workers_answered_s"),
        "ready_s": wake.get("ready_s"),
        "first_answer_s": wake.get("first_answer_s"),
        "first_client_first_token_s": round(first_token, 2),
        "first_client_kind": first.kind,
        "wakes_in_state": len(s.get("wakes", [])),
    }


def parts() -> dict:
    """What the lab measures of a wake's parts beyond the cycles: a worker's rpc-server answering HELLO again after
    its thaw, and llama-server's start to ready (its load of the model from the workers' tensor caches) alone."""
    t = time.monotonic()
    labkit.on("coordinator", f"systemctl restart {roles.COORDINATOR_UNIT}")
    url = "http://127.0.0.1:18080/health"  # llama-server's own port, on the coordinator's loopback
    while time.monotonic() - t < 300:
        if labkit.on("coordinator", f"curl -fsS --max-time 2 {url} >/dev/null && echo ok || true", check=False) == "ok":
            break
        time.sleep(0.2)
    return {"llama_server_restart_to_health_s": round(time.monotonic() - t, 2)}


def report(results: list[dict], extra: dict, args) -> str:
    failed = sum(r["failed"] for r in results)
    total = sum(r["requests"] for r in results)
    ttft = [r["first_client_first_token_s"] for r in results]
    hello = [r["hello_s"] for r in results if r["hello_s"] is not None]
    ready = [r["ready_s"] for r in results if r["ready_s"] is not None]
    lines = [
        "# Sleep and wake on the lab",
        "",
        f"`python3 -m benchmarks.sleep_wake --cycles {args.cycles} --idle {args.idle}` on {labkit.cpu_model()}, "
        f"commit {labkit.git('rev-parse', '--short', 'HEAD')}, {time.strftime('%Y-%m-%d')}. "
        f"Lab: a coordinator and 2 workers (CPU), the lab's sentence model; sleep_idle_seconds {args.idle}; "
        f"a worker's suspend is its container frozen (docker pause) and its wake the magic packet seen on the "
        f"lab's bridge (lab.wake_listener); all the rest as on real hosts. Clients: {CLIENTS} OpenAI clients "
        f"(max_retries 0, kept-alive connections), half streaming, {OPENAI_TOKENS} tokens, each sending one request "
        f"at a random time 0-{FIRST_WITHIN:g} s after the workers fell asleep, and one more 0-{SECOND_WITHIN:g} s "
        "after its answer.",
        "",
        f"**{failed} failed of {total} requests** ({sum(r['failed_streamed'] for r in results)} streamed), "
        f"{sum(r['sent_while_asleep'] for r in results)} sent while the workers slept, over {len(results)} cycles.",
        f"Wake to first token (the first client's first token, from its request): median "
        f"{statistics.median(ttft):.1f} s, at most {max(ttft):.1f} s (target: at most 15 s).",
        "",
        "| cycle | requests | failed | sent asleep | magic packet to every HELLO (s) | request to llama-server up (s) "
        "| to its first answer (s) | first client's first token (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['cycle']} | {r['requests']} | {r['failed']} | {r['sent_while_asleep']} | {r['hello_s']} | "
            f"{r['ready_s']} | {r['first_answer_s']} | {r['first_client_first_token_s']} ({r['first_client_kind']}) |"
        )
    hello_m, ready_m = statistics.median(hello), statistics.median(ready)
    restart = extra["llama_server_restart_to_health_s"]
    lines += [
        "",
        "## The real pair, estimated",
        "",
        "A wake is: the NIC's magic packet resumes the machine, rpc-server (still running: suspend keeps its process) "
        "answers HELLO once the network is back, then llama-server starts and loads its layers into each worker "
        "from the worker's tensor cache (rpc_cache), and the first token comes.",
        "",
        f"- Measured on the lab: the magic packet to every rpc-server answering HELLO, {hello_m:.1f} s (median; the "
        "container's thaw is immediate, so this is the poll of llama-sleep and the tunnel's TLS handshake); the "
        f"request to llama-server up, {ready_m:.1f} s (median), of which llama-server's own restart to /health is "
        f"{restart:.1f} s on this lab model.",
        "- Not measurable here, so assumed: a desktop's resume from suspend to RAM with its network back, 3-8 s "
        "(typical for a Linux desktop with an Intel or Realtek NIC; the link's renegotiation is most of it); the "
        "model's 17 GB reload: about 8.5 GB per 16 GB card from each worker's tensor cache on an NVMe SSD at about "
        "2 GB/s, with both workers loading at once, about 4-5 s, plus llama-server's own start and the weights it "
        "keeps on the coordinator's card (from its page cache, since the coordinator stays up).",
        f"- So for the RTX 4080 + RTX 5060 Ti pair: about {3 + hello_m:.0f}-{8 + hello_m:.0f} s to the worker's HELLO, "
        f"then about 6-10 s of load: **about 10-20 s from the first request to its first token**. Hibernate adds "
        "the image's read from disk (10-30 s); poweroff a whole boot.",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--idle", type=int, default=20, help="sleep_idle_seconds to deploy")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=labkit.RESULTS / "sleep-wake.md")
    args = parser.parse_args()
    stop, events = threading.Event(), []
    listener = threading.Thread(target=lab.wake_listener, args=(stop, events), daemon=True)
    listener.start()
    try:
        labkit.log(f"deploying the lab with sleep_idle_seconds={args.idle}")
        labkit.deploy(labkit.INVENTORY, f"sleep_idle_seconds={args.idle}")
        cluster = offline_cluster(labkit.INVENTORY)
        load = OpenAILoad(cluster, threads=CLIENTS)
        rng = random.Random(args.seed)
        results = []
        for number in range(1, args.cycles + 1):
            waited = wait_asleep()
            labkit.log(f"cycle {number}: asleep after {waited:.0f} s of waiting")
            results.append(cycle(load, rng, number))
            labkit.log(f"cycle {number}: {json.dumps(results[-1])}")
        extra = parts()
        text = report(results, extra, args)
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(
            json.dumps({"cycles": results, "parts": extra, "listener": events}, indent=1)
        )
        print(text)
        return 0 if all(r["failed"] == 0 for r in results) else 1
    finally:
        labkit.log("the lab's own settings again (sleep off)")
        wake_and_redeploy = labkit.pyinfra(labkit.INVENTORY)
        labkit.log(f"redeploy: rc {wake_and_redeploy.rc} in {wake_and_redeploy.seconds:.0f} s")
        stop.set()


if __name__ == "__main__":
    raise SystemExit(main())
