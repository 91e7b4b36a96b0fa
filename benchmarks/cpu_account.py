"""Where the lab hosts' CPU time goes: every thread of every process on a lab host (its own and its nested
containers'), read from this machine's /proc (the lab hosts share its kernel), with the scheduler's own
counters (/proc/PID/task/TID/sched: run time, migrations between cores, context switches) and the cores
each thread may run on. A snapshot before and after a measurement gives the difference per process.

    from benchmarks.cpu_account import snapshot, difference
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from pathlib import Path

from lab import lab

FIELDS = {
    "se.sum_exec_runtime": "cpu_ms",
    "se.nr_migrations": "migrations",
    "nr_voluntary_switches": "voluntary_switches",
    "nr_involuntary_switches": "involuntary_switches",
}
STAT = {"page_faults": 7, "system_ms": 12}  # /proc/PID/task/TID/stat after "(comm) ": minflt, stime (ticks)
TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")
COUNTERS = (*FIELDS.values(), *STAT)


def container_ids() -> dict[str, str]:
    """Each lab host's container id -> the lab host's name."""
    return {lab.docker("inspect", "--format", "{{.Id}}", c): c.removeprefix(f"{lab.PREFIX}-") for c in lab.running()}


TOTAL = "(all of the host)"  # the host's whole cgroup: also the processes that ended between two snapshots


def _host_totals(owners: dict[str, str]) -> dict[tuple, dict]:
    """Each lab host's CPU time in all, from its cgroup's cpuacct.usage (Docker's cgroupfs driver on cgroup v1;
    none elsewhere)."""
    totals = {}
    for cid, host in owners.items():
        usage = Path(f"/sys/fs/cgroup/cpuacct/docker/{cid}/cpuacct.usage")
        if usage.exists():
            totals[(host, TOTAL, False, "", "", "")] = {k: 0.0 for k in COUNTERS} | {
                "cpu_ms": int(usage.read_text()) / 1e6,
                "cpus": "",
            }
    return totals


def _host_of(pid: str, owners: dict[str, str]) -> tuple[str, bool] | None:
    """(the lab host a process runs on, whether in a container of the host's dockerd: its cgroups lie under
    lab-nested/, lab/host.Dockerfile's cgroup-parent), or None for a process of no lab host."""
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return None
    hosts = [owners[cid] for cid in re.findall(r"[0-9a-f]{64}", text) if cid in owners]
    return (hosts[0], "/lab-nested/" in text) if hosts else None


def _sched(path: Path) -> dict[str, float]:
    values: dict[str, float] = {}
    for line in path.read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip() in FIELDS:
            values[FIELDS[key.strip()]] = float(value)
    return values


def snapshot(owners: dict[str, str] | None = None) -> dict[tuple, dict]:
    """(host, process name, in a container, pid, thread name, tid) -> the scheduler's counters, the page faults and system time
    (stat's, in clock ticks: coarse), and Cpus_allowed_list, now."""
    owners = owners if owners is not None else container_ids()
    threads: dict[tuple, dict] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        owner = _host_of(pid, owners)
        if owner is None:
            continue
        try:
            process = Path(f"/proc/{pid}/comm").read_text().strip()
            for tid in os.listdir(f"/proc/{pid}/task"):
                task = Path(f"/proc/{pid}/task/{tid}")
                values = _sched(task / "sched")
                stat = (task / "stat").read_text().rsplit(")", 1)[1].split()
                values["page_faults"] = float(stat[STAT["page_faults"]])
                values["system_ms"] = float(stat[STAT["system_ms"]]) * TICK_MS
                status = (task / "status").read_text()
                values["cpus"] = re.search(r"Cpus_allowed_list:\s*(\S+)", status).group(1)
                threads[(owner[0], process, owner[1], pid, (task / "comm").read_text().strip(), tid)] = values
        except (OSError, AttributeError):
            continue  # ended while being read
    return threads | _host_totals(owners)


def difference(before: dict[tuple, dict], after: dict[tuple, dict]) -> dict[tuple[str, str, bool], dict]:
    """(host, process name, in a container) -> the counters' growth between two snapshots, summed over its threads (a thread
    that started in between counts from zero; one that ended is lost), and the cores its threads may use."""
    totals: dict[tuple[str, str, bool], dict] = defaultdict(lambda: {k: 0.0 for k in COUNTERS} | {"cpus": set()})
    for key, now in after.items():
        then = before.get(key, {})
        entry = totals[key[:3]]
        for field in COUNTERS:
            entry[field] += now[field] - then.get(field, 0.0)
        entry["cpus"].add(now["cpus"])
    return {k: v | {"cpus": ",".join(sorted(v["cpus"]))} for k, v in totals.items()}
