"""No request lost: 4 clients keep asking while the lab breaks, restarts and redeploys behind the front.

    python3 -m benchmarks.no_request_lost [--cases rpc-kill,cut-20,...] [--out docs/results/no-request-lost.md]
    python3 -m benchmarks.no_request_lost --clients openai [--threads 4] [--runs 3] --cases rpc-kill,worker-reboot

The lab up and deployed (`python3 -m llama_rpc_deploy lab up`, then `pyinfra -y .lab/inventory.py deploy.py`);
about 30 minutes for every case. Each case runs once, with 4 client threads started together, each in a loop
until the case ends: 3 send non-streamed completions (/completion, 16 tokens, as llama_rpc_deploy.loadtest),
1 sends streamed chat completions (/v1/chat/completions, stream true, 32 tokens); client timeout 300 s, a
failed request is followed by 0.5 s of pause (as loadtest). A streamed request counts as answered only when
its stream ended with a finish_reason and `data: [DONE]`.

With `--clients openai` the clients ask as an application does (benchmarks.client_load.OpenAILoad): --threads
threads (4), each with one `openai.OpenAI(max_retries=0)` of its own, whose pool keeps its connection to the front
alive between requests; half send non-streamed chat completions, half streamed ones, 16 tokens each. Failed
non-streamed requests and streams cut mid-way (failed after some tokens) are counted apart. Its report is
docs/results/no-request-lost-openai.md (and .json) unless --out says otherwise. --runs N runs each case N times in
a row, each run its own entry ("rpc-kill run 2"). The cases:

  front-cost       no fault: tokens/s and time to first token through the front against llama-server directly,
                   from a client inside the coordinator (stdlib, copied in), one request each way in turn, each
                   host pinned to its own core (`lab pin`, as benchmarks/tool_overhead.py); with the CPU time the
                   front's HAProxy and llama-server spent
  rpc-kill         `systemctl kill --signal=SIGKILL rpc-server` on worker1, 3 s into the load
  rpc-kill-process `docker kill --signal KILL rpc-server` on worker1 (the process itself), 3 s into the load
  worker-reboot    `docker restart llama-rpc-lab-worker1`, 3 s into the load
  cut-20, cut-60   iptables DROP both ways between coordinator and worker1 (on the coordinator) for 20 / 60 s
  redeploy-ctx     a deploy with llama_ctx_size=4096, then the lab's own settings again, both under load
  upgrade          every server restarts on another image under load (see the report for which)
  wake             llama_sleep_idle_seconds=5 deployed, llama-server asleep (its log says so), then the 4
                   clients start at once; the lab's own settings again after
  model-switch     llama_models with a second sentence model: each request names the model the client did
                   not name last time; the lab's own settings again after

After each case the lab serves again (a completion) and the front's figures from `llama-rpc status` are
recorded; the front's log and llama-server's journal in the case's window are kept in the JSON. Writes
docs/results/no-request-lost.md and docs/results/no-request-lost.json (a case run again replaces its own entry only), and
prints the table. The lab's own settings are deployed again at the end.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from benchmarks import labkit
from benchmarks.client_load import (
    CLIENT_TIMEOUT,
    OPENAI_CLIENTS,
    OPENAI_TOKENS,
    SERVED_BOUND,
    Load,
    OpenAILoad,
    figures,
)
from benchmarks.front_cost import PLACEMENTS, case_front_cost
from benchmarks.labkit import INVENTORY, RESULTS, ROOT, cpu_model, git, log, on
from lab import lab
from llama_rpc_deploy import client, roles
from llama_rpc_deploy.deployment import from_cluster
from llama_rpc_deploy.loading import offline_cluster
from llama_rpc_deploy.loadtest import until_serving

SWITCH_FOLDER = "/models/no-request-lost"
# the clients of every case's load: Load, or (--clients openai) an OpenAILoad of --threads threads, set by main
LOAD = Load
CASES = (
    "front-cost",
    "rpc-kill",
    "rpc-kill-process",
    "worker-reboot",
    "cut-20",
    "cut-60",
    "redeploy-ctx",
    "upgrade",
    "front-reload",
    "wake",
    "model-switch",
)

# before the front, from docs/results/faults.md (and the brief's quick check of a SIGKILL, 4 x 40 requests)
BEFORE = {
    "rpc-kill": "48 of 160 failed (SIGKILL, 4 clients x 40); a restart 3 s in: 48 of 160 failed, served 6.4 s after it",
    "rpc-kill-process": "one client: serving again 5.1 s after the kill (docker kill); under load: as rpc-kill",
    "worker-reboot": "one client: serving again 22.6 s after the reboot command; requests meanwhile failed",
    "cut-20": "requests during the cut time out; serving 6.7 s after the heal (TCP rides it out)",
    "cut-60": "requests during the cut hang and time out; serving 25.2 s after the heal (earlier 29.8 s)",
}


# --- what the front and the journal say -----------------------------------------------------------------


def front_figures() -> dict:
    """The coordinator's front figures as `llama-rpc status --json` gives them."""
    out = subprocess.run(
        [sys.executable, "-m", "llama_rpc_deploy", "status", "-i", str(INVENTORY), "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    try:
        return json.loads(out)[0].get("front", {})
    except (ValueError, IndexError):
        return {}


def front_line(f: dict) -> str:
    if not f:
        return "no front figures"
    return (
        f"front: {f['requests']} requests, {f['held']} held ({f['holding']} waiting now, {f['held_too_long']} past "
        f"the hold), {f['replays']} replays, {f['failed']} failed (5xx), {f['cut']} cut; llama-server "
        f"{f['llama_server']}, {f['in_flight']} in flight"
    )


COUNTERS = ("requests", "held", "held_too_long", "replays", "failed", "cut")


def front_delta(before: dict, after: dict) -> dict | None:
    """The front's counters during the case; None when they went back (the front reloaded: counted anew)."""
    if not before or not after or any(after[k] < before[k] for k in COUNTERS):
        return None
    return {k: after[k] - before[k] for k in COUNTERS}


LINE = re.compile(r'\] api (\S+) (\S+) (-?\d+) (\d+) \S+ \S+ (\S{4}) \S*?/\S*?/\S*?/\S*?/\+?(\d+) \S+ "(\S+) (\S+)')


def journal(unit: str, since: float, until: float, grep: str | None = None, host: str = "coordinator") -> list[str]:
    command = (
        f"journalctl -u {unit} --since @{math.floor(since)} --until @{math.ceil(until)} --no-pager -o short-iso-precise"
    )
    if grep:
        command += f" | grep -E {json.dumps(grep)}"
    return [l for l in on(host, command + " || true", check=False).splitlines() if not l.startswith("-- ")]


def logs(since: float, until: float) -> dict:
    """The front's log lines in the window, counted (status, how each ended, tries again), the unusual ones kept;
    llama-server's (and its watchdog's) lines about stops, starts, drains and crashes."""
    lines = journal(roles.FRONT_UNIT, since, until)
    statuses, states, retries, unusual, health = Counter(), Counter(), 0, [], Counter()
    for line in lines:
        m = LINE.search(line)
        if not m:
            continue
        status, state, tries, path = m.group(3), m.group(5), int(m.group(6)), m.group(8)
        if path == "/health":
            health[status] += 1
            continue
        statuses[status] += 1
        states[state] += 1
        retries += tries
        if status != "200" or state != "----" or tries:
            unusual.append(line[-260:])
    server = journal(
        roles.COORDINATOR_UNIT,
        since,
        until,
        "front-drain|Stopping|Stopped|Started|Starting|Main process exited|Failed|crash|abort|"
        "Remote RPC|error|sleeping state|Scheduled restart|wait-for-workers|timed out|Killing",
    )
    watchdog = journal(roles.WATCHDOG_UNIT, since, until)
    reloads = [line[-200:] for line in lines if "Former worker" in line or "Reloaded" in line or "Segmentation" in line]
    crashes = [line for line in server if "Remote RPC server crashed" in line]
    return {
        "front_requests": sum(statuses.values()),
        "front_status": dict(statuses),
        "front_ends": dict(states),
        "front_retries": retries,
        "front_health": dict(health),
        "front_reloads": reloads[:20],
        "llama_server_crashed_at": crashes[0].split()[0] if crashes else None,
        "front_unusual": unusual[:40],
        "llama_server": [l[-240:] for l in server][:60],
        "watchdog": [l[-240:] for l in watchdog][-10:],
    }


def case_front_log(since: float, until: float) -> dict:
    """The front's answers over a whole case (its deploys and waits included): 5xx to clients by status and path,
    and the front's own 503 to GET /health (what `status`'s 5xx figure counts besides failed requests)."""
    other, health = Counter(), 0
    for line in journal(roles.FRONT_UNIT, since, until):
        m = LINE.search(line)
        if m and m.group(3).startswith("5"):
            if m.group(8).split("?")[0] == "/health":
                health += 1
            else:
                other[f"{m.group(3)} {m.group(7)} {m.group(8)}"] += 1
    return {"health_503": health, "other_5xx": dict(other)}


def serving(cluster, bound: float = 240) -> float | None:
    return until_serving(cluster, bound, expect_down=False).seconds


def pyinfra(*data: str) -> dict:
    """The lab deployed with these settings over its own, as the report records it (a failure is data here)."""
    done = labkit.pyinfra(INVENTORY, *data)
    r = {"data": list(data), "rc": done.rc, "seconds": round(done.seconds, 1)}
    if done.rc != 0:
        r["tail"] = done.stdout[-2500:] + done.stderr[-1500:]
        log(f"deploy {done.describe()} FAILED ({done.rc}):\n{r['tail'][-1500:]}")
    return r


# --- the cases -------------------------------------------------------------------------------------------


def run_with_load(cluster, fault, models=None) -> dict:
    """Load started; `fault(load)` returns (fault time, heal time or None, a dict of what it did); then the
    load until every client is served again; the figures."""
    load = LOAD(cluster, models).start()
    done: dict = {}
    try:
        fault_at, heal_at, done = fault(load)
        done["served_again"] = load.until_every_client_served(load.now())
    finally:
        reqs = load.stop()
    end = load.now()
    r = {
        "fault_at_s": round(fault_at, 2),
        **({"heal_at_s": round(heal_at, 2)} if heal_at is not None else {}),
        "load_s": round(end, 1),
        **done,
        **figures(reqs, fault_at, heal_at),
        "window": [round(load.wall(0) - 1, 1), round(load.wall(end) + 2, 1)],
    }
    if models:
        r["answered_per_model"] = dict(Counter(q.model for q in reqs if q.ok))
        r["failed_per_model"] = dict(Counter(q.model for q in reqs if not q.ok))
    r["logs"] = logs(*r["window"])
    crashed = r["logs"]["llama_server_crashed_at"]
    if crashed:  # llama-server's abort on the lost worker, in seconds of the load
        from datetime import datetime

        r["llama_server_crashed_at_s"] = round(
            datetime.fromisoformat(crashed.replace("+0000", "+00:00")).timestamp() - load.wall(0), 2
        )
    r["deployed_front"] = on(
        "coordinator",
        f"cd {cluster.settings['deploy_dir']} && sha256sum front.cfg front.lua front-drain.sh | cut -c1-12",
        check=False,
    ).split()
    return r


def after(load: Load, seconds: float) -> None:
    time.sleep(max(0.0, seconds - load.now()))


def case_kill(cluster, command: str, host: str = "worker1") -> dict:
    def fault(load):
        after(load, 3)
        at = load.now()
        on(host, command)
        time.sleep(15)  # llama-server restarts (the wait below then asks for fresh answers)
        return at, None, {"command": f"{host}: {command}"}

    r = run_with_load(cluster, fault)
    r["logs"]["rpc_server_worker1"] = [
        l[-200:]
        for l in journal(
            "rpc-server",
            r["window"][0],
            r["window"][1],
            "Main process exited|Started|Stopping|Stopped|Scheduled restart|Failed|Killing|Killed|signal",
            host="worker1",
        )
    ][-12:]
    return r


def case_worker_reboot(cluster) -> dict:
    def fault(load):
        after(load, 3)
        at = load.now()
        subprocess.run(["docker", "restart", f"{lab.PREFIX}-worker1"], check=True, capture_output=True)
        took = load.now() - at
        time.sleep(20)
        return at, None, {"command": f"docker restart {lab.PREFIX}-worker1", "reboot_command_s": round(took, 1)}

    return run_with_load(cluster, fault)


def cut(command: str) -> None:
    worker = lab.ip_of(1)
    on("coordinator", f"iptables {command} OUTPUT -d {worker} -j DROP; iptables {command} INPUT -s {worker} -j DROP")


def case_cut(cluster, seconds: int) -> dict:
    def fault(load):
        after(load, 3)
        at = load.now()
        cut("-I")
        try:
            time.sleep(seconds)
        finally:
            cut("-D")
        healed = load.now()
        time.sleep(10)
        return at, healed, {"cut_s": seconds}

    return run_with_load(cluster, fault)


def case_deploys(cluster, first: tuple[str, ...], note: dict | None = None) -> dict:
    """Under load: a deploy with `first` as --data, then the lab's own settings again."""

    def fault(load):
        after(load, 3)
        at = load.now()
        one = pyinfra(*first)
        one.update(start_s=round(at, 1), end_s=round(load.now(), 1))
        time.sleep(3)
        start = load.now()
        two = pyinfra()
        two.update(start_s=round(start, 1), end_s=round(load.now(), 1))
        return at, None, {"deploys": [one, two], **(note or {})}

    return run_with_load(cluster, fault)


def case_front_reload(cluster) -> dict:
    """The front reloaded under load (as a deploy that changes its files does), once while requests go through,
    once while it holds them: llama-server stopped (its stop drains the front), the front reloaded, llama-server
    started again."""

    def fault(load):
        after(load, 3)
        at = load.now()
        steps = []
        for when, command in (
            (3, f"systemctl reload {roles.FRONT_UNIT}"),
            (6, f"systemctl stop {roles.COORDINATOR_UNIT}"),
            (8, f"systemctl reload {roles.FRONT_UNIT}"),
            (11, f"systemctl start {roles.COORDINATOR_UNIT}"),
        ):
            after(load, when)
            steps.append([round(load.now(), 2), command])
            on("coordinator", command)
        time.sleep(5)
        return at, None, {"steps": steps}

    return run_with_load(cluster, fault)


def case_upgrade(cluster) -> dict:
    """Every server on another image, under load. The image for llama_cpp_build_number + 1 is built and deployed
    first, without load (its build is not what the front is about); then, under load, the deploy of the lab's
    own settings replaces it by the lab's image on every host (both images are on every host by then, as after
    the image transfer of an upgrade); then, still under load, the bumped one again, and the lab's own after."""
    bumped = cluster.settings["llama_cpp_build_number"] + 1
    own = from_cluster(cluster, with_key=False).image
    other = from_cluster(offline_cluster(INVENTORY, overrides={"llama_cpp_build_number": bumped}), with_key=False).image
    log(f"upgrade: building and deploying {other} (llama_cpp_build_number={bumped}) without load")
    prep = pyinfra(f"llama_cpp_build_number={bumped}")
    prep["image"] = other
    assert serving(cluster) is not None

    def fault(load):
        after(load, 3)
        at = load.now()
        deploys = []
        for data, image in (((), own), ((f"llama_cpp_build_number={bumped}",), other)):
            start = load.now()
            d = pyinfra(*data)
            d.update(start_s=round(start, 1), end_s=round(load.now(), 1), image=image)
            deploys.append(d)
            time.sleep(3)
        return at, None, {"prepared_without_load": prep, "deploys": deploys, "from_image": other, "to_image": own}

    r = run_with_load(cluster, fault)
    r["deploy_back_without_load"] = pyinfra()
    return r


def case_wake(cluster) -> dict:
    since = time.time()
    setup = pyinfra("llama_sleep_idle_seconds=5")
    assert serving(cluster) is not None  # a completion: llama-server is awake now
    served, asleep = time.monotonic(), False
    while time.monotonic() < served + 90 and not asleep:
        time.sleep(1)
        states = journal(roles.COORDINATOR_UNIT, since - 1, time.time() + 1, "sleeping state")
        asleep = bool(states) and "entering" in states[-1]
    waited = round(time.monotonic() - served, 1)
    time.sleep(1)

    def fault(load):
        return 0.0, None, {"deploy": setup, "asleep": asleep, "waited_for_sleep_s": waited}

    r = run_with_load(cluster, fault)
    r["sleep_lines"] = [l[-160:] for l in journal(roles.COORDINATOR_UNIT, since - 1, time.time(), "sleeping state")][
        -8:
    ]
    r["deploy_back"] = pyinfra()
    return r


def case_model_switch(cluster) -> dict:
    from lab.testmodel import PROMPT_2, SENTENCE_2, write_sentence_model

    local = lab.CACHE / "no-request-lost-second.gguf"
    if not local.exists():
        write_sentence_model(local, lab.MODEL_SHAPE, prompt=PROMPT_2, sentence=SENTENCE_2)
    path = f"{SWITCH_FOLDER}/second.gguf"
    on("coordinator", f"rm -rf {SWITCH_FOLDER} && mkdir -p {SWITCH_FOLDER} && chmod 755 {SWITCH_FOLDER}")
    subprocess.run(["docker", "cp", str(local), f"{lab.PREFIX}-coordinator:{path}"], check=True)
    on("coordinator", f"chmod 644 {path}")
    models = {"second": {"llama_model_path": path}}
    setup = pyinfra(f"llama_models={json.dumps(models)}")
    router = offline_cluster(INVENTORY, overrides={"llama_models": models})
    try:
        assert serving(router) is not None

        def fault(load):
            time.sleep(30)
            return 0.0, None, {"deploy": setup, "models": router.served_models()}

        r = run_with_load(router, fault, models=router.served_models())
    finally:
        back = pyinfra()
        on("coordinator", f"rm -rf {SWITCH_FOLDER}", check=False)
    r["deploy_back"] = back
    return r


def run_case(name: str, cluster) -> dict:
    if name == "front-cost":
        return case_front_cost(cluster)
    if name == "rpc-kill":
        return case_kill(cluster, "systemctl kill --signal=SIGKILL rpc-server")
    if name == "rpc-kill-process":
        return case_kill(cluster, "docker kill --signal KILL rpc-server >/dev/null")
    if name == "worker-reboot":
        return case_worker_reboot(cluster)
    if name in ("cut-20", "cut-60"):
        return case_cut(cluster, int(name.split("-")[1]))
    if name == "redeploy-ctx":
        return case_deploys(cluster, ("llama_ctx_size=4096",))
    if name == "upgrade":
        return case_upgrade(cluster)
    if name == "front-reload":
        return case_front_reload(cluster)
    if name == "wake":
        return case_wake(cluster)
    if name == "model-switch":
        return case_model_switch(cluster)
    raise ValueError(name)


# --- targets and the report ----------------------------------------------------------------------------

ALL_ANSWERED = ("redeploy-ctx", "upgrade", "front-reload", "wake", "model-switch")
NO_FAULT = (
    "redeploy-ctx",
    "upgrade",
    "front-reload",
    "model-switch",
)  # no single moment to count the first answer from


def case_of(key: str) -> str:
    """The case a result is of: its key is the case's name, with " run N" after it when --runs was over 1."""
    return key.split(" ")[0]


def target(name: str, r: dict) -> tuple[str, bool]:
    name = case_of(name)
    if "error" in r:
        return "the case did not run to its end", False
    if name == "front-cost":
        return "ratio >= 0.99, TTFT <= +2 ms", r["ratio"] >= 0.99 and r["ttft_diff_ms"] <= 2
    if name in ALL_ANSWERED:
        return "0 failed, streamed included", r["failed"] == 0
    return "0 failed non-streamed", r["failed_plain"] == 0


def row(name: str, r: dict) -> str:
    goal, met = target(name, r)
    if "error" in r:
        return f"| {name} | - | - | - | - | - | - | {r['error'][:120]} | **no** |"
    first = r.get("first_answer_after_heal_s", r.get("first_answer_s"))
    first_text = (
        f"{first} s" + (" after the heal" if "first_answer_after_heal_s" in r else "") if first is not None else "-"
    )
    if "llama_server_crashed_at_s" in r and "heal_at_s" not in r and first is not None:
        first_text += (
            f" ({round(r['fault_at_s'] + first - r['llama_server_crashed_at_s'], 2)} s after llama-server's abort)"
        )
    if case_of(name) in NO_FAULT:
        first_text = "-"
    d = r.get("front_delta")
    health = r.get("case_front_log", {}).get("health_503", r["logs"].get("front_health", {}).get("503", 0))
    front = (
        f"{d['requests']} req, {d['held']} held, {d['replays']} replays, {d['failed']} 5xx ({health} of them "
        f"the front's 503 to GET /health), {d['cut']} cut"
        if d
        else f"counters reset (the front reloaded); its "
        f"log: {r['logs']['front_retries']} tries again, {health} /health 503"
    )
    return (
        f"| {name} | {r['sent']} ({r['sent_plain']} + {r['sent_stream']}) | {r['failed_plain']} | "
        f"{r['failed_stream']}{cut_text(r)} | {first_text} | {r['longest_no_answer_s']} s | {r['longest_plain_s']} s / "
        f"{r['longest_stream_s']} s | {front} | {'yes' if met else '**no**'} ({goal}) |"
    )


def cut_text(r: dict) -> str:
    return f" ({r['streams_cut']} cut mid-way)" if "streams_cut" in r else ""


def clients_text(meta: dict) -> str:
    if meta.get("clients", "loadtest") == "loadtest":
        return f"""4 client threads per case, started together, each in a loop until the case ends: 3 send non-streamed
completions (16 tokens), 1 sends streamed chat completions (32 tokens, `stream: true`; answered only when the stream
ends with a finish_reason and `[DONE]`), client timeout {CLIENT_TIMEOUT} s, 0.5 s of pause after a failure."""
    n = meta["threads"]
    return f"""{n} client threads per case, started together, each in a loop until the case ends, each with one
`openai.OpenAI(max_retries=0)` of its own (OpenAI's Python client, its retries off; its pool keeps the connection to
the front alive between requests): {n - n // 2} send non-streamed chat completions, {n // 2} streamed ones
({OPENAI_TOKENS} tokens each; a stream is answered only when a chunk had a finish_reason and it ended without an
error; one that failed after some tokens is counted as cut mid-way), client timeout {CLIENT_TIMEOUT} s, 0.5 s of
pause after a failure."""


def markdown(results: dict, meta: dict) -> str:
    order = sorted((c for c in results if case_of(c) in CASES), key=lambda c: (CASES.index(case_of(c)), len(c), c))
    load_cases = [c for c in order if c != "front-cost"]
    table = "\n".join(row(c, results[c]) for c in load_cases)
    before = "\n".join(
        f"| {c} | {BEFORE[case_of(c)]} | {results[c].get('failed_plain', '-')} of {results[c].get('sent_plain', '-')} "
        f"non-streamed failed; first answer "
        f"{results[c].get('first_answer_after_heal_s', results[c].get('first_answer_s'))} s"
        f"{' after the heal' if 'first_answer_after_heal_s' in results[c] else ''} |"
        for c in load_cases
        if case_of(c) in BEFORE and "error" not in results[c]
    )
    parts = [
        f"""# No request lost: the front under faults, restarts and deploys

`python3 -m benchmarks.no_request_lost` ({meta["command"]}), {meta["date"]}, commit {meta["commit"]}
({"uncommitted changes to " + ", ".join(meta["uncommitted"]) if meta["uncommitted"] else "no uncommitted change"}),
on {meta["machine"]}: the lab
(coordinator 172.30.57.10 with the front on :8080 and llama-server on 127.0.0.1:18080, workers .11 and .12,
the 8-layer sentence model split across the three, `llama_parallel` 2). Every figure is from one run of its case
(`{meta.get("json", "docs/results/no-request-lost.json")}` has each case's date, every failed request and the log lines of its window).

{clients_text(meta)} After the fault the load
goes on until every client has been answered a request sent after it (at most {SERVED_BOUND} s), then 2 s more.

- **first answer**: from the fault to the end of the longest stretch without any answer that follows it (the first
  answer once the fault took effect); for a cut, from the heal to the first answer after it.
- **longest no answer**: that stretch (no client got an answer meanwhile).
- **front**: the front's counters from `llama-rpc status` (requests, held, replays, 5xx answers, streams cut),
  the difference across the case.

## Under load

| case | sent (non-streamed + streamed) | failed non-streamed | failed streamed (cut mid-way) | first answer | longest no answer | longest request (non-streamed / streamed) | front during the case | target met |
| --- | --- | --- | --- | --- | --- | --- | --- | --- |
{table}
"""
    ]
    if before:
        parts.append(f"""## Before the front (docs/results/faults.md) and now

| case | before the front | with the front |
| --- | --- | --- |
{before}
""")
    if "front-cost" in results:
        r = results["front-cost"]
        if "error" in r:
            parts.append(f"## What the front costs\n\nThe case did not run to its end: {r['error']}\n")
        else:
            parts.append(
                f"""## What the front costs

A stdlib client inside the coordinator (copied in with `docker cp`), streamed chat completions of {r["tokens"]} tokens
(`ignore_eos`, `cache_prompt: false`), one through the front and one to llama-server directly in turn, {r["pairs"]}
pairs, the order swapped every pair, after 2 each way to warm up. The client also reads the CPU time
(`/proc/PID/schedstat`) of the front's HAProxy processes and of llama-server around each request. Once per
placement of the front's HAProxy, in one run (the lab has 2 cores, and every lab host generates on the CPU):
"""
                + "".join(f"- **{name}**: {what}.\n" for name, what in PLACEMENTS.items())
                + """
Medians of each way's requests. Generation tokens/s: the tokens after the first over the time from the first to
the last (as the client sees them); second half: the same over the last half of the tokens; end to end: all tokens
over the time from sending to the last token. First-ms tokens: how many tokens arrived within 1 ms of the first.
Ratios: the median of the pairs' front / direct, with a 95% bootstrap interval.

| placement | way | generation tokens/s | second half tokens/s | end to end tokens/s | time to first token | first-ms tokens | HAProxy's CPU per request | llama-server's CPU per request |
| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |
"""
                + "\n".join(
                    f"| {name} | {way} | {m[way]['tokens_per_s']} | {m[way]['second_half_tokens_per_s']} | "
                    f"{m[way]['end_to_end_tokens_per_s']} | {m[way]['ttft_ms']} ms | {m[way]['first_ms_tokens']} | "
                    f"{m[way]['front_cpu_ms']} ms | {m[way]['server_cpu_ms']} ms |"
                    for name, p in r["placements"].items()
                    for way, m in [(w, p["median"]) for w in ("front", "direct")]
                )
                + """

| placement | generation tokens/s, front / direct | end to end | time to first token | HAProxy's CPU per token | llama-server's CPU, front / direct | target (ratio >= 0.99, TTFT <= +2 ms) |
| --- | --- | --- | --- | --- | --- | --- |
"""
                + "\n".join(
                    f"| {name} | **{p['ratio']}** ({p['ratio_interval'][0]} to {p['ratio_interval'][1]}) | "
                    f"{p['ratio_end_to_end']} ({p['ratio_end_to_end_interval'][0]} to {p['ratio_end_to_end_interval'][1]}) | "
                    f"**{p['ttft_diff_ms']:+} ms** ({p['ttft_diff_interval'][0]:+} to {p['ttft_diff_interval'][1]:+}) | "
                    f"{p['front_cpu_us_per_token']} µs (llama-server: {p['server_cpu_us_per_token']} µs) | "
                    f"{p['server_cpu_front_over_direct']} | {'met' if target('front-cost', p)[1] else '**not met**'} |"
                    for name, p in r["placements"].items()
                )
                + "\n"
            )
    parts.append("## Each case\n")
    for c in load_cases:
        r = results[c]
        parts.append(f"### {c}\n\n{describe(c, r)}\n")
    parts.append(NOTES_MARK + "\n")
    return "\n".join(parts)


NOTES_MARK = "<!-- notes -->"


def flat(text: str) -> str:
    """An error on one line, an HTML page's tags left out."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", text)).strip()


def describe(name: str, r: dict) -> str:
    name = case_of(name)
    if "error" in r:
        return f"Did not run to its end: `{r['error']}`."
    start = (
        "the clients started together"
        if name in ("wake", "model-switch")
        else f"{'first deploy' if name in ('redeploy-ctx', 'upgrade') else 'first reload' if name == 'front-reload' else 'fault'} "
        f"{r['fault_at_s']} s into the load"
    )
    lines = [
        f"- run {r.get('date', '')}; {start}"
        + (f", healed at {r['heal_at_s']} s" if "heal_at_s" in r else "")
        + f"; load {r['load_s']} s; "
        f"every client served again afterwards: {r.get('served_again')}"
    ]
    if "command" in r:
        lines.append(
            f"- fault: `{r['command']}`" + (f" (took {r['reboot_command_s']} s)" if "reboot_command_s" in r else "")
        )
    for d in r.get("deploys", []):
        lines.append(
            f"- deploy `{' '.join('--data ' + x for x in d['data']) or 'pyinfra -y .lab/inventory.py deploy.py'}`"
            f"{' to ' + d['image'] if d.get('image') else ''}: {d['start_s']} s to {d['end_s']} s of the "
            f"load, rc {d['rc']}"
        )
    if "prepared_without_load" in r:
        p = r["prepared_without_load"]
        lines.append(
            f"- prepared without load: `--data {' '.join(p['data'])}` built and deployed {p['image']} "
            f"({p['seconds']} s, rc {p['rc']}); under load the servers went {r['from_image']} -> "
            f"{r['to_image']} -> {r['from_image']}; then back to {r['to_image']} without load"
        )
    if "steps" in r:
        lines.append("- steps (s of the load): " + "; ".join(f"{t}: `{c}`" for t, c in r["steps"]))
    if r["logs"].get("front_reloads"):
        lines.append(
            "- the front's reloads in the window: "
            + "; ".join(f"`{l.split(': ', 1)[-1]}`" for l in r["logs"]["front_reloads"])
        )
    if "llama_server_crashed_at_s" in r:
        lines.append(
            f'- llama-server aborted ("Remote RPC server crashed") at {r["llama_server_crashed_at_s"]} s of the load'
        )
    if "asleep" in r:
        lines.append(
            f"- llama-server asleep before the clients started: {r['asleep']} (waited {r['waited_for_sleep_s']} s "
            "for its log to say so)"
        )
    if "models" in r:
        lines.append(f"- models: {', '.join(r['models'])}, each client alternating between them")
    lines.append(
        f"- streamed requests in flight at the fault: {r['streams_in_flight_at_fault']}; stretches over 1 s "
        f"without any answer (start, length): {r['stretches_over_1s']}"
    )
    if r["errors"]:
        lines.append("- failures: " + "; ".join(f"{n} x `{flat(e)}`" for e, n in r["errors"].items()))
    g = r["logs"]
    lines.append(
        f"- the front's log: {g['front_requests']} requests, status {g['front_status']}, ends {g['front_ends']}, "
        f"{g['front_retries']} tries again"
    )
    lines.append(f"- `status` after: {r.get('front_after_line', '-')}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of: {', '.join(CASES)}")
    parser.add_argument("--out", type=Path, help="default docs/results/no-request-lost.md (-openai.md for openai)")
    parser.add_argument(
        "--clients",
        choices=("loadtest", "openai"),
        default="loadtest",
        help="loadtest: 3 non-streamed /completion and 1 streamed client, a connection per request; openai: "
        "--threads openai.OpenAI(max_retries=0) clients, each keeping its connection alive, half of them streaming",
    )
    parser.add_argument("--threads", type=int, default=OPENAI_CLIENTS, help="--clients openai: how many (default 4)")
    parser.add_argument("--runs", type=int, default=1, help="runs of each case, in a row (default 1)")
    args = parser.parse_args()
    if args.threads < 2 or args.runs < 1:
        sys.exit("--threads 2 or more (half of them stream), --runs 1 or more")
    global LOAD
    if args.clients == "openai":
        LOAD = functools.partial(OpenAILoad, threads=args.threads)
    args.out = args.out or RESULTS / ("no-request-lost-openai.md" if args.clients == "openai" else "no-request-lost.md")
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        sys.exit(f"unknown case(s): {', '.join(unknown)}; expected some of {', '.join(CASES)}")
    if args.clients == "openai" and "front-cost" in cases:
        sys.exit("front-cost has clients of its own: leave it out of --clients openai")
    json_path = args.out.with_suffix(".json")
    previous = json.loads(json_path.read_text()) if json_path.exists() else {}
    results = previous.get("cases", {})
    cluster = offline_cluster(INVENTORY)
    run_meta = meta(cases)  # the commit and the uncommitted files as the run starts
    run_meta.update(clients=args.clients, runs=args.runs, json=os.path.relpath(json_path, ROOT))
    if args.clients == "openai":
        run_meta["threads"] = args.threads
        run_meta["command"] += f" --clients openai --threads {args.threads}"
    if args.runs > 1:
        run_meta["command"] += f" --runs {args.runs}"
    started = time.monotonic()
    log(f"deploying the lab's own settings, then {', '.join(cases)}")
    first = pyinfra()
    if first["rc"] != 0 or serving(cluster) is None:
        sys.exit("the lab does not deploy or serve: nothing measured")
    try:
        runs = [
            (name, name if args.runs == 1 else f"{name} run {k}") for name in cases for k in range(1, args.runs + 1)
        ]
        for name, key in runs:
            log(f"case {key}")
            before = front_figures()
            case_start, case_wall = time.monotonic(), time.time()
            try:
                r = run_case(name, cluster)
            except Exception as error:  # the other cases still run; the lab is put back below
                r = {"error": f"{type(error).__name__}: {error}"[:600]}
                log(f"case {key} failed: {r['error']}")
            r["date"] = time.strftime("%Y-%m-%d %H:%M %Z")
            r["case_s"] = round(time.monotonic() - case_start, 1)
            r["serving_again_after_s"] = serving(cluster)
            after_ = front_figures()
            r["case_window"] = [round(case_wall, 1), round(time.time(), 1)]
            r["case_front_log"] = case_front_log(*r["case_window"])
            r.update(
                front_before=before,
                front_after=after_,
                front_delta=front_delta(before, after_),
                front_after_line=front_line(after_),
            )
            results[key] = r
            log(f"case {key}: {summary(name, r)}; {r['front_after_line']}")
            write(args.out, json_path, results, run_meta)
    finally:
        for attempt in range(2):
            last = pyinfra()
            if last["rc"] == 0:
                break
        ok = serving(cluster) is not None
        reply = client.complete(cluster, "Two computers, one model:", 8) if ok else {}
        log(f"the lab's own settings deployed again (rc {last['rc']}), a completion: {reply.get('content')!r}")
        log(f"whole run {time.monotonic() - started:.0f} s")
    print("\n" + markdown(results, run_meta).split("## Each case")[0])


def summary(name: str, r: dict) -> str:
    if "error" in r:
        return r["error"]
    if name == "front-cost":
        return "; ".join(
            f"{name}: ratio {p['ratio']} {p['ratio_interval']}, TTFT {p['ttft_diff_ms']:+} ms, HAProxy "
            f"{p['front_cpu_us_per_token']} us of CPU per token"
            for name, p in r["placements"].items()
        )
    return (
        f"{r['sent']} sent, {r['failed_plain']} failed non-streamed, {r['failed_stream']} failed streamed"
        f"{cut_text(r)}, "
        f"first answer {r.get('first_answer_after_heal_s', r['first_answer_s'])} s, longest "
        f"{r['longest_request_s']} s"
    )


def meta(cases: list[str]) -> dict:
    changed = [
        l[3:]
        for l in git("status", "--porcelain").splitlines()
        if not l[3:].startswith(
            (
                "docs/results/no-request-lost",
                "benchmarks/no_request_lost",
                "benchmarks/client_load",
                "benchmarks/front_cost",
            )
        )
    ]
    return {
        "command": f"--cases {','.join(cases)}",
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()} cores ({cpu_model()}), {platform.system()} {platform.release()}",
        "commit": git("rev-parse", "--short", "HEAD"),
        "uncommitted": changed,
    }


def write(out: Path, json_path: Path, results: dict, run_meta: dict) -> None:
    json_path.write_text(json.dumps({"meta": run_meta, "cases": results}, indent=1) + "\n")
    text = markdown(results, run_meta)
    if out.exists() and NOTES_MARK in out.read_text():  # notes written by hand below the mark stay
        text = text.split(NOTES_MARK)[0] + NOTES_MARK + out.read_text().split(NOTES_MARK, 1)[1]
    out.write_text(text)


if __name__ == "__main__":
    main()
