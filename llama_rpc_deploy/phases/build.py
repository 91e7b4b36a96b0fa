"""The image: built once on the coordinator, carried to every worker that lacks that exact image ID."""
from __future__ import annotations

import shlex

from pyinfra import host, inventory
from pyinfra.api import deploy
from pyinfra.operations import files, server

from .. import facts, image, transfer
from ..cluster import SERVICE_USER
from ..deployment import TRANSFER_KEY_COMMENT
from ..run import Run
from .checks import ssh_port
from .services import put


@deploy("The unprivileged user the containers run as")
def service_user():
    server.user(name=f"System user {SERVICE_USER} (no login, no home)", user=SERVICE_USER, system=True,
                shell="/usr/sbin/nologin", create_home=False, home="/nonexistent")


@deploy("Prepare the worker to receive the image")
def prepare_worker(run: Run):
    s = run.deployment.cluster.host(host.name).settings
    files.directory(name="rpc-server tensor cache (kept across deploys, written by the service user)",
                    path=s["rpc_cache_dir"], mode="755", user=SERVICE_USER, group=SERVICE_USER, recursive=True)
    files.put(name="Image receiver", src=str(image.FILES / "receive-image.sh"),
              dest=f"{s['deploy_dir']}/receive-image.sh", mode="755")
    public = run.deployment.transfer_key.with_suffix(".pub").read_text().strip()
    files.directory(name="root's .ssh", path="/root/.ssh", mode="700")
    # one line, found by the key's comment (the key itself holds regex characters), replaced when the key changes
    files.line(name="Accept the coordinator's transfer key, for image loads only",
               path="/root/.ssh/authorized_keys", line=f"^restrict,command=.* {TRANSFER_KEY_COMMENT}$",
               replace=f'restrict,command="{s["deploy_dir"]}/receive-image.sh" {public}')


@deploy("Build the image once, on the coordinator")
def build_image(run: Run):
    dep = run.deployment
    build_dir = f"{dep.cluster.settings['state_dir']}/build"
    files.directory(name="Build context", path=build_dir, mode="755")
    for name in image.IMAGE_FILES:
        files.put(name=f"Build context: {name}", src=str(image.FILES / name), dest=f"{build_dir}/{name}", mode="644")
    if dep.source.local_tarball:
        files.put(name="llama.cpp source (uploaded)", src=str(dep.source.local_tarball),
                  dest=f"{build_dir}/llama.cpp.tar.gz", mode="644")
    else:
        files.download(name=f"llama.cpp source ({dep.cluster.settings['llama_cpp_ref']})", src=dep.source.url,
                       dest=f"{build_dir}/llama.cpp.tar.gz")
    if host.get_fact(facts.DockerImageId, image=dep.image) is None:
        args = " ".join(f"--build-arg {shlex.quote(f'{k}={v}')}"
                        for k, v in sorted(image.build_args(dep.cluster, dep.source).items()))
        server.shell(name=f"Build {dep.image}",
                     commands=[f"cd {build_dir} && DOCKER_BUILDKIT=1 docker build --progress=plain {args} "
                               f"--tag {dep.image} ."])


@deploy("Carry the image to the workers")
def distribute_image(run: Run):
    dep = run.deployment
    files.directory(name="/etc/llama-rpc", path="/etc/llama-rpc", mode="700")
    files.put(name="Image-transfer key", src=str(dep.transfer_key), dest=transfer.TRANSFER_KEY, mode="600")
    known = []
    for worker in dep.cluster.workers:
        key = inventory.get_host(worker.name).get_fact(facts.SshHostKey)
        port = ssh_port(worker)
        known.append(f"{worker.address if port == 22 else f'[{worker.address}]:{port}'} {key}")
    put(run, transfer.KNOWN_HOSTS, "\n".join(known) + "\n", mode="600")

    mine = host.get_fact(facts.DockerImageId, image=dep.image)
    for worker in dep.cluster.workers:
        theirs = inventory.get_host(worker.name).get_fact(facts.DockerImageId, image=dep.image)
        if mine is not None and theirs == mine:
            continue  # same image ID already there: send nothing
        server.shell(name=f"Send {dep.image} to {worker.name}",
                     commands=[transfer.send_command(dep.image, worker.address, ssh_port(worker))],
                     _shell_executable="bash")
