"""pyinfra facts this deploy reads on the hosts before it changes anything."""
from __future__ import annotations

import shlex

from pyinfra.api import FactBase


class DockerImageId(FactBase):
    """The ID (sha256:...) of a local image by name:tag, or None when the host does not have it."""

    def command(self, image: str) -> str:
        return f"docker image inspect --format '{{{{.Id}}}}' {shlex.quote(image)} 2>/dev/null || true"

    def process(self, output: list[str]) -> str | None:
        lines = [line.strip() for line in output if line.strip().startswith("sha256:")]
        return lines[0] if lines else None


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
        return "for c in " + " ".join(shlex.quote(n) for n in names) + "; do command -v \"$c\" >/dev/null || echo \"$c\"; done"

    def process(self, output: list[str]) -> list[str]:
        return [line.strip() for line in output if line.strip()]


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
                return line[start + 3:line.find('"', start + 3)] if start >= 0 else ""
        return None


class TcpReachable(FactBase):
    """Whether this host can open a TCP connection to address:port (3 s at most)."""

    def command(self, address: str, port: int) -> str:
        return (f"timeout 3 bash -c '>/dev/tcp/{shlex.quote(address)}/{int(port)}' 2>/dev/null "
                "&& echo yes || echo no")

    def process(self, output: list[str]) -> bool:
        return "yes" in output
