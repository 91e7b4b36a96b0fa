"""deploy.py through pyinfra's own prepare stage (as `pyinfra INVENTORY deploy.py` runs it), the facts faked:
every operation of every host is created, in pyinfra's order, without a host. For tests/unit/test_wiring.py and
scripts/snapshot.py (every rendered file and operation, to compare two versions of the deploy)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from unittest import mock

import pyinfra
from pyinfra.api import Config, State
from pyinfra.api.host import Host
from pyinfra.api.state import StateStage
from pyinfra.context import ctx_config, ctx_inventory, ctx_state
from pyinfra.facts import deb as deb_facts
from pyinfra.facts import files as file_facts
from pyinfra.facts import server as server_facts
from pyinfra.facts import systemd as systemd_facts

from llama_rpc_deploy import facts, roles, systems
from llama_rpc_deploy.paths import PROJECT

IMAGE_ID = "sha256:" + "1" * 64
# running and enabled on every host (the tunnel's unit is not: its operations start it)
UNITS = (
    roles.WORKER_UNIT,
    roles.COORDINATOR_UNIT,
    roles.FIREWALL_UNIT,
    roles.WATCHDOG_UNIT,
    roles.WORKER_WATCHDOG_UNIT,
    roles.CACHE_PRUNE_TIMER,
    roles.FRONT_UNIT,
)


class Unchanged(str):
    """A remote checksum equal to whatever it is compared with: the file on the host is the one rendered."""

    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = str.__hash__


EVERY_FILE = object()  # changed = EVERY_FILE: no file on any host is the one the deploy renders


def fake_facts(changed: dict[str, set[str]], header: bytes, header_size: int, runtimes=("runc",)):
    """Host.get_fact for these runs: every host has what the deploy needs (the image, its services running),
    and on each host exactly the files named in changed[host] differ from what the deploy renders."""

    def get_fact(host: Host, fact, *args, **kwargs):
        path = kwargs.get("path", "")
        answers = {
            facts.MissingCommands: [],
            facts.DockerRuntimes: list(runtimes),
            facts.NvidiaGpus: [],
            facts.VulkanGpus: [],
            facts.TcpListener: None,
            facts.TcpReachable: True,
            facts.GgufFiles: [],
            facts.RenderNodes: ["renderD128"],
            facts.SshHostKey: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTheWiringTest",
            facts.DockerImageId: IMAGE_ID,
            facts.DockerImageLayers: [],
            facts.GgufHeader: (header_size, header[: kwargs.get("limit", len(header))]),
            systems.OsRelease: {"ID": "debian", "VERSION_ID": "12", "PRETTY_NAME": "Debian GNU/Linux 12 (bookworm)"},
            systems.DisplayVendors: [],
            systems.NvidiaDriver: True,
            systems.DockerDaemonRuntimes: list(runtimes),
        }
        if fact in answers:
            return answers[fact]
        if fact is deb_facts.DebPackages:
            prepared = systems.BASE_PACKAGES + ("docker.io", systems.NVIDIA_TOOLKIT)  # what the prepare phase installs
            return {"haproxy": ["2.6.12-1+deb12u4"], "socat": ["1.7.4.4-2"], **{p: ["1"] for p in prepared}}
        if fact in (file_facts.Sha1File, file_facts.Sha256File):
            differs = changed is EVERY_FILE or path in changed.get(host.name, ())
            return "0" * 40 if differs else Unchanged("same")
        if fact is file_facts.File:
            return {"mode": 755 if path.endswith(".sh") else 644, "user": "root", "group": "root", "size": 1}
        if fact is file_facts.Directory:
            return {"mode": 755, "user": "root", "group": "root"}
        if fact is file_facts.FindInFile:
            return ["present"]
        if fact in (systemd_facts.SystemdStatus, systemd_facts.SystemdEnabled):
            return {unit: True for unit in (*UNITS, "docker.service")}
        if fact is server_facts.Users:
            return {
                "llama-rpc": {
                    "home": "/nonexistent",
                    "shell": "/usr/sbin/nologin",
                    "group": "llama-rpc",
                    "groups": [],
                    "uid": 999,
                    "gid": 999,
                    "comment": None,
                }
            }
        if fact is server_facts.Groups:
            return {"llama-rpc"}
        if fact is server_facts.Os:
            return "Linux"
        if fact is server_facts.TmpDir:
            return "/tmp"
        raise AssertionError(f"the wiring run fakes no {fact.__name__}({kwargs}): add it")

    return get_fact


def prepare(inventory_file: Path, get_fact, transfer_key: Path) -> State:
    """deploy.py through pyinfra's prepare stage, as its CLI does it (pyinfra_cli/cli.py), with get_fact
    as every host's facts and transfer_key as the image-transfer key."""
    from pyinfra_cli.inventory import make_inventory
    from pyinfra_cli.util import load_deploy_file

    from llama_rpc_deploy import remote

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(remote, "transfer_key", lambda *a, **k: transfer_key))
        stack.enter_context(mock.patch.object(Host, "get_fact", get_fact))
        # operations ordered by the lines that create them, as in the CLI
        stack.enter_context(mock.patch.object(pyinfra, "is_cli", True))
        cwd = os.getcwd()
        os.chdir(PROJECT)
        stack.callback(os.chdir, cwd)
        state = State(check_for_changes=True)
        # one PARALLEL for every run in this process (pyinfra derives it from the inventory's size otherwise): a run
        # refused in one host's greenlet can leave its Config in pyinfra's context for the next run's other hosts,
        # whose operations would then differ in `_parallel` ("Cannot have different values for `_parallel`")
        config = Config(PARALLEL=16)
        with ctx_state.use(state), ctx_config.use(config):
            inventory = make_inventory(str(inventory_file), cwd=str(PROJECT))
            with ctx_inventory.use(inventory):
                state.init(inventory, config)
                for host in inventory:  # as connect_all does for each host it reached
                    state.activate_host(host)
                state.set_stage(StateStage.Prepare)
                state.current_op_file_number = 0
                load_deploy_file(state, str(PROJECT / "deploy.py"))
    return state


def model_header(path: Path) -> bytes:
    """The model of these runs, written to path: a small llama (8 layers), its header what the facts read."""
    from tests.unit.shaped import write_shaped

    return write_shaped(
        path, arch="llama", n_layer=8, n_embd=512, n_head=8, n_head_kv=4, head_dim=64, n_ff=1024, n_vocab=1000
    ).read_bytes()


def fake_transfer_key(folder: Path) -> Path:
    key = folder / "state" / "transfer_ed25519"
    key.parent.mkdir(parents=True, exist_ok=True)
    key.write_text("fake private key\n")
    key.with_suffix(".pub").write_text("ssh-ed25519 AAAA fake\n")
    return key
