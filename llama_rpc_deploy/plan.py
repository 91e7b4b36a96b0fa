"""The cluster as the deploy sees it, computed from settings alone (no host is touched).

Who is the coordinator and who are the workers, the RPC endpoints, the order of
the devices (every worker's devices first, the coordinator's own GPUs last, so
the output layer and the logits stay local), the CUDA architectures to build
for, the image's build arguments and its tag.
"""
from __future__ import annotations

import hashlib
import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path

from .gpus import Gpu, lookup
from .settings import PLACEHOLDER, QUANTIZED_CACHE_TYPES, Layer, SettingsError, resolve
from .source import Source

FILES = Path(__file__).resolve().parent.parent / "files"
IMAGE_FILES = ("Dockerfile", "entrypoint.sh")  # with llama.cpp.tar.gz, the build context

# The first CUDA release that can build for a compute capability (newer cards need newer CUDA).
MIN_CUDA_FOR_ARCH = {"100": (12, 8), "101": (12, 8), "120": (12, 8), "121": (12, 9), "90": (11, 8), "89": (11, 8)}


@dataclass(frozen=True)
class HostPlan:
    name: str  # the inventory name: how the control machine reaches the host
    settings: dict
    gpus: tuple[Gpu, ...]
    sources: dict  # setting -> where its value came from, for error messages

    @property
    def address(self) -> str:
        """How the other hosts reach this one."""
        return self.settings["address"] or self.name

    @property
    def rpc_endpoint(self) -> str:
        return f"{self.settings['rpc_host'] or self.address}:{self.settings['rpc_port']}"

    @property
    def device_count(self) -> int:
        """rpc-server exposes every GPU, or one CPU device on a host without GPUs."""
        return max(1, len(self.gpus))


@dataclass(frozen=True)
class Cluster:
    coordinator: HostPlan
    workers: tuple[HostPlan, ...]

    @property
    def settings(self) -> dict:
        """Cluster-wide settings (image, model, llama-server) are the coordinator's."""
        return self.coordinator.settings

    @property
    def rpc_endpoints(self) -> list[str]:
        return [w.rpc_endpoint for w in self.workers]

    @property
    def devices(self) -> list[str]:
        """Device order for llama-server: remote first (RPC0, RPC1, ... in worker order), local GPUs last."""
        n_rpc = sum(w.device_count for w in self.workers)
        return [f"RPC{i}" for i in range(n_rpc)] + [f"CUDA{i}" for i in range(len(self.coordinator.gpus))]

    @property
    def cuda_architectures(self) -> str:
        if self.settings["image_cuda_architectures"]:
            return self.settings["image_cuda_architectures"]
        archs = {g.cuda_arch for h in (self.coordinator, *self.workers) for g in h.gpus}
        return ";".join(sorted(archs, key=lambda a: int(re.sub(r"\D", "", a))))

    def build_args(self, source: Source) -> dict[str, str]:
        s = self.settings
        args = {
            "GGML_BACKEND": s["image_backend"],
            "BUILD_IMAGE": s["image_build_image"],
            "RUNTIME_IMAGE": s["image_runtime_image"],
            "GGML_NATIVE": "ON" if s["image_cpu_native"] else "OFF",
            "LLAMA_CPP_REF": s["llama_cpp_ref"] if source.url else "local",
            "SOURCE_SHA256": source.ident if source.local_tarball else "unknown",
        }
        if s["image_backend"] == "cuda":
            args["CUDA_ARCHITECTURES"] = self.cuda_architectures
        if s["image_build_jobs"]:
            args["BUILD_JOBS"] = str(s["image_build_jobs"])
        return args

    def image_tag(self, source: Source, files_dir: Path = FILES) -> str:
        """name:REF-HASH, HASH over the source, the image's files and the build arguments.

        The same inputs always give the same tag, so an image that is already there
        is never built again, and a changed input never reuses an old image.
        """
        digest = hashlib.sha256(source.ident.encode())
        for name in IMAGE_FILES:
            digest.update((files_dir / name).read_bytes())
        for key, value in sorted(self.build_args(source).items()):
            digest.update(f"{key}={value}\n".encode())
        ref = re.sub(r"[^0-9A-Za-z_.-]", "-", self.settings["llama_cpp_ref"] if source.url else "local")[:40]
        return f"{self.settings['image_name']}:{ref}-{digest.hexdigest()[:12]}"


DOCUMENTATION_NETS = [ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24")]


def _is_documentation_address(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in net for net in DOCUMENTATION_NETS)


def host_plan(name: str, layers: list[Layer]) -> HostPlan:
    values, sources = resolve(layers)
    gpus = []
    for entry in values["gpus"]:
        try:
            gpus.append(lookup(entry))
        except ValueError as err:
            raise SettingsError(f"{sources['gpus']}: gpus = {values['gpus']!r}: {err}") from None
    return HostPlan(name=name, settings=values, gpus=tuple(gpus), sources=sources)


def _cuda_version(image: str) -> tuple[int, int] | None:
    match = re.search(r"cuda:(\d+)\.(\d+)", image)
    return (int(match.group(1)), int(match.group(2))) if match else None


def make_cluster(coordinators: list[HostPlan], workers: list[HostPlan], inventory_file: str = "inventory.py") -> Cluster:
    """Check the inventory's shape and the settings that span hosts; return the Cluster."""
    if len(coordinators) != 1:
        raise SettingsError(f"{inventory_file}: group coordinator has {len(coordinators)} hosts: expected exactly one")
    if not workers:
        raise SettingsError(f"{inventory_file}: group workers is empty: expected at least one worker")
    names = [h.name for h in coordinators + workers]
    both = sorted({n for n in names if names.count(n) > 1})
    if both:
        raise SettingsError(f"{inventory_file}: {', '.join(both)} is listed twice (coordinator and workers, "
                            "or twice in workers): expected each host once")
    cluster = Cluster(coordinator=coordinators[0], workers=tuple(workers))
    endpoints = cluster.rpc_endpoints
    dup = sorted({e for e in endpoints if endpoints.count(e) > 1})
    if dup:
        raise SettingsError(f"{inventory_file}: rpc endpoint {', '.join(dup)} is used by two workers: "
                            "expected one address:port per worker")
    s = cluster.settings
    if PLACEHOLDER in s["llama_model_path"]:
        raise SettingsError(f"{cluster.coordinator.sources['llama_model_path']}: llama_model_path = "
                            f"{s['llama_model_path']!r}: expected the path of your GGUF file on the coordinator")
    if not s["llama_model_path"].endswith(".gguf"):
        raise SettingsError(f"{cluster.coordinator.sources['llama_model_path']}: llama_model_path = "
                            f"{s['llama_model_path']!r}: expected a .gguf file")
    examples = [h.name for h in (cluster.coordinator, *cluster.workers) if _is_documentation_address(h.address)]
    if examples:
        raise SettingsError(f"{inventory_file}: {', '.join(examples)}: example addresses (RFC 5737, they reach "
                            "nothing): expected your hosts' addresses")
    k, v = s["llama_cache_type_k"], s["llama_cache_type_v"]
    if k in QUANTIZED_CACHE_TYPES and v in QUANTIZED_CACHE_TYPES and k != v:
        raise SettingsError(f"{cluster.coordinator.sources['llama_cache_type_v']}: llama_cache_type_v = {v!r} with "
                            f"llama_cache_type_k = {k!r}: expected the same quantized type for K and V "
                            "(RPC workers crash on mixed quantized K/V, llama.cpp issue #27905)")
    if v in QUANTIZED_CACHE_TYPES and s["llama_flash_attn"] == "off":
        raise SettingsError(f"{cluster.coordinator.sources['llama_flash_attn']}: llama_flash_attn = 'off' with "
                            f"llama_cache_type_v = {v!r}: expected 'on' or 'auto' (a quantized V cache needs flash attention)")
    for h in cluster.workers:
        if h.settings["rpc_port"] == s["llama_port"] and h.address == cluster.coordinator.address:
            raise SettingsError(f"{h.sources['rpc_port']}: rpc_port = {h.settings['rpc_port']} on {h.name}: "
                                "expected a port other than llama_port on the same address")
    split = s["llama_tensor_split"]
    if isinstance(split, (list, tuple)) and len(split) != len(cluster.devices):
        raise SettingsError(
            f"{cluster.coordinator.sources['llama_tensor_split']}: llama_tensor_split = {list(split)!r}: expected {len(cluster.devices)} numbers, one per device "
            f"({', '.join(cluster.devices)})")
    if s["image_backend"] == "cuda":
        if not cluster.cuda_architectures:
            raise SettingsError(f"{cluster.coordinator.sources['image_backend']}: image_backend = 'cuda' but no host "
                                "lists gpus: expected gpus on at least one host "
                                "(e.g. gpus = ['RTX 4080']), or image_backend = 'cpu'")
        version = _cuda_version(s["image_build_image"])
        for arch in cluster.cuda_architectures.split(";"):
            need = MIN_CUDA_FOR_ARCH.get(re.sub(r"\D", "", arch))
            if version and need and version < need:
                raise SettingsError(
                    f"{cluster.coordinator.sources['image_build_image']}: image_build_image = {s['image_build_image']!r}: CUDA {version[0]}.{version[1]} cannot build "
                    f"for sm_{arch}: expected CUDA {need[0]}.{need[1]} or newer")
    for h in cluster.workers:
        if h.settings["rpc_firewall"]:
            _check_allowed_sources(cluster, h, inventory_file)
    if s["llama_api_key_file"]:
        api_key(cluster)
    return cluster


SERVICE_USER = "llama-rpc"  # the containers run as this system user, made by the deploy on every host


def allowed_sources(cluster: Cluster, worker: HostPlan) -> list[str]:
    """Who may open a worker's RPC port: rpc_allow_from, or the coordinator's address."""
    return list(worker.settings["rpc_allow_from"] or [cluster.coordinator.address])


def _check_allowed_sources(cluster: Cluster, worker: HostPlan, inventory_file: str) -> None:
    for source in allowed_sources(cluster, worker):
        try:
            ipaddress.ip_network(source, strict=False)
        except ValueError:
            where, key = ((worker.sources["rpc_allow_from"], "rpc_allow_from") if worker.settings["rpc_allow_from"]
                          else (cluster.coordinator.sources["address"], "address"))
            if where == "default":  # the address is the coordinator's inventory name
                where = f"{inventory_file} (host {cluster.coordinator.name})"
            raise SettingsError(
                f"{where}: {key} = {source!r} (the source {worker.name}'s firewall admits to rpc_port): expected an "
                "IP address or network (set address to the coordinator's IP, or rpc_allow_from, or rpc_firewall = False)"
            ) from None


def api_key(cluster: Cluster) -> str:
    """The API key from llama_api_key_file, checked: the file exists, only its owner may read it, one word."""
    setting = cluster.settings["llama_api_key_file"]
    where = cluster.coordinator.sources["llama_api_key_file"]
    path = Path(setting).expanduser()
    try:
        mode = path.stat().st_mode & 0o777
        text = path.read_text()
    except OSError as error:
        raise SettingsError(f"{where}: llama_api_key_file = {setting!r}: {error.strerror}: expected a file on this "
                            "machine holding the key (umask 077; openssl rand -hex 32 > FILE)") from None
    if mode & 0o077:
        raise SettingsError(f"{where}: llama_api_key_file = {setting!r} has mode {mode:o}: expected 600 or 400 "
                            f"(chmod 600 {path})")
    key = text.strip()
    if len(key) < 16 or any(c.isspace() for c in key):
        raise SettingsError(f"{where}: llama_api_key_file = {setting!r}: expected one key of at least 16 characters "
                            "without spaces (openssl rand -hex 32)")
    return key
