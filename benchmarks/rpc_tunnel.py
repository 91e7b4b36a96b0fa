"""What the RPC tunnel costs: generation and model load through stunnel (rpc_transport: tunnel) against plain TCP.

    python3 -m benchmarks.rpc_tunnel [--rounds 8] [--runs 5] [--loads 3] [--rate 1gbit] [--out docs/results/rpc-tunnel.md]

The lab up and deployed (`python3 -m llama_rpc_deploy lab up --workers 2`, then `pyinfra -y .lab/inventory.py
deploy.py`); about 15 minutes. Each lab host pinned to its own core (`lab pin`: the coordinator on core 0, the
workers on core 1), so the tunnel's own CPU lands where it would on real hosts: beside llama-server and rpc-server.
Every host's link is shaped to --rate (tc tbf on its eth0: the lab's "1 Gbit/s network").

One run, alternated: each round deploys tunnel then plain, or plain then tunnel (the order swaps every round), with
rpc_cache off on both (with the cache a reload sends hashes of the large tensors, not their bytes). In each:
  generation  --runs completions of 64 tokens after a warm-up; llama-server's own tokens/s (timings), median;
  load        --loads restarts of llama-server; the model's bytes on the workers (llama.cpp's load report) over the
              time llama.cpp's log puts between its last weights buffer line and its last KV buffer line on a worker
              (the upload, until each worker has read it: upload()).
The ratio tunnel / plain is the median of the per-round ratios, with a 95% bootstrap interval over rounds.
Targets (issue 27): generation at least 0.97, load at least 0.9. The lab is deployed as its inventory says, its
links unshaped and the hosts unpinned at the end. Writes --out and its .json beside it.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import time
from pathlib import Path

from benchmarks.labkit import INVENTORY, RESULTS, deploy, interval, log, on
from lab import lab
from llama_rpc_deploy import client, load_report
from llama_rpc_deploy.loading import offline_cluster
from llama_rpc_deploy.loadtest import until_serving

TRANSPORTS = ("tunnel", "plain")
STAMP = re.compile(r"^(\d+)\.(\d+)\.(\d+)\.(\d+) ")  # llama.cpp's log time: minutes.seconds.milliseconds.microseconds


def shape(rate: str | None) -> None:
    """Every lab host's egress on its lab network interface at rate (tc tbf), or unshaped."""
    for index, host in enumerate(lab.host_names(2)):
        dev = lab.lab_interface(f"{lab.PREFIX}-{host}", lab.ip_of(index))
        if rate:
            on(host, f"tc qdisc replace dev {dev} root tbf rate {rate} burst 256kb latency 50ms")
        else:
            on(host, f"tc qdisc del dev {dev} root 2>/dev/null || true")


def seconds(stamp: re.Match) -> float:
    m, s, ms, us = (int(x) for x in stamp.groups())
    return m * 60 + s + ms / 1e3 + us / 1e6


def upload(journal: str) -> tuple[float, float]:
    """(MiB of weights on the workers, seconds from llama.cpp's last weights buffer line to its last KV buffer line on
    a worker) from one start's log. The weights go out as SET_TENSOR messages, which have no reply: llama.cpp has
    written them once they sit in socket buffers (through a tunnel, in two sets of them and stunnel's), not once they
    arrived. Each worker's KV buffer is allocated by a command that waits for its reply, behind every byte sent to that
    worker before it: so the window ends when both workers have read their weights."""
    report = load_report.parse(journal)
    mib = sum(v for device, v in report.model.items() if device.startswith("RPC"))
    lines = [line for line in journal.splitlines() if STAMP.match(line)]
    last_buffer = max(i for i, line in enumerate(lines) if "model buffer size" in line and "RPC" in line)
    last_kv = max(i for i, line in enumerate(lines) if i > last_buffer and "KV buffer size" in line and "RPC" in line)
    return mib, seconds(STAMP.match(lines[last_kv])) - seconds(STAMP.match(lines[last_buffer]))


def load_once(cluster) -> tuple[float, float]:
    since = on("coordinator", "date +%s").strip()
    on("coordinator", "systemctl restart llama-server")
    assert until_serving(cluster, 240, expect_down=False).seconds is not None, "llama-server did not come back"
    return upload(on("coordinator", f"journalctl -u llama-server --since @{since} -o cat --no-pager"))


def generation(cluster, runs: int) -> list[float]:
    client.complete(cluster, "warm up", 8)
    return [client.complete(cluster, "Once upon a time", 64)["timings"]["predicted_per_second"] for _ in range(runs)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--loads", type=int, default=3)
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--out", type=Path, default=RESULTS / "rpc-tunnel.md")
    args = parser.parse_args()
    cluster = offline_cluster(INVENTORY)
    rounds = []
    lab.pin()
    shape(args.rate)
    try:
        for r in range(args.rounds):
            row = {}
            for transport in TRANSPORTS if r % 2 == 0 else TRANSPORTS[::-1]:
                switch = deploy(INVENTORY, f"rpc_transport={transport}", "rpc_cache=False").seconds
                gen = generation(cluster, args.runs)
                loads = [load_once(cluster) for _ in range(args.loads)]
                row[transport] = {
                    "switch_s": round(switch, 1),
                    "generation_tps": gen,
                    "load_mib": [round(m, 2) for m, _ in loads],
                    "load_s": [round(s, 4) for _, s in loads],
                }
                log(
                    f"round {r + 1} {transport}: {statistics.median(gen):.1f} tok/s, load "
                    f"{statistics.median(m / s for m, s in loads):.0f} MiB/s ({loads[0][0]:.1f} MiB), switch {switch:.0f} s"
                )
            rounds.append(row)
    finally:
        shape(None)
        deploy(INVENTORY)
        lab.pin(unpin=True)
    write(args, rounds)


def summary(rounds: list[dict]) -> dict:
    out = {}
    for kind, value in (
        ("generation", lambda s: statistics.median(s["generation_tps"])),
        ("load", lambda s: statistics.median(m / t for m, t in zip(s["load_mib"], s["load_s"]))),
    ):
        per = {t: [value(r[t]) for r in rounds] for t in TRANSPORTS}
        ratios = [value(r["tunnel"]) / value(r["plain"]) for r in rounds]
        low, high = interval(ratios, seed=27)
        out[kind] = {
            "tunnel": round(statistics.median(per["tunnel"]), 2),
            "plain": round(statistics.median(per["plain"]), 2),
            "ratio": round(statistics.median(ratios), 3),
            "interval": [round(low, 3), round(high, 3)],
            "ratios": [round(x, 3) for x in ratios],
            "tunnel_ahead": sum(x > 1 for x in ratios),
        }
    g = out["generation"]
    out["added_ms_per_token"] = round(1000 / g["tunnel"] - 1000 / g["plain"], 3)
    return out


def write(args, rounds: list[dict]) -> None:
    s = summary(rounds)
    data = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": platform.node(),
        "rounds": args.rounds,
        "runs": args.runs,
        "loads": args.loads,
        "rate": args.rate,
        "summary": s,
        "data": rounds,
    }
    args.out.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
    g, ld = s["generation"], s["load"]
    added = s["added_ms_per_token"]
    lines = [
        "# What the RPC tunnel costs (rpc_transport: tunnel against plain)",
        "",
        f"`python3 -m benchmarks.rpc_tunnel --rounds {args.rounds} --runs {args.runs} --loads {args.loads} --rate {args.rate}`, "
        f"one run, {data['when']}, on the lab (pinned: coordinator core 0, workers core 1; every link shaped to "
        f"{args.rate}; rpc_cache off). Each round deploys both transports, the order swapped every round. Raw figures: "
        f"[{args.out.with_suffix('.json').name}]({args.out.with_suffix('.json').name}).",
        "",
        "| | tunnel | plain | tunnel / plain, median of rounds (95% interval) | rounds the tunnel was ahead | target |",
        "| --- | --- | --- | --- | --- | --- |",
        f"| generation, tokens/s | {g['tunnel']} | {g['plain']} | **{g['ratio']}** ({g['interval'][0]}-{g['interval'][1]}) | "
        f"{g['tunnel_ahead']} of {args.rounds} | ≥ 0.97 |",
        f"| model load, MiB/s to the workers | {ld['tunnel']} | {ld['plain']} | **{ld['ratio']}** ({ld['interval'][0]}-"
        f"{ld['interval'][1]}) | {ld['tunnel_ahead']} of {args.rounds} | ≥ 0.9 |",
        "",
        f"The tunnel adds {added} ms to each token here ({1000 / g['plain']:.2f} ms a token plain). "
        f"At the article's 26 tokens/s (38.5 ms a token) the same {added} ms would be "
        f"{added / (1000 / 26) * 100:.2f}% of a token: a ratio of {(1000 / 26) / (1000 / 26 + added):.3f}.",
        "",
        "Notes.",
        "- **Generation misses 0.97 on the lab.** The tunnel's cost is per message, not per byte: each RPC message "
        "waits for its reply, and each reply now passes two stunnel processes (the coordinator's end, the worker's), "
        "four more trips through a socket and a process wake-up. [tunnel-candidates.md](tunnel-candidates.md) measures "
        "one round trip: about 47 µs more than plain, for stunnel and for SSH forwarding alike. The added time a token "
        "divided by that is the number of round trips a token makes to the two workers. The lab's model computes a "
        "token in about 3 ms, so a fixed 0.5-0.6 ms weighs 15%; a GPU pair at the article's 26 tokens/s spends 38 ms a "
        "token and the same messages, so the same cost weighs the percentage above. On the lab both workers and their "
        "tunnels share one core (lab pin), so every stunnel wake-up also waits for rpc-server's compute: on hosts with "
        "idle cores the round trip is cheaper, not dearer.",
        "- **The load is the link's.** Both transports fill the 1 Gbit/s link (114 MiB/s is 0.96 Gbit/s); TLS's "
        "22 bytes a record of up to 16 KiB (header, AES-GCM tag, type) are 0.13%. The window ends at the last KV buffer on a worker: SET_TENSOR has no "
        "reply, so llama.cpp is done writing the weights once they sit in socket buffers, and through a tunnel there "
        'are more of those (an earlier version of this script, ending at "constructing llama_context", showed the '
        "tunnel at 1.2x plain for that reason).",
        "- rpc_cache is off on both sides: with it, a reload sends the large tensors' hashes only, and the load would "
        "measure the cache.",
        "",
    ]
    args.out.write_text("\n".join(lines))
    log(f"wrote {args.out}: generation {g['ratio']} {g['interval']}, load {ld['ratio']} {ld['interval']}")


if __name__ == "__main__":
    main()
