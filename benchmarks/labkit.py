"""What the benchmarks share to drive the lab: the checkout's paths, a deploy of the lab with pyinfra, a log line,
a command on a lab host or on this machine, links limited to 1 Gbit/s, a bootstrap interval, and what a report says
about the machine and the commit.

    from benchmarks import labkit
"""

from __future__ import annotations

import platform
import random
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from lab import lab

ROOT = Path(__file__).resolve().parent.parent  # the checkout
RESULTS = (
    ROOT / "docs" / "results"
)  # where the benchmarks write their reports by default (docs/results/README.md lists them)
INVENTORY = lab.LAB_DIR / "inventory.py"  # the lab's, as `lab up` writes it

on = lab.run_on  # a shell command on a lab host (docker exec, as root): its stdout


def sh(*args: str, check: bool = True, **kw) -> str:
    """A command on this machine: its stdout, stripped."""
    return subprocess.run(list(args), capture_output=True, text=True, check=check, **kw).stdout.strip()


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def lab_hosts(cluster) -> list[str]:
    """The lab's host names for `on`: the coordinator, then worker1, worker2, ..."""
    return lab.host_names(len(cluster.workers))


# --- deploying the lab ---


@dataclass
class Deployed:
    """One run of the deploy: its --data, exit status, wall time and output."""

    data: tuple[str, ...]
    rc: int
    seconds: float
    stdout: str
    stderr: str

    def describe(self) -> str:
        return " ".join(a for d in self.data for a in ("--data", d))


def pyinfra(inventory: Path, *data: str, json_output: bool = False) -> Deployed:
    """`pyinfra -y [--json] [--data KEY=VALUE ...] INVENTORY deploy.py` in the checkout: the lab deployed with
    these settings over its own (none: its own settings), however it ends."""
    args = [a for d in data for a in ("--data", d)]
    start = time.monotonic()
    result = subprocess.run(
        ["pyinfra", "-y", *(["--json"] if json_output else []), *args, str(inventory), "deploy.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    return Deployed(data, result.returncode, time.monotonic() - start, result.stdout, result.stderr)


def deploy(inventory: Path, *data: str, json_output: bool = False) -> Deployed:
    """As pyinfra(); a deploy that fails raises RuntimeError with the end of its output."""
    done = pyinfra(inventory, *data, json_output=json_output)
    if done.rc != 0:
        raise RuntimeError(f"deploy {done.describe()} failed ({done.rc}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done


# --- links limited to 1 Gbit/s, both directions ---

LINK = "1gbit"
LINK_BYTES_PER_S = 125_000_000


def host_veth(name: str) -> str:
    """The control machine's end of a lab host's eth0 (traffic into the host leaves through it)."""
    index = on(name, "cat /sys/class/net/eth0/iflink")
    line = next(l for l in sh("ip", "-o", "link").splitlines() if l.split(":")[0] == index)
    return line.split(":")[1].strip().split("@")[0]


def limit_links(names: list[str], on_: bool = True) -> None:
    """tc tbf at LINK on each lab host's eth0 and on its veth here (both directions); on_=False removes them."""
    for name in names:
        for run in (
            lambda c: on(name, c, check=False),
            lambda c: sh("sh", "-c", c.replace("eth0", host_veth(name)), check=False),
        ):
            run("tc qdisc del dev eth0 root 2>/dev/null")
            if on_:
                run(f"tc qdisc add dev eth0 root tbf rate {LINK} burst 1250kb latency 50ms")


# --- statistics ---


def interval(
    values: list[float], *, seed: int, statistic=statistics.median, draws: int = 4000, digits: int | None = None
) -> list[float]:
    """A 95% bootstrap interval [low, high] of statistic(values): draws resamples with a fixed seed (the same data,
    the same interval), rounded to digits if given."""
    rng = random.Random(seed)
    stats = sorted(statistic(rng.choices(values, k=len(values))) for _ in range(draws))
    low, high = stats[int(0.025 * draws)], stats[int(0.975 * draws) - 1]
    return [round(low, digits), round(high, digits)] if digits is not None else [low, high]


# --- what a report says about where it ran ---


def cpu_model() -> str:
    """This machine's CPU, as /proc/cpuinfo names it."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    return next((l.split(":", 1)[1].strip() for l in lines if l.startswith("model name")), platform.processor())


def git(*args: str) -> str:
    """A git command in the checkout: its stdout, without trailing white space."""
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.rstrip()
