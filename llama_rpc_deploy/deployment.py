"""What deploy.py works from: the checked cluster, the llama.cpp source, the image tag.

Two ways to it, with the same layers (settings.layers) and the same checks: from pyinfra's loaded
inventory (`from_pyinfra`, once per run, see run.py) and from the files alone (`offline_cluster`:
config.py's preflight before pyinfra connects, the commands, the verification suite). Either way a
bad setting stops the deploy before the first host is touched.
"""
from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from . import cluster as cluster_
from . import image
from .cluster import Cluster
from .cluster_checks import check_inventory_shape
from .settings import SettingsError, layers
from .source import Source, resolve_source

from .paths import PROJECT
STATE = PROJECT / ".state"  # on the control machine: packed sources, the image-transfer key
ROLES = {"coordinator": "coordinator", "workers": "worker"}  # inventory group -> role


@dataclass(frozen=True)
class Deployment:
    cluster: Cluster
    source: Source
    image: str  # name:tag, the same on every host
    transfer_key: Path | None  # private key the coordinator uses to send the image to the workers

    def with_split(self, split: list, model: str | None = None) -> Deployment:
        """The same deployment with llama_tensor_split = the planner's split (for llama_tensor_split = 'auto'),
        for one model of llama_models when model names it."""
        return replace(self, cluster=self.cluster.with_split(split, model))


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


def from_pyinfra(inventory, inventory_file: str = "inventory.py") -> Deployment:
    """The deployment from pyinfra's loaded inventory and group data (the deploy's own view)."""
    def plan(name: str, role: str):
        host = inventory.get_host(name)
        return cluster_.host_plan(name, layers(
            name, role, overrides=inventory.get_override_data(), host_data=inventory.get_host_data(name),
            groups=[(g, inventory.get_group_data(g)) for g in host.groups], all_data=inventory.get_data(),
            inventory_file=inventory_file))

    names = {role: [h.name for h in inventory.get_group(group, [])] for group, role in ROLES.items()}
    check_inventory_shape(names["coordinator"], names["worker"], inventory_file)  # before a host's own checks
    hosts = {role: [plan(name, role) for name in names[role]] for role in names}
    return from_cluster(cluster_.build(hosts["coordinator"], hosts["worker"], inventory_file))


def from_cluster(cluster: Cluster, with_key: bool = True) -> Deployment:
    s = cluster.settings
    source = resolve_source(s["llama_cpp_source"], s["llama_cpp_ref"], STATE / "sources", s["llama_cpp_url"],
                            s["llama_cpp_sha256"], STATE / "sources.lock", chat_page=f"b{s['llama_cpp_build_number']}")
    return Deployment(cluster=cluster, source=source, image=image.tag(cluster, source),
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
    except SettingsError:
        raise
    except Exception as error:  # the file ran and raised: name its line, not a traceback
        import traceback

        line = next((f.lineno for f in reversed(traceback.extract_tb(error.__traceback__))
                     if Path(f.filename).resolve() == path.resolve()), "?")
        raise SettingsError(f"{path}:{line}: {type(error).__name__}: {error}: expected Python that runs "
                            "(name = value lines)") from None
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


def group_data_for(inventory_path: Path) -> Path:
    """The group_data/ folder that goes with an inventory: beside it, in the current folder, or the checkout's."""
    for folder in (Path(inventory_path).resolve().parent, Path.cwd(), PROJECT):
        if (folder / "group_data").is_dir():
            return folder / "group_data"
    return PROJECT / "group_data"


@contextlib.contextmanager
def ssh_runner(inventory: Path):
    """run(host, command, input=None, timeout=120) -> CompletedProcess: a command on an inventory host over
    SSH, reached the way pyinfra reaches it (write_ssh_config), for the commands around the deploy."""
    with tempfile.TemporaryDirectory() as tmp:
        config = write_ssh_config(inventory, Path(tmp))

        def run(host: str, command: str, input: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
            return subprocess.run(["ssh", "-F", str(config), host, command], input=input, capture_output=True,
                                  text=True, timeout=timeout)

        yield run


def offline_cluster(inventory_path: Path, group_data: Path | None = None,
                    overrides: dict | None = None) -> Cluster:
    """The Cluster as deploy.py computes it, read from the files alone (same layers, same checks)."""
    group_data = group_data or group_data_for(inventory_path)
    groups = read_inventory(inventory_path)
    check_inventory_shape(*[[name for name, _ in groups[g]] for g in ROLES], str(inventory_path))
    all_data = _python_data(group_data / "all.py")
    hosts = {}
    for group, role in ROLES.items():
        group_layer = (group, _python_data(group_data / f"{group}.py"))
        hosts[role] = [cluster_.host_plan(name, layers(
            name, role, overrides=overrides or {}, host_data=data, groups=[group_layer], all_data=all_data,
            inventory_file=str(inventory_path))) for name, data in groups[group]]
    return cluster_.build(hosts["coordinator"], hosts["worker"], str(inventory_path))


def data_overrides(items: list[str]) -> dict:
    """--data KEY=VALUE items as pyinfra reads them (its own parse_cli_arg: 999 an int, null None, ...)."""
    import warnings

    with warnings.catch_warnings():  # pyinfra_cli monkey-patches ssl on import, and says so
        warnings.simplefilter("ignore")
        from pyinfra_cli.util import parse_cli_arg

    overrides = {}
    for item in items:
        key, eq, raw = item.partition("=")
        if not eq or not key:
            raise SettingsError(f"--data {item!r} on the command line: expected KEY=VALUE")
        overrides[key] = parse_cli_arg(raw)
    return overrides


def preflight(argv: list[str] = sys.argv) -> None:
    """Run from config.py, which pyinfra reads before it connects to any host: check every setting.

    A bad one stops the run with one line naming the file, the key, the value and what was expected.
    deploy.py checks again with pyinfra's own view of the data.
    """
    from pyinfra.api.exceptions import DeployError

    inventory = Path(inventory_file(argv))
    if not inventory.is_file():
        return  # an inventory given on the command line (host names, @docker/...): deploy.py checks it
    items = [flag.removeprefix("--data=") if flag.startswith("--data=") else value  # --data K=V, --data=K=V
             for flag, value in zip(argv, argv[1:] + [""]) if flag == "--data" or flag.startswith("--data=")]
    try:
        overrides = data_overrides(items)
        from_cluster(offline_cluster(inventory, overrides=overrides), with_key=False)  # the source too (its sha256)
    except (SettingsError, OSError, SyntaxError) as error:
        raise DeployError(str(error)) from None
