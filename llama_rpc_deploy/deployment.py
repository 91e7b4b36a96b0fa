"""What deploy.py works from: the checked cluster, the llama.cpp source, the image tag.

Built once per pyinfra run from the loaded inventory, before any operation, so a
bad setting stops the deploy before the first host is touched.
"""
from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from .plan import Cluster, HostPlan, host_plan, make_cluster
from .settings import Layer, SettingsError
from .source import Source, resolve_source

PROJECT = Path(__file__).resolve().parent.parent
STATE = PROJECT / ".state"  # on the control machine: packed sources, the image-transfer key

# Operations of this pyinfra run that other hosts' operations look at when they run (deploy.py
# runs once per host, and every host's operations are created before the first one runs):
RPC_SERVICE_OPS: dict = {}  # worker name -> its "rpc-server running" operation
REPLACED: dict = {}  # host name -> [(path, the operation that kept the old file as path.previous)]
HEALTH: dict = {}  # "check" -> the coordinator's health wait (fails: the new version is rolled back)
RUN_ID = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())  # names the folder a failed version's logs go to


@dataclass(frozen=True)
class Deployment:
    cluster: Cluster
    source: Source
    image: str  # name:tag, the same on every host
    transfer_key: Path | None  # private key the coordinator uses to send the image to the workers

    def role(self, name: str) -> str:
        if name == self.cluster.coordinator.name:
            return "coordinator"
        if any(w.name == name for w in self.cluster.workers):
            return "worker"
        return "none"

    def host(self, name: str) -> HostPlan:
        return next(h for h in (self.cluster.coordinator, *self.cluster.workers) if h.name == name)


def with_split(dep: Deployment, split: list[int]) -> Deployment:
    """The same deployment with llama_tensor_split = the planner's split (for llama_tensor_split = 'auto')."""
    c = dep.cluster.coordinator
    coordinator = replace(c, settings={**c.settings, "llama_tensor_split": list(split)})
    return replace(dep, cluster=replace(dep.cluster, coordinator=coordinator))


def layers_for(inventory, name: str, inventory_file: str) -> list[Layer]:
    """pyinfra's data layers for one host, highest first, each labelled with where it came from."""
    host = inventory.get_host(name)
    layers = [Layer("--data on the command line", dict(inventory.get_override_data())),
              Layer(f"{inventory_file} (host {name})", dict(inventory.get_host_data(name)))]
    for group in reversed(host.groups):
        if group != "all":
            layers.append(Layer(f"group_data/{group}.py", dict(inventory.get_group_data(group))))
    layers.append(Layer("group_data/all.py", dict(inventory.get_data())))
    return layers


TRANSFER_KEY_COMMENT = "llama-rpc-deploy-image-transfer"


def transfer_key(state_dir: Path = STATE) -> Path:
    """An ed25519 key pair made once on the control machine; the workers accept it only for image loads."""
    key = state_dir / "transfer_ed25519"
    if not key.exists():
        state_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", TRANSFER_KEY_COMMENT,
                        "-f", str(key)], check=True)
    return key


def inventory_file(argv: list[str] = sys.argv) -> str:
    """The inventory file pyinfra was given (the first .py argument), for error messages."""
    return next((a for a in argv[1:] if a.endswith(".py")), "inventory.py")


_LOADED: dict = {}


def load(inventory, inventory_file: str = "inventory.py") -> Deployment:
    """The deployment for this pyinfra run. deploy.py runs once per host; the inventory is the
    same object each time, so the settings are checked and the source hashed once."""
    if id(inventory) not in _LOADED:
        _LOADED.clear()
        _LOADED[id(inventory)] = _load(inventory, inventory_file)
    return _LOADED[id(inventory)]


def _load(inventory, inventory_file: str) -> Deployment:
    groups = {g: [h.name for h in inventory.get_group(g, [])] for g in ("coordinator", "workers")}
    coordinators = [host_plan(n, layers_for(inventory, n, inventory_file)) for n in groups["coordinator"]]
    workers = [host_plan(n, layers_for(inventory, n, inventory_file)) for n in groups["workers"]]
    return from_cluster(make_cluster(coordinators, workers, inventory_file))


def from_cluster(cluster: Cluster, with_key: bool = True) -> Deployment:
    s = cluster.settings
    source = resolve_source(s["llama_cpp_source"], s["llama_cpp_ref"], STATE / "sources")
    return Deployment(cluster=cluster, source=source, image=cluster.image_tag(source),
                      transfer_key=transfer_key() if with_key else None)


# --- the same data without pyinfra: for `complete`, `settings` and the testinfra suite ---

def _python_data(path: Path) -> dict:
    """The public names a group_data/inventory file defines (pyinfra's rule: no dunders, no modules)."""
    import runpy
    import types

    if not path.is_file():
        return {}
    try:
        names = runpy.run_path(str(path))
    except SyntaxError as error:
        raise SettingsError(f"{path}:{error.lineno}: {error.msg}: expected Python (name = value lines)") from None
    return {k: v for k, v in names.items()
            if not k.startswith("__") and not isinstance(v, (types.ModuleType, types.FunctionType, type))}


def read_inventory(inventory_path: Path) -> dict[str, list[tuple[str, dict]]]:
    """{"coordinator": [(name, host data)], "workers": [...]} from an inventory file."""
    data = _python_data(inventory_path)
    return {group: [(h, {}) if isinstance(h, str) else (h[0], dict(h[1])) for h in data.get(group, [])]
            for group in ("coordinator", "workers")}


def write_ssh_config(inventory: Path, directory: Path) -> Path:
    """An ssh_config with one Host block per inventory host, from its ssh_* data: for testinfra (which
    ignores --ssh-extra-args) and `bench`, to reach the hosts the way pyinfra does."""
    blocks = []
    for hosts in read_inventory(inventory).values():
        for name, data in hosts:
            block = [f"Host {name}", f"  HostName {name}", f"  User {data.get('ssh_user', 'root')}",
                     f"  Port {data.get('ssh_port', 22)}", "  BatchMode yes"]
            if data.get("ssh_key"):
                block += [f"  IdentityFile {data['ssh_key']}", "  IdentitiesOnly yes"]
            if data.get("ssh_known_hosts_file"):
                block.append(f"  UserKnownHostsFile {data['ssh_known_hosts_file']}")
            if data.get("ssh_strict_host_key_checking"):
                block.append(f"  StrictHostKeyChecking {data['ssh_strict_host_key_checking']}")
            blocks.append("\n".join(block))
    path = directory / "ssh_config"
    path.write_text("\n\n".join(blocks) + "\n")
    return path


def offline_cluster(inventory_path: Path, group_data: Path = PROJECT / "group_data",
                    overrides: dict | None = None) -> Cluster:
    """The Cluster as deploy.py computes it, read from the files alone (same layers, same checks)."""
    groups = read_inventory(inventory_path)
    all_data = _python_data(group_data / "all.py")
    top = [Layer("--data on the command line", overrides)] if overrides else []
    plans = {}
    for group, hosts in groups.items():
        group_layer = Layer(f"group_data/{group}.py", _python_data(group_data / f"{group}.py"))
        plans[group] = [host_plan(name, [*top, Layer(f"{inventory_path} (host {name})", data), group_layer,
                                         Layer("group_data/all.py", all_data)]) for name, data in hosts]
    return make_cluster(plans["coordinator"], plans["workers"], str(inventory_path))


def preflight(argv: list[str] = sys.argv) -> None:
    """Run from config.py, which pyinfra reads before it connects to any host: check every setting.

    A bad one stops the run with one line naming the file, the key, the value and what was expected.
    deploy.py checks again with pyinfra's own view of the data.
    """
    from pyinfra.api.exceptions import DeployError
    from pyinfra_cli.util import parse_cli_arg

    inventory = Path(inventory_file(argv))
    if not inventory.is_file():
        return  # an inventory given on the command line (host names, @docker/...): deploy.py checks it
    overrides = {}
    for flag, value in zip(argv, argv[1:]):
        if flag == "--data" and "=" in value:
            key, raw = value.split("=", 1)
            overrides[key] = parse_cli_arg(raw)
    try:
        offline_cluster(inventory, overrides=overrides)
    except (SettingsError, OSError, SyntaxError) as error:
        raise DeployError(str(error)) from None
