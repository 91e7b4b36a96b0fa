"""When the new version failed its health check: every host keeps the failed version's files and
logs, puts back what this run replaced (the launch scripts and units name the previous image, which
is never deleted), and restarts; the coordinator waits for /health again and the deploy exits 1."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import server

from .. import render, roles
from ..quoting import shell
from ..run import Run
from ..settings import COORDINATOR, WORKERS
from .shared import ready_probe, wait_for_health


@deploy("Roll back when the new version failed its health check")
def roll_back(run: Run):
    cluster = run.deployment.cluster
    role = cluster.role(host.name)
    failed = f"{cluster.settings['state_dir']}/failed/{run.run_id}"
    unit = roles.of(cluster, cluster.host(host.name)).server
    replaced = run.replaced.get(host.name, [])  # what this run replaced here (a .previous was kept)
    server.shell(
        name=f"Keep the failed version's files and {unit} log in {failed}",
        commands=[
            f"mkdir -p {shell(failed)} && journalctl -u {unit} -n 2000 --no-pager > {shell(f'{failed}/{unit}.log')}; "
            + "".join(f"cp -a {shell(path)} {shell(failed + '/')}; " for path in replaced)
        ],
        _if=run.health_failed,
    )
    # one operation on every host, whatever it replaced: the same shape everywhere (see services.put)
    server.shell(
        name="Put back the files this run replaced",
        commands=[" && ".join(f"cp -a {shell(path + '.previous')} {shell(path)}" for path in replaced)]
        if replaced
        else [],
        _if=run.health_failed,
    )
    reload_firewall = role == WORKERS and cluster.host(host.name).settings["rpc_firewall"]
    firewall = f"systemctl reload {roles.FIREWALL_UNIT}; " if reload_firewall else ""
    # the front's previous files, if this run replaced them: reloaded first (a reload strands what it holds
    # in the old process, which no longer checks llama-server: not while llama-server restarts)
    front_files = render.front_files(cluster) if role == COORDINATOR else {}
    front = (
        f"systemctl try-reload-or-restart {roles.FRONT_UNIT}; " if any(path in front_files for path in replaced) else ""
    )
    # the tunnel's previous configuration (its keys stay: every host got the same generation's)
    tunnel_files = render.tunnel_files(cluster, cluster.host(host.name))
    tunnel = (
        f"systemctl try-reload-or-restart {roles.TUNNEL_UNIT}; "
        if any(path in tunnel_files for path in replaced)
        else ""
    )
    server.shell(
        name=f"Restart {unit} on the previous version",
        commands=[f"systemctl daemon-reload; {firewall}{front}{tunnel}systemctl restart {unit}"],
        _if=run.health_failed,
    )
    if role == COORDINATOR:
        url, _ = ready_probe(cluster)
        server.shell(
            name="Previous version healthy again?",
            commands=[wait_for_health(cluster, ready=False)],
            _if=run.health_failed,
            _ignore_errors=True,
        )
        server.shell(
            name="Say so: the new version was rolled back",
            commands=[
                f"echo {shell(f'the new version failed its health check ({url}): every host is back on the previous launch scripts, units and image; the failed version and its logs are in {failed} on each host')} >&2; exit 1"
            ],
            _if=run.health_failed,
        )
