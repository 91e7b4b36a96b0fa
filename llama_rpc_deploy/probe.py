"""`llama-rpc probe -i INVENTORY`: what each host has, read over SSH (nothing changes), and the inventory lines that
say it; `plan --probe` plans with the cards it learns (learned_cluster).

Per host: its cards as nvidia-smi lists them (name, memory in MiB as CUDA reports it, compute capability) and as
`vulkaninfo --summary` lists the others (AMD, Intel: the name; the summary gives no memory), with the same commands
and parsers as the deploy's facts (facts.NvidiaGpus, facts.VulkanGpus); the system (PRETTY_NAME of /etc/os-release);
the NIC it reaches its peer through (a worker: the coordinator; the coordinator: the first worker), its speed
(/sys/class/net/IF/speed) and whether its link is up. Then one inventory line per host, to paste: its cards as
gpus.py names them, or as a dict for a card the table lacks. The hosts are reached as status.py reaches them
(remote.ssh_runner: the inventory's ssh_* data). A host that does not answer is one line, and exit status 1.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from . import facts, gpus
from .cluster import Cluster, ClusterHost
from .cluster_checks import with_learned
from .loading import offline_cluster
from .quoting import shell
from .remote import ssh_runner
from .status import answer_parts

TIMEOUT = 60  # seconds a host has to answer


@dataclass
class HostProbe:
    name: str
    role: str
    nvidia: list[gpus.Found] = field(default_factory=list)  # nvidia-smi's cards
    vulkan: list[gpus.Found] = field(default_factory=list)  # vulkaninfo's (which lists NVIDIA cards too)
    system: str = ""  # PRETTY_NAME
    nic: str = ""
    speed: str = ""  # Mb/s, as /sys/class/net/IF/speed says; "" where it says nothing (-1, or no such file)
    link: str = ""  # operstate: up, down, unknown
    error: str = ""  # why the host gave no answer

    def found(self, backend: str) -> list[gpus.Found]:
        """The cards the deploy learns on this host for its image_backend (phases/checks.GPU_FACTS): nvidia-smi's
        on cuda, vulkaninfo's on vulkan, none on cpu."""
        return {"cuda": self.nvidia, "vulkan": self.vulkan}.get(backend, [])

    @property
    def cards(self) -> list[gpus.Found]:
        """Every card the host has, each once: nvidia-smi's, then vulkaninfo's of other vendors."""
        return self.nvidia + [f for f in self.vulkan if f.vendor != "nvidia"]


def peer_of(cluster: Cluster, host: ClusterHost) -> str:
    """Whom the host talks to over the network: a worker to the coordinator, the coordinator to its first worker."""
    return cluster.workers[0].address if host.name == cluster.coordinator.name else cluster.coordinator.address


def host_script(peer: str) -> str:
    """One sh script: sections that start with '== NAME', read by parse()."""
    return (
        "\n".join(
            [
                f"echo '== nvidia'; {facts.NvidiaGpus().command()}",
                f"echo '== vulkan'; {facts.VulkanGpus().command()}",
                "echo '== system'; sed -n 's/^PRETTY_NAME=//p' /etc/os-release 2>/dev/null | tr -d '\"'",
                f"echo '== nic'; a=$(getent ahostsv4 {shell(peer)} | awk 'NR == 1 {{ print $1 }}'); "
                "i=$(ip -o route get \"$a\" 2>/dev/null | sed -nE 's/.* dev ([^ ]+).*/\\1/p'); "
                'echo "name $i"; [ -n "$i" ] && echo "speed $(cat "/sys/class/net/$i/speed" 2>/dev/null)" && '
                'echo "link $(cat "/sys/class/net/$i/operstate" 2>/dev/null)"; true',
            ]
        )
        + "\n"
    )


def parse(name: str, role: str, output: str) -> HostProbe:
    sections = answer_parts(output)
    nic = dict(line.split(" ", 1) for line in sections.get("nic", []) if " " in line)
    speed = nic.get("speed", "").strip()
    return HostProbe(
        name=name,
        role=role,
        nvidia=facts.NvidiaGpus().process(sections.get("nvidia", [])),
        vulkan=facts.VulkanGpus().process(sections.get("vulkan", [])),
        system=" ".join(sections.get("system", [])).strip(),
        nic=nic.get("name", "").strip(),
        speed=speed if speed.isdigit() else "",  # -1: no link; virtual NICs report nothing
        link=nic.get("link", "").strip(),
    )


def collect(cluster: Cluster, inventory: Path, hosts: list[ClusterHost] | None = None) -> list[HostProbe]:
    """Each host's probe over SSH (every host of the cluster, or those given), in the cluster's order."""
    out = []
    with ssh_runner(inventory) as run:
        for host in cluster.hosts if hosts is None else hosts:
            role = cluster.role(host.name)
            try:
                result = run(host.name, "sh -s", input=host_script(peer_of(cluster, host)), timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                out.append(HostProbe(host.name, role, error=f"no answer over SSH in {TIMEOUT} s"))
                continue
            if result.returncode != 0:
                reason = (result.stderr.strip().splitlines() or [f"ssh exit status {result.returncode}"])[-1]
                out.append(HostProbe(host.name, role, error=f"no answer over SSH: {reason}"))
                continue
            out.append(parse(host.name, role, result.stdout))
    return out


def unreachable(probes: list[HostProbe]) -> list[str]:
    """One line per host that did not answer."""
    return [f"error: probe: {p.name} ({p.role}): {p.error}" for p in probes if p.error]


def inventory_line(probe: HostProbe, host: ClusterHost) -> str:
    """The host's inventory line: its cards as gpus names them (a dict for a card the table lacks), and the
    image_backend they need where the host's is another one."""
    nvidia = [gpus.learned(f) for f in probe.nvidia]
    others = [gpus.learned(f) for f in probe.vulkan if f.vendor != "nvidia"]
    cards, backend = (nvidia, "cuda") if nvidia else (others, "vulkan") if others else ([], None)
    data: dict = {"gpus": [gpus.inventory_entry(g) for g in cards]}
    if backend and host.backend != backend:
        data["image_backend"] = backend
    line = f"({json.dumps(host.name)}, {json.dumps(data)}),"
    assumed = [g.name for g in cards if g.bandwidth_assumed]
    if assumed:
        line += f"  # not in gpus.py: add bandwidth_gbs (GB/s, the datasheet's) for {', '.join(assumed)}"
    return line


def card_line(found: gpus.Found, tool: str) -> str:
    known = gpus.table_entry(found)
    memory = f"{found.vram_mib} MiB" if found.vram_mib else "memory not reported"
    capability = f", compute capability {found.compute_cap}" if found.compute_cap else ""
    table = f"{known.name} in gpus.py" if known else "not in gpus.py"
    return f"  GPU {found.name}, {memory}{capability} ({tool}; {table})"


def report(cluster: Cluster, probes: list[HostProbe]) -> str:
    rows = []
    for p in probes:
        if p.error:
            continue
        host = cluster.host(p.name)
        rows.append(f"{p.name} ({p.role})  image_backend {host.backend}")
        rows.append(f"  system {p.system or 'unknown (no /etc/os-release)'}")
        speed = f"{p.speed} Mb/s" if p.speed else "speed unknown"
        rows.append(f"  NIC {p.nic or 'unknown'}, {speed}, link {p.link or 'unknown'}")
        rows += [card_line(f, "nvidia-smi") for f in p.nvidia]
        rows += [card_line(f, "vulkaninfo") for f in p.vulkan if f.vendor != "nvidia"]
        if not p.cards:
            rows.append("  no GPU (neither nvidia-smi nor vulkaninfo lists one)")
        if host.gpus_from == "settings":
            listed = ", ".join(g.name for g in host.gpus) or "none"
            rows.append(f"  the inventory lists gpus = {host.settings['gpus']!r} ({listed}): it wins")
    answered = [p for p in probes if not p.error]
    if answered:
        rows.append("inventory lines, to paste into inventory.py (what the inventory lists wins over the host):")
        rows += [f"  {inventory_line(p, cluster.host(p.name))}" for p in answered]
    return "\n".join(rows)


def learned_cluster(cluster: Cluster, inventory: Path) -> Cluster:
    """The cluster with the cards of every host whose gpus are not set learned from it over SSH (as the deploy learns
    them: cluster_checks.with_learned); a host that does not answer is an OSError (one line)."""
    if not cluster.unlearned:
        return cluster
    probes = collect(cluster, inventory, cluster.unlearned)
    lines = unreachable(probes)
    if lines:
        raise OSError(lines[0].removeprefix("error: probe: "))
    return with_learned(cluster, {p.name: p.found(cluster.host(p.name).backend) for p in probes}, str(inventory))


def command(args) -> int:
    """`llama-rpc probe`: 1 when a host does not answer."""
    cluster = offline_cluster(args.inventory, deploying=False)
    probes = collect(cluster, args.inventory)
    text = report(cluster, probes)
    if text:
        print(text)
    lines = unreachable(probes)
    for line in lines:
        print(line, file=sys.stderr)
    return 1 if lines else 0
