"""`llama-rpc tune` on the lab: an exhaustive sweep against tune, on an asymmetric lab, and tune on the symmetric one.

    python3 -m benchmarks.tune_lab [--quota 0.15] [--rounds 3] [--repeats 2] [--confirm 4] [--out docs/results/tune.md]

The lab up and deployed (`python3 -m llama_rpc_deploy lab up --workers 2`, then `pyinfra -y .lab/inventory.py
deploy.py`); about 25 minutes. Each lab host pinned to its own core (`lab pin`: the coordinator on core 0, the workers
on core 1). The places: the coordinator's CPU (the layers llama_n_gpu_layers leaves there), worker1's rpc-server
(RPC0), worker2's (RPC1); the lab deploys 3, 3 and 2 of the 8 layers.

1. asymmetric: worker1's rpc-server limited to `--quota` of a core by a CFS quota (`docker update --cpu-period
   10000 --cpu-quota ...` on its container, 10 ms periods), so that the deployed split is wrong for it.
   a. the sweep: every split of the 8 layers that fits, `--rounds` rounds, each round in the other order;
   b. tune (`--repeats` measurements a side per comparison, `--confirm` a side for the confirmation) with a
      budget of a third of the sweep's measurements.
2. symmetric: the quota lifted; tune again, same budget.

Targets (issue 24): tune's best within 2% of the sweep's best (by the sweep's own medians), with at most a third of
its measurements; on the asymmetric lab the tuned split at least 1.10x the deployed one, or the sweep shows no
better split exists; on the symmetric lab no significant gain, nothing changed. Writes docs/results/tune.md, docs/results/tune.json
and docs/results/tune-sweep.png, docs/results/tune-asymmetric.png, docs/results/tune-symmetric.png. The lab is unpinned, the quota lifted
and the deployed split back in place at the end.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import time
from pathlib import Path

from benchmarks.labkit import INVENTORY, RESULTS, cpu_model, deploy, git, log
from lab import lab
from llama_rpc_deploy import tune

SLOW = f"{lab.PREFIX}-worker1"
PERIOD_US = 10_000


def quota(fraction: float | None) -> None:
    """worker1's rpc-server limited to fraction of a core (None: no limit): a CFS quota on its container, set by
    the worker's own dockerd (a quota on the lab host's container does not reach the containers its dockerd runs)."""
    args = (
        ["--cpu-period", str(PERIOD_US), "--cpu-quota", str(int(fraction * PERIOD_US))]
        if fraction
        else ["--cpu-quota", "-1"]
    )
    subprocess.run(["docker", "exec", SLOW, "docker", "update", *args, "rpc-server"], check=True, capture_output=True)
    log(f"{SLOW}'s rpc-server: {'limited to ' + str(fraction) + ' of a core' if fraction else 'no CPU limit'}")


def medians(report: tune.Report) -> dict[tuple[int, ...], float]:
    return {split: statistics.median(values) for split, values in report.by_split().items()}


def summary(name: str, report: tune.Report, sweep: dict | None, sweep_calls: int | None) -> dict:
    r = report.result
    out = {
        "name": name,
        "start": list(r.start),
        "best": list(r.best),
        "gain": round(r.gain, 4),
        "interval": [round(x, 4) for x in r.interval],
        "significant": r.significant,
        "reason": r.reason,
        "measurements": len(r.measurements),
        "switch_s_median": round(statistics.median(report.switch_seconds), 2) if report.switch_seconds else None,
    }
    if sweep:
        best_sweep = max(sweep, key=sweep.get)
        out.update(
            sweep_best=list(best_sweep),
            sweep_best_value=round(sweep[best_sweep], 2),
            tuned_in_sweep=round(sweep.get(r.best, 0.0), 2),
            tuned_over_sweep_best=round(sweep.get(r.best, 0.0) / sweep[best_sweep], 4),
            deployed_in_sweep=round(sweep[r.start], 2),
            sweep_best_over_deployed=round(sweep[best_sweep] / sweep[r.start], 4),
            measurements_over_sweep=round(len(r.measurements) / sweep_calls, 3),
        )
    return out


def markdown(
    meta: dict,
    sweep_report: tune.Report,
    sweep: dict,
    asym: dict,
    sym: dict,
    asym_report: tune.Report,
    sym_report: tune.Report,
) -> str:
    places = ", ".join(sweep_report.places)
    rows = "\n".join(
        f"| {list(s)} | {len(sweep_report.by_split()[s])} | {v:.1f} | {v / sweep[sweep_report.start]:.3f} |"
        for s, v in sorted(sweep.items(), key=lambda kv: -kv[1])
    )
    met_near = asym["tuned_over_sweep_best"] >= 0.98 and asym["measurements_over_sweep"] <= 1 / 3
    met_gain = (asym["significant"] and asym["gain"] >= 1.10) or asym["sweep_best_over_deployed"] < 1.10
    met_sym = not sym["significant"] and sym["best"] == sym["start"]

    def run_lines(report: tune.Report) -> str:
        return "\n".join(
            f"| {i} | {s['split']} | {s['value']} | {s['generation']} | {s['prompt']} |"
            for i, s in enumerate(report.samples)
        )

    return f"""# `llama-rpc tune` on the lab

`python3 -m benchmarks.tune_lab --quota {meta["quota"]} --rounds {meta["rounds"]} --repeats {meta["repeats"]} --confirm {meta["confirm"]}`, {meta["date"]}, commit {meta["commit"]},
on {meta["machine"]}. The lab: the coordinator (CPU), worker1 and worker2 (rpc-server on CPU), the 8-layer test
model, each host pinned to its own core (coordinator core 0, workers core 1). Places, in llama.cpp's order: {places};
the lab deploys {list(sweep_report.start)}. Every figure is from this one run (`docs/results/tune.json` has every measurement).

A measurement: llama-server restarted with the split (its launch script rendered by the deploy's code with that split's
llama_n_gpu_layers and llama_tensor_split; only llama-server restarts, behind the front), a warm-up, then
llama-server's own timings: generation tokens/s, the mean of a short-prompt and a long-prompt completion of 32 tokens.
Each switch took {asym["switch_s_median"]} s (median, restart to serving again).

## Asymmetric lab: worker1 limited to {meta["quota"]} of a core

### The sweep: every split, {meta["rounds"]} rounds ({len(sweep_report.samples)} measurements)

| split | runs | generation tokens/s (median) | vs deployed |
| --- | ---: | ---: | ---: |
{rows}

![sweep](tune-sweep.png)

### tune

From {asym["start"]}: best **{asym["best"]}**, **{asym["gain"]}x** the deployed split (95% interval {asym["interval"][0]} to
{asym["interval"][1]}), {"beyond the noise" if asym["significant"] else "within the noise"}; {asym["measurements"]}
measurements ({asym["measurements_over_sweep"]:.0%} of the sweep's); {asym["reason"]}.

- In the sweep, tune's best has {asym["tuned_in_sweep"]} tokens/s, the sweep's best ({asym["sweep_best"]})
  {asym["sweep_best_value"]}: **{asym["tuned_over_sweep_best"]}** of it (target: within 2%, with at most a third of the
  measurements): {"met" if met_near else "**not met**"}.
- The sweep's best over the deployed split: {asym["sweep_best_over_deployed"]}x; tune's gain {asym["gain"]}x (target:
  at least 1.10x, or the sweep shows no better split): {"met" if met_gain else "**not met**"}.

![asymmetric](tune-asymmetric.png)

| # | split | value | generation | prompt |
| ---: | --- | ---: | ---: | ---: |
{run_lines(asym_report)}

## Symmetric lab (no limit)

From {sym["start"]}: best {sym["best"]}, {sym["gain"]}x (95% interval {sym["interval"][0]} to {sym["interval"][1]}),
{"beyond the noise" if sym["significant"] else "within the noise: nothing changed"}; {sym["measurements"]} measurements;
{sym["reason"]}. Target (no significant gain, nothing changed): {"met" if met_sym else "**not met**"}.

![symmetric](tune-symmetric.png)

| # | split | value | generation | prompt |
| ---: | --- | ---: | ---: | ---: |
{run_lines(sym_report)}
"""


def symmetric_more(sweep_report: tune.Report, sweep: dict, sym: dict, again: dict, again_report: tune.Report) -> str:
    rows = "\n".join(
        f"| {list(s)} | {len(sweep_report.by_split()[s])} | {v:.1f} | {v / sweep[sweep_report.start]:.3f} |"
        for s, v in sorted(sweep.items(), key=lambda kv: -kv[1])
    )
    met_again = not again["significant"] and again["best"] == again["start"]
    return (
        f"""
### The symmetric lab's own sweep: every split, 2 rounds ({len(sweep_report.samples)} measurements)

In the same run, before tune above. tune's best has {sym["tuned_in_sweep"]} tokens/s here, the sweep's best
({sym["sweep_best"]}) {sym["sweep_best_value"]}: {sym["tuned_over_sweep_best"]} of it; the sweep's best over the
deployed split: {sym["sweep_best_over_deployed"]}x.

| split | runs | generation tokens/s (median) | vs deployed |
| --- | ---: | ---: | ---: |
{rows}

![symmetric sweep](tune-symmetric-sweep.png)

### tune again, on its own best

tune's best ({sym["best"]}) deployed (`--data` llama_n_gpu_layers and llama_tensor_split, as `--apply` writes them),
then tune again: best {again["best"]}, {again["gain"]}x (95% interval {again["interval"][0]} to {again["interval"][1]}),
{"beyond the noise" if again["significant"] else "within the noise: nothing changed"}; {again["measurements"]}
measurements; {again["reason"]}. No significant gain, nothing changed: {"met" if met_again else "**not met**"}.

| # | split | value | generation | prompt |
| ---: | --- | ---: | ---: | ---: |
"""
        + "\n".join(
            f"| {i} | {s['split']} | {s['value']} | {s['generation']} | {s['prompt']} |"
            for i, s in enumerate(again_report.samples)
        )
        + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quota", type=float, default=0.15, help="worker1's share of a core on the asymmetric lab")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the sweep")
    parser.add_argument("--repeats", type=int, default=2, help="tune's measurements of each side of a comparison")
    parser.add_argument("--confirm", type=int, default=4, help="tune's confirmation: measurements of each side")
    parser.add_argument("--out", type=Path, default=RESULTS / "tune.md")
    args = parser.parse_args()
    meta = {
        "quota": args.quota,
        "rounds": args.rounds,
        "repeats": args.repeats,
        "confirm": args.confirm,
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "commit": git("rev-parse", "--short", "HEAD")
        + (" (uncommitted changes)" if git("status", "--porcelain") else ""),
        "machine": f"{platform.machine()}, 2 cores ({cpu_model()}), Linux {platform.release()}",
    }
    lab.pin()
    try:
        quota(args.quota)
        sweep_report = tune.run(INVENTORY, sweep=True, repeats=args.rounds, log=log)
        sweep = medians(sweep_report)
        sweep_calls = len(sweep_report.samples)
        budget = sweep_calls // 3
        asym_report = tune.run(INVENTORY, budget=budget, repeats=args.repeats, confirm=args.confirm, log=log)
        asym = summary("asymmetric", asym_report, sweep, sweep_calls)
        log(f"asymmetric: {asym}")
        quota(None)
        sym_sweep_report = tune.run(INVENTORY, sweep=True, repeats=2, log=log)
        sym_sweep = medians(sym_sweep_report)
        sym_report = tune.run(INVENTORY, budget=budget, repeats=args.repeats, confirm=args.confirm, log=log)
        sym = summary("symmetric", sym_report, sym_sweep, len(sym_sweep_report.samples))
        log(f"symmetric: {sym}")
        # tune's best deployed (as --apply and a deploy would), then tune again: nothing left to gain
        tuned = sym_report.layout.settings(sym_report.result.best)
        data = [f"{k}={json.dumps(v)}" for k, v in tuned.items()]
        deploy(INVENTORY, *data)
        log(f"deployed {' '.join(data) or 'the lab’s own settings'}")
        again_report = tune.run(
            INVENTORY, budget=budget, repeats=args.repeats, confirm=args.confirm, overrides=tuned, log=log
        )
        again = summary("again", again_report, None, None)
        log(f"tuned split deployed, tune again: {again}")
    finally:
        quota(None)
        lab.pin(unpin=True)
        deploy(INVENTORY)
        log("deployed the lab’s own settings")
    docs = args.out.parent
    sweep_report.result = None
    sweep_report.plot(docs / "tune-sweep.png")
    asym_report.plot(docs / "tune-asymmetric.png")
    sym_report.plot(docs / "tune-symmetric.png")
    sym_sweep_report.plot(docs / "tune-symmetric-sweep.png")
    args.out.with_suffix(".json").write_text(
        json.dumps(
            {
                "meta": meta,
                "asymmetric": asym,
                "symmetric": sym,
                "again": again,
                "symmetric_sweep": [{"split": list(s), "values": v} for s, v in sym_sweep_report.by_split().items()],
                "again_samples": again_report.samples,
                "sweep": [{"split": list(s), "values": v} for s, v in sweep_report.by_split().items()],
                "asymmetric_samples": asym_report.samples,
                "symmetric_samples": sym_report.samples,
            },
            indent=1,
        )
        + "\n"
    )
    args.out.write_text(
        markdown(meta, sweep_report, sweep, asym, sym, asym_report, sym_report)
        + symmetric_more(sym_sweep_report, sym_sweep, sym, again, again_report)
    )
    print(args.out.read_text())


if __name__ == "__main__":
    main()
