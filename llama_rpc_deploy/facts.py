"""pyinfra facts this deploy reads on the hosts before it changes anything."""

from __future__ import annotations

from . import gpus
from .quoting import shell

from pyinfra.api import FactBase


class DockerImageId(FactBase):
    """The ID (sha256:...) of a local image by name:tag, or None when the host does not have it."""

    def command(self, image: str) -> str:
        return f"docker image inspect --format '{{{{.Id}}}}' {shell(image)} 2>/dev/null || true"

    def process(self, output: list[str]) -> str | None:
        lines = [line.strip() for line in output if line.strip().startswith("sha256:")]
        return lines[0] if lines else None


class DockerImageLayers(FactBase):
    """Every local image as the diff IDs of its layers, bottom up: what an image transfer may leave out."""

    def command(self) -> str:
        return (
            "docker image ls -q --no-trunc 2>/dev/null | sort -u | xargs -r docker image inspect "
            "--format '{{range .RootFS.Layers}}{{.}},{{end}}' 2>/dev/null || true"
        )

    def process(self, output: list[str]) -> list[tuple[str, ...]]:
        images = {
            tuple(d for d in line.strip().split(",") if d) for line in output if line.strip().startswith("sha256:")
        }
        return sorted(images)


class GgufFiles(FactBase):
    """The .gguf files (or links to them) directly in a folder, by path."""

    def command(self, folder: str) -> str:
        return f"find {shell(folder)} -maxdepth 1 \\( -type f -o -type l \\) -name '*.gguf' 2>/dev/null || true"

    def process(self, output: list[str]) -> list[str]:
        return sorted(line.strip() for line in output if line.strip())


class SshHostKey(FactBase):
    """The host's ed25519 SSH host key ("ssh-ed25519 AAAA..."), for the coordinator's known_hosts."""

    def command(self) -> str:
        return "cat /etc/ssh/ssh_host_ed25519_key.pub 2>/dev/null || true"

    def process(self, output: list[str]) -> str | None:
        for line in output:
            parts = line.split()
            if len(parts) >= 2 and parts[0].startswith("ssh-"):
                return f"{parts[0]} {parts[1]}"
        return None


class MissingCommands(FactBase):
    """Which of the given commands are not on the host's PATH."""

    def command(self, names: tuple[str, ...]) -> str:
        return "for c in " + " ".join(shell(n) for n in names) + '; do command -v "$c" >/dev/null || echo "$c"; done'

    def process(self, output: list[str]) -> list[str]:
        return [line.strip() for line in output if line.strip()]


class RenderNodes(FactBase):
    """The host's GPU render nodes (/dev/dri/renderD128, ...): how a Vulkan GPU reaches a container."""

    def command(self) -> str:
        return "ls -1 /dev/dri/ 2>/dev/null | grep '^renderD' || true"

    def process(self, output: list[str]) -> list[str]:
        return [f"/dev/dri/{line.strip()}" for line in output if line.strip()]


class DockerRuntimes(FactBase):
    """Names of the container runtimes Docker knows (e.g. runc, nvidia)."""

    def command(self) -> str:
        return "docker info --format '{{range $name, $_ := .Runtimes}}{{$name}} {{end}}' 2>/dev/null || true"

    def process(self, output: list[str]) -> list[str]:
        return " ".join(output).split()


class TcpListener(FactBase):
    """The process listening on a TCP port (as ss names it), '' when something unnamed listens, None when free."""

    def command(self, port: int) -> str:
        return f"ss -Hltnp 'sport = :{int(port)}' 2>/dev/null || true"

    def process(self, output: list[str]):
        for line in output:
            if line.strip():
                start = line.find('(("')
                return line[start + 3 : line.find('"', start + 3)] if start >= 0 else ""
        return None


class TcpReachable(FactBase):
    """Whether this host can open a TCP connection to address:port (3 s at most)."""

    def command(self, address: str, port: int) -> str:
        return (
            f"timeout 3 bash -c {shell(f'>/dev/tcp/{shell(address)}/{int(port)}')} 2>/dev/null && echo yes || echo no"
        )

    def process(self, output: list[str]) -> bool:
        return "yes" in output


class GgufHeader(FactBase):
    """(file size, the first bytes) of a GGUF file: enough for the planner to read its metadata."""

    def command(self, path: str, limit: int) -> str:
        q = shell(path)
        return f"stat -c %s {q} && head -c {int(limit)} {q} | gzip -1 | base64 -w0 && echo"

    def process(self, output: list[str]):
        import base64
        import gzip

        if len(output) < 2 or not output[0].strip().isdigit():
            return None
        return int(output[0]), gzip.decompress(base64.b64decode("".join(output[1:]).strip()))


class NvidiaGpus(FactBase):
    """The host's NVIDIA GPUs as nvidia-smi lists them: [gpus.Found] (name, memory in MiB, compute capability);
    [] without nvidia-smi."""

    @staticmethod
    def default() -> list:  # no output at all (no tool, no card): none, not None
        return []

    def command(self) -> str:
        return f"command -v nvidia-smi >/dev/null && {gpus.nvidia_smi_query()} 2>/dev/null || true"

    def process(self, output: list[str]) -> list[gpus.Found]:
        return gpus.parse_nvidia_smi(output)


class WakeNic(FactBase):
    """The NIC that would wake this worker (sleep.Nic, parsed by sleep.nic_of): wol_interface, or the one this host
    reaches the coordinator through; its MAC, IPv4 broadcast address, and ethtool's Wake-on lines."""

    def command(self, coordinator: str, interface: str | None = None) -> str:
        find = (
            f"i={shell(interface)}"
            if interface
            else (
                f"a=$(getent ahostsv4 {shell(coordinator)} | awk 'NR == 1 {{ print $1 }}'); "
                "i=$(ip -o route get \"$a\" 2>/dev/null | sed -nE 's/.* dev ([^ ]+).*/\\1/p')"
            )
        )
        return (
            f'{find}; echo "interface $i"; '
            'if [ -n "$i" ] && [ -e "/sys/class/net/$i" ]; then echo "exists yes"; '
            'echo "mac $(cat "/sys/class/net/$i/address")"; '
            'echo "broadcast $(ip -o -4 addr show dev "$i" | sed -nE \'s/.* brd ([0-9.]+).*/\\1/p\' | head -n 1)"; '
            'else echo "exists no"; fi; '
            "e=$(command -v ethtool || ls /usr/sbin/ethtool /sbin/ethtool 2>/dev/null | head -n 1); "
            'if [ -n "$e" ]; then echo "ethtool yes"; [ -n "$i" ] && "$e" "$i" 2>/dev/null | grep "Wake-on"; '
            'else echo "ethtool no"; fi; true'
        )

    def process(self, output: list[str]) -> list[str]:
        return [line for line in output if line.strip()]


class VulkanGpus(FactBase):
    """The host's AMD and Intel (or other) GPUs as `vulkaninfo --summary` lists them: [gpus.Found] (its device name,
    no memory; gpus.parse_vulkaninfo says which devices count); [] without vulkaninfo."""

    @staticmethod
    def default() -> list:  # no output at all (no tool, no card): none, not None
        return []

    def command(self) -> str:
        return "command -v vulkaninfo >/dev/null && vulkaninfo --summary 2>/dev/null || true"

    def process(self, output: list[str]) -> list[gpus.Found]:
        return gpus.parse_vulkaninfo(output)
