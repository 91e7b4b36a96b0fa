"""The workers' sleep when idle (sleep_idle_seconds; docs/sleep.md). Checks first: each worker's NIC can wake it
(facts.WakeNic, sleep.nic_problem) and the coordinator has python3 for llama-sleep.py. Then on each worker
sleep-now.sh, the one command the coordinator's sleep key may run, and Wake-on-LAN on at every boot; on the
coordinator, after llama-server is checked, the sleep key and llama-sleep.service. With sleep_idle_seconds None,
an earlier deploy's key line and service go."""

from __future__ import annotations

from pyinfra import host, inventory, logger
from pyinfra.api import deploy
from pyinfra.operations import files, server

from .. import facts, operations, render, roles, sleep
from ..quoting import shell
from ..refusal import refuse
from ..remote import SLEEP_KEY_COMMENT, sleep_key
from ..run import Run
from ..settings import COORDINATOR
from . import prepare
from .shared import put_all, removed_if_left, service


def nic(cluster, worker) -> sleep.Nic:
    """The worker's waking NIC as read on the worker (the same fact on both hosts' reads: pyinfra asks once)."""
    lines = inventory.get_host(worker.name).get_fact(
        facts.WakeNic, coordinator=cluster.coordinator.address, interface=worker.settings["wol_interface"]
    )
    return sleep.chosen(worker, sleep.nic_of(lines))


def can_sleep(run: Run) -> None:
    """Refuse, before anything changes, a worker that could not be woken, or a coordinator without python3."""
    cluster = run.deployment.cluster
    if not cluster.settings["sleep_idle_seconds"]:
        return
    me = cluster.host(host.name)
    if cluster.role(host.name) == COORDINATOR:
        if prepare.lacks(me, ("python3", "ssh")):
            refuse(
                f"{host.name}: sleep_idle_seconds is set ({me.origins.get('sleep_idle_seconds', 'group_data')}) but "
                "python3 or ssh is missing there: llama-sleep.py needs both (apt-get install python3 openssh-client)"
            )
        return
    tools = ("ip", "ethtool") if me.settings["wol_check_nic"] else ("ip",)
    absent = host.get_fact(facts.MissingCommands, names=tools)
    if absent and prepare.is_prepared(me):  # the NIC is read now, before the prepare phase installs them
        refuse(
            f"{host.name}: sleep_idle_seconds is set, and the worker's NIC is read before the deploy changes anything, "
            f"but {' and '.join(absent)} {'is' if len(absent) == 1 else 'are'} not installed yet: expected one deploy "
            "without sleep_idle_seconds first (its prepare phase installs them), or apt-get install iproute2 ethtool"
        )
    found = nic(cluster, me)
    problem = sleep.nic_problem(me, found)
    if problem:
        refuse(problem)
    how = "sleep_command" if me.settings["sleep_command"] else me.settings["sleep_mode"]
    logger.info(
        f"    [{host.name}] can sleep ({how}) and be woken: {found.interface} {found.mac}, magic packets to "
        f"{found.broadcast}" + ("" if me.settings["wol_check_nic"] else " (wol_check_nic False: NIC not checked)")
    )


@deploy("The worker's sleep command and Wake-on-LAN")
def sleep_worker(run: Run) -> None:
    """sleep-now.sh and its key line on the worker (or the key line gone when sleep is off); Wake-on-LAN on now and
    at every boot (wol_check_nic)."""
    cluster = run.deployment.cluster
    me = cluster.host(host.name)
    on = bool(cluster.settings["sleep_idle_seconds"])
    found = nic(cluster, me) if on else None
    ops = put_all(run, render.worker_sleep_files(cluster, me, found))
    key = sleep_key(run.deployment.transfer_key) if on else None
    files.line(
        name="Accept the coordinator's sleep key, for sleep-now.sh only" if on else "No sleep key (sleep is off)",
        path="/root/.ssh/authorized_keys",
        line=f"^restrict,command=.* {SLEEP_KEY_COMMENT}$",
        replace=(
            f'restrict,command="{me.settings["deploy_dir"]}/{roles.SLEEP_NOW}" '
            f"{key.with_suffix('.pub').read_text().strip()}"
            if on
            else None
        ),
        present=on,
    )
    link = any(op.will_change for op in ops[2:])  # the .link file, with wol_check_nic
    server.shell(
        name="Wake-on-LAN (magic packet) on now; the .link file keeps it on at every boot",
        commands=[f"ethtool -s {shell(found.interface)} wol g"] if link else [],
    )


@deploy("The workers' sleep when idle (llama-sleep on the coordinator)")
def install_sleep(run: Run) -> None:
    """The sleep key and llama-sleep.service on the coordinator, restarted on new files; or gone (sleep off)."""
    cluster = run.deployment.cluster
    s = cluster.settings
    unit = f"{roles.UNIT_DIR}/{roles.SLEEP_UNIT}"
    if not s["sleep_idle_seconds"]:
        removed_if_left(
            "No sleep (sleep_idle_seconds is None): an earlier deploy's llama-sleep.service removed",
            roles.SLEEP_UNIT,
            unit,
            roles.SLEEP_STATE_DIR,
        )
        return
    key = operations.secret_file(
        name=f"Sleep key as {roles.SLEEP_KEY} (mode 400, content never shown)",
        src=str(sleep_key(run.deployment.transfer_key)),
        dest=roles.SLEEP_KEY,
        user="root",
        group="root",
    )
    nics = {w.name: nic(cluster, w) for w in cluster.workers}
    ops = put_all(run, render.sleep_files(cluster, nics))
    service(f"The workers sleep after {s['sleep_idle_seconds']} s idle (llama-sleep)", roles.SLEEP_UNIT, [key, *ops])
