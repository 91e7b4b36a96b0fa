"""The front-cost case of benchmarks.no_request_lost: streamed chat completions from a client inside the
coordinator, through the front and to llama-server directly in turn, with the CPU time the front's HAProxy and
llama-server spent on each; once per placement of HAProxy.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

from benchmarks import labkit
from benchmarks.labkit import on
from lab import lab
from llama_rpc_deploy import roles
from llama_rpc_deploy.settings import DEFAULTS

COST_CLIENT = r"""
import http.client, json, os, subprocess, sys, time
key = sys.stdin.readline().strip()
ways, pairs, tokens = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
FRONT, SERVER = sys.argv[4], "llama-server --"

def pids(pattern):  # the processes whose command line has pattern (not this one)
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out if int(p) != os.getpid()]

def cpu_ns(ps):  # CPU time so far (the scheduler's, in ns) of the processes ps
    total = 0
    for p in ps:
        try:
            total += int(open(f"/proc/{p}/schedstat").read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total

def one(way):
    host, port = ways[way]
    body = json.dumps({"messages": [{"role": "user", "content": "Once upon a time"}], "max_tokens": tokens,
                       "stream": True, "temperature": 0, "ignore_eos": True, "cache_prompt": False})
    front, server = pids(FRONT), pids(SERVER)
    cpu = (cpu_ns(front), cpu_ns(server))
    connection = http.client.HTTPConnection(host, port, timeout=120)
    start = time.perf_counter()
    connection.request("POST", "/v1/chat/completions", body,
                       {"Content-Type": "application/json", "Authorization": "Bearer " + key})
    response = connection.getresponse()
    assert response.status == 200, (way, response.status, response.read()[:200])
    times = []
    while True:
        line = response.readline()
        if not line or line.strip() == b"data: [DONE]":
            break
        if line.startswith(b"data:"):
            choice = (json.loads(line[5:]).get("choices") or [{}])[0]
            if choice.get("delta", {}).get("content"):
                times.append(time.perf_counter())
    connection.close()
    half = len(times) // 2
    return {"ttft_ms": (times[0] - start) * 1000, "total_ms": (times[-1] - start) * 1000, "tokens": len(times),
            "tokens_per_s": (len(times) - 1) / (times[-1] - times[0]),
            "second_half_tokens_per_s": (len(times) - 1 - half) / (times[-1] - times[half]),
            "end_to_end_tokens_per_s": len(times) / (times[-1] - start),
            "first_ms_tokens": sum(t - times[0] < 0.001 for t in times),
            "front_cpu_ms": (cpu_ns(front) - cpu[0]) / 1e6, "server_cpu_ms": (cpu_ns(server) - cpu[1]) / 1e6}

assert pids(FRONT) and pids(SERVER), "no front or no llama-server process in the coordinator"
for way in ways:
    one(way)
    one(way)
out = {way: [] for way in ways}
for i in range(pairs):  # one request each way, the order swapped every pair: drift falls on both alike
    for way in (list(ways) if i % 2 == 0 else list(ways)[::-1]):
        out[way].append(one(way))
print(json.dumps(out))
"""


def interval(values: list[float]) -> list[float]:
    """The 95% bootstrap interval of values' median, as this report gives it."""
    return labkit.interval(values, seed=1, digits=4)


PLACEMENTS = {  # where the front's HAProxy runs, against the processes that generate
    "shared": "HAProxy on llama-server's core: each lab host pinned to its own core (`lab pin`, as "
    "benchmarks/tool_overhead.py), the coordinator on core 0 alone, the client there too",
    "apart": "HAProxy on the workers' core (1), llama-server and the client on core 0: every core still generates",
    "free": "HAProxy and the client on a core that does not generate (1), llama-server and both workers on core 0: "
    "a coordinator whose card generates, with CPU cores to spare",
}


def place(placement: str) -> int:
    """Pin the lab for placement (taskset inside the coordinator for llama-server's threads and HAProxy's);
    the core for the client."""
    last = (os.cpu_count() or 2) - 1
    if placement == "shared":
        lab.pin()
        return 0
    workers = 0 if placement == "free" else last
    for container in lab.running():  # with what each host's dockerd runs (a cgroup v1 cpuset holds its children's)
        lab.set_cpus(container, f"0-{last}" if container.endswith("-coordinator") else str(workers))
    on(
        "coordinator",
        f"set -e; for p in $(pgrep -f 'llama-server --'); do taskset -a -p -c 0 $p >/dev/null; done; "
        f"for p in $(pgrep -f {FRONT_CONFIG}); do taskset -a -p -c {last} $p >/dev/null; done",
    )
    return last if placement == "free" else 0


def unplace() -> None:
    lab.pin(unpin=True)
    last = (os.cpu_count() or 2) - 1
    on(
        "coordinator",
        f"for p in $(pgrep -f 'llama-server --') $(pgrep -f {FRONT_CONFIG}); do "
        f"taskset -a -p -c 0-{last} $p >/dev/null; done",
        check=False,
    )


# how the client and place() find the front's HAProxy processes: its configuration on the lab's coordinator
FRONT_CONFIG = f"{DEFAULTS['deploy_dir']}/{roles.FRONT_CONFIG}"


def case_front_cost(cluster, pairs: int = 80, tokens: int = 128) -> dict:
    """Streamed chat completions from inside the coordinator: through the front (its public address) and to
    llama-server on 127.0.0.1 directly, one request each way in turn (the order swapped every pair), and the
    CPU time the front's HAProxy and llama-server spent on each; once per placement of HAProxy."""
    s = cluster.settings
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(COST_CLIENT)
    script = "/tmp/no-request-lost-cost.py"
    subprocess.run(["docker", "cp", f.name, f"{lab.PREFIX}-coordinator:{script}"], check=True)
    Path(f.name).unlink()
    key = (Path(s["llama_api_key_file"]).read_text().strip() + "\n") if s["llama_api_key_file"] else "\n"
    host = s["llama_host"] or cluster.coordinator.address
    ways = {"front": [host, s["llama_port"]], "direct": ["127.0.0.1", s["llama_server_port"]]}
    out = {"pairs": pairs, "tokens": tokens, "placements": {}}
    try:
        for placement in PLACEMENTS:
            core = place(placement)
            try:
                result = subprocess.run(
                    [
                        "docker",
                        "exec",
                        "-i",
                        f"{lab.PREFIX}-coordinator",
                        "taskset",
                        "-c",
                        str(core),
                        "python3",
                        script,
                        json.dumps(ways),
                        str(pairs),
                        str(tokens),
                        FRONT_CONFIG,
                    ],
                    input=key,
                    capture_output=True,
                    text=True,
                    timeout=900,
                )
            finally:
                unplace()
            if result.returncode != 0:
                raise RuntimeError(f"the client in the coordinator failed: {result.stderr[-2000:]}")
            out["placements"][placement] = cost_figures(json.loads(result.stdout))
    finally:
        on("coordinator", f"rm -f {script}", check=False)
    return out


def cost_figures(raw: dict) -> dict:
    keys = (
        "ttft_ms",
        "total_ms",
        "tokens_per_s",
        "second_half_tokens_per_s",
        "end_to_end_tokens_per_s",
        "first_ms_tokens",
        "front_cpu_ms",
        "server_cpu_ms",
    )
    med = {w: {k: round(statistics.median(x[k] for x in v), 2) for k in keys} for w, v in raw.items()}
    paired = list(zip(raw["front"], raw["direct"]))  # request i each way: next to each other in time
    ratios = {
        k: [f[k] / d[k] for f, d in paired]
        for k in ("tokens_per_s", "second_half_tokens_per_s", "end_to_end_tokens_per_s")
    }
    ttft = [f["ttft_ms"] - d["ttft_ms"] for f, d in paired]
    n_tokens = statistics.median(x["tokens"] for v in raw.values() for x in v)
    # the front's own CPU per token: what HAProxy spent during a request through it, less what it spends anyway
    # (health checks) during a direct one
    front_cpu_us = (med["front"]["front_cpu_ms"] - med["direct"]["front_cpu_ms"]) * 1000 / n_tokens
    server_cpu_us = med["direct"]["server_cpu_ms"] * 1000 / n_tokens
    return {
        "requests_each_way": len(raw["front"]),
        "tokens_each": sorted({x["tokens"] for v in raw.values() for x in v}),
        "median": med,
        "ratio": round(statistics.median(ratios["tokens_per_s"]), 4),
        "ratio_interval": interval(ratios["tokens_per_s"]),
        "ratio_second_half": round(statistics.median(ratios["second_half_tokens_per_s"]), 4),
        "ratio_end_to_end": round(statistics.median(ratios["end_to_end_tokens_per_s"]), 4),
        "ratio_end_to_end_interval": interval(ratios["end_to_end_tokens_per_s"]),
        "ttft_diff_ms": round(statistics.median(ttft), 2),
        "ttft_diff_interval": interval(ttft),
        "front_cpu_us_per_token": round(front_cpu_us, 1),
        "server_cpu_us_per_token": round(server_cpu_us, 1),
        "server_cpu_front_over_direct": round(med["front"]["server_cpu_ms"] / med["direct"]["server_cpu_ms"], 4),
        "raw": {w: [{k: round(x[k], 3) for k in x} for x in v] for w, v in raw.items()},
    }
