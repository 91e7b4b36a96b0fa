"""Speculative decoding over the split: tokens/s, and what crosses the wire per generated token, each mode against plain.

    python3 -m benchmarks.speculation [--rounds 3] [--runs 3] [--out docs/results/speculation.md]

The lab up and deployed (`python3 -m llama_rpc_deploy lab up --workers 2`, then `pyinfra -y .lab/inventory.py
deploy.py`); about 20 minutes with 3 rounds. Each lab host is pinned to its own core (`lab pin`).

Two targets, each with the modes the deploy offers:
  sentence  the lab's model: plain; the lab's draft (lab.DRAFT_MODEL, which skips every third word, so some drafts
            fail) on the coordinator's CPU (the default); the same draft on RPC0, a worker's device (asked for);
            ngram-mod (the sentence repeats);
  random    lab.RANDOM_MODEL, the same vocabulary and shape with random weights, whose text no draft predicts:
            plain; the draft; ngram-mod.
Each round deploys every (target, mode), the order turned by one every round, and runs --runs times, after a
warm-up, two greedy completions of PROMPT: SHORT and LONG tokens. From each: llama-server's own tokens/s (the LONG
one's timings), drafted and accepted tokens, and the kernel's counters on the coordinator (`ss -tin`) for
llama-server's connection to each worker (its --rpc endpoint): bytes down (bytes_received), bytes up (bytes_acked),
data segments down (data_segs_in). Per generated token = (LONG's - SHORT's) / (LONG - SHORT): what the prompt and
a request's start cost falls out.

Round trips: rpc-server answers only a few commands (GET_TENSOR above all); in plain decoding one reply per
worker per token, of 8 + 4 * n_embd bytes from a worker whose layers hand on the activations and 8 + 4 * n_vocab
from the one with the output layer: the report checks the counter against that hand count. A reply is a few KB
and on the coordinator's loopback (the tunnel's end, or a LAN's MSS for larger ones) most replies come as one data
segment: data_segs_in per token is the report's estimate of round trips, stated as such.

The ratio mode / plain is the median over rounds of each round's ratio of medians, with a 95% bootstrap interval
over rounds. The lab is deployed as its inventory says and unpinned at the end. Writes --out and its .json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from benchmarks.labkit import INVENTORY, RESULTS, cpu_model, deploy, git, interval, log, on
from lab import lab
from lab.testmodel import PROMPT, sentence_vocabulary
from llama_rpc_deploy import client, wire
from llama_rpc_deploy.loading import offline_cluster
from llama_rpc_deploy.loadtest import until_serving

SHORT, LONG = 16, 64
TARGETS = {"sentence": lab.MODEL, "random": lab.RANDOM_MODEL}
MODES = {
    "plain": {},
    "draft (coordinator CPU)": {"llama_spec_draft_path": lab.DRAFT_MODEL},
    "draft on RPC0 (a worker)": {"llama_spec_draft_path": lab.DRAFT_MODEL, "llama_spec_draft_device": "RPC0"},
    "ngram-mod": {"llama_spec_type": "ngram-mod"},
}
CASES = [("sentence", m) for m in MODES] + [("random", m) for m in ("plain", "draft (coordinator CPU)", "ngram-mod")]
COUNTERS = wire.COUNTERS


def counters(endpoints: list[str]) -> dict[str, dict[str, int]]:
    """The coordinator's counters for its connection to each endpoint (llama-server's, to rpc-server or the tunnel)."""
    coordinator = lab.host_names(len(endpoints))[0]
    return {endpoint: wire.parse(on(coordinator, wire.command(endpoint))) for endpoint in endpoints}


def completion(cluster, n: int, prompt: str = PROMPT) -> tuple[dict, dict]:
    before = counters(cluster.rpc_endpoints)
    reply = client.complete(cluster, prompt, n, temperature=0, return_tokens=True)
    after = counters(cluster.rpc_endpoints)
    delta = {e: {k: after[e][k] - before[e][k] for k in COUNTERS} for e in before}
    return reply, delta


def measure(cluster, runs: int, prompt: str = PROMPT) -> list[dict]:
    completion(cluster, LONG, prompt)  # warm-up: graphs built, the draft's context too
    out = []
    for _ in range(runs):
        short, d_short = completion(cluster, SHORT, prompt)
        long, d_long = completion(cluster, LONG, prompt)
        n = long["timings"]["predicted_n"] - short["timings"]["predicted_n"]
        out.append(
            {
                "tokens_per_s": long["timings"]["predicted_per_second"],
                "drafted": long["timings"].get("draft_n", 0),
                "accepted": long["timings"].get("draft_n_accepted", 0),
                "tokens": long["tokens"],
                "per_token": {
                    e: {k: (d_long[e][k] - d_short[e][k]) / n for k in COUNTERS} for e in cluster.rpc_endpoints
                },
            }
        )
    return out


def deployed(data: dict, inventory: Path = INVENTORY):
    """The lab deployed with these settings (the deploy's --data, JSON where not a string), serving: its Cluster."""
    deploy(inventory, *(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in data.items()))
    cluster = offline_cluster(inventory, overrides=data)
    until_serving(cluster, 120, expect_down=False)
    return cluster


def ratio_rows(results: dict, cases: list[tuple[str, str]] = CASES, seed: int = 36) -> list[dict]:
    """Per (target, mode) of cases: its ratio to the target's plain mode, results[target][mode] a list of rounds,
    each a list of measure()'s runs."""
    rows = []
    for target, mode in cases:
        rounds = results[target][mode]
        plain = results[target]["plain"]
        ratios = [
            statistics.median(r["tokens_per_s"] for r in rounds[i])
            / statistics.median(r["tokens_per_s"] for r in plain[i])
            for i in range(len(rounds))
        ]
        every = [r for runs in rounds for r in runs]
        drafted, accepted = sum(r["drafted"] for r in every), sum(r["accepted"] for r in every)
        endpoints = list(every[0]["per_token"])
        wire = {e: {k: statistics.median(r["per_token"][e][k] for r in every) for k in COUNTERS} for e in endpoints}
        same = all(r["tokens"] == plain[0][0]["tokens"] for r in every)
        rows.append(
            {
                "target": target,
                "mode": mode,
                "tokens_per_s": statistics.median(r["tokens_per_s"] for r in every),
                "ratio": statistics.median(ratios),
                "interval": interval(ratios, seed=seed, digits=3) if len(ratios) > 1 else [ratios[0], ratios[0]],
                "acceptance": accepted / drafted if drafted else None,
                "drafted": drafted,
                "accepted": accepted,
                "same_tokens": same,
                "wire": wire,
            }
        )
    return rows


def table(rows: list[dict], first: str) -> list[str]:
    """ratio_rows' rows as a Markdown table, the first column (each row's "target") headed `first`."""
    lines = [
        f"| {first} | mode | tok/s | ratio (95%) | accepted / drafted | same tokens | per token, per worker: down B / up B / segs down |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        wire = "; ".join(
            f"{w['bytes_received']:.0f} / {w['bytes_acked']:.0f} / {w['data_segs_in']:.2f}" for w in r["wire"].values()
        )
        acc = f"{r['accepted']} / {r['drafted']} ({r['acceptance']:.0%})" if r["acceptance"] is not None else "-"
        lines.append(
            f"| {r['target']} | {r['mode']} | {r['tokens_per_s']:.1f} | {r['ratio']:.2f} "
            f"({r['interval'][0]:.2f} to {r['interval'][1]:.2f}) | {acc} | {'yes' if r['same_tokens'] else 'NO'} | {wire} |"
        )
    return lines


def report(rows: list[dict], meta: dict) -> str:
    n_embd, n_vocab = lab.MODEL_SHAPE.n_embd, meta["n_vocab"]
    lines = [
        "# Speculative decoding over the split (issue 36)",
        "",
        f"`python3 -m benchmarks.speculation --rounds {meta['rounds']} --runs {meta['runs']}`, {meta['date']}, "
        f"commit {meta['commit']}, {meta['cpu']}: the lab (coordinator and two CPU workers, each pinned to its own "
        "core), the draft on the coordinator's CPU unless said. Ratios: mode / plain tokens/s, the median of the "
        "rounds' ratios with a 95% bootstrap interval over rounds. Per generated token, per worker (its --rpc "
        "endpoint on the coordinator): bytes down / up and data segments down (the round-trip estimate).",
        "",
        *table(rows, "target"),
    ]
    plain = next(r for r in rows if r["target"] == "sentence" and r["mode"] == "plain")
    down = [w["bytes_received"] for w in plain["wire"].values()]
    lines += [
        "",
        f"Hand check, plain decoding: a worker that hands on activations sends 8 + 4 x {n_embd} = {8 + 4 * n_embd} B "
        f"a token, the one with the output layer 8 + 4 x {n_vocab} = {8 + 4 * n_vocab} B (logits). Measured: "
        + ", ".join(f"{d:.0f} B" for d in down)
        + ".",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "speculation.md")
    args = parser.parse_args(argv)
    results: dict = {t: {m: [] for m in MODES} for t in TARGETS}
    lab.pin()
    try:
        for round_ in range(args.rounds):
            turn = round_ % len(CASES)
            for target, mode in CASES[turn:] + CASES[:turn]:
                data = {"llama_model_path": TARGETS[target], **MODES[mode]}
                log(f"round {round_ + 1}: {target}, {mode}")
                cluster = deployed(data)
                results[target][mode].append(measure(cluster, args.runs))
    finally:
        deploy(INVENTORY)
        lab.pin(unpin=True)
    rows = ratio_rows(results)
    meta = {
        "rounds": args.rounds,
        "runs": args.runs,
        "date": time.strftime("%Y-%m-%d"),
        "commit": git("rev-parse", "--short", "HEAD"),
        "cpu": cpu_model(),
        "n_vocab": len(sentence_vocabulary()[0]),  # the sentence model's and the random target's
    }
    args.out.write_text(report(rows, meta))
    args.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
