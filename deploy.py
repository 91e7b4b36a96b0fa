"""llama-rpc-deploy: one llama.cpp server from GPUs in different computers.

    pyinfra inventory.py deploy.py

In order:
  1. check every setting and what the hosts have (before anything changes)
  2. every host: the unprivileged user the containers run as; workers: get ready to receive the image
  3. coordinator: build the image once (skipped when that exact image exists)
  4. coordinator: stream it to every worker that lacks it (docker save | zstd | ssh | docker load)
  5. workers: the firewall rule (RPC port from the coordinator only), rpc-server as a systemd service
  6. coordinator: llama-server as a systemd service, after its workers; wait for /health
The logic lives in llama_rpc_deploy/ (settings, plan, render); this file only says what goes where.
"""
import hashlib
import os
import shlex
from io import StringIO
from pathlib import PurePosixPath

from pyinfra import host, inventory, logger
from pyinfra.api import deploy
from pyinfra.api.exceptions import DeployError
from pyinfra.facts.files import Directory, File, Sha1File
from pyinfra.operations import files, server, systemd

from llama_rpc_deploy import capacity, deployment, facts, operations, render, transfer
from llama_rpc_deploy.plan import FILES, SERVICE_USER
from llama_rpc_deploy.settings import SettingsError

try:
    dep = deployment.load(inventory, inventory_file=deployment.inventory_file())
except (SettingsError, FileNotFoundError) as error:
    raise DeployError(str(error)) from None

ROLE = dep.role(host.name)
ME = dep.host(host.name) if ROLE != "none" else None
BUILD_DIR = f"{dep.cluster.settings['state_dir']}/build"
TRANSFER_KEY, KNOWN_HOSTS = transfer.TRANSFER_KEY, transfer.KNOWN_HOSTS
if ROLE == "coordinator":
    HEALTH_URL = f"http://{ME.settings['llama_host'] or ME.address}:{ME.settings['llama_port']}/health"
    HEALTH_PROBE = f"docker exec llama-server curl -fsS --max-time 5 {HEALTH_URL}"


def check_host():
    """Stop before any change when this host lacks what the deploy needs."""
    s = ME.settings
    needed = ("docker", "zstd", "systemctl", "bash") + (("iptables", "iptables-restore") if ROLE == "worker" and s["rpc_firewall"] else ())
    missing = host.get_fact(facts.MissingCommands, names=needed)
    if missing:
        raise DeployError(f"{host.name}: {', '.join(missing)} not found: install them first (Docker Engine, zstd, iptables)")
    if ME.gpus and dep.cluster.settings["image_backend"] == "cuda" and "nvidia" not in host.get_fact(facts.DockerRuntimes):
        raise DeployError(f"{host.name}: gpus = {s['gpus']!r} but Docker has no nvidia runtime: "
                          "install the NVIDIA Container Toolkit (nvidia-ctk runtime configure --runtime=docker)")
    found = host.get_fact(facts.NvidiaGpus)
    if found and len(found) != len(ME.gpus):
        logger.warning(f"{host.name}: nvidia-smi lists {len(found)} GPUs ({', '.join(n for n, _ in found)}), "
                       f"gpus lists {len(ME.gpus)}: the plan and the device order follow gpus")
    key, ours = ("llama_port", "llama-server") if ROLE == "coordinator" else ("rpc_port", "rpc-server")
    listener = host.get_fact(facts.TcpListener, port=s[key])
    if listener is not None and listener != ours:
        raise DeployError(f"{host.name}: port {s[key]} is taken by {listener or 'another process'}: "
                          f"expected it free for {ours} (change {key})")
    if ROLE == "coordinator":
        model = s["llama_model_path"]
        found = host.get_fact(File, path=model)
        if not found:
            raise DeployError(f"{ME.sources['llama_model_path']}: llama_model_path = {model!r}: "
                              f"no such file on the coordinator {host.name}")
        folder = host.get_fact(Directory, path=str(PurePosixPath(model).parent))
        if not (int(str(found["mode"]), 8) & 0o004 and folder and int(str(folder["mode"]), 8) & 0o005 == 0o005):
            raise DeployError(f"{ME.sources['llama_model_path']}: llama_model_path = {model!r}: llama-server runs as "
                              f"the unprivileged user {SERVICE_USER}, which cannot read it on {host.name}: expected the "
                              f"file readable by others and its folder listable (chmod o+r FILE; chmod o+rx FOLDER)")
        for worker in dep.cluster.workers:
            if not host.get_fact(facts.TcpReachable, address=worker.address, port=ssh_port(worker)):
                raise DeployError(f"{host.name} cannot reach {worker.name}'s sshd at {worker.address}:{ssh_port(worker)}: "
                                  "the coordinator sends the image that way (set address or transfer_ssh_port)")
    if ROLE == "worker" and not host.get_fact(facts.SshHostKey):
        raise DeployError(f"{host.name}: no /etc/ssh/ssh_host_ed25519_key.pub: the coordinator needs it to send the image")


def ssh_port(worker):
    """The port the coordinator uses to reach a worker's sshd (the inventory's, unless set apart)."""
    return worker.settings["transfer_ssh_port"] or inventory.get_host(worker.name).data.get("ssh_port", 22)


def check_capacity():
    """The planner, on the model file's header read from the coordinator: refuse what won't fit,
    warn on what the seed measured slow, and resolve llama_tensor_split = 'auto'."""
    global dep
    model_path = dep.cluster.settings["llama_model_path"]
    try:
        model = capacity.read_remote_model(lambda limit: host.get_fact(facts.GgufHeader, path=model_path, limit=limit))
    except Exception as error:  # not a GGUF file
        raise DeployError(f"llama_model_path = {model_path!r}: {error}") from None
    plan = capacity.plan_cluster(dep.cluster, model)
    for line in plan.table().splitlines():
        logger.info(f"    [plan] {line}")
    if plan.problems:
        raise DeployError("; ".join(plan.problems) + " (python3 -m llama_rpc_deploy plan shows the table)")
    if dep.cluster.settings["llama_tensor_split"] == "auto":
        dep = deployment.with_split(dep, plan.split)


def put(path, content, mode="644"):
    """Upload rendered content. When it replaces different content, the old file stays as PATH.previous:
    the last working launch scripts and units survive a deploy that goes wrong."""
    current = host.get_fact(Sha1File, path=path)
    if current and current != hashlib.sha1(content.encode()).hexdigest():
        keep = server.shell(name=f"Keep {path} as {path}.previous", commands=[f"cp -a {path} {path}.previous"])
        deployment.REPLACED.setdefault(host.name, []).append((path, keep))
    return files.put(name=f"Install {path}", src=StringIO(content), dest=path, mode=mode)


def put_all(rendered: dict[str, str]) -> list:
    """put() each file (scripts executable); returns the operations."""
    return [put(path, content, mode="755" if path.endswith(".sh") else "644") for path, content in rendered.items()]


@deploy("The unprivileged user the containers run as")
def service_user():
    server.user(name=f"System user {SERVICE_USER} (no login, no home)", user=SERVICE_USER, system=True,
                shell="/usr/sbin/nologin", create_home=False, home="/nonexistent")


@deploy("Prepare the worker to receive the image")
def prepare_worker():
    s = ME.settings
    files.directory(name="rpc-server tensor cache (kept across deploys, written by the service user)",
                    path=s["rpc_cache_dir"], mode="755", user=SERVICE_USER, group=SERVICE_USER, recursive=True)
    files.put(name="Image receiver", src=str(FILES / "receive-image.sh"), dest=f"{s['deploy_dir']}/receive-image.sh",
              mode="755")
    public = dep.transfer_key.with_suffix(".pub").read_text().strip()
    files.directory(name="root's .ssh", path="/root/.ssh", mode="700")
    # one line, found by the key's comment (the key itself holds regex characters), replaced when the key changes
    files.line(name="Accept the coordinator's transfer key, for image loads only",
               path="/root/.ssh/authorized_keys", line=f"^restrict,command=.* {deployment.TRANSFER_KEY_COMMENT}$",
               replace=f'restrict,command="{s["deploy_dir"]}/receive-image.sh" {public}')


@deploy("Build the image once, on the coordinator")
def build_image():
    files.directory(name="Build context", path=BUILD_DIR, mode="755")
    for name in ("Dockerfile", "entrypoint.sh"):
        files.put(name=f"Build context: {name}", src=str(FILES / name), dest=f"{BUILD_DIR}/{name}", mode="644")
    if dep.source.local_tarball:
        files.put(name="llama.cpp source (uploaded)", src=str(dep.source.local_tarball),
                  dest=f"{BUILD_DIR}/llama.cpp.tar.gz", mode="644")
    else:
        files.download(name=f"llama.cpp source ({dep.cluster.settings['llama_cpp_ref']})", src=dep.source.url,
                       dest=f"{BUILD_DIR}/llama.cpp.tar.gz")
    if host.get_fact(facts.DockerImageId, image=dep.image) is None:
        args = " ".join(f"--build-arg {shlex.quote(f'{k}={v}')}" for k, v in sorted(dep.cluster.build_args(dep.source).items()))
        server.shell(name=f"Build {dep.image}",
                     commands=[f"cd {BUILD_DIR} && DOCKER_BUILDKIT=1 docker build --progress=plain {args} "
                               f"--tag {dep.image} ."])


@deploy("Carry the image to the workers")
def distribute_image():
    files.directory(name="/etc/llama-rpc", path="/etc/llama-rpc", mode="700")
    files.put(name="Image-transfer key", src=str(dep.transfer_key), dest=TRANSFER_KEY, mode="600")
    known = []
    for worker in dep.cluster.workers:
        key = inventory.get_host(worker.name).get_fact(facts.SshHostKey)
        port = ssh_port(worker)
        known.append(f"{worker.address if port == 22 else f'[{worker.address}]:{port}'} {key}")
    put(KNOWN_HOSTS, "\n".join(known) + "\n", mode="600")

    mine = host.get_fact(facts.DockerImageId, image=dep.image)
    for worker in dep.cluster.workers:
        theirs = inventory.get_host(worker.name).get_fact(facts.DockerImageId, image=dep.image)
        if mine is not None and theirs == mine:
            continue  # same image ID already there: send nothing
        server.shell(name=f"Send {dep.image} to {worker.name}",
                     commands=[transfer.send_command(dep.image, worker.address, ssh_port(worker))],
                     _shell_executable="bash")


@deploy("rpc-server on the worker")
def install_worker():
    firewall = render.firewall_files(dep.cluster, ME)
    if firewall:  # before rpc-server (re)starts; a reload re-applies the rule without restarting rpc-server
        will_change = {path: op.will_change for path, op in zip(firewall, put_all(firewall))}
        systemd.service(name="Firewall: RPC port from the coordinator only", service=render.FIREWALL_UNIT,
                        running=True, enabled=True,
                        reloaded=any(c for path, c in will_change.items() if path.endswith(".sh")),
                        daemon_reload=any(c for path, c in will_change.items() if path.endswith(".service")))
    changed = put_all(render.worker_files(dep.cluster, ME, dep.image))
    deployment.RPC_SERVICE_OPS[host.name] = service("rpc-server running and enabled", render.WORKER_UNIT,
                                                    changed, _ignore_errors=True)
    service("Watchdog: restart rpc-server when it holds a dead client", render.WORKER_WATCHDOG_UNIT,
            put_all(render.worker_watchdog_files(ME)))


def service(name, unit, files_ops, **arguments):
    """The unit running and enabled, restarted (after a daemon-reload) when its files change: a plain
    `systemctl restart`, not pyinfra's start-when-stopped, so that a unit still starting on its old files
    (llama-server's wait for its workers) starts over on the new ones."""
    if any(op.will_change for op in files_ops):
        return server.shell(name=name, commands=[f"systemctl daemon-reload && systemctl enable --quiet {unit} && "
                                                 f"systemctl restart {unit}"], **arguments)
    return systemd.service(name=name, service=unit, running=True, enabled=True, **arguments)


@deploy("llama-server on the coordinator")
def install_coordinator():
    s = ME.settings
    changed = put_all(render.coordinator_files(dep.cluster, dep.image))
    if s["llama_api_key_file"]:
        # /etc/llama-rpc (mode 700) was made by distribute_image; no .previous copy of a secret
        changed.insert(0, operations.secret_file(
            name=f"API key as {render.API_KEY_PATH} (mode 400, owner {SERVICE_USER}, content never shown)",
            src=os.path.expanduser(s["llama_api_key_file"]), dest=render.API_KEY_PATH,
            user=SERVICE_USER, group=SERVICE_USER))
    started = service("llama-server running and enabled", render.COORDINATOR_UNIT, changed,
                      _ignore_errors=True)  # the health check below decides
    # llama-server drops a worker whose rpc-server restarts (it aborts on the next request), so it
    # restarts too whenever this run (re)started any worker. Decided when the operation runs.
    after_workers = server.shell(
        name="Restart llama-server after its workers restarted", commands=[f"systemctl restart {render.COORDINATOR_UNIT}"],
        _ignore_errors=True,
        _if=lambda: not started.did_change() and any(op.did_change() for op in deployment.RPC_SERVICE_OPS.values()))

    def not_healthy_now():
        """Checked when the operation runs: after a restart, or whenever /health is not ok (a worker
        restarted, say). A healthy server that nothing touched is left alone: no change."""
        return started.did_change() or after_workers.did_change() or not host.run_shell_command(HEALTH_PROBE)[0]

    # a failure here is not the end: roll_back() below puts the previous version back on every host
    deployment.HEALTH["check"] = server.shell(
        name=f"Wait for {HEALTH_URL} (at most {s['llama_health_timeout']} s)",
        commands=[wait_for_health()], _if=not_healthy_now, _ignore_errors=True)
    service("Watchdog: restart llama-server when it loses a worker", render.WATCHDOG_UNIT,
            put_all(render.watchdog_files(dep.cluster)))


def wait_for_health():
    return (f"for i in $(seq {ME.settings['llama_health_timeout']}); do {HEALTH_PROBE} && exit 0; sleep 1; done; "
            f"journalctl -u {render.COORDINATOR_UNIT} -n 40 --no-pager; exit 1")


def health_failed():
    check = deployment.HEALTH.get("check")
    return check is not None and check.is_complete() and check.did_error()


@deploy("Roll back when the new version failed its health check")
def roll_back():
    """Every host: keep the failed version's files and logs, put back what this run replaced (the
    launch scripts and units name the previous image, which is still there), restart."""
    failed = f"{dep.cluster.settings['state_dir']}/failed/{deployment.RUN_ID}"
    unit = render.COORDINATOR_UNIT if ROLE == "coordinator" else render.WORKER_UNIT
    replaced = deployment.REPLACED.get(host.name, [])
    server.shell(name=f"Keep the failed version's files and {unit} log in {failed}",
                 commands=[f"mkdir -p {failed} && journalctl -u {unit} -n 2000 --no-pager > {failed}/{unit}.log; "
                           + "".join(f"cp -a {path} {failed}/; " for path, _ in replaced)],
                 _if=health_failed)
    for path, kept in replaced:
        server.shell(name=f"Put back {path}", commands=[f"cp -a {path}.previous {path}"],
                     _if=lambda kept=kept: health_failed() and kept.did_change())
    firewall = f"systemctl reload {render.FIREWALL_UNIT}; " if ROLE == "worker" and ME.settings["rpc_firewall"] else ""
    server.shell(name=f"Restart {unit} on the previous version",
                 commands=[f"systemctl daemon-reload; {firewall}systemctl restart {unit}"], _if=health_failed)
    if ROLE == "coordinator":
        server.shell(name="Previous version healthy again?", commands=[wait_for_health()], _if=health_failed,
                     _ignore_errors=True)
        server.shell(
            name="Say so: the new version was rolled back",
            commands=[f"echo 'the new version failed its health check ({HEALTH_URL}): every host is back on the previous "
                      f"launch scripts, units and image; the failed version and its logs are in {failed} on each host' >&2; exit 1"],
            _if=health_failed)


def barrier(label):
    """The same no-op on every host: pyinfra orders each host's operations, and a shared
    operation is what makes the workers' and the coordinator's steps wait for each other."""
    files.directory(name=f"== {label} ==", path=ME.settings["deploy_dir"], mode="755")


if ROLE != "none":
    check_host()
    if ROLE == "coordinator":
        check_capacity()
    service_user()
    if ROLE == "worker":
        prepare_worker()
    if ROLE == "coordinator":
        build_image()
    barrier("image built, workers ready to receive it")
    if ROLE == "coordinator":
        distribute_image()
    barrier("the same image on every host")
    if ROLE == "worker":
        install_worker()
    barrier("rpc-server running on every worker")
    if ROLE == "coordinator":
        install_coordinator()
    barrier("llama-server checked")
    if ROLE == "worker":
        roll_back()
    barrier("workers rolled back, if the new version failed")
    if ROLE == "coordinator":
        roll_back()
