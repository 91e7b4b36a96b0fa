"""The images: one per image_backend the hosts run, each built once on the coordinator and carried to every
worker of its backend that lacks that exact image ID."""

from __future__ import annotations

import time
from io import StringIO

from pyinfra import host, inventory, logger
from pyinfra.api import deploy
from pyinfra.api.exceptions import DeployError
from pyinfra.facts.files import Sha256File
from pyinfra.operations import files, python, server

from .. import facts, image, roles, source, transfer
from ..cluster import SERVICE_USER
from ..remote import TRANSFER_KEY_COMMENT
from ..quoting import shell
from ..run import Run
from . import prepare
from .shared import put


@deploy("The unprivileged user the containers run as")
def service_user(run: Run):  # the same on every host, whatever the run
    server.user(
        name=f"System user {SERVICE_USER} (no login, no home)",
        user=SERVICE_USER,
        system=True,
        shell="/usr/sbin/nologin",
        create_home=False,
        home="/nonexistent",
    )


@deploy("Prepare the worker to receive the image")
def prepare_worker(run: Run):
    s = run.deployment.cluster.host(host.name).settings
    files.directory(
        name="rpc-server tensor cache (kept across deploys, written by the service user)",
        path=s["rpc_cache_dir"],
        mode="755",
        user=SERVICE_USER,
        group=SERVICE_USER,
        recursive=True,
    )
    files.put(
        name="Image receiver",
        src=str(image.FILES / roles.IMAGE_RECEIVER),
        dest=f"{s['deploy_dir']}/{roles.IMAGE_RECEIVER}",
        mode="755",
    )
    public = run.deployment.transfer_key.with_suffix(".pub").read_text().strip()
    files.directory(name="root's .ssh", path="/root/.ssh", mode="700")
    # one line, found by the key's comment (the key itself holds regex characters), replaced when the key changes
    files.line(
        name="Accept the coordinator's transfer key, for image loads only",
        path="/root/.ssh/authorized_keys",
        line=f"^restrict,command=.* {TRANSFER_KEY_COMMENT}$",
        replace=f'restrict,command="{s["deploy_dir"]}/{roles.IMAGE_RECEIVER}" {public}',
    )


@deploy("Build the image once, on the coordinator")
def build_image(run: Run):
    dep = run.deployment
    build_dir = f"{dep.cluster.settings['state_dir']}/build"
    files.directory(name="Build context", path=build_dir, mode="755")
    for name in image.IMAGE_FILES:
        files.put(name=f"Build context: {name}", src=str(image.FILES / name), dest=f"{build_dir}/{name}", mode="644")
    tarball = f"{build_dir}/llama.cpp.tar.gz"
    if dep.source.local_tarball:
        files.put(name="llama.cpp source (uploaded)", src=str(dep.source.local_tarball), dest=tarball, mode="644")
    elif not dep.source.sha256 or host.get_fact(Sha256File, path=tarball) != dep.source.sha256:
        server.shell(
            name=f"llama.cpp source: download {dep.source.url}, check its sha256",
            commands=[source.fetch_command(dep.source.url, tarball, dep.source.sha256)],
            _shell_executable="bash",
        )
        if not dep.source.sha256:
            python.call(
                name=f"Record its sha256 in {dep.source.lock} (later downloads must match)",
                function=record_download,
                url=dep.source.url,
                lock=dep.source.lock,
                tarball=tarball,
            )
    for backend, tag in dep.images.items():  # one image per backend the hosts run, each from the same source
        if host.get_fact(facts.DockerImageId, image=tag) is not None:
            continue
        args = " ".join(
            f"--build-arg {shell(f'{k}={v}')}"
            for k, v in sorted(image.build_args(dep.cluster, dep.source, backend).items())
        )
        python.call(
            name=f"Build {tag} (minutes the first time; progress every {PROGRESS_SECONDS} s)",
            function=build_with_progress,
            tag=tag,
            build_dir=build_dir,
            log_dir=f"{dep.cluster.settings['state_dir']}/logs",
            command=f"DOCKER_BUILDKIT=1 docker build --progress=plain {args} --tag {tag} .",
        )


def record_download(url: str, lock, tarball: str) -> None:
    """Trust on first use: the first download's sha256, kept on the control machine."""
    ok, output = host.run_shell_command(f"sha256sum {shell(tarball)}")
    if not ok:
        raise DeployError(f"cannot read the sha256 of {tarball} on {host.name}")
    sha256 = output.stdout.split()[0]
    source.record(lock, url, sha256)
    logger.info(f"    [{host.name}] {url}: sha256 {sha256}, recorded in {lock} (or pin it: llama_cpp_sha256)")


PROGRESS_SECONDS = 30
FIRST_LOOK_SECONDS = 5  # the first look at a build: one that is done by then says nothing before "built in"


def build_with_progress(tag: str, build_dir: str, log_dir: str, command: str, every: float = PROGRESS_SECONDS) -> None:
    """docker build in build_dir, in the background on the coordinator, its latest step shown every so often
    (a first build takes minutes), its log kept in log_dir (the latest: build.log); fails with the log's end
    when the build does. A build still running from a deploy that was killed is waited for (flock), not raced.
    The image is looked for again first: the fact that scheduled the build was read before the prepare phase
    installed Docker, and Docker's first start may have brought it (the lab's stand-in for a registry does)."""
    if host.run_shell_command(f"docker image inspect {shell(tag)} >/dev/null 2>&1")[0]:
        logger.info(f"    [{host.name}] {tag} is there already: not built")
        return
    token = time.strftime("build-%Y%m%dT%H%M%S", time.gmtime())
    log, rc = shell(f"{log_dir}/{token}.log"), shell(f"{log_dir}/{token}.rc")
    start = (
        f"mkdir -p {shell(log_dir)} && ln -sfn {token}.log {shell(log_dir + '/build.log')} && cd {shell(build_dir)} && "
        f"(setsid flock {shell(log_dir + '/build.lock')} bash -c {shell(f'{command}; echo $? > {rc}')} "
        f"> {log} 2>&1 < /dev/null &)"
    )
    if not host.run_shell_command(start)[0]:
        raise DeployError(f"cannot start the image build on {host.name}")
    began = time.monotonic()
    while True:
        time.sleep(min(every, FIRST_LOOK_SECONDS) if time.monotonic() - began < every else every)
        done, output = host.run_shell_command(f"cat {rc} 2>/dev/null")
        if done and output.stdout.strip():
            break
        _, output = host.run_shell_command(f"grep -E '^#[0-9]+ ' {log} | tail -n 1 | cut -c1-160")
        logger.info(f"    [{host.name}] building, {time.monotonic() - began:.0f} s: {output.stdout.strip()}")
    if output.stdout.strip() != "0":
        _, tail = host.run_shell_command(f"tail -n 30 {log}")
        raise DeployError(f"the image build failed on {host.name} (the whole log: {log}):\n{tail.stdout}")
    host.run_shell_command(f"rm -f {rc}")
    logger.info(f"    [{host.name}] built in {time.monotonic() - began:.0f} s")


@deploy("Carry the image to the workers")
def distribute_image(run: Run):
    dep = run.deployment
    files.directory(name=roles.CONFIG_DIR, path=roles.CONFIG_DIR, mode="700")
    files.put(name="Image-transfer key", src=str(dep.transfer_key), dest=roles.TRANSFER_KEY, mode="600")
    known = []
    for worker in dep.cluster.workers:
        key = inventory.get_host(worker.name).get_fact(facts.SshHostKey)
        port = worker.transfer_port
        known.append(f"{worker.address if port == 22 else f'[{worker.address}]:{port}'} {key}")
    put(run, roles.KNOWN_HOSTS, "\n".join(known) + "\n", mode="600")

    # the layer filter needs python3 on the coordinator; without it every layer is sent
    skip_layers = f"{dep.cluster.settings['deploy_dir']}/{roles.SKIP_LAYERS}"
    if prepare.lacks(run.deployment.cluster.host(host.name), ("python3",)):
        logger.warning(f"{host.name}: no python3: every image layer goes to the workers, not only those they lack")
        skip_layers = None
    else:
        files.put(name="Image layer filter", src=str(image.FILES / roles.SKIP_LAYERS), dest=skip_layers, mode="755")
    for worker in dep.cluster.workers:
        tag = dep.image_of(worker.name)  # its backend's image, built above
        mine = host.get_fact(facts.DockerImageId, image=tag)
        theirs = inventory.get_host(worker.name).get_fact(facts.DockerImageId, image=tag)
        if mine is not None and theirs == mine:
            continue  # same image ID already there: send nothing
        have = inventory.get_host(worker.name).get_fact(facts.DockerImageLayers)
        layers_file = None
        if skip_layers and have:
            layers_file = f"{dep.cluster.settings['state_dir']}/layers-of-{worker.name}"
            files.put(
                name=f"The image layers {worker.name} has",
                src=StringIO(transfer.layers_text(have)),
                dest=layers_file,
                mode="600",
            )
        server.shell(
            name=f"Send {tag} to {worker.name} (the layers it lacks)",
            commands=[transfer.send_command(tag, worker.address, worker.transfer_port, layers_file, skip_layers)],
            _shell_executable="bash",
        )
