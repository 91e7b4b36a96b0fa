"""`bench`: a deployed cluster's tokens/s for one and for N parallel streams, against the planner's ceiling.

    python -m llama_rpc_deploy bench -i inventory.py [--streams 1,2,4] [--json OUT.json] [--png OUT.png]

Measured through llama-server's own timings (prompt processing and generation tokens/s per request)
and the wall clock (all streams together). The ceiling is the capacity planner's bandwidth bound for
one stream (every weight read once per token); parallel streams share those reads, so together they
may pass it. With llama_sleep_idle_seconds set, it also waits for the server to fall asleep and
measures the time to the first token of the request that wakes it.

What crosses the wire per generated token, per worker (wire.py): bytes each way and data segments down (the round
trips' estimate), from the kernel's counters for llama-server's connection to each worker, read on the coordinator
over SSH around a short and a long greedy completion. With speculation deployed, the drafted and accepted tokens
of the long one too, so that a speculative mode and plain decoding (deployed in turn) read side by side.
"""

from __future__ import annotations

import json
import sys
import statistics
import time
import urllib.request
from pathlib import Path

from . import client, probe, wire
from .gguf_header import read_model, read_remote_model
from .cluster import Cluster
from .remote import ssh_runner
from .facts import GgufHeader
from .loading import offline_cluster
from .loadtest import run_load
from .plan import plan_cluster
from .status import cache_bytes_command

PROMPT = "The quick brown fox jumps over the lazy dog. "


def model_header(cluster: Cluster, inventory: Path, local: Path | None, key: str = "llama_model_path"):
    """The GGUF header of the model (or of the file of `key`): from a local copy, or read on the coordinator over
    SSH (as the deploy does)."""
    if local:
        return read_model(local)
    fact, path = GgufHeader(), cluster.settings[key]
    with ssh_runner(inventory) as run:

        def fetch(file, limit):
            result = run(cluster.coordinator.name, fact.command(file, limit))
            result.check_returncode()
            return fact.process(result.stdout.splitlines())

        return read_remote_model(fetch, path)


def cache_sizes(cluster: Cluster, inventory: Path) -> dict[str, int]:
    """Bytes in each worker's tensor cache (rpc_cache_dir/rpc), read over SSH; -1 where unreadable."""
    sizes = {}
    with ssh_runner(inventory) as run:
        for worker in cluster.workers:
            out = run(worker.name, cache_bytes_command(worker), timeout=60).stdout.strip()
            sizes[worker.name] = int(out) if out.isdigit() else -1
    return sizes


def time_to_first_token(
    cluster: Cluster, prompt: str = "Wake up:", timeout: float = 600, model: str | None = None
) -> float:
    """Seconds from sending a streamed completion to its first token (to `model`, with llama_models)."""
    body = json.dumps(
        {**client.model_field(cluster, model), "prompt": prompt, "n_predict": 8, "stream": True, "cache_prompt": False}
    ).encode()
    request = urllib.request.Request(
        client.server_url(cluster) + "/completion", data=body, headers=client.headers(cluster)
    )
    start, first = time.monotonic(), None
    with urllib.request.urlopen(request, timeout=timeout) as response:
        for line in response:  # read to the end: the request is over when this returns
            if first is None and line.startswith(b"data: "):
                first = time.monotonic() - start
    if first is None:
        raise RuntimeError("the stream ended without a token")
    return first


def wire_per_token(cluster: Cluster, inventory: Path, short: int = 16, long: int = 64) -> dict:
    """Per generated token, per worker (its --rpc endpoint): the kernel's counters (wire.COUNTERS), from a short and
    a long greedy completion of the same prompt; with the long one's drafted and accepted tokens."""
    endpoints = cluster.rpc_endpoints
    with ssh_runner(inventory) as run:

        def counters() -> dict:
            out = {}
            for endpoint in endpoints:
                result = run(cluster.coordinator.name, wire.command(endpoint), timeout=60)
                result.check_returncode()
                out[endpoint] = wire.parse(result.stdout)
            return out

        def completion(n: int) -> tuple[dict, dict]:
            before = counters()
            timings = client.complete(cluster, "Once upon a time", n, temperature=0, ignore_eos=True)["timings"]
            return timings, wire.difference(before, counters())

        completion(short)  # warm-up
        t_short, d_short = completion(short)
        t_long, d_long = completion(long)
    tokens = t_long["predicted_n"] - t_short["predicted_n"]
    return {
        "tokens": tokens,
        "per_token": {
            e: {k: round(v, 2) for k, v in c.items()} for e, c in wire.per_token(d_short, d_long, tokens).items()
        },
        "drafted": t_long.get("draft_n", 0),
        "accepted": t_long.get("draft_n_accepted", 0),
    }


def sleeping(cluster: Cluster) -> bool:
    return bool(client.get(cluster, "/props").get("is_sleeping"))


def long_prompt(cluster: Cluster, repeats: int, room: int) -> str:
    """PROMPT repeated up to `repeats` times, as long as a slot holds with `room` tokens to spare: each slot gets
    ctx / parallel cells, and a model whose vocabulary lacks the prompt's words (the lab's) spells them in bytes."""
    per_slot = cluster.settings["llama_ctx_size"] // cluster.settings["llama_parallel"]
    per_repeat = max(1, len(client.post(cluster, "/tokenize", {"content": PROMPT})["tokens"]))
    return PROMPT * max(1, min(repeats, (per_slot - room) // per_repeat))


def measure(
    cluster: Cluster,
    streams=(1, 2, 4),
    n_predict: int = 64,
    prompt_repeats: int = 24,
    runs: int = 3,
    sleep_wait: float = 300,
    ceiling: float | None = None,
) -> dict:
    client.complete(cluster, "warm up", 4)
    long = long_prompt(cluster, prompt_repeats, room=64)
    pp = [client.complete(cluster, long, 1)["timings"] for _ in range(runs)]
    single = [client.complete(cluster, "Once upon a time", n_predict)["timings"] for _ in range(runs)]
    parallel = []
    for n in streams:
        load = run_load(cluster, clients=n, requests_each=2, n_predict=n_predict, timeout=600)
        ok = [r for r in load.requests if r.ok]
        parallel.append(
            {
                "streams": n,
                "requests": len(load.requests),
                "failed": len(load.failed),
                "total_tokens_per_s": round(load.tokens_per_second, 2),
                "per_stream_tokens_per_s": round(statistics.mean(r.tokens_per_second for r in ok), 2) if ok else 0.0,
            }
        )
    generation = statistics.median(t["predicted_per_second"] for t in single)
    result = {
        "prompt_tokens": pp[0]["prompt_n"],
        "prompt_tokens_per_s": round(statistics.median(t["prompt_per_second"] for t in pp), 2),
        "generation_tokens": n_predict,
        "generation_tokens_per_s": round(generation, 2),
        "parallel": parallel,
        "ceiling_tokens_per_s": round(ceiling, 2) if ceiling else None,
        "single_over_ceiling": round(generation / ceiling, 3) if ceiling else None,
        "first_token_after_sleep_s": None,
    }
    idle = cluster.settings["llama_sleep_idle_seconds"]
    if idle:
        deadline = time.monotonic() + min(sleep_wait, idle + 120)
        while not sleeping(cluster) and time.monotonic() < deadline:
            time.sleep(1)
        if sleeping(cluster):
            result["first_token_after_sleep_s"] = round(time_to_first_token(cluster), 2)
        else:
            result["first_token_after_sleep_note"] = f"not asleep within {min(sleep_wait, idle + 120):.0f} s"
    else:
        result["first_token_after_sleep_note"] = "llama_sleep_idle_seconds is None: the server never sleeps"
    return result


def table(result: dict) -> str:
    lines = [
        f"prompt processing   {result['prompt_tokens_per_s']:>9.1f} tokens/s  ({result['prompt_tokens']} tokens)",
        f"generation, 1 stream {result['generation_tokens_per_s']:>8.1f} tokens/s  ({result['generation_tokens']} tokens)",
    ]
    if result["ceiling_tokens_per_s"]:
        lines.append(
            f"planner's ceiling   {result['ceiling_tokens_per_s']:>9.1f} tokens/s  "
            f"(one stream at {result['single_over_ceiling']:.2f}x of it)"
        )
    w = result.get("wire")
    if w:
        lines.append(f"per generated token ({w['tokens']} tokens), per worker: bytes down, bytes up, segments down")
        for endpoint, c in w["per_token"].items():
            lines.append(
                f"  {endpoint:<21} {c['bytes_received']:>10.0f} {c['bytes_acked']:>10.0f} {c['data_segs_in']:>8.2f}"
            )
        if w["drafted"]:
            lines.append(f"  speculation: {w['accepted']} of {w['drafted']} drafted tokens accepted")
    lines.append("streams   total tokens/s   per stream   failed")
    for p in result["parallel"]:
        lines.append(
            f"{p['streams']:>7}   {p['total_tokens_per_s']:>14.1f}   {p['per_stream_tokens_per_s']:>10.1f}   {p['failed']:>6}"
        )
    ttft = result["first_token_after_sleep_s"]
    lines.append(
        f"first token after idle sleep: {f'{ttft} s' if ttft is not None else result.get('first_token_after_sleep_note')}"
    )
    for worker, (size, limit) in result.get("tensor_cache", {}).items():
        lines.append(
            f"tensor cache on {worker}: {size / 2**20:.1f} MiB of its {limit / 2**30:g} GiB limit"
            if size >= 0
            else f"tensor cache on {worker}: not readable"
        )
    return "\n".join(lines)


PLOT_HINT = "bench --png needs matplotlib: pip install 'llama-rpc-deploy[plot]'"


def can_plot() -> bool:
    """Whether matplotlib (the package's `plot` extra) is installed: --png needs it."""
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def plot(result: dict, path: Path, title: str = "llama-rpc-deploy bench") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    streams = [p["streams"] for p in result["parallel"]]
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=100)
    ax.plot(streams, [p["total_tokens_per_s"] for p in result["parallel"]], "o-", label="all streams together")
    ax.plot(streams, [p["per_stream_tokens_per_s"] for p in result["parallel"]], "s--", label="per stream")
    if result["ceiling_tokens_per_s"]:
        ax.axhline(
            result["ceiling_tokens_per_s"],
            color="red",
            linestyle=":",
            label=f"bandwidth ceiling, one stream ({result['ceiling_tokens_per_s']:.0f})",
        )
    ax.set_xlabel("parallel streams")
    ax.set_ylabel("generated tokens/s")
    ax.set_xticks(streams)
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def run(
    inventory: Path,
    cluster: Cluster,
    streams,
    model: Path | None,
    json_out: Path | None,
    png_out: Path | None,
    sleep_wait: float = 300,
) -> dict:
    if png_out and not can_plot():  # before minutes of measuring, not after
        raise ValueError(PLOT_HINT)
    plan = plan_cluster(cluster, model_header(cluster, inventory, model))
    result = measure(cluster, streams=streams, ceiling=plan.tokens_per_s or None, sleep_wait=sleep_wait)
    result["wire"] = wire_per_token(cluster, inventory)
    result["tensor_cache"] = {
        name: (size, cluster.host(name).settings["rpc_cache_max_gib"] * 2**30)
        for name, size in cache_sizes(cluster, inventory).items()
    }
    if json_out:
        json_out.write_text(json.dumps(result, indent=2) + "\n")
    if png_out:
        plot(result, png_out)
    return result


def command(args) -> int:
    """`llama-rpc bench`: the table (and --json, --png)."""
    if args.png and not can_plot():  # said now, not after the measurements
        print(f"error: {PLOT_HINT}", file=sys.stderr)
        return 2
    streams = [int(n) for n in args.streams.split(",")]
    try:  # the ceiling from the hosts' own cards where the inventory lists none (as the deploy learns them)
        cluster = probe.learned_cluster(offline_cluster(args.inventory), args.inventory)
    except OSError as error:
        print(f"error: bench: {error}", file=sys.stderr)
        return 1
    result = run(args.inventory, cluster, streams, args.model, args.json, args.png, args.sleep_wait)
    print(table(result))
    return 0
