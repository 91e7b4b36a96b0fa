"""`llama-rpc status -i INVENTORY`: the cluster's state at a glance, read over SSH (nothing changes).

Per host: each service and whether it runs, its restarts and their cause (systemd restarting a process
that died: a crash; a watchdog restarting it: the watchdog's reason), the image, its backend (cuda, vulkan,
cpu) and the RPC protocol its binaries speak, the devices rpc-server serves and the tensor cache (workers), the memory nvidia-smi reports (GPU hosts); on the
coordinator, llama.cpp's load report (weights and KV cache per device, where the projector went),
whether the API answers, and the front's figures (requests held, replayed and failed, the queue).
Exits 1 when a service is down or the API does not answer.
"""

from __future__ import annotations

import csv
import json
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import client, load_report, render, roles, speculation
from .cluster import Cluster, ClusterHost
from .loading import offline_cluster
from .remote import ssh_runner
from .quoting import shell
from .settings import COORDINATOR, WORKERS

CRASH = "Scheduled restart job"  # what systemd logs when it restarts a unit whose process ended


@dataclass
class Service:
    unit: str
    state: str  # systemctl is-active
    crashes: int = 0  # restarts by systemd after the process ended, in the journal
    last_crash: str = ""
    watchdog_restarts: int = 0
    last_watchdog_reason: str = ""


@dataclass
class HostStatus:
    name: str
    role: str
    services: list[Service] = field(default_factory=list)
    image: str = ""
    backend: str = ""  # the image's build: cuda, vulkan or cpu (its /app/backend)
    rpc_protocol: str = ""
    rpc_devices: list[str] = field(default_factory=list)  # what rpc-server serves, from its last start's log
    cache_bytes: int | None = None
    cache_limit_bytes: int | None = None
    gpu_memory: list[str] = field(default_factory=list)  # "name: used / total MiB"
    devices: dict = field(default_factory=dict)  # device -> {"model": MiB, "kv": MiB} (the coordinator's load report)
    projector_on: str | None = None
    api: str = ""  # "ok", or what went wrong
    front: dict = field(default_factory=dict)  # the front's figures (front_figures), on the coordinator
    speculation: dict = field(default_factory=dict)  # {"type", "drafted", "accepted", "drafts"} (speculation_of)
    sleep: dict = field(default_factory=dict)  # the coordinator: llama-sleep.py's state; a worker: {"asleep", "since"}

    @property
    def asleep(self) -> bool:
        """The workers sleep (llama-sleep.py): llama-server is stopped and the workers are not asked, on purpose."""
        return bool(self.sleep.get("asleep_since") or self.sleep.get("asleep"))

    @property
    def ok(self) -> bool:
        stopped_to_sleep = {roles.COORDINATOR_UNIT} if self.asleep else set()
        return (
            all(s.state == "active" or s.unit in stopped_to_sleep for s in self.services)
            and self.api in ("", "ok", "asleep")
            and not self.sleep.get("failed")
        )


def cache_bytes_command(worker: ClusterHost) -> str:
    """A command that prints the bytes in a worker's tensor cache (%.0f: mawk prints big sums as 2.1e+09)."""
    return (
        f"find {shell(render.cache_dir(worker))} -maxdepth 1 -type f -printf '%s\\n' 2>/dev/null | "
        "awk '{ s += $1 } END { printf \"%.0f\\n\", s }'"
    )


def host_script(cluster: Cluster, host: ClusterHost) -> str:
    """One bash script for a host: sections that start with '== NAME', read by parse()."""
    mine = roles.of(cluster, host)
    unit, watchdog, container = mine.server, mine.watchdog, mine.container
    lines = []
    for u in mine.units:
        lines.append(f"echo '== unit {u}'; systemctl is-active {shell(u)} || true")
    lines += [
        f"echo '== crashes'; journalctl -u {shell(unit)} -o short-iso --no-pager 2>/dev/null | grep -F {shell(CRASH)} || true",
        f"echo '== watchdog'; journalctl -u {shell(watchdog)} -o short-iso --no-pager 2>/dev/null | grep -F ': restarting ' || true",
        f"echo '== image'; docker inspect --format '{{{{.Config.Image}}}}' {container} 2>/dev/null || true",
        f"echo '== protocol'; docker exec {container} cat /app/rpc-protocol 2>/dev/null || true",
        f"echo '== backend'; docker exec {container} cat /app/backend 2>/dev/null || true",
        "echo '== gpus'; command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.used,memory.total "
        "--format=csv,noheader,nounits 2>/dev/null || true",
    ]
    if mine.role == WORKERS:
        lines.append(f"echo '== cache'; {cache_bytes_command(host)}")
        # rpc-server lists its devices when it starts ("  Vulkan0: llvmpipe (...) (MiB, MiB free)"): the running
        # service's start (its invocation's log, whose start is the list; then a line per client connection)
        lines.append(
            f"echo '== rpc devices'; journalctl -u {shell(unit)} _SYSTEMD_INVOCATION_ID=\"$(systemctl show -p "
            f'InvocationID --value {shell(unit)})" -o cat --no-pager 2>/dev/null | head -n 200 | '
            "awk '/^Starting RPC server/ { n = 0; delete d } /^Devices:/ { on = 1; next } "
            "on && /^  [A-Za-z]+[0-9]*: / { d[n++] = substr($0, 3); next } { on = 0 } "
            "END { for (i = 0; i < n; i++) print d[i] }'"
        )
    else:
        lines.append(
            f"echo '== log'; journalctl -u {shell(unit)} -o cat --no-pager -n 20000 2>/dev/null | "
            "grep -E 'buffer size|CLIP using|loaded meta data|load_model: loading' || true"
        )
        lines.append(
            f"echo '== spec'; grep -oE -- '--spec-type [a-z0-9-]+' {shell(mine.launch_script)} | head -n 1 || true"
        )
        socket = shell(f"unix-connect:{roles.FRONT_SOCKET}")
        lines.append(f"echo '== front held'; echo 'show front' | socat -t 5 stdio {socket} 2>/dev/null || true")
        lines.append(f"echo '== front stat'; echo 'show stat' | socat -t 5 stdio {socket} 2>/dev/null || true")
        # whatever the settings say now (a deploy's --data may have set sleep_idle_seconds): llama-sleep's own word
        lines.append(f"echo '== sleep'; cat {shell(roles.SLEEP_STATE)} 2>/dev/null || true")
    return "\n".join(lines) + "\n"


def answer_parts(output: str) -> dict[str, list[str]]:
    """A host's answer to a script of `echo '== NAME'; command` parts: each part's lines by its name."""
    found: dict[str, list[str]] = {}
    current = None
    for line in output.splitlines():
        if line.startswith("== "):
            current = line[3:]
            found[current] = []
        elif current is not None:
            found[current].append(line)
    return found


def parse(name: str, role: str, output: str, cache_limit: int | None = None) -> HostStatus:
    sections = answer_parts(output)
    status = HostStatus(name=name, role=role, cache_limit_bytes=cache_limit)
    unit = roles.SERVER_UNIT[role]
    for key, value in sections.items():
        if key.startswith("unit "):
            status.services.append(Service(key[5:], (value or ["unknown"])[0].strip()))
    main = next((s for s in status.services if s.unit == unit), None)
    if main:
        crashes, restarts = sections.get("crashes", []), sections.get("watchdog", [])
        main.crashes, main.watchdog_restarts = len(crashes), len(restarts)
        main.last_crash = crashes[-1].split()[0] if crashes else ""
        main.last_watchdog_reason = restarts[-1].split(": ", 1)[-1] if restarts else ""
    status.image = " ".join(sections.get("image", [])).strip()
    status.rpc_protocol = " ".join(sections.get("protocol", [])).strip()
    status.backend = " ".join(sections.get("backend", [])).strip()
    status.rpc_devices = [line.strip() for line in sections.get("rpc devices", []) if line.strip()]
    status.gpu_memory = [line.strip() for line in sections.get("gpus", []) if line.strip()]
    if "cache" in sections:
        text = " ".join(sections["cache"]).strip()
        status.cache_bytes = int(text) if text.isdigit() else None
    spec = " ".join(sections.get("spec", [])).split()
    if spec:
        status.speculation = {"type": spec[-1]}
    if "front stat" in sections:
        status.front = front_figures(sections.get("front held", []), sections["front stat"])
    if "sleep" in sections:
        try:
            status.sleep = json.loads("\n".join(sections["sleep"]) or "{}")
        except ValueError:
            status.sleep = {}
    if "log" in sections:
        report = load_report.parse("\n".join(sections["log"]))
        status.devices = {
            d: {"model": report.model.get(d, 0.0), "kv": report.kv.get(d, 0.0)}
            for d in sorted({*report.model, *report.kv})
        }
        status.projector_on = report.clip_device
    return status


def front_figures(held: list[str], stat: list[str]) -> dict:
    """The front's figures from its admin socket: front.lua's `show front` (held, holding, expired) and
    HAProxy's `show stat` CSV (its frontend api, backend llama-server and its server llama-server;
    front.cfg.j2).
    Counted since the front last started or reloaded."""
    rows = {}
    lines = [line for line in stat if line.strip()]
    if lines and lines[0].startswith("# "):
        for row in csv.DictReader([lines[0][2:], *lines[1:]]):
            rows[(row["pxname"], row["svname"])] = row
    if not rows:
        return {}
    number = lambda key, field: int(rows.get(key, {}).get(field) or 0)  # noqa: E731
    api, backend = ("api", "FRONTEND"), (render.FRONT_BACKEND, "BACKEND")
    server = (render.FRONT_BACKEND, render.FRONT_SERVER)
    lua = dict(line.split(None, 1) for line in held if len(line.split()) == 2)
    return {
        "requests": number(api, "req_tot"),
        "held": int(lua.get("held", 0)),  # waited while llama-server was down, loading or drained
        "holding": int(lua.get("holding", 0)),  # waiting now: the queue
        "held_too_long": int(lua.get("expired", 0)),  # answered 503 past llama_front_hold_seconds
        "replays": number(backend, "wretr"),  # tries the front made again after llama-server died or was down
        "failed": number(api, "hrsp_5xx"),  # 5xx answers clients got (the front's own 503 to /health included)
        "cut": number(backend, "srv_abrt"),  # answers cut short by llama-server's end (streamed ones)
        "in_flight": number(server, "scur"),
        "llama_server": rows.get(server, {}).get("status", "unknown"),
    }


def collect(cluster: Cluster, inventory: Path) -> list[HostStatus]:
    """Every host's status over SSH, the coordinator's first; a worker that sleeps (the coordinator's
    llama-sleep.py says so) is not asked: it would not answer, and asking must not wake it."""
    out = []
    with ssh_runner(inventory) as run:
        for host in cluster.hosts:
            role = cluster.role(host.name)
            slept = out[0].sleep.get("workers", {}).get(host.name, {}) if out else {}
            if role == WORKERS and slept.get("asleep"):
                out.append(HostStatus(name=host.name, role=role, sleep=slept))
                continue
            try:
                result = run(host.name, "bash -s", input=host_script(cluster, host), timeout=60)
                output = result.stdout if result.returncode == 0 else ""
            except subprocess.TimeoutExpired:
                output = ""
            limit = int(host.settings["rpc_cache_max_gib"] * 2**30) if role == WORKERS else None
            status = parse(host.name, role, output, limit)
            if not output:
                status.services = [Service(roles.SERVER_UNIT[role], "unreachable (ssh)")]
            out.append(status)
    coordinator = out[0]
    try:
        health = client.get(cluster, "/health", timeout=10)
        coordinator.api = "ok" if health.get("status") == "ok" else f"/health says {health}"
    except Exception as error:  # refused, timed out, 503 while loading
        coordinator.api = "asleep" if coordinator.asleep else f"no answer ({error})"
    if coordinator.api == "ok" and coordinator.speculation and not cluster.router:
        try:  # the drafted and accepted tokens since llama-server started (it serves /metrics when it speculates)
            coordinator.speculation.update(speculation.counters(client.get_text(cluster, "/metrics", timeout=10)))
        except Exception as error:  # a restart under way
            coordinator.speculation["metrics"] = f"no answer ({error})"
    return out


def when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def sleep_rows(h: HostStatus) -> list[str]:
    """The sleep's lines: a worker asleep and since when; on the coordinator the idle time, wakes in the last day,
    the last wake's times and a failed wake's worker."""
    s = h.sleep
    if h.role == WORKERS:
        return [f"  asleep since {when(s['since'])}: not asked (llama-sleep on the coordinator wakes it)"]
    now = time.time()
    rows = [
        f"  sleep: the workers sleep after {s.get('idle_seconds')} s idle; "
        + (f"asleep since {when(s['asleep_since'])}" if s.get("asleep_since") else "awake")
        + "; "
        + ", ".join(
            f"{name} {'asleep' if w['asleep'] else 'awake'} since {when(w['since'])}"
            for name, w in s.get("workers", {}).items()
        )
    ]
    wakes = [t for t in s.get("wakes", []) if t > now - 86400]
    last = s.get("last_wake")
    line = f"  wakes in the last 24 h: {len(wakes)}"
    if last:
        first = last.get("first_answer_s")
        line += (
            f"; the last at {when(last['at'])}: every worker answered {last['hello_s']} s after the first magic "
            f"packet, llama-server up {last['ready_s']} s"
            + (f" and its first answer {first} s" if first is not None else "")
            + " after the request that woke them"
        )
    rows.append(line)
    if s.get("failed"):
        rows.append(f"  LAST WAKE FAILED at {when(s['failed']['at'])}: {s['failed']['message']}")
    return rows


def table(hosts: list[HostStatus]) -> str:
    rows = []
    for h in hosts:
        if h.role == WORKERS and h.asleep:
            rows += [f"{h.name} ({h.role})", *sleep_rows(h)]
            continue
        rows.append(
            f"{h.name} ({h.role})  backend {h.backend or '-'}  image {h.image or '-'}  "
            f"RPC protocol {h.rpc_protocol or '-'}" + (f"  API {h.api}" if h.role == COORDINATOR else "")
        )
        for device in h.rpc_devices:
            rows.append(f"  serves {device}")
        for s in h.services:
            restarts = ""
            if s.crashes or s.watchdog_restarts:
                restarts = (
                    f"  restarts: {s.crashes} after a crash{f' (last {s.last_crash})' if s.last_crash else ''}, "
                    f"{s.watchdog_restarts} by its watchdog"
                    f"{f' (last: {s.last_watchdog_reason})' if s.last_watchdog_reason else ''}"
                )
            rows.append(f"  {s.unit:<32} {s.state}{restarts}")
        if h.cache_bytes is not None:
            rows.append(f"  tensor cache {h.cache_bytes / 2**20:.1f} MiB of {h.cache_limit_bytes / 2**30:g} GiB")
        for gpu in h.gpu_memory:
            rows.append(f"  GPU {gpu} (name, used MiB, total MiB)")
        for device, mib in h.devices.items():
            rows.append(f"  {device:<40} weights {mib['model']:9.2f} MiB  KV {mib['kv']:9.2f} MiB")
        if h.projector_on:
            rows.append(f"  vision projector on {h.projector_on}")
        if h.speculation:
            s = h.speculation
            drafted, accepted = s.get("drafted", 0), s.get("accepted", 0)
            share = f" ({accepted / drafted:.0%})" if drafted else ""
            rows.append(
                f"  speculative decoding: {s['type']}: {accepted} of {drafted} drafted tokens accepted{share}, "
                f"{s.get('drafts', 0)} drafts since llama-server started"
                + (f" (metrics: {s['metrics']})" if "metrics" in s else "")
            )
        if h.sleep:
            rows += sleep_rows(h)
        if h.front:
            f = h.front
            rows.append(
                f"  front: {f['requests']} requests, {f['held']} held ({f['holding']} waiting now, "
                f"{f['held_too_long']} past the hold), {f['replays']} replays, {f['failed']} failed (5xx), "
                f"{f['cut']} cut; llama-server {f['llama_server']}, {f['in_flight']} in flight"
            )
    rows.append("all well" if all(h.ok for h in hosts) else "NOT WELL: " + ", ".join(h.name for h in hosts if not h.ok))
    return "\n".join(rows)


def to_json(hosts: list[HostStatus]) -> str:
    return json.dumps([dict(asdict(h), ok=h.ok) for h in hosts], indent=2)


def command(args) -> int:
    """`llama-rpc status`: 1 when something is wrong."""
    hosts = collect(offline_cluster(args.inventory), args.inventory)
    print(to_json(hosts) if args.json else table(hosts))
    return 0 if all(h.ok for h in hosts) else 1
