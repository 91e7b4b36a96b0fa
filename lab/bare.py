"""Bare lab hosts: a coordinator and a worker on Debian 12 or 13 with systemd and sshd only (lab/bare.Dockerfile):
no Docker, zstd, iptables, python3 or curl. The deploy's prepare phase (llama_rpc_deploy/phases/prepare.py) has to
install them; tests/e2e/test_lab_bare.py and benchmarks/prepare_time.py deploy onto them.

What the lab hands a bare host that a real one would get elsewhere:
- the base images, from a registry for a real host (there is none here): the lab leaves them in
  /var/cache/lab-images, which Docker loads at its first start (a drop-in of lab/bare.Dockerfile);
- the image the lab's own coordinator built from the same source and settings, the same way, when it has it: the
  deploy looks for its image again at build time and finds it, so a bare host's test does not recompile llama.cpp
  for 10 minutes (the build itself is tested on the lab's prepared coordinator, tests/e2e/test_lab.py);
- the lab's model file, on the coordinator.

Each `up` starts from nothing: earlier bare hosts of that release, and their Docker volumes, are removed first.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

from . import lab

RELEASES = {"12": "bookworm", "13": "trixie"}
FIRST_INDEX = {"12": 20, "13": 22}  # lab.ip_of: Debian 12's hosts .30 and .31, Debian 13's .32 and .33
DOCKERFILE = lab.PROJECT / "lab" / "bare.Dockerfile"
IMAGES_DIR = "/var/cache/lab-images"  # where bare.Dockerfile's drop-in looks at Docker's first start


def image(version: str) -> str:
    return f"{lab.PREFIX}/bare:{RELEASES[version]}"


def containers(version: str) -> list[str]:
    return [f"{lab.PREFIX}-bare{version}-coordinator", f"{lab.PREFIX}-bare{version}-worker"]


def addresses(version: str) -> list[str]:
    return [lab.ip_of(FIRST_INDEX[version] + i) for i in range(2)]


def inventory(version: str) -> Path:
    return lab.LAB_DIR / f"bare-{version}.py"


def _dockerfile_hash() -> str:
    return hashlib.sha256(DOCKERFILE.read_bytes()).hexdigest()[:12]


def ensure_image(version: str) -> None:
    """The bare host image of that release, built FROM the lab's debootstrap base image of it."""
    tag = image(version)
    if lab.exists("image", tag):
        labels = json.loads(lab.docker("image", "inspect", "--format", "{{json .Config.Labels}}", tag)) or {}
        if labels.get("lab.dockerfile") == _dockerfile_hash():
            return
    base = next(i for i, release in lab.BASE_IMAGES.items() if release == RELEASES[version])
    lab.log(f"building {tag}")
    lab.docker(
        "build",
        "--quiet",
        "--build-arg",
        f"BASE_IMAGE={base}",
        "--label",
        f"lab.dockerfile={_dockerfile_hash()}",
        "-f",
        str(DOCKERFILE),
        "-t",
        tag,
        str(lab.PROJECT / "lab"),
        env={"DOCKER_BUILDKIT": "0"},
    )


def down(version: str) -> None:
    for container in containers(version):
        lab.docker("rm", "--force", "--volumes", container, check=False)
        lab.docker("volume", "rm", "--force", f"{container}-docker", check=False)


def _leave_images(container: str, name: str, save: list[str]) -> None:
    """`save` (a docker save command, on this machine or in a lab host) into the bare host's IMAGES_DIR/name.tar."""
    producer = subprocess.Popen(save, stdout=subprocess.PIPE)
    subprocess.run(
        [
            "docker",
            "exec",
            "-i",
            container,
            "sh",
            "-c",
            f"cat > {IMAGES_DIR}/{name}.tar.part && mv {IMAGES_DIR}/{name}.tar.part {IMAGES_DIR}/{name}.tar",
        ],
        stdin=producer.stdout,
        check=True,
    )
    if producer.wait() != 0:
        raise RuntimeError(f"{' '.join(save)} failed")


def up(version: str, images: bool = True) -> Path:
    """A bare coordinator and worker on Debian `version` ('12' or '13'), fresh; returns their inventory, which has
    the lab's settings (lab.lab_settings) for one worker. images False: none left for Docker's first start (for
    a measure of the prepare phase alone)."""
    from llama_rpc_deploy.deployment import from_cluster
    from llama_rpc_deploy.loading import offline_cluster

    lab.ensure_images()
    sdist = lab.ensure_sdist()
    key = lab.ensure_key()
    lab.ensure_network()
    ensure_image(version)
    down(version)
    names, ips = containers(version), addresses(version)
    lines = []
    for container, address in zip(names, ips):
        lab.start_host(container, container.removeprefix(f"{lab.PREFIX}-"), address, image(version))
    for container, address in zip(names, ips):
        lab.wait_ready(container, dockerd=False)  # there is no Docker yet
        lab.authorize(container, key)
        lines.append(lab.host_key_line(container, address))
    known_hosts = lab.LAB_DIR / f"bare-{version}-known_hosts"
    known_hosts.write_text("\n".join(lines) + "\n")
    path = lab.write_inventory(
        1, key, known_hosts, lab.lab_settings(sdist, 1, lab.ensure_api_key()), addresses=ips, path=inventory(version)
    )
    coordinator = names[0]
    if images:
        _leave_images(coordinator, "base", ["docker", "save", lab.BASE_IMAGE])
    lab_coordinator = f"{lab.PREFIX}-coordinator"
    tags = sorted(set(from_cluster(offline_cluster(path), with_key=False).images.values()))
    have = [
        t
        for t in tags
        if lab.exists("container", lab_coordinator)
        and subprocess.run(
            ["docker", "exec", lab_coordinator, "docker", "image", "inspect", t], capture_output=True
        ).returncode
        == 0
    ]
    if have and images:
        _leave_images(coordinator, "built", ["docker", "exec", lab_coordinator, "docker", "save", *have])
    lab.log(
        f"bare Debian {version}: coordinator {ips[0]}, worker {ips[1]}; carried {', '.join(have) or 'no built image'}"
    )
    local = lab.CACHE / "lab-sentence.gguf"
    if not local.exists():
        lab.write_sentence_model(local, lab.MODEL_SHAPE)
    folder = str(Path(lab.MODEL).parent)
    lab.docker("exec", coordinator, "sh", "-c", f"mkdir -p {folder} && chmod 755 {folder}")
    lab.docker("cp", str(local), f"{coordinator}:{lab.MODEL}")
    lab.docker("exec", coordinator, "chmod", "644", lab.MODEL)
    return path
