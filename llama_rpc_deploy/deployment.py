"""What deploy.py works from: the checked cluster, the llama.cpp source, the image tag.

Two ways to it, with the same layers (settings.layers) and the same checks: from pyinfra's loaded
inventory (`from_pyinfra`, once per run, see run.py) and from the files alone (`offline_cluster`:
config.py's preflight before pyinfra connects, the commands, the verification suite). Either way a
bad setting stops the deploy before the first host is touched.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from . import cluster as cluster_
from . import image, tunnel
from .cluster import Cluster
from .cluster_checks import build, check_inventory_shape
from .settings import COORDINATOR, ROLES, WORKERS, SettingsError, layers
from .source import Source, resolve_source
from .gpus import lookup
from .trees import find_tree

from .paths import PROJECT, STATE


@dataclass(frozen=True)
class Deployment:
    cluster: Cluster
    source: Source
    images: dict[str, str]  # image_backend -> name:tag (image.tags): every host of a backend runs the same image
    transfer_key: Path | None  # private key the coordinator uses to send the images to the workers
    tunnel: Path | None = None  # the RPC tunnel's CA, keys and certificates on this machine (tunnel.py)

    @property
    def image(self) -> str:
        """The coordinator's image (llama-server's)."""
        return self.images[self.cluster.coordinator.backend]

    def image_of(self, name: str) -> str:
        """The image a host (by inventory name) runs: its backend's."""
        return self.images[self.cluster.host(name).backend]

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


def cluster_of(inventory, inventory_file: str = "inventory.py", deploying: bool = True) -> Cluster:
    """The checked Cluster from pyinfra's Inventory: each host's data in pyinfra's layers (--data, the host's
    own, every group it is in, group_data/all). The deploy and every command read the hosts this one way."""
    groups = {g for h in inventory for g in h.groups}
    for group in groups:
        if not isinstance(inventory.get_group_data(group), dict):  # ("a", "b"): pyinfra reads (hosts, data)
            raise SettingsError(f"{inventory_file}: group {group} = {inventory.get_group_data(group)!r} as its data: "
                                "expected a list of hosts [...], or a (hosts, {data}) tuple")
    names = {role: [h.name for h in inventory.get_group(role, [])] for role in ROLES}  # a role is its group
    role_of = {name: role for role in ROLES for name in names[role]}
    # another group of the inventory applies to the one role its hosts have (a setting no host of it reads is
    # refused there, as in group_data/workers.yml), or to every host when it holds both
    group_roles = {}
    for group in groups - set(ROLES):
        roles = {role_of.get(h.name) for h in inventory.get_group(group, [])} - {None}
        if len(roles) == 1:
            group_roles[group] = roles.pop()

    def plan(name: str, role: str):
        host = inventory.get_host(name)
        return cluster_.host_plan(name, layers(
            name, role, overrides=inventory.get_override_data(), host_data=inventory.get_host_data(name),
            groups=[(g, inventory.get_group_data(g)) for g in host.groups], all_data=inventory.get_data(),
            inventory_file=inventory_file, group_roles=group_roles))

    check_inventory_shape(names[COORDINATOR], names[WORKERS], inventory_file)  # before a host's own checks
    hosts = {role: [plan(name, role) for name in names[role]] for role in ROLES}
    return build(hosts[COORDINATOR], hosts[WORKERS], inventory_file, deploying)


def from_pyinfra(inventory, inventory_file: str = "inventory.py") -> Deployment:
    """The deployment from pyinfra's loaded inventory and group data (the deploy's own view)."""
    return from_cluster(cluster_of(inventory, inventory_file))


def from_cluster(cluster: Cluster, with_key: bool = True) -> Deployment:
    s = cluster.settings
    source = resolve_source(s["llama_cpp_source"], s["llama_cpp_ref"], STATE / "sources", s["llama_cpp_url"],
                            s["llama_cpp_sha256"], STATE / "sources.lock", chat_page=f"b{s['llama_cpp_build_number']}")
    for backend in cluster.backends:
        backend_is_in_the_tree(cluster, backend)
    return Deployment(cluster=cluster, source=source, images=image.tags(cluster, source),
                      transfer_key=transfer_key() if with_key else None,
                      tunnel=tunnel_keys(cluster) if with_key else None)


def backend_is_in_the_tree(cluster: Cluster, backend: str) -> None:
    """A local llama.cpp source (llama_cpp_source) has the backend's code: ggml/src/ggml-cuda or ggml-vulkan
    (a download is checked by its build, on the coordinator)."""
    folder = {"cuda": "ggml-cuda", "vulkan": "ggml-vulkan"}.get(backend)
    setting = cluster.settings["llama_cpp_source"]
    if not folder or not setting or not Path(setting).expanduser().is_dir():
        return
    tree = find_tree(Path(setting).expanduser())
    if not (tree / "ggml" / "src" / folder / "CMakeLists.txt").is_file():
        host = next(h for h in cluster.hosts if h.backend == backend)
        raise SettingsError(f"{cluster.coordinator.origins['llama_cpp_source']}: llama_cpp_source = {setting!r} has no "
                            f"ggml/src/{folder}, which image_backend = {backend!r} ({host.origins['image_backend']}, "
                            f"{host.name}) builds: expected a llama.cpp tree with it, or another image_backend")


def tunnel_keys(cluster: Cluster, state_dir: Path = STATE) -> Path | None:
    """The RPC tunnel's keys for every host that needs them (tunnel.ensure), when a worker is tunnelled."""
    if not cluster.tunnelled:
        return None
    generation, origin = tunnel.generation(cluster)
    return tunnel.ensure(state_dir, generation, [cluster.coordinator.name] + [w.name for w in cluster.tunnelled], origin)


# --- the same Inventory outside a pyinfra run: for config.py's preflight, the commands, the testinfra suite ---

def _quiet_import():
    """pyinfra_cli monkey-patches ssl on import (gevent), and warns that it does."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pyinfra_cli.inventory
        import pyinfra_cli.util
    return pyinfra_cli.inventory, pyinfra_cli.util


def _error_line(error: BaseException, filename: str) -> int | str:
    """The line of filename where error was raised (the innermost frame in that file)."""
    import traceback

    tb = getattr(error, "_traceback", None) or error.__traceback__
    return next((f.lineno for f in reversed(traceback.extract_tb(tb))
                 if Path(f.filename).resolve() == Path(filename).resolve()), "?")


def group_data_folders(inventory_path: Path) -> list[Path]:
    """The group_data/ folders pyinfra reads for this inventory run from the current folder (those that exist)."""
    folders = dict.fromkeys((Path.cwd() / "group_data", Path(inventory_path).resolve().parent / "group_data"))
    return [f for f in folders if f.is_dir()]


def load_inventory(inventory_path: Path, overrides: dict | None = None, group_data: Path | None = None):
    """pyinfra's own Inventory of an inventory file, made by pyinfra's own loader exactly as
    `pyinfra INVENTORY deploy.py` makes it in the current folder: every group of the file, group_data/ of the
    current folder and of the inventory's folder (and group_data, as --group-data), --data overrides.
    A file that does not run is one SettingsError naming its file and line."""
    from pyinfra.api import State
    from pyinfra.context import ctx_state

    inventory_mod, util = _quiet_import()
    from pyinfra_cli.exceptions import UnexpectedExternalError

    path = Path(inventory_path)
    if not path.is_file():
        raise SettingsError(f"{path}: no such file: expected an inventory file (see inventory.py)")
    util.PYTHON_CODES.clear()  # pyinfra compiles each file once a process: a file may have changed since
    try:
        with ctx_state.use(State()):  # pyinfra's loader notes the file it runs on the current State
            return inventory_mod.make_inventory(str(path), override_data=dict(overrides or {}), cwd=os.getcwd(),
                                                group_data_directories=[str(group_data)] if group_data else None)
    except SyntaxError as error:
        raise SettingsError(f"{error.filename}:{error.lineno}: {error.msg}: expected Python (name = value lines)") from None
    except UnexpectedExternalError as wrapped:
        error = wrapped.exception
        if isinstance(error, SettingsError):  # group_data's YAML loader says what is wrong itself
            raise error from None
        raise SettingsError(f"{wrapped.filename}:{_error_line(error, wrapped.filename)}: {type(error).__name__}: "
                            f"{error}: expected Python that runs (name = value lines)") from None
    except SettingsError:
        raise
    except (TypeError, AttributeError, ValueError, KeyError) as error:  # pyinfra's loader on a group it cannot read
        raise SettingsError(f"{path}: {type(error).__name__}: {error}: expected each group a list of host names or "
                            "(name, {data}) tuples, as in inventory.py") from None


def write_ssh_config(inventory: Path, directory: Path) -> Path:
    """An ssh_config with one Host block per inventory host, from its ssh_* data as pyinfra sees it: for
    testinfra (which ignores --ssh-extra-args) and `bench`, to reach the hosts the way pyinfra does."""
    blocks = []
    for host in load_inventory(inventory):
        data = host.data
        block = [f"Host {host.name}", f"  HostName {data.get('ssh_hostname') or host.name}",
                 f"  User {data.get('ssh_user') or 'root'}", f"  Port {data.get('ssh_port') or 22}", "  BatchMode yes"]
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
            return subprocess.run(["ssh", "-F", str(config), host, command], input=input, capture_output=True,
                                  text=True, timeout=timeout)

        yield run


def offline_cluster(inventory_path: Path, group_data: Path | None = None, overrides: dict | None = None,
                    deploying: bool = True) -> Cluster:
    """The Cluster as deploy.py computes it, from pyinfra's own Inventory (load_inventory), before connecting;
    for a plan (deploying=False), without the checks only a deploy needs (cluster_checks.DEPLOY_ONLY)."""
    return cluster_of(load_inventory(inventory_path, overrides, group_data), str(inventory_path), deploying)


EXAMPLE_COORDINATOR, EXAMPLE_WORKERS = "192.0.2.10", "192.0.2.{}"  # RFC 5737, as in inventory.py


def gpus_inventory(gpus: list[str], directory: Path) -> Path:
    """An inventory of one host per GPU, the coordinator's first, at example addresses: `plan --gpus`,
    with no inventory of one's own (the current folder's group_data still applies)."""
    hosts = [(EXAMPLE_COORDINATOR, gpus[0])] + [(EXAMPLE_WORKERS.format(20 + i), g) for i, g in enumerate(gpus[1:])]

    def data(gpu: str) -> dict:  # each host the backend its card needs (an unknown card: the settings' error)
        try:
            return {"gpus": [gpu], "image_backend": lookup(gpu).backend}
        except ValueError:
            return {"gpus": [gpu]}
    path = Path(directory) / "gpus_inventory.py"
    path.write_text(f"coordinator = [({hosts[0][0]!r}, {data(hosts[0][1])!r})]\n"
                    f"workers = [{', '.join(f'({h!r}, {data(g)!r})' for h, g in hosts[1:])}]\n")
    return path


def data_overrides(items: list[str]) -> dict:
    """--data KEY=VALUE items as pyinfra reads them (its own parse_cli_arg: 999 an int, null None, ...)."""
    parse_cli_arg = _quiet_import()[1].parse_cli_arg
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
