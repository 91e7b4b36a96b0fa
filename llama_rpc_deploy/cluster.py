"""The cluster as the deploy sees it, from settings alone (no host is touched; a host's GPUs that its settings do
not list are learned from it when the deploy connects: ClusterHost.gpus_from).

Who is the coordinator and who are the workers, each host's checked settings and GPUs, the RPC
endpoints, and the order of the devices: every worker's devices first, the coordinator's own GPUs
last, so the output layer and the logits stay local; and the values derived from the settings
(the CUDA architectures, who may reach a worker's RPC port, the API key). cluster_checks.checked_cluster()
makes one and runs the cross-setting checks on it.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

from .gpus import Gpu, lookup
from .settings import COORDINATOR, WORKERS, MODEL_FILE, Scope, SettingsError, resolve

SERVICE_USER = "llama-rpc"  # the containers run as this system user, made by the deploy on every host
LOCAL_DEVICE = {"cuda": "CUDA", "vulkan": "Vulkan"}  # what llama.cpp calls a host's own GPUs, by image_backend


@dataclass(frozen=True)
class ClusterHost:
    name: str  # the inventory name: how the control machine reaches the host
    settings: dict
    gpus: tuple[Gpu, ...]
    origins: dict  # setting -> where its value came from, for error messages
    ssh_port: int = 22  # the inventory's ssh_port: how the control machine (and the image transfer) reach it
    tunnel_end: int | None = None  # a tunnelled worker: its tunnel's port on the coordinator's loopback
    # a host that sets image_backend 'vulkan' itself and lists no gpus: its device is the CPU's Vulkan device
    # (Mesa's lavapipe), which llama.cpp uses only when it is named (GGML_VK_VISIBLE_DEVICES); no /dev/dri goes
    # to its container. On a worker, rpc-server serves it; on the coordinator, it is llama-server's local device
    # (Vulkan0, last), as a card would be. Set by cluster_checks.checked_cluster(); a worker that takes vulkan
    # from the coordinator serves its CPU.
    software_vulkan: bool = False
    # where gpus came from: "settings" (the inventory or group_data listed them), "host" (learned from the host:
    # nvidia-smi, vulkaninfo), "backend" (image_backend 'cpu': none to learn), or None: not known yet (gpus None, the
    # default: learned when the deploy connects, phases/checks.learn_gpus; until then gpus is () and every value
    # derived from it is the CPU device's, which the checks that depend on it know: cluster_checks.LEARNED_CHECKS)
    gpus_from: str | None = "settings"

    @property
    def gpus_known(self) -> bool:
        """Whether gpus is what the host has or was told (False: to be learned from the host, gpus_from None)."""
        return self.gpus_from is not None

    @property
    def address(self) -> str:
        """How the other hosts reach this one."""
        return self.settings["address"] or self.name

    @property
    def transfer_port(self) -> int:
        """The port the coordinator reaches this worker's sshd at to send the image: transfer_ssh_port, or the
        inventory's ssh_port."""
        return self.settings["transfer_ssh_port"] or self.ssh_port

    @property
    def tunnelled(self) -> bool:
        """rpc_transport = 'tunnel': rpc-server on loopback, reached through stunnel (tunnel.py)."""
        return self.settings.get("rpc_transport") == "tunnel"

    @property
    def rpc_bind(self) -> str:
        """Where rpc-server listens: the worker's loopback behind a tunnel, rpc_host (or its address) otherwise."""
        return "127.0.0.1" if self.tunnelled else self.settings["rpc_host"] or self.address

    @property
    def rpc_remote(self) -> str:
        """What the coordinator connects to over the network: the tunnel's TLS end, or rpc-server itself."""
        return f"{self.settings['rpc_host'] or self.address}:{self.exposed_port}"

    @property
    def exposed_port(self) -> int:
        """The port the worker opens to the network."""
        return self.settings["rpc_tunnel_port"] if self.tunnelled else self.settings["rpc_port"]

    @property
    def firewalled_ports(self) -> list[int]:
        """The ports the worker's firewall rule guards: the one it opens, and rpc-server's own behind a tunnel too
        (on loopback it is out of the network's reach; guarded all the same, so that no deploy that moves
        rpc-server between its address and loopback ever leaves it open)."""
        return [self.exposed_port] + ([self.settings["rpc_port"]] if self.tunnelled else [])

    @property
    def rpc_endpoint(self) -> str:
        """The worker as llama-server's --rpc names it (and llama.cpp's load report): the coordinator's end of
        its tunnel, or rpc-server's address."""
        return f"127.0.0.1:{self.tunnel_end}" if self.tunnelled else self.rpc_remote

    @property
    def device_count(self) -> int:
        """rpc-server exposes every GPU, or one CPU device on a host without GPUs (on a vulkan host: the CPU's
        Vulkan device, lavapipe)."""
        return max(1, len(self.gpus))

    @property
    def backend(self) -> str:
        """image_backend: the llama.cpp build this host runs (cluster_checks.checked_cluster() fills in a worker's None
        with the coordinator's)."""
        return self.settings["image_backend"] or "cuda"


@dataclass(frozen=True)
class Cluster:
    coordinator: ClusterHost
    workers: tuple[ClusterHost, ...]

    @property
    def settings(self) -> dict:
        """Cluster-wide settings (image, model, llama-server) are the coordinator's."""
        return self.coordinator.settings

    @property
    def hosts(self) -> tuple[ClusterHost, ...]:
        return (self.coordinator, *self.workers)

    @property
    def unlearned(self) -> list[ClusterHost]:
        """The hosts whose GPUs are not known yet (gpus None, learned when the deploy connects)."""
        return [h for h in self.hosts if not h.gpus_known]

    @property
    def rpc_endpoints(self) -> list[str]:
        return [w.rpc_endpoint for w in self.workers]

    @property
    def tunnelled(self) -> list[ClusterHost]:
        """The workers reached through a tunnel (rpc_transport = 'tunnel')."""
        return [w for w in self.workers if w.tunnelled]

    def tunnels_at(self, host: ClusterHost) -> list[ClusterHost]:
        """The workers whose tunnel has an end on host: every tunnelled one on the coordinator, itself on a
        tunnelled worker, none on a plain one. host runs the tunnel's service when this is not empty."""
        if host.name == self.coordinator.name:
            return self.tunnelled
        return [host] if host.tunnelled else []

    @property
    def devices(self) -> list[str]:
        """Device order for llama-server: remote first (RPC0, RPC1, ... in worker order), local GPUs last
        (CUDA0, ... or Vulkan0, ..., as llama.cpp names them)."""
        n_rpc = sum(w.device_count for w in self.workers)
        local = LOCAL_DEVICE.get(self.coordinator.backend)
        n_local = self.coordinator.device_count if self.coordinator.gpus or self.coordinator.software_vulkan else 0
        return [f"RPC{i}" for i in range(n_rpc)] + [f"{local}{i}" for i in range(n_local if local else 0)]

    @property
    def local_devices(self) -> list[str]:
        """The coordinator's own devices (its GPUs, or lavapipe), after every worker's in `devices`."""
        return self.devices[sum(w.device_count for w in self.workers) :]

    @property
    def backends(self) -> list[str]:
        """The image backends the hosts run, each once: the coordinator's first, then in worker order."""
        return list(dict.fromkeys(h.backend for h in self.hosts))

    def host(self, name: str) -> ClusterHost:
        return next(h for h in self.hosts if h.name == name)

    def role(self, name: str) -> str | None:
        """COORDINATOR or WORKERS (the inventory group the host is in), or None (a host in neither)."""
        if name == self.coordinator.name:
            return COORDINATOR
        return WORKERS if any(w.name == name for w in self.workers) else None

    # --- models on demand (llama_models): one Cluster view per model ---

    @property
    def router(self) -> bool:
        """llama-server runs as a router that loads the model each request names (llama_models is set,
        or llama_models_folder)."""
        return bool(self.settings["llama_models"]) or self.settings["llama_models_folder"]

    @property
    def default_model(self) -> str:
        """The name llama_model_path's model is served under: its llama_models entry's, or its file's."""
        path = self.settings["llama_model_path"]
        named = [n for n, e in self.settings["llama_models"].items() if e["llama_model_path"] == path]
        return named[0] if named else model_name(path)

    def with_folder(self, files: list[str]) -> Cluster:
        """llama_models_folder: the GGUF files of llama_model_path's folder (as listed on the coordinator,
        or here for `plan`) added to llama_models, each under its file's name; a file that llama_model_path
        or an entry already serves keeps that, and what is no model of its own is left out (folder_models)."""
        models = dict(self.settings["llama_models"])
        served = {e["llama_model_path"] for e in models.values()} | {self.settings["llama_model_path"]}
        for path in folder_models(files):
            if path in served:
                continue
            if not MODEL_FILE.ok(path):
                raise SettingsError(
                    f"{self.coordinator.origins['llama_models_folder']}: llama_models_folder: the file "
                    f"{path!r} on the coordinator: expected {MODEL_FILE.expected} (rename it, or "
                    "list the models in llama_models instead)"
                )
            name = model_name(path)
            if name in models or name == self.default_model:
                raise SettingsError(
                    f"{self.coordinator.origins['llama_models_folder']}: llama_models_folder: {path!r} "
                    f"would be served as {name!r}, which another file is: expected file names that "
                    "differ in more than punctuation, or a llama_models entry that names one"
                )
            models[name] = {"llama_model_path": path}
        c = self.coordinator
        return replace(self, coordinator=replace(c, settings={**c.settings, "llama_models": models}))

    def served_models(self) -> list[str]:
        """Every model's name, llama_model_path's first; [] when llama_models is empty (one model, no router)."""
        if not self.router:
            return []
        return [self.default_model] + [n for n in self.settings["llama_models"] if n != self.default_model]

    def model_names(self) -> list[str]:
        """Every model the deploy plans and serves: served_models(), or llama_model_path's alone."""
        return self.served_models() or [self.default_model]

    def for_model(self, name: str) -> Cluster:
        """This cluster as one served model sees it: its llama_models entry's settings over the shared ones
        (each origin then says which entry the value came from)."""
        entry = self.settings["llama_models"].get(name, {})
        if name != self.default_model:  # llama_mmproj_path is llama_model_path's projector, no other model's
            entry = {"llama_mmproj_path": None, **entry}
        if not entry:
            return self
        c = self.coordinator
        where = f"{c.origins['llama_models']} (llama_models: {name})"
        return replace(
            self,
            coordinator=replace(
                c, settings={**c.settings, **entry}, origins={**c.origins, **{k: where for k in entry}}
            ),
        )

    def with_split(self, split: list, model: str | None = None) -> Cluster:
        """The same cluster with llama_tensor_split = split (the planner's, for 'auto')."""
        return self.with_setting("llama_tensor_split", list(split), model)

    def with_setting(self, key: str, value, model: str | None = None) -> Cluster:
        """The same cluster with a setting the coordinator settled (the planner's split, the draft's type); for a
        model of llama_models, in that model's entry."""
        c = self.coordinator
        models = c.settings["llama_models"]
        if model in models:
            entry = {**models[model], key: value}
            return replace(
                self, coordinator=replace(c, settings={**c.settings, "llama_models": {**models, model: entry}})
            )
        return replace(self, coordinator=replace(c, settings={**c.settings, key: value}))


def model_name(path: str) -> str:
    """The name a GGUF file is served under when nothing names it: the file's, less .gguf, as a model
    name may be (settings.MODEL_NAME)."""
    stem = PurePosixPath(path).name.removesuffix(".gguf")
    return re.sub(r"[^A-Za-z0-9._-]", "-", stem).lstrip("._-")[:64] or "model"


DRAFT_PREFIXES = ("mtp-", "dspark-", "dflash-")  # llama.cpp's companions of a model (common/preset.cpp)


def folder_models(files: list[str]) -> list[str]:
    """Of a folder's files, the GGUF models of their own, sorted: not a projector (mmproj), not a draft
    model, not the second or later shard of a split model (llama.cpp's own --models-dir rules)."""

    def own(path: str) -> bool:
        name = PurePosixPath(path).name
        shard = re.search(r"-(\d{5})-of-\d{5}\.gguf$", name)
        return (
            name.endswith(".gguf")
            and "mmproj" not in name
            and not name.startswith(DRAFT_PREFIXES)
            and (not shard or shard.group(1) == "00001")
        )

    return sorted(p for p in files if own(p))


def cluster_host(name: str, scopes: list[Scope]) -> ClusterHost:
    values, origins = resolve(scopes)
    gpus = []
    for entry in values["gpus"] or ():
        try:
            gpus.append(lookup(entry))
        except ValueError as err:
            raise SettingsError(f"{origins['gpus']}: gpus = {values['gpus']!r}: {err}") from None
    ssh_port = next((scope.data["ssh_port"] for scope in scopes if "ssh_port" in scope.data), 22)
    return ClusterHost(
        name=name,
        settings=values,
        gpus=tuple(gpus),
        origins=origins,
        ssh_port=ssh_port,
        gpus_from=None if values["gpus"] is None else "settings",
    )


# --- values derived from the settings ---


def cuda_architectures(cluster: Cluster) -> str:
    """image_cuda_architectures, or the union of every host's GPUs ("89;120")."""
    if cluster.settings["image_cuda_architectures"]:
        return cluster.settings["image_cuda_architectures"]
    archs = {g.cuda_arch for h in cluster.hosts if h.backend == "cuda" for g in h.gpus if g.cuda_arch}
    return ";".join(sorted(archs, key=lambda a: int(re.sub(r"\D", "", a))))


def allowed_clients(cluster: Cluster, worker: ClusterHost) -> list[str]:
    """Who may open a worker's RPC port: rpc_allow_from, or the coordinator's address."""
    return list(worker.settings["rpc_allow_from"] or [cluster.coordinator.address])


def is_wide(network) -> bool:
    """Wider than a private /16 (IPv6: a unique-local or link-local /48)."""
    if network.num_addresses == 1:
        return False
    narrow = 16 if network.version == 4 else 48
    return network.prefixlen < narrow or not (network.is_private or network.is_link_local)


def wide_clients(cluster: Cluster, worker: ClusterHost) -> list[str]:
    return [c for c in allowed_clients(cluster, worker) if is_wide(ipaddress.ip_network(c, strict=False))]


def api_key(cluster: Cluster) -> str:
    """The API key from llama_api_key_file, checked: the file exists, only its owner may read it, one word."""
    setting = cluster.settings["llama_api_key_file"]
    where = cluster.coordinator.origins["llama_api_key_file"]
    path = Path(setting).expanduser()
    try:
        mode = path.stat().st_mode & 0o777
        text = path.read_text()
    except OSError as error:
        raise SettingsError(
            f"{where}: llama_api_key_file = {setting!r}: {error.strerror}: expected a file on this "
            "machine holding the key (umask 077; openssl rand -hex 32 > FILE)"
        ) from None
    if mode & 0o077:
        raise SettingsError(
            f"{where}: llama_api_key_file = {setting!r} has mode {mode:o}: expected 600 or 400 (chmod 600 {path})"
        )
    key = text.strip()
    if len(key) < 16 or any(c.isspace() for c in key):
        raise SettingsError(
            f"{where}: llama_api_key_file = {setting!r}: expected one key of at least 16 characters "
            "without spaces (openssl rand -hex 32)"
        )
    return key
