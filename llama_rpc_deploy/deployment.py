"""What deploy.py works from: the checked cluster, the llama.cpp source, the images' tags, the keys.

`from_pyinfra` makes it once per run from pyinfra's loaded inventory (run.py); `from_cluster` from any checked
Cluster (the preflight, the commands, the tests). `preflight` is config.py's check of every setting before
pyinfra connects: a bad one stops the deploy before the first host is touched.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

from . import image, remote, tunnel
from .cluster import Cluster
from .loading import cluster_of, data_overrides, inventory_file, offline_cluster
from .paths import STATE
from .refusal import refuse
from .settings import SettingsError
from .source import Source, resolve_source
from .trees import find_tree


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


def from_pyinfra(inventory, inventory_file: str = "inventory.py") -> Deployment:
    """The deployment from pyinfra's loaded inventory and group data (the deploy's own view)."""
    return from_cluster(cluster_of(inventory, inventory_file))


def from_cluster(cluster: Cluster, with_key: bool = True) -> Deployment:
    s = cluster.settings
    source = resolve_source(
        s["llama_cpp_source"],
        s["llama_cpp_ref"],
        STATE / "sources",
        s["llama_cpp_url"],
        s["llama_cpp_sha256"],
        STATE / "sources.lock",
        chat_page=f"b{s['llama_cpp_build_number']}",
    )
    for backend in cluster.backends:
        backend_is_in_the_tree(cluster, backend)
    return Deployment(
        cluster=cluster,
        source=source,
        images=image.tags(cluster, source),
        transfer_key=remote.transfer_key() if with_key else None,
        tunnel=tunnel_keys(cluster) if with_key else None,
    )


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
        raise SettingsError(
            f"{cluster.coordinator.origins['llama_cpp_source']}: llama_cpp_source = {setting!r} has no "
            f"ggml/src/{folder}, which image_backend = {backend!r} ({host.origins['image_backend']}, "
            f"{host.name}) builds: expected a llama.cpp tree with it, or another image_backend"
        )


def tunnel_keys(cluster: Cluster, state_dir: Path = STATE) -> Path | None:
    """The RPC tunnel's keys for every host that needs them (tunnel.ensure), when a worker is tunnelled."""
    if not cluster.tunnelled:
        return None
    generation, origin = tunnel.generation(cluster)
    return tunnel.ensure(
        state_dir, generation, [cluster.coordinator.name] + [w.name for w in cluster.tunnelled], origin
    )


def preflight(argv: list[str] = sys.argv) -> None:
    """Run from config.py, which pyinfra reads before it connects to any host: check every setting.

    A bad one stops the run (exit status 1) with one line naming the file, the key, the value and what was
    expected (refusal.refuse). deploy.py checks again with pyinfra's own view of the data.
    """
    inventory = Path(inventory_file(argv))
    if not inventory.is_file():
        return  # an inventory given on the command line (host names, @docker/...): deploy.py checks it
    items = [
        flag.removeprefix("--data=") if flag.startswith("--data=") else value  # --data K=V, --data=K=V
        for flag, value in zip(argv, argv[1:] + [""])
        if flag == "--data" or flag.startswith("--data=")
    ]
    try:
        overrides = data_overrides(items)
        from_cluster(offline_cluster(inventory, overrides=overrides), with_key=False)  # the source too (its sha256)
    except (SettingsError, OSError, SyntaxError) as error:
        refuse(str(error))
