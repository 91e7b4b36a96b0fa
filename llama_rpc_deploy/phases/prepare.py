"""The first phase: each host gets what it lacks (host_prepare, on by default; docs/prepare.md). The system is read
from /etc/os-release and refused unless systems.py supports it; then the distribution's packages the deploy needs
(Docker Engine, zstd, iptables, python3, ...), only those missing, and Docker enabled and running. A host with
NVIDIA cards must have its driver (refused otherwise, with the command for its system); it gets the NVIDIA
Container Toolkit from NVIDIA's repository (a pinned key) and Docker's nvidia runtime, Docker restarted only when
that changed its configuration. A host with AMD or Intel cards gets Mesa's Vulkan drivers. Nothing is upgraded or
removed. With host_prepare False the host is only checked (phases/checks.host_is_ready)."""

from __future__ import annotations

from io import StringIO

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import File
from pyinfra.facts.systemd import SystemdStatus
from pyinfra.operations import files, server, systemd

from .. import facts, systems
from ..refusal import refuse
from ..run import Run
from .shared import debian_packages

# The commands this phase provides (systems.BASE_PACKAGES and Docker's), which the checks that follow do not ask of
# a host it prepares: they read their facts before it installs anything
PROVIDES = frozenset({"docker", "zstd", "iptables", "iptables-restore", "python3", "curl", "ss", "ip"})


def cards(me, vendors: list[str]) -> str | None:
    """'nvidia' or 'vulkan' for a host whose cards the prepare phase sets up, None for a CPU host: the cards gpus
    lists, or with gpus unset (None, learned from the host) the display controllers its PCI bus shows."""
    listed, unset = me.settings["gpus"], me.settings["gpus"] is None
    if me.backend == "cuda" and (listed or (unset and "nvidia" in vendors)):
        return "nvidia"
    if me.backend == "vulkan" and (listed or (unset and {"amd", "intel"} & set(vendors))):
        return "vulkan"
    return None


def is_prepared(me) -> bool:
    """Whether the prepare phase runs on this host (host_prepare)."""
    return bool(me.settings["host_prepare"])


def sets_up(me) -> str | None:
    """The cards ('nvidia', 'vulkan') the prepare phase sets up on this host (its driver checked, the toolkit and
    Docker's runtime, or Mesa's drivers); None when it does not run here or the host has none."""
    return cards(me, host.get_fact(systems.DisplayVendors)) if is_prepared(me) else None


def lacks(me, names: tuple[str, ...]) -> list[str]:
    """Which of the commands names the host lacks once this phase has run: those it neither has nor gets here."""
    missing = host.get_fact(facts.MissingCommands, names=names) or []
    return [n for n in missing if not (is_prepared(me) and n in PROVIDES)]


@deploy("Prepare the host: what the deploy needs, installed where it lacks it")
def prepare_host(run: Run):
    me = run.deployment.cluster.host(host.name)
    if not is_prepared(me):
        return
    try:
        system = systems.system_of(host.get_fact(systems.OsRelease), host.name)
    except systems.Unsupported as error:
        refuse(str(error))
    kind = sets_up(me)
    if kind == "vulkan" and me.settings["gpus"] is None and host.get_fact(facts.MissingCommands, names=("vulkaninfo",)):
        # the cards are learned while the deploy loads, before this phase installs vulkan-tools
        refuse(
            f"{host.name}: gpus is not set and an AMD or Intel card is on its PCI bus, but vulkaninfo is not installed "
            "yet: the deploy learns the cards before it installs anything: expected gpus listed (e.g. gpus = "
            "['RX 7900 XTX']), or vulkan-tools installed first (apt-get install vulkan-tools; llama-rpc probe then "
            "prints the line)"
        )
    if kind == "nvidia" and not host.get_fact(systems.NvidiaDriver):
        refuse(
            f"{host.name}: image_backend = 'cuda' ({me.origins['image_backend']}) with NVIDIA cards, but nvidia-smi "
            f"does not answer: the NVIDIA driver is missing (the deploy does not install drivers): on "
            f"{system.name}, {system.driver}"
        )
    installed = host.get_fact(DebPackages) or {}
    toolkit = kind == "nvidia" and systems.NVIDIA_TOOLKIT not in installed
    no_docker = bool(host.get_fact(facts.MissingCommands, names=("docker",)))
    wanted = (
        systems.BASE_PACKAGES
        # the distribution's Docker, or what it lacks of it (Debian 13's docker.io without buildx); not a Docker
        # of another kind (docker-ce)
        + (system.docker if no_docker or "docker.io" in installed else ())
        + (systems.NVIDIA_TOOLKIT_PACKAGES if toolkit else ())
        + (systems.VULKAN_PACKAGES if kind == "vulkan" else ())
    )
    debian_packages(f"{system.name}'s packages the deploy needs", wanted)
    if no_docker or "docker.service" in (host.get_fact(SystemdStatus) or {}):  # not a Docker of another kind (snap)
        systemd.service(name="Docker enabled and running", service="docker", running=True, enabled=True)
    if kind != "nvidia":
        return
    if toolkit:
        if not host.get_fact(File, path=systems.NVIDIA_KEYRING):
            server.shell(
                name=f"NVIDIA's repository key, its fingerprint checked ({systems.NVIDIA_KEY_FINGERPRINT})",
                commands=[systems.key_command()],
                _shell_executable="bash",
            )
        files.put(
            name="NVIDIA's repository (signed by that key)",
            src=StringIO(systems.NVIDIA_SOURCE),
            dest=systems.NVIDIA_SOURCE_FILE,
            mode="644",
        )
        debian_packages("The NVIDIA Container Toolkit", (systems.NVIDIA_TOOLKIT,))
    configured = "nvidia" in (host.get_fact(systems.DockerDaemonRuntimes) or [])
    if not configured:
        server.shell(name="Docker's nvidia runtime", commands=[systems.CONFIGURE_RUNTIME])
    # also when daemon.json has it but the running Docker does not (a run that stopped before this restart)
    if not configured or "nvidia" not in (host.get_fact(facts.DockerRuntimes) or []):
        systemd.service(
            name="Docker restarted onto its new configuration", service="docker", running=True, restarted=True
        )
