"""The capacity planner (`python -m llama_rpc_deploy plan`): what each device holds, whether it fits,
and the tokens/s ceiling.

From the model's layer sizes and KV shapes (gguf_header.py reads them, no weights are loaded), it takes each device's memory and bandwidth from llama_rpc_deploy/gpus.py, and for a configuration
(context, parallel slots, KV cache types) computes per device: weights, KV cache, a compute
reserve, and what is left.

Decode is memory-bound and the devices work in turn, so one token costs, on each device, the
time to read its weights from its memory, plus one network hop per device boundary:
    ceiling = 1 / (sum(bytes_i / bandwidth_i) + hops * hop_seconds)
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .gguf_header import ModelInfo
from .settings import QUANTIZED_CACHE_TYPES

# bytes per element of each KV cache type (block formats: bytes per block / elements per block)
CACHE_TYPE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_1": 20 / 32,
                    "q5_0": 22 / 32, "q5_1": 24 / 32, "iq4_nl": 18 / 32}
GIB = 1024 ** 3
COMPUTE_RESERVE = 512 * 1024 ** 2  # CUDA context, cuBLAS workspace, the graph's compute buffer
UBATCH = 512
HOP_SECONDS = 0.0003  # one boundary per token on a home LAN: latency plus a few KB of activations


def kv_bytes(model: ModelInfo, layers: list[int], ctx: int, parallel: int, type_k: str, type_v: str) -> int:
    """KV cache bytes of these layers: ctx cells for global layers, the window per slot for sliding ones."""
    total = 0.0
    for il in layers:
        k, v = model.kv_per_token[il]
        cells = min(ctx, model.swa_window * parallel + UBATCH) if model.swa_layers and model.swa_layers[il] else ctx
        total += cells * (k * CACHE_TYPE_BYTES[type_k] + v * CACHE_TYPE_BYTES[type_v])
    return int(total)


@dataclass(frozen=True)
class Device:
    name: str  # RPC0, CUDA0, ...
    host: str
    gpu: str
    vram_bytes: int
    bandwidth: float  # bytes/s


@dataclass
class Placement:
    device: Device
    layers: list[int] = field(default_factory=list)
    weights: int = 0
    kv: int = 0
    reserve: int = COMPUTE_RESERVE

    @property
    def free(self) -> int:
        return self.device.vram_bytes - self.weights - self.kv - self.reserve

    @property
    def fits(self) -> bool:
        return self.free >= 0


def assign_layers(n_layer: int, n_gpu_layers: int, shares: list[float]) -> list[int | None]:
    """llama.cpp's rule (llama-model.cpp): the device index of layers 0..n_layer-1 and of the output
    layer (index n_layer), or None for the CPU. The last n_gpu_layers of those n_layer + 1 go to the
    devices, split by the cumulative shares."""
    total = sum(shares)
    splits, acc = [], 0.0
    for share in shares:
        acc += share
        splits.append(acc / total)
    start = max(n_layer + 1 - n_gpu_layers, 0)
    active = min(n_gpu_layers, n_layer + 1)
    out: list[int | None] = []
    for il in range(n_layer + 1):
        if il < start or il - start >= active:
            out.append(None)
        else:
            x = (il - start) / active
            out.append(next((i for i, c in enumerate(splits) if c > x), len(splits) - 1))
    return out


def place(model: ModelInfo, devices: list[Device], shares: list[float], ctx: int, parallel: int,
          type_k: str, type_v: str, n_gpu_layers: int = 999) -> tuple[list[Placement], int]:
    """Weights, KV and reserve per device for a split, and the bytes left in the host's memory
    (token embeddings always, plus whatever is not offloaded)."""
    placements = [Placement(device=d) for d in devices]
    host = model.input_bytes
    where = assign_layers(model.n_layer, n_gpu_layers, shares)
    for il, index in enumerate(where[:-1]):
        if index is None:
            host += model.layer_bytes[il]
            continue
        p = placements[index]
        p.layers.append(il)
        p.weights += model.layer_bytes[il]
        p.kv += kv_bytes(model, [il], ctx, parallel, type_k, type_v)
    if where[-1] is None:
        host += model.output_bytes
    else:
        placements[where[-1]].weights += model.output_bytes
        placements[where[-1]].reserve += model.n_vocab * UBATCH * 4  # logits
    return placements, host


def render_shares(counts: list[int]) -> list[int]:
    """--tensor-split values that give exactly these layer counts under llama.cpp's rule: the output
    layer counts as one more layer on the last device."""
    return counts[:-1] + [counts[-1] + 1]


def ceiling(placements: list[Placement], hop_seconds: float = HOP_SECONDS) -> float:
    """Tokens/s when every token reads each device's weights once, device after device."""
    seconds = sum(p.weights / p.device.bandwidth for p in placements if p.weights)
    hops = sum(1 for p in placements if p.weights) - 1
    return 1.0 / (seconds + max(0, hops) * hop_seconds)


def auto_split(model: ModelInfo, devices: list[Device], ctx: int, parallel: int, type_k: str, type_v: str) -> list[int]:
    """Layers per device (in device order) that maximize the ceiling within every device's memory.

    The time per token is sum(bytes_i / bandwidth_i), so layers go to the fastest device that still
    has room, then the next; the order of the devices (remote first, local last) stays as it is.
    The sum is below n_layer when the model does not fit.
    """
    n = model.n_layer
    per_layer = [model.layer_bytes[i] + kv_bytes(model, [i], ctx, parallel, type_k, type_v) for i in range(n)]
    mean = sum(per_layer) / n
    counts = [0] * len(devices)
    left = n
    for i in sorted(range(len(devices)), key=lambda i: -devices[i].bandwidth):
        room = devices[i].vram_bytes - COMPUTE_RESERVE
        if i == len(devices) - 1:
            room -= model.output_bytes + model.n_vocab * UBATCH * 4
        counts[i] = max(0, min(left, int(room // mean)))
        left -= counts[i]
    # the mean hides heavier layers (global attention among sliding ones): give back until all fit
    for _ in range(n):
        if sum(counts) == 0:
            break
        placements, _ = place(model, devices, [float(c) for c in render_shares(counts)], ctx, parallel, type_k, type_v)
        bad = [i for i, p in enumerate(placements) if not p.fits and counts[i]]
        if not bad:
            break
        counts[bad[0]] -= 1
    return counts


# --- the cluster's view ---

@dataclass
class CapacityPlan:
    placements: list[Placement]  # one per device, in device order
    host_bytes: int  # weights left in the coordinator's host memory (token embeddings, layers not offloaded)
    split: list  # --tensor-split values, in device order ([] for llama.cpp's default)
    tokens_per_s: float
    problems: list[str]  # each one stops the deploy
    warnings: list[str]
    n_layer: int = 0

    @property
    def fits(self) -> bool:
        return not self.problems

    def table(self) -> str:
        rows = [f"{'device':<26} {'card':<18} {'layers':>6} {'weights':>9} {'KV':>8} {'reserve':>8} "
                f"{'memory':>8} {'free':>8}  fit"]
        for p in self.placements:
            d = p.device
            memory = f"{d.vram_bytes / GIB:7.2f}G" if d.vram_bytes else "     n/a"
            free = f"{p.free / GIB:7.2f}G" if d.vram_bytes else "     n/a"
            fit = ("yes" if p.fits else "NO") if d.vram_bytes else "n/a"
            rows.append(f"{d.name + ' ' + d.host:<26} {d.gpu:<18} {len(p.layers):>6} {p.weights / GIB:8.2f}G "
                        f"{p.kv / GIB:7.2f}G {p.reserve / GIB:7.2f}G {memory} {free}  {fit}")
        kept = self.n_layer - sum(len(p.layers) for p in self.placements)
        rows.append(f"host memory of the coordinator: {self.host_bytes / GIB:.2f}G (token embeddings"
                    f"{f', {kept} layers not offloaded' if kept else ''})")
        split = ",".join(str(c) for c in self.split) if self.split else "by free memory (llama.cpp's default)"
        rows.append(f"tensor split: {split}   predicted ceiling: {self.tokens_per_s:.1f} tokens/s")
        rows += [f"warning: {w}" for w in self.warnings] + [f"does not fit: {p}" for p in self.problems]
        return "\n".join(rows)


CPU_DEVICE_BANDWIDTH = 40e9  # a CPU rpc-server's memory, roughly (DDR4 dual channel); no fit check on CPUs
SPECULATIVE_FLAGS = ("--spec-type", "-md", "--model-draft", "--draft", "--draft-max", "-mtp", "--mtp")


def devices_of(cluster) -> list[Device]:
    """Every worker's devices first (RPC0, RPC1, ...), the coordinator's GPUs last, as llama-server sees them."""
    out = []
    index = 0
    for worker in cluster.workers:
        for gpu in worker.gpus or [None]:
            out.append(Device(name=f"RPC{index}", host=worker.name, gpu=gpu.name if gpu else "CPU",
                              vram_bytes=int(gpu.vram_gib * GIB) if gpu else 0,
                              bandwidth=gpu.bandwidth_gbs * 1e9 if gpu else CPU_DEVICE_BANDWIDTH))
            index += 1
    for i, gpu in enumerate(cluster.coordinator.gpus):
        out.append(Device(name=f"CUDA{i}", host=cluster.coordinator.name, gpu=gpu.name,
                          vram_bytes=int(gpu.vram_gib * GIB), bandwidth=gpu.bandwidth_gbs * 1e9))
    return out


def plan_cluster(cluster, model: ModelInfo) -> CapacityPlan:
    s = cluster.settings
    devices = devices_of(cluster)
    ctx, parallel, tk, tv = s["llama_ctx_size"], s["llama_parallel"], s["llama_cache_type_k"], s["llama_cache_type_v"]
    ngl = s["llama_n_gpu_layers"]
    split_setting = s["llama_tensor_split"]
    problems = []
    unknown = [f"{d.name} ({d.host})" for d in devices if not d.vram_bytes]
    if split_setting == "auto" and unknown:
        problems.append(f"llama_tensor_split = 'auto' needs every device's memory, and {', '.join(unknown)} "
                        "is a CPU device: expected a list of shares for llama_tensor_split, or gpus on that host")
        split_setting = None
    if split_setting == "auto":
        counts = auto_split(model, devices, ctx, parallel, tk, tv)
        if sum(counts) < model.n_layer:
            problems.append(f"{model.n_layer} layers with {ctx} context ({tk}/{tv} KV, {parallel} slots) need more "
                            f"memory than the devices have: {sum(counts)} layers fit")
        shares = [float(x) for x in render_shares(counts)] if sum(counts) else [1.0] * len(devices)
    elif split_setting:
        shares = [float(x) for x in split_setting]
    else:  # llama.cpp's default: by free memory (total memory here; 1 for a CPU device)
        shares = [float(d.vram_bytes or 1) for d in devices]
    placements, host_bytes = place(model, devices, shares, ctx, parallel, tk, tv, ngl)
    for p in placements:
        if p.device.vram_bytes and not p.fits:
            need = p.weights + p.kv + p.reserve
            problems.append(f"{ctx // 1024}K context with {tk} KV needs {need / GIB:.1f} GiB on the {p.device.gpu} "
                            f"({p.device.name}, {p.device.host}), it has {p.device.vram_bytes / GIB:.1f}")
    warnings = []
    if tk in QUANTIZED_CACHE_TYPES or tv in QUANTIZED_CACHE_TYPES:
        f16, _ = place(model, devices, shares, ctx, parallel, "f16", "f16", ngl)
        if all(p.fits or not p.device.vram_bytes for p in f16):
            warnings.append(f"KV cache {tk}/{tv} although f16 fits: f16 measured faster over RPC (23.5 vs 20 tok/s)")
    if any(flag in s["llama_extra_args"] for flag in SPECULATIVE_FLAGS):
        warnings.append("speculative decoding / MTP with RPC devices: measured slower, not faster (seed article)")
    rendered = [int(x) if float(x).is_integer() else x for x in shares] if split_setting else []
    return CapacityPlan(placements=placements, host_bytes=host_bytes, split=rendered,
                        tokens_per_s=ceiling(placements) if any(p.weights for p in placements) else 0.0,
                        problems=problems, warnings=warnings, n_layer=model.n_layer)
