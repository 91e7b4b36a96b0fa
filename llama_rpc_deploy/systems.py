"""The systems the prepare phase (phases/prepare.py) can bring from bare to ready, and what it installs on each.

Supported: Debian 12 and 13, Ubuntu 22.04 and 24.04, read from /etc/os-release. Every package comes from the
distribution's own archive, except NVIDIA's Container Toolkit, which comes from NVIDIA's apt repository, signed by
a key whose fingerprint is pinned here (NVIDIA_KEY_FINGERPRINT): the key is downloaded, its fingerprint checked,
and only then installed as the repository's keyring. The NVIDIA driver is never installed (it needs the right
release for the card and a reboot): a host without one is refused with the command for its system.

The facts below are read while the deploy loads, before anything changes (pyinfra reads every fact then).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pyinfra.api import FactBase

from .quoting import shell


@dataclass(frozen=True)
class System:
    id: str  # os-release ID
    version: str  # os-release VERSION_ID
    name: str  # in messages
    docker: tuple[str, ...]  # the packages of the distribution's Docker Engine, as the deploy uses it
    driver: str  # how a user installs the NVIDIA driver here


_DEBIAN_DRIVER = (
    "apt-get install nvidia-driver firmware-misc-nonfree (Debian's non-free component; its driver predates "
    "RTX 50xx cards, which need 570 or newer: cuda-drivers from NVIDIA's CUDA repository), then reboot"
)
_UBUNTU_DRIVER = "ubuntu-drivers install (or apt-get install nvidia-driver-570), then reboot"

SYSTEMS = {
    (s.id, s.version): s
    for s in (
        # Docker 20.10 builds with BuildKit itself
        System("debian", "12", "Debian 12", ("docker.io",), _DEBIAN_DRIVER),
        # Docker 23 and later need buildx for a BuildKit build (the deploy's); from Debian 13, the docker command is
        # a package of its own
        System("debian", "13", "Debian 13", ("docker.io", "docker-cli", "docker-buildx"), _DEBIAN_DRIVER),
        System("ubuntu", "22.04", "Ubuntu 22.04", ("docker.io", "docker-buildx"), _UBUNTU_DRIVER),
        System("ubuntu", "24.04", "Ubuntu 24.04", ("docker.io", "docker-buildx"), _UBUNTU_DRIVER),
    )
}
SUPPORTED = "Debian 12 or 13, Ubuntu 22.04 or 24.04"

# What every host needs besides Docker: the image's transfer (zstd), the worker's firewall (iptables), llama-sleep
# (python3), HTTPS downloads (ca-certificates, curl), the port checks and the wake's NIC (iproute2: ss, ip; ethtool).
BASE_PACKAGES = ("zstd", "iptables", "python3", "ca-certificates", "curl", "iproute2", "ethtool")
# For NVIDIA's repository: its key is checked with gpg
NVIDIA_TOOLKIT_PACKAGES = ("gpg",)
# A Vulkan card: Mesa's drivers and the loader on the host (the image has its own), and vulkaninfo. The render
# node's group reaches the container by its number (render.py: --group-add), so no group is made here.
VULKAN_PACKAGES = ("mesa-vulkan-drivers", "libvulkan1", "vulkan-tools")

NVIDIA_KEY_URL = "https://nvidia.github.io/libnvidia-container/gpgkey"
NVIDIA_KEY_FINGERPRINT = "C95B321B61E88C1809C4F759DDCAE044F796ECB0"  # NVIDIA CORPORATION (Open Source Projects)
NVIDIA_KEYRING = "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"
NVIDIA_SOURCE_FILE = "/etc/apt/sources.list.d/nvidia-container-toolkit.list"
NVIDIA_SOURCE = f"deb [signed-by={NVIDIA_KEYRING}] https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /\n"
NVIDIA_TOOLKIT = "nvidia-container-toolkit"
DOCKER_DAEMON_JSON = "/etc/docker/daemon.json"

# PCI vendor IDs of display controllers (class 0x03....): how a host shows a card before any driver is there
PCI_VENDORS = {"0x10de": "nvidia", "0x1002": "amd", "0x8086": "intel"}


class Unsupported(ValueError):
    """A system the prepare phase does not know: the message names it and what is supported."""


def system_of(release: dict[str, str], host: str) -> System:
    """The supported system an /etc/os-release describes; Unsupported, naming it and what is supported, if none."""
    found = SYSTEMS.get((release.get("ID", ""), release.get("VERSION_ID", "")))
    if found is None:
        name = release.get("PRETTY_NAME") or "an unknown system"
        raise Unsupported(
            f"{host}: {name} (/etc/os-release: ID={release.get('ID', '')!r}, VERSION_ID="
            f"{release.get('VERSION_ID', '')!r}) is not supported by the prepare phase: expected {SUPPORTED}, "
            "or host_prepare: False on this host and Docker Engine, zstd, iptables, python3 installed by you"
        )
    return found


def key_command() -> str:
    """Download NVIDIA's repository key file, import it into a keyring of its own, and install as the repository's
    keyring the pinned key alone, exported by its fingerprint: a file without it stops with the fingerprints it had
    and installs nothing; another key beside it in the file is not trusted."""
    return "\n".join(
        (
            "set -euo pipefail",
            "tmp=$(mktemp -d); trap 'rm -rf \"$tmp\"' EXIT",
            'export GNUPGHOME="$tmp/gnupg"; mkdir -m 700 "$GNUPGHOME"',
            f'curl -fsSL --retry 3 --connect-timeout 20 -o "$tmp/key" {shell(NVIDIA_KEY_URL)}',
            'gpg --batch --quiet --import "$tmp/key" 2>/dev/null || true',
            f"if ! gpg --batch --list-keys {NVIDIA_KEY_FINGERPRINT} >/dev/null 2>&1; then",
            "  found=$(gpg --batch --with-colons --list-keys 2>/dev/null | awk -F: '$1 == \"fpr\" { print $10 }' | tr '\\n' ' ')",
            f'  echo "{NVIDIA_KEY_URL}: no key {NVIDIA_KEY_FINGERPRINT} (the file holds: ${{found:-no key}}): not installed" >&2',
            "  exit 1",
            "fi",
            f'gpg --batch --export {NVIDIA_KEY_FINGERPRINT} > "$tmp/keyring.gpg"',
            f'install -m 644 "$tmp/keyring.gpg" {shell(NVIDIA_KEYRING)}',
        )
    )


CONFIGURE_RUNTIME = "nvidia-ctk runtime configure --runtime=docker"


class OsRelease(FactBase):
    """/etc/os-release as a dict (ID, VERSION_ID, PRETTY_NAME, ...); {} without one."""

    @staticmethod
    def default() -> dict[str, str]:  # what pyinfra gives for no output at all
        return {}

    def command(self) -> str:
        return "cat /etc/os-release 2>/dev/null || cat /usr/lib/os-release 2>/dev/null || true"

    def process(self, output: list[str]) -> dict[str, str]:
        release = {}
        for line in output:
            key, sep, value = line.strip().partition("=")
            if sep and key and not key.startswith("#"):
                release[key] = value.strip().strip("\"'")
        return release


class DisplayVendors(FactBase):
    """The vendors (nvidia, amd, intel, or the PCI ID) of the host's display controllers, driver or not."""

    @staticmethod
    def default() -> list[str]:  # what pyinfra gives for no output at all (no display controller), not None
        return []

    def command(self) -> str:
        return (
            'for d in /sys/bus/pci/devices/*; do case "$(cat "$d/class" 2>/dev/null)" in 0x03*) cat "$d/vendor";; '
            "esac; done 2>/dev/null; true"
        )

    def process(self, output: list[str]) -> list[str]:
        return sorted({PCI_VENDORS.get(line.strip(), line.strip()) for line in output if line.strip()})


class NvidiaDriver(FactBase):
    """Whether the NVIDIA driver answers (nvidia-smi -L lists a card)."""

    def command(self) -> str:
        return "nvidia-smi -L 2>/dev/null | grep -q '^GPU ' && echo yes || echo no"

    def process(self, output: list[str]) -> bool:
        return "yes" in output


class DockerDaemonRuntimes(FactBase):
    """The runtimes /etc/docker/daemon.json names (what `nvidia-ctk runtime configure` adds), None when the file is
    missing or not JSON: Docker's configuration, which the daemon reads when it starts."""

    def command(self) -> str:
        return f"cat {DOCKER_DAEMON_JSON} 2>/dev/null || true"

    def process(self, output: list[str]) -> list[str] | None:
        try:
            config = json.loads("\n".join(output))
        except ValueError:
            return None
        return sorted((config.get("runtimes") or {}).keys()) if isinstance(config, dict) else None
