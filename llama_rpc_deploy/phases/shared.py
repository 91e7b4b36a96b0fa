"""What the phases share: uploading rendered files (the previous version kept), starting a unit on its new files,
Debian's packages, the barrier between phases, and the probes of llama-server's health (the deploy's wait, the
rollback's). Each phase module imports from here, never from another phase."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from io import StringIO

from pyinfra import host
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import File, Sha1File
from pyinfra.operations import apt, files, server, systemd

from .. import client, render, roles
from ..quoting import shell, shell_line
from ..run import Run


def barrier(run, label: str):
    """The same no-op on every host: pyinfra orders each host's operations, and a shared
    operation is what makes the workers' and the coordinator's steps wait for each other."""
    files.directory(
        name=f"== {label} ==", path=run.deployment.cluster.host(host.name).settings["deploy_dir"], mode="755"
    )


def put(run: Run, path: str, content: str, mode: str = "644"):
    """Upload rendered content. When it replaces different content, the old file stays as PATH.previous:
    the last working launch scripts and units survive a deploy that goes wrong.

    Every host creates the same operations whatever changed on it (the keep has no command where nothing is
    replaced): pyinfra orders all hosts' operations in one graph, and an operation made on some hosts only,
    in a loop, gave two workers opposite orders ("Cycle detected in operation ordering DAG")."""
    current = host.get_fact(Sha1File, path=path)
    replaces = bool(current) and current != hashlib.sha1(content.encode()).hexdigest()
    server.shell(
        name=f"Keep {path} as {path}.previous",
        commands=[f"cp -a {shell(path)} {shell(path + '.previous')}"] if replaces else [],
    )
    if replaces:
        run.keep_replaced(host.name, path)
    return files.put(name=f"Install {path}", src=StringIO(content), dest=path, mode=mode)


def put_all(run: Run, rendered: dict[str, str]) -> list:
    """put() each file (scripts executable); returns the operations. host.loop: each file's operations
    are told apart by their place in the loop, the same on every host."""
    return [
        put(run, path, content, mode="755" if path.endswith(".sh") else "644")
        for path, content in host.loop(rendered.items())
    ]


@dataclass(frozen=True)
class Started:
    """A unit's two operations, at most one of which has commands: the restart on new files, or
    'running and enabled'; planned: whether new files restart it (known before anything runs)."""

    restart: object
    ensure: object
    planned: bool = False

    def did_change(self) -> bool:
        """Whether this run (re)started the unit (asked when a later operation runs)."""
        return self.restart.did_change() or self.ensure.did_change()


def service(name: str, unit: str, files_ops: list, **arguments) -> Started:
    """The unit running and enabled, restarted (after a daemon-reload) when its files change: a plain
    `systemctl restart`, not pyinfra's start-when-stopped, so that a unit still starting on its old files
    (llama-server's wait for its workers) starts over on the new ones. Both operations exist on every host,
    whatever changed there (one of them without commands), so every host has the same shape, and --dry
    shows a restart only where one will happen."""
    restarts = any(op.will_change for op in files_ops)
    restart = server.shell(
        name=f"{name}: restarted on its new files",
        commands=[f"systemctl daemon-reload && systemctl enable --quiet {unit} && systemctl restart {unit}"]
        if restarts
        else [],
        **arguments,
    )
    ensure = systemd.service(
        name=name, service=unit, running=None if restarts else True, enabled=None if restarts else True, **arguments
    )
    return Started(restart, ensure, restarts)


def removed_if_left(name: str, unit: str, *paths: str):
    """A unit an earlier deploy installed and this one does not want: stopped, disabled, and removed with paths (its
    unit file among them). The operation exists on every host; it has commands only where the unit file is left."""
    left = host.get_fact(File, path=f"{roles.UNIT_DIR}/{unit}")
    return server.shell(
        name=name,
        commands=[f"systemctl disable --now {unit}; rm -rf {shell_line(*paths)} && systemctl daemon-reload"]
        if left
        else [],
    )


def debian_packages(what: str, packages: tuple[str, ...]):
    """Debian's packages installed (no recommends), the package lists updated first only when one is missing."""
    missing = [p for p in packages if p not in (host.get_fact(DebPackages) or {})]
    return apt.packages(
        name=f"{what}: {', '.join(packages)}", packages=list(packages), update=bool(missing), no_recommends=True
    )


def health_probe(cluster) -> tuple[str, str]:
    """(the /health URL, a command on the coordinator that succeeds when it answers ok). Through the front,
    as clients see it: it answers 503 at once while llama-server is not up."""
    url = client.server_url(cluster) + "/health"
    return url, f"docker exec llama-server curl -fsS --max-time 5 {shell(url)}"


def ready_probe(cluster) -> tuple[str, str]:
    """What the deploy waits for after a (re)start: /health; with models on demand, the router's /props
    of llama_model_path's model, which it loads at start and which answers only once that model is loaded
    across the workers (/health answers as soon as the router is up, whatever model is loaded)."""
    if not cluster.router:
        return health_probe(cluster)
    url = f"{client.server_url(cluster)}/props?model={cluster.default_model}&autoload=false"
    key = f' -H "Authorization: Bearer $(cat {render.API_KEY_MOUNT})"' if cluster.settings["llama_api_key_file"] else ""
    script = f'curl -fsS -o /dev/null --max-time 5{key} "$0"'  # the URL comes in as $0
    return url, f"docker exec llama-server sh -c {shell(script)} {shell(url)}"


def wait_for_health(cluster, ready: bool = True) -> str:
    """Wait for ready_probe (after a new version's start), or for health_probe (the previous version's,
    after a rollback: its models need not be the new settings' ones)."""
    _, probe = ready_probe(cluster) if ready else health_probe(cluster)
    # by the clock, not by tries: through the front, a try may wait (held) up to curl's --max-time
    return (
        f"end=$(($(date +%s) + {cluster.settings['llama_health_timeout']})); "
        f'while [ "$(date +%s)" -lt "$end" ]; do {probe} && exit 0; sleep 1; done; '
        f"journalctl -u {roles.COORDINATOR_UNIT} -n 40 --no-pager; exit 1"
    )


def front_drain(cluster, word: str) -> str:
    """front-drain.sh WORD on the coordinator; nothing where the front is not installed yet (a first deploy)."""
    script = shell(roles.coordinator(cluster).path(roles.FRONT_DRAIN))
    return f"if [ -x {script} ]; then {script} {word}; fi"
