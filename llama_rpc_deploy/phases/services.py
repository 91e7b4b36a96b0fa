"""The services: on each worker the firewall, rpc-server and its watchdog; on the coordinator
llama-server (after its workers), the wait for /health, and its watchdog. Only what a change
affects restarts; every file a deploy replaces stays next to the new one as PATH.previous."""

from __future__ import annotations

import os

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import files, server, systemd

from .. import operations, render, roles, tunnel
from ..cluster import SERVICE_USER
from ..run import Run
from .shared import (
    Started,
    debian_packages,
    front_drain,
    health_probe,
    put_all,
    ready_probe,
    removed_if_left,
    service,
    wait_for_health,
)


def install_tunnel(run: Run, me) -> None:
    """stunnel with this host's key and certificate (tunnel.py) and its configuration (render.tunnel_files).
    New keys or peers reload it (the connections open stay up); a new unit restarts it, which cuts them, so it
    counts as a worker's restart (llama-server restarts after it). Where nothing is tunnelled (rpc_transport:
    plain), a tunnel left by an earlier deploy goes. Every host of a role makes the same operations."""
    cluster = run.deployment.cluster
    rendered = render.tunnel_files(cluster, me)
    config, unit = f"{me.settings['deploy_dir']}/{roles.TUNNEL_CONFIG}", f"{roles.UNIT_DIR}/{roles.TUNNEL_UNIT}"
    if not rendered:
        removed_if_left(
            "No RPC tunnel (rpc_transport: plain): one left by an earlier deploy removed",
            roles.TUNNEL_UNIT,
            roles.TUNNEL_DIR,
            config,
            unit,
        )
        return
    debian_packages("The tunnel's package", roles.TUNNEL_PACKAGES)
    files.directory(
        name=f"{roles.TUNNEL_DIR}: the tunnel's keys (mode 700, owner {SERVICE_USER})",
        path=roles.TUNNEL_DIR,
        user=SERVICE_USER,
        group=SERVICE_USER,
        mode="700",
    )
    keys = [
        operations.secret_file(
            name=f"Tunnel: {dest} (mode 400, owner {SERVICE_USER}, content never shown)",
            src=str(src),
            dest=dest,
            user=SERVICE_USER,
            group=SERVICE_USER,
        )
        for dest, src in host.loop(tunnel.host_sources(run.deployment.tunnel, me.name).items())
    ]
    ops = dict(zip(rendered, put_all(run, rendered)))
    new_unit = ops[unit].will_change
    reread = not new_unit and (ops[config].will_change or any(op.will_change for op in keys))
    restart = server.shell(
        name="RPC tunnel: restarted on its new unit",
        commands=[
            f"systemctl daemon-reload && systemctl enable --quiet {roles.TUNNEL_UNIT} && "
            f"systemctl restart {roles.TUNNEL_UNIT}"
        ]
        if new_unit
        else [],
    )
    server.shell(
        name="RPC tunnel: new keys or peers read again (the connections open stay up)",
        commands=[f"systemctl try-reload-or-restart {roles.TUNNEL_UNIT}"] if reread else [],
    )
    ensure = systemd.service(
        name="RPC tunnel running and enabled",
        service=roles.TUNNEL_UNIT,
        running=None if new_unit else True,
        enabled=None if new_unit else True,
    )
    run.tunnel_services[host.name] = Started(restart, ensure, new_unit)


@deploy("rpc-server on the worker")
def install_worker(run: Run):
    cluster, image = run.deployment.cluster, run.deployment.image_of(host.name)
    me = cluster.host(host.name)
    firewall = render.firewall_files(cluster, me)
    if firewall:  # before rpc-server (re)starts; a reload re-applies the rule without restarting rpc-server
        will_change = {path: op.will_change for path, op in zip(firewall, put_all(run, firewall))}
        systemd.service(
            name="Firewall: RPC port from the coordinator only",
            service=roles.FIREWALL_UNIT,
            running=True,
            enabled=True,
            reloaded=any(c for path, c in will_change.items() if not path.endswith(".service")),
            daemon_reload=any(c for path, c in will_change.items() if path.endswith(".service")),
        )
    install_tunnel(run, me)
    run.worker_services[host.name] = service(
        "rpc-server running and enabled",
        roles.WORKER_UNIT,
        put_all(run, render.worker_files(cluster, me, image)),
        _ignore_errors=True,
    )  # the health check decides
    service(
        "Watchdog: restart rpc-server when it holds a dead client",
        roles.WORKER_WATCHDOG_UNIT,
        put_all(run, render.worker_watchdog_files(me)),
    )
    service(
        f"Tensor cache kept under {me.settings['rpc_cache_max_gib']:g} GiB (a timer)",
        roles.CACHE_PRUNE_TIMER,
        put_all(run, render.cache_prune_files(me)),
    )


@deploy("The front, drained before a server restarts")
def install_front(run: Run):
    """HAProxy and socat, the front's files, and a reload of a running front on new files, all before any
    server restarts: a reload leaves the requests it holds in the old HAProxy process, which no longer
    checks llama-server's health, so it must not come while llama-server restarts. (The front's first
    start comes after llama-server's restart, in install_coordinator: before this version llama-server
    held llama_port.) Then, when any rpc-server or llama-server will restart (new files, a new image),
    the drain: the front stops sending new requests to llama-server (it holds them) and waits, bounded,
    for those in flight. llama-server cannot survive a worker's restart, so this comes before the workers'."""
    cluster = run.deployment.cluster
    debian_packages("The front's packages", roles.FRONT_PACKAGES)
    changed = any(op.will_change for op in put_all(run, render.front_files(cluster)))
    server.shell(
        name="The front reloaded on its new files, if it runs (its requests in flight finish in the old process)",
        commands=[f"systemctl daemon-reload && systemctl try-reload-or-restart {roles.FRONT_UNIT}"] if changed else [],
    )
    run.front_drain = server.shell(
        name=f"Drain the front (at most {cluster.settings['llama_front_drain_seconds']} s) before servers restart",
        commands=[front_drain(cluster, "drain")],
        _if=run.restart_planned,
    )


@deploy("llama-server on the coordinator")
def install_coordinator(run: Run):
    cluster, image = run.deployment.cluster, run.deployment.image
    s = cluster.settings
    install_tunnel(run, cluster.coordinator)  # its ends up before llama-server (re)starts through them
    changed = put_all(run, render.coordinator_files(cluster, image))
    if s["llama_api_key_file"]:
        # /etc/llama-rpc (mode 700) was made by distribute_image; no .previous copy of a secret
        changed.insert(
            0,
            operations.secret_file(
                name=f"API key as {roles.API_KEY_PATH} (mode 400, owner {SERVICE_USER}, content never shown)",
                src=os.path.expanduser(s["llama_api_key_file"]),
                dest=roles.API_KEY_PATH,
                user=SERVICE_USER,
                group=SERVICE_USER,
            ),
        )
    started = service(
        "llama-server running and enabled", roles.COORDINATOR_UNIT, changed, _ignore_errors=True
    )  # the health check below decides
    run.coordinator_service = started
    after_workers = server.shell(
        name="Restart llama-server after its workers restarted",
        commands=[f"systemctl restart {roles.COORDINATOR_UNIT}"],
        _ignore_errors=True,
        _if=lambda: run.coordinator_restart_needed(started),
    )
    # started here the first time (install_front reloads it): on an upgrade from a version without the
    # front, llama-server held llama_port until its restart above
    systemd.service(
        name=f"The front: HAProxy at {render.front_address(cluster)}, running and enabled",
        service=roles.FRONT_UNIT,
        running=True,
        enabled=True,
        _ignore_errors=True,
    )  # the health check below, through the front, decides
    _, probe = health_probe(cluster)

    def not_healthy_now():
        """Checked when the operation runs: after a restart, or whenever /health is not ok (a worker
        restarted, say). A healthy server that nothing touched is left alone: no change (with models on
        demand, whichever model a client loaded last stays loaded)."""
        return started.did_change() or after_workers.did_change() or not host.run_shell_command(probe)[0]

    # a failure here is not the end: rollback.py puts the previous version back on every host
    run.health_check = server.shell(
        name=f"Wait for {ready_probe(cluster)[0]} (at most {s['llama_health_timeout']} s)",
        commands=[wait_for_health(cluster)],
        _if=not_healthy_now,
        _ignore_errors=True,
    )
    service(
        "Watchdog: restart llama-server when it loses a worker",
        roles.WATCHDOG_UNIT,
        put_all(run, render.watchdog_files(cluster)),
    )
    server.shell(
        name="The front sends requests to llama-server again",
        commands=[front_drain(cluster, "ready")],
        _if=lambda: run.front_drain is not None and run.front_drain.did_change(),
    )
