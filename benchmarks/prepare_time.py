"""The prepare phase's time (issue 38): on bare hosts, and again on the same hosts once prepared (checks only).

    python3 -m benchmarks.prepare_time [--versions 12,13] [--again 3] [--out docs/results/prepare-time.md]

For each Debian release: a fresh bare coordinator and worker (lab/bare.py: systemd and sshd only, no images left for
Docker's first start), then, timed on this machine's clock, whole pyinfra runs against them:
  connect   `pyinfra INVENTORY exec -- true`: connecting and one command, the part of every run that is not the phase
  bare      `pyinfra INVENTORY benchmarks/prepare_only.py`: the prepare phase on the bare hosts (Debian's packages
            from deb.debian.org, Docker enabled and started)
  prepared  the same, AGAIN times, on the hosts it prepared: its facts and no change
The phase's own time is a run's minus the connect run's (median of AGAIN for prepared). The lab's hosts are
containers on this machine; their downloads come from Debian's mirror over this machine's link.
Writes docs/results/prepare-time.md and .json; the bare hosts are removed at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

from benchmarks import labkit
from lab import bare


def timed(*args: str) -> float:
    start = time.monotonic()
    result = subprocess.run(["pyinfra", "-y", *args], cwd=labkit.ROOT, capture_output=True, text=True)
    seconds = time.monotonic() - start
    if result.returncode != 0:
        raise SystemExit(f"pyinfra {' '.join(args)} failed:\n{result.stderr[-3000:]}")
    return seconds


def measure(version: str, again: int) -> dict:
    inventory = bare.up(version, images=False)
    try:
        connect = timed(str(inventory), "exec", "--", "true")
        labkit.log(f"Debian {version}: connect {connect:.1f} s")
        first = timed(str(inventory), "benchmarks/prepare_only.py")
        labkit.log(f"Debian {version}: bare {first:.1f} s")
        runs = [timed(str(inventory), "benchmarks/prepare_only.py") for _ in range(again)]
        labkit.log(f"Debian {version}: prepared {', '.join(f'{s:.1f}' for s in runs)} s")
    finally:
        bare.down(version)
    prepared = statistics.median(runs)
    return {
        "version": version,
        "connect_s": round(connect, 2),
        "bare_run_s": round(first, 2),
        "prepared_runs_s": [round(s, 2) for s in runs],
        "bare_phase_s": round(first - connect, 2),
        "prepared_phase_s": round(prepared - connect, 2),
        "ratio": round((first - connect) / max(prepared - connect, 0.01), 1),
    }


def report(results: list[dict]) -> str:
    lines = [
        "# The prepare phase's time: bare hosts, then prepared ones",
        "",
        "`python3 -m benchmarks.prepare_time` (benchmarks/prepare_time.py says how), one run, on "
        f"{labkit.cpu_model()}, commit {labkit.git('rev-parse', '--short', 'HEAD')}. A coordinator and a worker per "
        "release, bare (systemd and sshd only); the phase's time is a whole pyinfra run's minus that of a run "
        "that only connects.",
        "",
        "| Debian | connect | bare: run | bare: phase | prepared: runs | prepared: phase | bare / prepared |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['version']} | {r['connect_s']:.1f} s | {r['bare_run_s']:.1f} s | {r['bare_phase_s']:.1f} s | "
            f"{', '.join(f'{s:.1f}' for s in r['prepared_runs_s'])} s | {r['prepared_phase_s']:.1f} s | "
            f"{r['ratio']:.0f}x |"
        )
    lines += [
        "",
        "The bare phase's time is mostly apt: the package lists and Debian's packages (Docker Engine and its "
        "dependencies) from deb.debian.org through this machine's link, then Docker's first start. "
        "On a prepared host the phase reads its facts (os-release, the display controllers, dpkg's list, the "
        "docker command, systemd's units) and changes nothing.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", default="12,13")
    parser.add_argument("--again", type=int, default=3)
    parser.add_argument("--out", type=Path, default=labkit.RESULTS / "prepare-time.md")
    args = parser.parse_args()
    results = [measure(v, args.again) for v in args.versions.split(",")]
    args.out.write_text(report(results))
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    print(report(results))


if __name__ == "__main__":
    main()
