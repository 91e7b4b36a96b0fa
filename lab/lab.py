"""The local lab: a coordinator and workers as local containers that behave like real hosts.

Each lab host boots systemd as PID 1, runs sshd with its own host keys and its
own dockerd (its /var/lib/docker on a Docker volume, so it uses overlay2), on
a private Docker network with an explicit subnet. The deploy reaches them over
SSH exactly as it reaches real machines. `lab up` writes .lab/inventory.py.

What the lab adds that real hosts would already have: a base image inside the
coordinator's dockerd (there is no registry to pull from here), a model file
on the coordinator (generated: its greedy answer is a known sentence), and the llama.cpp source tree
from the llama-cpp-python sdist on PyPI (built offline).

    python -m llama_rpc_deploy lab up [--workers N]
    python -m llama_rpc_deploy lab pin      (each host on its own core, for measurements)
    python -m llama_rpc_deploy lab down
"""

from __future__ import annotations

import json
import os
import pprint
import re
import secrets
import shutil
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from llama_rpc_deploy.settings import BY_NAME, EVERY_HOST, ROLES
from llama_rpc_deploy.source import sha256_file

from .testmodel import Shape, write_draft_model, write_model, write_random_sentence_model, write_sentence_model
from .testgemma4 import write_gemma4_assistant, write_gemma4_sentence_model

PROJECT = Path(__file__).resolve().parent.parent  # the checkout: lab/ sits at its top
LAB_DIR = PROJECT / ".lab"
CACHE = PROJECT / ".cache"
PREFIX = "llama-rpc-lab"
NETWORK = PREFIX
SUBNET = "172.30.57.0/24"
FIRST_IP = 10  # coordinator .10, workers .11, .12, ...
BASE_IMAGE = f"{PREFIX}/debian:bookworm"
# the base of the lab's vulkan image (ggml-vulkan needs Debian 13's Vulkan headers; its lavapipe is Mesa 25)
VULKAN_BASE_IMAGE = f"{PREFIX}/debian:trixie"
BASE_IMAGES = {BASE_IMAGE: "bookworm", VULKAN_BASE_IMAGE: "trixie"}  # image -> Debian release
HOST_IMAGE = f"{PREFIX}/host:bookworm"
SDIST = "llama-cpp-python==0.3.36"
MODEL = "/models/lab.gguf"
MODEL_SHAPE = Shape(n_layer=8, n_embd=512, n_head=8, n_head_kv=4, n_ff=1536)
OTHER_VOCAB_SHAPE = Shape(n_layer=1, n_embd=64, n_head=2, n_head_kv=1, n_ff=128)
# For speculative decoding (testmodel.write_draft_model, write_random_sentence_model), outside MODEL's folder
DRAFT_MODEL = "/models-spec/draft.gguf"  # the sentence model's draft (llama-server -md, --spec-type draft-simple)
RANDOM_MODEL = "/models-spec/random.gguf"  # a target on the same vocabulary whose text the draft does not predict
OTHER_VOCAB_MODEL = "/models-spec/other-vocab.gguf"  # a draft of another vocabulary (write_model's): refused
GEMMA4_MODEL = "/models-spec/gemma4.gguf"  # the sentence in Gemma 4's architecture (testgemma4.py) ...
ASSISTANT_MODEL = (
    "/models-spec/gemma4-assistant.gguf"  # ... and its assistant (draft-mtp), which skips every third word
)
# Flags that let systemd and a nested dockerd run in a container without --privileged (checked on this machine).
HOST_FLAGS = [
    "--cap-add",
    "ALL",
    "--cap-drop",
    "SYS_RESOURCE",
    "--security-opt",
    "seccomp=unconfined",
    "--security-opt",
    "apparmor=unconfined",
    "--security-opt",
    "systempaths=unconfined",
    "--cgroupns=host",
    "-v",
    "/sys/fs/cgroup:/sys/fs/cgroup:rw",
    "--tmpfs",
    "/run",
    "--tmpfs",
    "/run/lock",
]
LABEL = "io.llama-rpc-deploy.lab=1"

# --- the two hardware edges of sleep and wake (docs/sleep.md), which a container cannot have ---
GATEWAY = "172.30.57.1"  # this machine on the lab's network (the bridge)
WOL_PORT = 9  # where the coordinator sends its magic packets (and the lab's hosts their freeze word)
FREEZE_WORD = b"llama-rpc-lab-freeze"
# sleep_command for a lab worker: instead of suspending a kernel, it asks this machine to freeze its container
LAB_SLEEP_COMMAND = ["bash", "-c", f"echo {FREEZE_WORD.decode()} > /dev/udp/{GATEWAY}/{WOL_PORT}"]


def log(message: str) -> None:
    print(f"lab: {message}", file=sys.stderr, flush=True)


def docker(*args: str, check: bool = True, capture: bool = True, input: bytes | None = None, env=None) -> str:
    result = subprocess.run(
        ["docker", *args], check=False, capture_output=capture, input=input, env={**os.environ, **(env or {})}
    )
    if check and result.returncode != 0:
        err = result.stderr.decode(errors="replace") if capture else ""
        raise RuntimeError(f"docker {' '.join(args)} failed ({result.returncode}): {err.strip()}")
    return result.stdout.decode(errors="replace").strip() if capture else ""


def run_on(name: str, command: str, check: bool = True) -> str:
    """A shell command on a lab host (as root, through docker exec): its stdout. RuntimeError on failure if check."""
    return docker("exec", f"{PREFIX}-{name}", "bash", "-c", command, check=check)


def put_file(name: str, path: str, text: str) -> None:
    """Write text to a file on a lab host."""
    subprocess.run(
        ["docker", "exec", "-i", f"{PREFIX}-{name}", "sh", "-c", f"cat > {shlex.quote(path)}"],
        input=text,
        text=True,
        check=True,
    )


def exists(kind: str, name: str) -> bool:
    return subprocess.run(["docker", kind, "inspect", name], capture_output=True).returncode == 0


def host_names(workers: int) -> list[str]:
    return ["coordinator"] + [f"worker{i}" for i in range(1, workers + 1)]


def ip_of(index: int) -> str:
    return SUBNET.rsplit(".", 1)[0] + f".{FIRST_IP + index}"


def ensure_images() -> None:
    """The debootstrap base images (no registry here) and the host image built on the first."""
    for image, release in BASE_IMAGES.items():
        if exists("image", image):
            continue
        log(f"making {image} with debootstrap (about a minute)")
        with tempfile.TemporaryDirectory(prefix="lab-rootfs-") as rootfs:
            subprocess.run(
                ["debootstrap", "--variant=minbase", release, rootfs, "http://deb.debian.org/debian"],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            tar = subprocess.Popen(["tar", "-C", rootfs, "-c", "."], stdout=subprocess.PIPE)
            subprocess.run(
                ["docker", "import", "--change", 'CMD ["/bin/bash"]', "-", image],
                stdin=tar.stdout,
                check=True,
                stdout=subprocess.DEVNULL,
            )
            if tar.wait() != 0:
                raise RuntimeError("tar of the debootstrap tree failed")
    if not exists("image", HOST_IMAGE) or _host_image_stale():
        log(f"building {HOST_IMAGE}")
        docker(
            "build",
            "--quiet",
            "--build-arg",
            f"BASE_IMAGE={BASE_IMAGE}",
            "--label",
            f"lab.dockerfile={_host_dockerfile_hash()}",
            "-f",
            str(PROJECT / "lab" / "host.Dockerfile"),
            "-t",
            HOST_IMAGE,
            str(PROJECT / "lab"),
            env={"DOCKER_BUILDKIT": "0"},
        )


def _host_dockerfile_hash() -> str:
    import hashlib

    return hashlib.sha256((PROJECT / "lab" / "host.Dockerfile").read_bytes()).hexdigest()[:12]


def _host_image_stale() -> bool:
    labels = docker("image", "inspect", "--format", "{{json .Config.Labels}}", HOST_IMAGE)
    return (json.loads(labels) or {}).get("lab.dockerfile") != _host_dockerfile_hash()


def ensure_sdist() -> Path:
    """The llama-cpp-python sdist from PyPI, unpacked: its vendor/llama.cpp is the lab's llama.cpp source."""
    name = SDIST.replace("-", "_").replace("==", "-")
    tree = CACHE / name
    if (tree / "vendor" / "llama.cpp" / "ggml" / "CMakeLists.txt").is_file():
        return tree
    CACHE.mkdir(parents=True, exist_ok=True)
    log(f"downloading the {SDIST} sdist (its vendor/llama.cpp is the lab's source)")
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:", "-d", tmp, SDIST],
            check=True,
        )
        archive = next(Path(tmp).glob("*.tar.gz"))
        subprocess.run(["tar", "-xzf", str(archive), "-C", tmp], check=True)
        shutil.rmtree(tree, ignore_errors=True)
        Path(tmp, name).rename(tree)
    return tree


def ensure_key() -> Path:
    key = LAB_DIR / "id_ed25519"
    if not key.exists():
        LAB_DIR.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "llama-rpc-lab", "-f", str(key)], check=True
        )
    return key


def ensure_api_key() -> Path:
    """The lab's llama-server API key: a file only its owner can read, as a user would keep theirs."""
    path = LAB_DIR / "api_key"
    if not path.exists():
        LAB_DIR.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
    return path


OUTSIDER = f"{PREFIX}-outsider"
OUTSIDER_IP_INDEX = -1  # .9: on the lab's network, in no inventory


def outsider() -> str:
    """Another machine on the same network that is not part of the cluster (for the lockdown tests):
    a plain container with bash and curl, no services. Returns its container name."""
    if not exists("container", OUTSIDER):
        docker(
            "run",
            "-d",
            "--name",
            OUTSIDER,
            "--hostname",
            "outsider",
            "--label",
            LABEL,
            "--network",
            NETWORK,
            "--ip",
            ip_of(OUTSIDER_IP_INDEX),
            "--entrypoint",
            "sleep",
            HOST_IMAGE,
            "infinity",
        )
    elif docker("inspect", "--format", "{{.State.Running}}", OUTSIDER) != "true":
        docker("start", OUTSIDER)
    return OUTSIDER


MIRROR = f"{PREFIX}-mirror"
MIRROR_IP_INDEX = -2  # .8: on the lab's network, in no inventory
GITHUB_PATH = "/ggml-org/llama.cpp/archive/{ref}.tar.gz"  # as on github.com


def mirror(tarballs: dict[str, Path]) -> str:
    """A lab host that serves files over HTTP (busybox httpd) at the paths given, e.g. a llama.cpp
    tarball at GitHub's path; for the deploy's download path. Returns its base URL."""
    if not exists("container", MIRROR):
        docker(
            "run",
            "-d",
            "--name",
            MIRROR,
            "--hostname",
            "mirror",
            "--label",
            LABEL,
            "--network",
            NETWORK,
            "--ip",
            ip_of(MIRROR_IP_INDEX),
            "--entrypoint",
            "sleep",
            HOST_IMAGE,
            "infinity",
        )
        log("mirror: installing busybox (its httpd serves the files)")
        docker(
            "exec",
            MIRROR,
            "sh",
            "-c",
            "apt-get update -qq && DEBIAN_FRONTEND=noninteractive "
            "apt-get install -y -qq --no-install-recommends busybox >/dev/null",
        )
    elif docker("inspect", "--format", "{{.State.Running}}", MIRROR) != "true":
        docker("start", MIRROR)
    for path, local in tarballs.items():
        docker("exec", MIRROR, "mkdir", "-p", f"/srv{Path(path).parent}")
        docker("cp", str(local), f"{MIRROR}:/srv{path}")
    # a second httpd cannot bind port 80 and exits at once: starting one each time is safe
    docker("exec", "-d", MIRROR, "busybox", "httpd", "-f", "-p", "80", "-h", "/srv")
    return f"http://{ip_of(MIRROR_IP_INDEX)}"


def ensure_network() -> None:
    if not exists("network", NETWORK):
        docker("network", "create", "--subnet", SUBNET, "--label", LABEL, NETWORK)


def ensure_host(index: int, name: str) -> str:
    container = f"{PREFIX}-{name}"
    if exists("container", container) and docker("inspect", "--format", "{{.Image}}", container) != docker(
        "image", "inspect", "--format", "{{.Id}}", HOST_IMAGE
    ):
        log(f"{container}: lab/host.Dockerfile changed: a new container (its dockerd's volume, images included, stays)")
        docker("rm", "--force", container)
    if exists("container", container):
        if docker("inspect", "--format", "{{.State.Running}}", container) != "true":
            docker("start", container)
        return container
    start_host(container, name, ip_of(index), HOST_IMAGE)
    return container


def start_host(container: str, name: str, ip: str, image: str) -> None:
    """A lab host's container from image: systemd as PID 1 (HOST_FLAGS), on the lab's network at ip, its
    /var/lib/docker on a volume of its own (overlay2 does not work on the container's own overlay)."""
    docker(
        "run",
        "-d",
        "--name",
        container,
        "--hostname",
        name,
        "--label",
        LABEL,
        "--network",
        NETWORK,
        "--ip",
        ip,
        *HOST_FLAGS,
        "-v",
        f"{container}-docker:/var/lib/docker",
        image,
    )


def wait_ready(container: str, timeout: float = 120, dockerd: bool = True) -> None:
    """systemd up, sshd and (dockerd True) dockerd answering."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        probe = subprocess.run(
            [
                "docker",
                "exec",
                container,
                "sh",
                "-c",
                "systemctl is-active --quiet ssh && test -s /etc/ssh/ssh_host_ed25519_key.pub"
                + (" && systemctl is-active --quiet docker && docker info >/dev/null 2>&1" if dockerd else ""),
            ],
            capture_output=True,
        )
        if probe.returncode == 0:
            return
        time.sleep(1)
    raise RuntimeError(
        f"{container}: sshd{' and dockerd' if dockerd else ''} not up within {timeout:.0f} s (docker exec {container} systemctl --failed)"
    )


def authorize(container: str, key: Path) -> None:
    public = key.with_suffix(".pub").read_text().strip()
    docker(
        "exec",
        container,
        "sh",
        "-c",
        f"mkdir -p /root/.ssh && chmod 700 /root/.ssh && touch /root/.ssh/authorized_keys && "
        f"grep -qxF '{public}' /root/.ssh/authorized_keys || echo '{public}' >> /root/.ssh/authorized_keys",
    )


def host_key_line(container: str, ip: str) -> str:
    """Read the host key from inside the container (no network scan): the known_hosts line for it."""
    key = docker("exec", container, "cat", "/etc/ssh/ssh_host_ed25519_key.pub").split()
    return f"{ip} {key[0]} {key[1]}"


def preload_base_images(container: str) -> None:
    """The coordinator builds FROM the lab's base images; with no registry they have to be loaded in."""
    for image in BASE_IMAGES:
        wanted = docker("image", "inspect", "--format", "{{.Id}}", image)
        have = subprocess.run(
            ["docker", "exec", container, "docker", "image", "inspect", "--format", "{{.Id}}", image],
            capture_output=True,
            text=True,
        ).stdout.strip()
        if have == wanted:
            continue
        log(f"loading {image} into {container}'s dockerd")
        save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
        subprocess.run(
            ["docker", "exec", "-i", container, "docker", "load", "--quiet"],
            stdin=save.stdout,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        if save.wait() != 0:
            raise RuntimeError(f"docker save of {image} failed")


def place_model(container: str) -> None:
    """The lab's model on the coordinator: the sentence model (testmodel.py), whose greedy answer is a
    known sentence that wins by a wide margin at every step, so a split that computes wrong shows.
    A different file there (an older lab's) is replaced, and a running llama-server restarted onto it.

    Beside it, in a folder of its own (tests list MODEL's folder), the models for speculative decoding:
    DRAFT_MODEL, the sentence model's draft, RANDOM_MODEL, a target on the same vocabulary whose
    text the draft does not predict, OTHER_VOCAB_MODEL, a draft of another vocabulary, and GEMMA4_MODEL with
    ASSISTANT_MODEL, a Gemma 4 target and assistant (MTP drafting). Each is generated once into CACHE and copied when it differs."""
    models = [
        (CACHE / "lab-sentence.gguf", MODEL, lambda local: write_sentence_model(local, MODEL_SHAPE)),
        (CACHE / "lab-draft.gguf", DRAFT_MODEL, write_draft_model),
        (CACHE / "lab-random.gguf", RANDOM_MODEL, lambda local: write_random_sentence_model(local, MODEL_SHAPE)),
        (CACHE / "lab-other-vocab.gguf", OTHER_VOCAB_MODEL, lambda local: write_model(local, OTHER_VOCAB_SHAPE)),
        (CACHE / "lab-gemma4.gguf", GEMMA4_MODEL, write_gemma4_sentence_model),  # before its assistant, built from it
        (
            CACHE / "lab-gemma4-assistant.gguf",
            ASSISTANT_MODEL,
            lambda local: write_gemma4_assistant(local, CACHE / "lab-gemma4.gguf"),
        ),
    ]
    for local, remote, write in models:
        if not local.exists():
            write(local)
        have = subprocess.run(["docker", "exec", container, "sha256sum", remote], capture_output=True, text=True)
        if have.stdout.split()[:1] == [sha256_file(local)]:
            continue
        folder = str(Path(remote).parent)
        docker("exec", container, "sh", "-c", f"mkdir -p {folder} && chmod 755 {folder}")
        docker("cp", str(local), f"{container}:{remote}.new")
        restart = (  # a llama-server on the lab's model, none on the others
            " && { ! systemctl cat llama-server.service >/dev/null 2>&1 || systemctl try-restart llama-server.service; }"
            if remote == MODEL
            else ""
        )
        docker("exec", container, "sh", "-c", f"chmod 644 {remote}.new && mv {remote}.new {remote}{restart}")


def lab_settings(sdist: Path, workers: int, api_key: Path) -> dict:
    """Settings the lab needs instead of the defaults (CPU build, the lab's base image, a small model)."""
    return {
        "image_backend": "cpu",
        "image_build_image": BASE_IMAGE,
        "image_runtime_image": BASE_IMAGE,
        "image_vulkan_build_image": VULKAN_BASE_IMAGE,  # for a vulkan worker (tests/e2e/test_lab_vulkan.py)
        "image_vulkan_runtime_image": VULKAN_BASE_IMAGE,
        "image_cpu_native": True,  # every lab host is this machine's CPU
        "llama_cpp_source": str(sdist),
        "llama_model_path": MODEL,
        "llama_ctx_size": 2048,
        "llama_parallel": 2,
        "llama_n_gpu_layers": MODEL_SHAPE.n_layer - 2,  # with the output layer: layers 3..7 + output on the workers
        "llama_tensor_split": [1] * workers,  # even, so the planner's figures can be checked against llama.cpp's
        "llama_threads": 1,
        "rpc_threads": 1,
        "llama_health_timeout": 300,
        "llama_api_key_file": str(api_key),  # the lab runs the locked-down setup: clients need the key
        # with sleep_idle_seconds (off here): a worker's sleep freezes its container, and its veth cannot be
        # checked for Wake-on-LAN; wake_listener stands in for both (docs/sleep.md)
        "sleep_command": LAB_SLEEP_COMMAND,
        "wol_check_nic": False,
    }


def write_inventory(
    workers: int,
    key: Path,
    known_hosts: Path,
    settings: dict,
    addresses: list[str] | None = None,
    path: Path | None = None,
) -> Path:
    """The lab's inventory: each host gets the lab's settings that its role reads (settings.Setting.read_from).
    addresses: the coordinator's, then each worker's (the lab's own by default); path: where (.lab/inventory.py)."""
    addresses = addresses or [ip_of(i) for i in range(workers + 1)]
    ssh = {
        "ssh_user": "root",
        "ssh_port": 22,
        "ssh_key": str(key),
        "ssh_known_hosts_file": str(known_hosts),
        "ssh_strict_host_key_checking": "yes",
        "ssh_allow_agent": False,
        "ssh_look_for_keys": False,
    }
    by_role = {
        role: {k: v for k, v in settings.items() if BY_NAME[k].read_from in (role, EVERY_HOST)} for role in ROLES
    }
    text = f'''# Written by `python -m llama_rpc_deploy lab up`: the local lab's hosts (containers on {SUBNET}).
# Same form as ../inventory.py; the lab's settings override group_data for these hosts.
SSH = {ssh!r}
LAB_COORDINATOR = {pprint.pformat(by_role["coordinator"], sort_dicts=False)}
LAB_WORKER = {pprint.pformat(by_role["workers"], sort_dicts=False)}

coordinator = [("{addresses[0]}", {{**SSH, **LAB_COORDINATOR}})]
workers = [
'''
    for i in range(1, workers + 1):
        text += f'    ("{addresses[i]}", {{**SSH, **LAB_WORKER}}),\n'
    text += "]\n"
    path = path or LAB_DIR / "inventory.py"
    path.write_text(text)
    return path


def up(workers: int = 1) -> Path:
    if workers < 1:
        raise SystemExit("lab: --workers must be at least 1")
    ensure_images()
    sdist = ensure_sdist()
    key = ensure_key()
    ensure_network()
    existing = [n for n in host_names(8) if exists("container", f"{PREFIX}-{n}")]
    extra = [n for n in existing if n not in host_names(workers)]
    for name in extra:  # fewer workers than last time
        _remove_host(f"{PREFIX}-{name}")
    lines = []
    for index, name in enumerate(host_names(workers)):
        container = ensure_host(index, name)
        wait_ready(container)
        authorize(container, key)
        lines.append(host_key_line(container, ip_of(index)))
    known_hosts = LAB_DIR / "known_hosts"
    known_hosts.write_text("\n".join(lines) + "\n")
    coordinator = f"{PREFIX}-coordinator"
    preload_base_images(coordinator)
    place_model(coordinator)
    inventory = write_inventory(workers, key, known_hosts, lab_settings(sdist, workers, ensure_api_key()))
    log(
        f"up: coordinator {ip_of(0)}, workers {', '.join(ip_of(i) for i in range(1, workers + 1))}; inventory {inventory}"
    )
    return inventory


def _remove_host(container: str) -> None:
    docker("rm", "--force", "--volumes", container, check=False)
    docker("volume", "rm", "--force", f"{container}-docker", check=False)


def down() -> None:
    containers = docker("ps", "-a", "--filter", f"label={LABEL}", "--format", "{{.Names}}").split()
    for container in containers:
        _remove_host(container)
    if exists("network", NETWORK):
        docker("network", "rm", NETWORK)
    for name in ("inventory.py", "known_hosts", "api_key"):
        (LAB_DIR / name).unlink(missing_ok=True)
    log(f"down: removed {len(containers)} hosts, their volumes and the network")


def running() -> list[str]:
    """The lab's containers that run (hosts, the outsider, the mirror), by name."""
    return docker("ps", "--filter", f"label={LABEL}", "--format", "{{.Names}}").split()


def pin(unpin: bool = False) -> None:
    """The coordinator on core 0, the workers on the last core: on 2 cores the thread pools compete otherwise.
    The containers each host's dockerd runs are confined with it (set_cpus)."""
    ncpu = os.cpu_count() or 1
    for container in running():
        cpus = f"0-{ncpu - 1}" if unpin else ("0" if container.endswith("-coordinator") else str(ncpu - 1))
        below = set_cpus(container, cpus)
        log(f"{container} on cpus {cpus}" + (f" with the {below} cgroups below it" if below else ""))


def set_cpus(container: str, cpus: str) -> int:
    """Confine a lab host, and what its dockerd runs (in the host's cgroup: lab/host.Dockerfile's cgroup-parent),
    to cpus. A cgroup v1 cpuset must hold its children's cores, so everything first gets every core (the host
    before its children), then cpus (the children before the host), whatever it had; a cgroup that ends meanwhile
    is skipped. Returns how many cgroups below the host's were set."""
    every = f"0-{(os.cpu_count() or 1) - 1}"
    below = _cpuset_children(container)
    docker("update", "--cpuset-cpus", every, container)
    for cgroup in below:
        _write_cpus(cgroup, every)
    if cpus != every:
        for cgroup in reversed(below):
            _write_cpus(cgroup, cpus)
        docker("update", "--cpuset-cpus", cpus, container)
    return len(below)


def _write_cpus(cgroup: Path, cpus: str) -> None:
    try:
        (cgroup / "cpuset.cpus").write_text(cpus)
    except FileNotFoundError:
        pass  # its container ended meanwhile


def _cpuset_children(container: str) -> list[Path]:
    """The cgroup v1 cpusets below a lab host's own, parents before children; none with cgroup v2, where a
    parent's cpuset confines its children as they are."""
    pid = docker("inspect", "--format", "{{.State.Pid}}", container)
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpuset" in controllers.split(","):
            top = Path("/sys/fs/cgroup/cpuset") / path.lstrip("/")
            return [Path(root) for root, _, _ in os.walk(top)][1:]  # top-down; a folder gone meanwhile is left out
    return []


def reconnect(container: str, ip: str) -> None:
    """Put a lab host (back) on the lab's network at ip. Docker names the new interface eth1, and it must keep that
    name: a renamed one cannot be disconnected again. Whoever needs the interface asks lab_interface()."""
    docker("network", "connect", "--ip", ip, NETWORK, container)


def lab_interface(container: str, ip: str) -> str:
    """The name of the host's interface on the lab's network (eth0, or eth1 after a reconnect)."""
    return docker(
        "exec", container, "sh", "-c", f"ip -o -4 addr show | awk '$4 ~ /^{re.escape(ip)}\\// {{ print $2; exit }}'"
    )


def free_ports(n: int) -> list[int]:
    """n distinct free loopback ports from the OS (all held open until all are chosen), for the processes the
    tests and benchmarks start on this machine."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def container_by(field: str, value: str) -> str | None:
    """The lab container whose address (field 'ip') or MAC (field 'mac') on the lab's network is value."""
    key = {"ip": "IPAddress", "mac": "MacAddress"}[field]
    names = docker("ps", "-a", "--filter", f"label={LABEL}", "--format", "{{.Names}}").split()
    for name in names:
        have = docker("inspect", "--format", f'{{{{(index .NetworkSettings.Networks "{NETWORK}").{key}}}}}', name,
                      check=False)  # fmt: skip
        if have and have.lower() == value.lower():
            return name
    return None


def wake_listener(stop=None, events: list | None = None) -> None:
    """Stand in for the workers' hardware: a lab host that sends FREEZE_WORD (its sleep_command) is frozen (docker
    pause: every process on it stops, its network stays silent, as a suspended machine's), and a magic packet
    for a frozen host's MAC, seen on the lab's bridge, thaws it (docker unpause), as its NIC would wake it.
    Runs until stop (a threading.Event) is set; each freeze and thaw is appended to events as (time, what, host)."""
    import socket as _socket

    sock = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
    sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
    sock.bind(("0.0.0.0", WOL_PORT))
    sock.settimeout(0.5)
    log(f"wake listener on UDP {WOL_PORT}: freezes a lab host on its word, thaws it on its magic packet")
    try:
        while stop is None or not stop.is_set():
            try:
                data, (source, _) = sock.recvfrom(2048)
            except TimeoutError:
                continue
            if data.strip() == FREEZE_WORD:
                name = container_by("ip", source)
                if name:
                    time.sleep(0.5)  # its SSH session closes first, as a real host's suspend comes after the reply
                    docker("pause", name, check=False)
                    log(f"{name} frozen (its sleep command)")
                    if events is not None:
                        events.append((time.time(), "frozen", name))
            elif len(data) >= 102 and data[:6] == b"\xff" * 6 and data[6:12] * 16 == data[6:102]:
                mac = ":".join(f"{b:02x}" for b in data[6:12])
                name = container_by("mac", mac)
                state = docker("inspect", "--format", "{{.State.Paused}}", name, check=False) if name else ""
                if state == "true":
                    docker("unpause", name, check=False)
                    log(f"{name} thawed (a magic packet for {mac} from {source})")
                    if events is not None:
                        events.append((time.time(), "thawed", name))
    finally:
        sock.close()
