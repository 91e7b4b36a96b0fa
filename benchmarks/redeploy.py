"""Full deploy against a no-op re-deploy, on a fresh lab, in one run.

    python3 -m benchmarks.redeploy [--workers 1] [--out docs/results/benchmarks.md]

Takes the lab down first (so the full deploy really builds and sends the image), brings it up,
then measures:
  - the full deploy's wall time and change count,
  - a second deploy with nothing changed: wall time, changes, image sends, and the bytes the
    coordinator sent meanwhile (its eth0 tx counter; pyinfra's own SSH traffic included),
  - the image's size and its zstd-compressed size on the wire,
  - a completion's tokens/s from the model split across the hosts (each host pinned to its own core).
Prints one JSON object and writes the Markdown table to --out.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.labkit import RESULTS, deploy as deploy_lab
from lab import lab
from llama_rpc_deploy.client import complete
from llama_rpc_deploy.deployment import from_cluster
from llama_rpc_deploy.loading import offline_cluster


def deploy(inventory: Path) -> tuple[float, dict]:
    """The lab deployed with its own settings: the wall time, and pyinfra's --json results."""
    done = deploy_lab(inventory, json_output=True)
    return done.seconds, json.loads(done.stdout)["results"]


def tx_bytes() -> int:
    return int(lab.run_on("coordinator", "cat /sys/class/net/eth0/statistics/tx_bytes"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS / "benchmarks.md")
    parser.add_argument("--json", type=Path, help="also write the figures here as JSON")
    args = parser.parse_args()

    lab.down()
    inventory = lab.up(workers=args.workers)
    image = from_cluster(offline_cluster(inventory), with_key=False).image

    full_s, full = deploy(inventory)
    sent_before = tx_bytes()
    noop_s, noop = deploy(inventory)
    sent_during_noop = tx_bytes() - sent_before
    sends = [op for op in noop["operations"] if " | Send " in op["name"] and (op["success"] or op["error"])]

    size = int(lab.run_on("coordinator", f"docker image inspect --format '{{{{.Size}}}}' {image}"))
    wire = int(lab.run_on("coordinator", f"docker save {image} | zstd -T0 -3 -c | wc -c"))

    lab.pin()
    try:
        complete(offline_cluster(inventory), "warm up", 4)
        timings = complete(offline_cluster(inventory), "Two computers, one model:", 64)["timings"]
    finally:
        lab.pin(unpin=True)

    figures = {
        "workers": args.workers,
        "full_deploy_s": round(full_s, 1),
        "full_deploy_changes": full["totals"]["success"],
        "noop_deploy_s": round(noop_s, 1),
        "noop_deploy_changes": noop["totals"]["success"],
        "noop_image_sends": len(sends),
        "noop_coordinator_tx_bytes": sent_during_noop,
        "noop_over_full": round(noop_s / full_s, 3),
        "image_bytes": size,
        "image_zstd_bytes": wire,
        "completion_tokens_per_s": round(timings["predicted_per_second"], 1),
        "completion_tokens": timings["predicted_n"],
    }
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    rows = "\n".join(f"| `{k}` | {v} |" for k, v in figures.items())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(f"""# Benchmarks

Measured with `python3 -m benchmarks.redeploy --workers {args.workers}` on a fresh lab
(2-core, no-GPU machine; CPU build of llama.cpp; the generated 8-layer test model).
The full deploy includes the first llama.cpp build (no compiler cache yet).
Target: a no-op re-deploy makes 0 changes, sends 0 image bytes and takes at most 0.15x the full deploy.

| figure | value |
| --- | --- |
{rows}

`noop_coordinator_tx_bytes` counts everything the coordinator sent during the no-op run (pyinfra's SSH
replies to the control machine included); an image send would be at least `image_zstd_bytes`.
""")


if __name__ == "__main__":
    main()
