"""Reaching the hosts from the control machine, outside a pyinfra run: an ssh_config of the inventory's hosts,
commands over SSH the way pyinfra reaches them (status, bench, tune, testinfra), and the image-transfer key the
deploy makes here once for the coordinator to send the images to the workers."""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
from pathlib import Path

from .loading import load_inventory
from .paths import STATE

TRANSFER_KEY_COMMENT = "llama-rpc-deploy-image-transfer"
SLEEP_KEY_COMMENT = "llama-rpc-deploy-sleep"


def _key_pair(key: Path, comment: str) -> Path:
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(key)], check=True)
    return key


def transfer_key(state_dir: Path = STATE) -> Path:
    """An ed25519 key pair made once on the control machine; the workers accept it only for image loads."""
    return _key_pair(state_dir / "transfer_ed25519", TRANSFER_KEY_COMMENT)


def sleep_key(transfer: Path) -> Path:
    """The key pair, beside the transfer key, that the workers accept only for their sleep (sleep-now.sh)."""
    return _key_pair(transfer.parent / "sleep_ed25519", SLEEP_KEY_COMMENT)


def write_ssh_config(inventory: Path, directory: Path) -> Path:
    """An ssh_config with one Host block per inventory host, from its ssh_* data as pyinfra sees it: for
    testinfra (which ignores --ssh-extra-args) and `bench`, to reach the hosts the way pyinfra does."""
    blocks = []
    for host in load_inventory(inventory):
        data = host.data
        block = [
            f"Host {host.name}",
            f"  HostName {data.get('ssh_hostname') or host.name}",
            f"  User {data.get('ssh_user') or 'root'}",
            f"  Port {data.get('ssh_port') or 22}",
            "  BatchMode yes",
        ]
        if data.get("ssh_key"):
            block += [f"  IdentityFile {data.get('ssh_key')}", "  IdentitiesOnly yes"]
        if data.get("ssh_known_hosts_file"):
            block.append(f"  UserKnownHostsFile {data.get('ssh_known_hosts_file')}")
        if data.get("ssh_strict_host_key_checking"):
            block.append(f"  StrictHostKeyChecking {data.get('ssh_strict_host_key_checking')}")
        blocks.append("\n".join(block))
    path = directory / "ssh_config"
    path.write_text("\n\n".join(blocks) + "\n")
    return path


@contextlib.contextmanager
def ssh_runner(inventory: Path):
    """run(host, command, input=None, timeout=120) -> CompletedProcess: a command on an inventory host over
    SSH, reached the way pyinfra reaches it (write_ssh_config), for the commands around the deploy."""
    with tempfile.TemporaryDirectory() as tmp:
        config = write_ssh_config(inventory, Path(tmp))

        def run(host: str, command: str, input: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
            return subprocess.run(
                ["ssh", "-F", str(config), host, command], input=input, capture_output=True, text=True, timeout=timeout
            )

        yield run
