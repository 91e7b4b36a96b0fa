"""The workers' sleep and wake (sleep_idle_seconds): what the deploy learns about each worker's NIC, and what it
refuses before anything changes. The daemon is files/llama-sleep.py (on the coordinator); render.sleep_files
and render.worker_sleep_files write its settings and the workers' side; docs/sleep.md tells the whole story."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .loading import inventory_file, offline_cluster
from .programs import SLEEPER
from .quoting import shell, shell_line
from .refusal import refuse
from .remote import ssh_runner
from .roles import SLEEP_UNIT
from .settings import SettingsError

SLEEP_COMMANDS = {"suspend": "systemctl suspend", "hibernate": "systemctl hibernate", "poweroff": "systemctl poweroff"}
KEEP_AWAKE = 600  # seconds the workers stay up after `llama-sleep.py wake` (a redeploy's), whatever the idle clock
WAKE_RETRY_AFTER = 30  # seconds the front answers 503 at once after a failed wake, before a request tries again


@dataclass(frozen=True)
class Nic:
    """The worker's NIC that wakes it, as the deploy read it on the worker (facts.WakeNic)."""

    interface: str | None
    mac: str | None
    broadcast: str | None
    exists: bool
    wake_on: str | None  # ethtool's "Supports Wake-on: pumbg" letters; None: ethtool said nothing (or is missing)
    ethtool: bool  # whether ethtool is there


def nic_of(lines: list[str]) -> Nic:
    """facts.WakeNic's output: 'key value' lines."""
    found = {}
    for line in lines:
        key, _, value = line.strip().partition(" ")
        found.setdefault(key, value.strip())
    supports = re.search(r"Supports Wake-on:\s*(\S+)", "\n".join(lines))
    return Nic(
        interface=found.get("interface") or None,
        mac=(found.get("mac") or "").lower() or None,
        broadcast=found.get("broadcast") or None,
        exists=found.get("exists") == "yes",
        wake_on=supports.group(1) if supports else None,
        ethtool=found.get("ethtool") == "yes",
    )


def chosen(worker, nic: Nic) -> Nic:
    """nic with what the inventory says in its place (wol_mac, wol_broadcast win over what the host has)."""
    s = worker.settings
    return Nic(
        interface=s["wol_interface"] or nic.interface,
        mac=(s["wol_mac"] or nic.mac or "").lower() or None,
        broadcast=s["wol_broadcast"] or nic.broadcast,
        exists=nic.exists,
        wake_on=nic.wake_on,
        ethtool=nic.ethtool,
    )


def nic_problem(worker, nic: Nic) -> str | None:
    """Why this worker cannot sleep and be woken (one line naming the setting to change), or None."""
    s, where = worker.settings, worker.origins
    iface = s["wol_interface"]
    if iface and not nic.exists:
        return (
            f"{where.get('wol_interface', 'inventory')}: wol_interface {iface!r}: {worker.name} has no such network "
            f"interface (`ip link` there lists them; None: the one that holds its address)"
        )
    if not nic.interface or not nic.exists:
        return f"{worker.name}: no network interface found that reaches the coordinator: set wol_interface"
    if not nic.mac or nic.mac == "00:00:00:00:00:00":
        return f"{worker.name}: {nic.interface} has no MAC address for a magic packet: set wol_mac or wol_interface"
    if not nic.broadcast:
        return f"{worker.name}: {nic.interface} has no IPv4 broadcast address: set wol_broadcast"
    if s["wol_check_nic"]:
        if not nic.ethtool:
            return (
                f"{worker.name}: ethtool is missing, so whether {nic.interface} can wake on a magic packet is unknown: "
                f"apt-get install ethtool there (or set wol_check_nic: False if you set Wake-on-LAN up yourself)"
            )
        if not nic.wake_on or "g" not in nic.wake_on:
            return (
                f"{where.get('sleep_idle_seconds', 'group_data')}: sleep_idle_seconds is set, but {worker.name}'s "
                f"{nic.interface} cannot wake on a magic packet (ethtool: Supports Wake-on: {nic.wake_on or 'nothing'}"
                f", 'g' needed): use a NIC that can (wol_interface), or leave sleep_idle_seconds None"
            )
    return None


def sleep_line(worker) -> str:
    """The shell line sleep-now.sh runs on the worker: sleep_command's words, or sleep_mode's systemctl."""
    command = worker.settings["sleep_command"]
    return shell_line(*command) if command else SLEEP_COMMANDS[worker.settings["sleep_mode"]]


def wake_for_deploy(argv: list[str] = sys.argv) -> None:
    """Run from config.py, before pyinfra connects: a worker that sleeps would not answer pyinfra, so when the
    coordinator runs llama-sleep.service (an earlier deploy's, whatever the settings now), it wakes the workers
    first and keeps them up KEEP_AWAKE s. One SSH round trip when nothing sleeps; a worker that does not wake
    stops the deploy with the daemon's line. A coordinator it cannot reach is left to pyinfra to report."""
    inventory = Path(inventory_file(argv))
    if not inventory.is_file():
        return
    try:
        cluster = offline_cluster(inventory)
    except (SettingsError, OSError, SyntaxError):
        return  # preflight said why
    name, deploy_dir = cluster.coordinator.name, cluster.settings["deploy_dir"]
    sleeper = f"{deploy_dir}/{SLEEPER}"
    command = (
        f"if [ -f {shell(sleeper)} ] && systemctl is-active --quiet {SLEEP_UNIT}; "
        f"then python3 {shell(sleeper)} wake; else echo 'no sleep here'; fi"
    )
    with ssh_runner(inventory) as run:
        try:
            result = run(name, command, timeout=3700)
        except subprocess.TimeoutExpired:
            refuse(f"{name}: the workers sleep, and llama-sleep did not say within 3700 s whether they woke")
    said = result.stdout.strip()
    if result.returncode == 1:
        refuse(f"{name}: the workers sleep and did not wake, so the deploy cannot reach them: {said}")
    if result.returncode == 0 and "woken" in said:
        print(f"--> {name}: {said} (they stay up {KEEP_AWAKE} s, then sleep again when idle)", file=sys.stderr)
