"""The capacity planner (`python -m llama_rpc_deploy plan`): what each device holds, whether it fits,
and the tokens/s ceiling.

From the model's layer sizes and KV shapes (gguf_header.py reads them, no weights are loaded), it takes each device's memory and bandwidth from llama_rpc_deploy/gpus.py, and for a configuration
(context, parallel slots, KV cache types) computes per device: weights, KV cache, a compute
reserve, and what is left.

Decode is memory-bound and the devices work in turn, so one token costs, on each device, the
time to read its weights from its memory, plus one network hop per device boundary:
    ceiling = 1 / (sum(bytes_i / bandwidth_i) + hops * hop_seconds)

With speculative decoding (a draft model, the target's MTP head or n-gram drafting), one step drafts k tokens
and the target checks them in one pass; with each drafted token accepted with probability a (given the ones
before it were), a step yields E = (1 - a^(k+1)) / (1 - a) tokens (Leviathan et al., 2023):
    speculative = E / (1 / ceiling + k * draft_seconds)
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from . import gguf_header, speculation
from .cluster_checks import no_example_addresses
from .gguf_header import ModelInfo
from .gpus import lookup
from .loading import data_overrides, offline_cluster
from .settings import PLACEHOLDER, QUANTIZED_CACHE_TYPES, SettingsError

GIB = 1024**3
MIB = 1024**2
COMPUTE_RESERVE = 512 * MIB  # the graph's compute buffer and cuBLAS workspace (llama-fit-params: 300-900 MiB)
CUDA_CONTEXT = 384 * MIB  # what one process's CUDA context takes from a card before llama.cpp allocates
UBATCH = 512
HOP_SECONDS = 0.0003  # one boundary per token on a home LAN: latency plus a few KB of activations


def row_bytes(cache_type: str, elements: int) -> int:
    """ggml_row_size: a row of a KV cache type (block formats store blocks of 32)."""
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[cache_type.upper()]]
    return elements // block * size


def pad(n: int, to: int = 256) -> int:
    return -(-n // to) * to


@dataclass(frozen=True)
class Context:
    """What llama-server is asked for, as llama.cpp sizes its KV cache from it (src/llama-context.cpp,
    llama-kv-cache.cpp, llama-kv-cache-iswa.cpp): the context is padded to 256 cells; without
    --kv-unified each of the `parallel` slots is a stream of its own with ctx/parallel cells (padded)
    and its own sliding window; with it, one stream of ctx cells that every slot shares."""

    ctx: int
    parallel: int = 1
    type_k: str = "f16"
    type_v: str = "f16"
    flash_attn: bool = True  # 'auto' turns it on where the devices support it (CUDA, CPU)
    unified: bool = False
    ubatch: int = UBATCH

    @property
    def streams(self) -> int:
        return 1 if self.unified else self.parallel

    @property
    def per_slot(self) -> int:
        """The most tokens one request can hold (llama.cpp's n_ctx_seq)."""
        return pad(self.ctx) if self.unified else pad(pad(self.ctx) // self.parallel)

    def cells(self, window: int = 0) -> int:
        """Cells of one stream: n_ctx_seq for a global layer, the window (and a ubatch) for a sliding one."""
        if not window:
            return self.per_slot
        return pad(min(self.per_slot, window * (self.parallel if self.unified else 1) + self.ubatch))

    def with_types(self, type_k: str, type_v: str) -> Context:
        return dataclasses.replace(self, type_k=type_k, type_v=type_v)


def kv_by_layer(model: ModelInfo, context: Context) -> list[int]:
    """KV cache (and recurrent state) bytes of each layer. Without flash attention V is stored
    transposed, every layer's as wide as the widest (llama.cpp's TAG_V_CACHE_VARIABLE); a model with
    latent attention (MLA) stores K only."""
    v_widest = max(v for _, v in model.kv_per_token)
    out = []
    for il, (k, v) in enumerate(model.kv_per_token):
        total = 0
        if model.recurrent_per_seq and model.recurrent_per_seq[il]:
            total += 4 * model.recurrent_per_seq[il] * max(1, context.parallel)  # f32, one row per sequence
        if k:
            sliding = bool(model.swa_layers) and model.swa_layers[il]
            cells = context.cells(model.swa_window if sliding else 0) * context.streams
            total += row_bytes(context.type_k, k) * cells
            if not model.mla:
                total += row_bytes(context.type_v, v if context.flash_attn else v_widest) * cells
        out.append(total)
    return out


def kv_bytes(model: ModelInfo, layers: list[int], context: Context) -> int:
    """KV cache (and recurrent state) bytes of these layers."""
    per_layer = kv_by_layer(model, context)
    return sum(per_layer[il] for il in layers)


@dataclass(frozen=True)
class Device:
    name: str  # RPC0, CUDA0, ...
    host: str
    gpu: str
    vram_bytes: int  # the card's memory as CUDA reports it (nvidia-smi's memory.total); 0: a CPU device
    bandwidth: float  # bytes/s

    @property
    def usable(self) -> int:
        """What llama.cpp can allocate: the card less its CUDA context."""
        return self.vram_bytes - CUDA_CONTEXT if self.vram_bytes else 0


@dataclass
class Placement:
    device: Device
    layers: list[int] = field(default_factory=list)
    weights: int = 0
    kv: int = 0
    reserve: int = COMPUTE_RESERVE
    mmproj: int = 0  # the vision projector's weights, on the first device of --device (common/arg.cpp)
    draft: int = 0  # a draft model's weights, KV and compute reserve, on the device it runs on (DraftMemory)

    @property
    def free(self) -> int:
        return self.device.usable - self.weights - self.kv - self.reserve - self.mmproj - self.draft

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


def place(
    model: ModelInfo,
    devices: list[Device],
    shares: list[float],
    context: Context,
    n_gpu_layers: int = 999,
    mmproj_bytes: int = 0,
) -> tuple[list[Placement], int]:
    """Weights, KV and reserve per device for a split, and the bytes left in the host's memory
    (token embeddings always, plus whatever is not offloaded)."""
    placements = [Placement(device=d) for d in devices]
    kv = kv_by_layer(model, context)
    host = model.input_bytes
    where = assign_layers(model.n_layer, n_gpu_layers, shares)
    for il, index in enumerate(where[:-1]):
        if index is None:
            host += model.layer_bytes[il]
            continue
        p = placements[index]
        p.layers.append(il)
        p.weights += model.layer_bytes[il]
        p.kv += kv[il]
    if where[-1] is None:
        host += model.output_bytes
    else:
        placements[where[-1]].weights += model.output_bytes
        placements[where[-1]].reserve += model.n_vocab * UBATCH * 4  # logits
    if placements:
        placements[0].mmproj = mmproj_bytes
    return placements, host


DRAFT_COMPUTE_RESERVE = 256 * MIB  # a draft on a GPU: its compute buffer (its outputs are one row per slot)


@dataclass(frozen=True)
class DraftMemory:
    """What a draft model takes where it runs (speculation.draft_device): llama.cpp gives it the target's context
    and slots, with its own KV types (--spec-draft-type-k/-v, f16 by default), and keeps its token embeddings in
    host memory as it does the target's. `llama-fit-params -m DRAFT -c CTX -np PARALLEL` answers the same
    (its 'model' and 'context' columns; tests/oracle.py)."""

    kind: str
    device: str  # a device of --device, or speculation.CPU
    weights: int  # on the device (on the host for CPU)
    input_bytes: int  # token embeddings: host memory
    kv: int
    reserve: int
    counted: bool  # the planner knows the architecture's KV layout (gguf_header.KV_LAYOUTS)
    shared_kv: bool = False  # it reads the target's KV cache and has none of its own

    @property
    def on_device(self) -> int:
        return self.weights + self.kv + self.reserve


def draft_memory(draft: ModelInfo, kind: str, device: str, context: Context) -> DraftMemory:
    shared = draft.arch in speculation.SHARED_KV_DRAFTS
    counted = draft.kv_modeled or shared
    kv = sum(kv_by_layer(draft, context.with_types("f16", "f16"))) if draft.kv_modeled and not shared else 0
    return DraftMemory(
        kind=kind,
        device=device,
        weights=draft.weight_bytes - draft.input_bytes,
        input_bytes=draft.input_bytes,
        kv=kv,
        reserve=0 if device == speculation.CPU else DRAFT_COMPUTE_RESERVE,
        counted=counted,
        shared_kv=shared,
    )


DEFAULT_ACCEPTANCE = 0.7  # per drafted token; `plan --acceptance` sets another
NGRAM_N_MAX = {  # tokens an n-gram type without bounds of ours drafts at most, llama.cpp's defaults
    "ngram-simple": 48,  # (common_speculative_n_max); ngram-mod's and a draft model's: speculation.LLAMA_BOUNDS
    "ngram-map-k": 48,
    "ngram-map-k4v": 48,
    "ngram-cache": 8,
}
BLOCK_DRAFT_TYPES = ("draft-dflash", "draft-dspark")  # one draft pass drafts the whole block


def tokens_per_step(acceptance: float, n_max: int) -> float:
    """Expected tokens one verify step yields when each of n_max drafted tokens is accepted with probability
    `acceptance` given the ones before it were, the target's own token included (Leviathan et al., 2023, eq. 1)."""
    if acceptance >= 1:
        return n_max + 1.0
    return (1 - acceptance ** (n_max + 1)) / (1 - acceptance)


@dataclass(frozen=True)
class SpeculativeSpeed:
    """Speculative decoding's tokens/s, as the ceiling counts it: one step is the target's pass over the n_max + 1
    tokens (its weights read once, as for one token: memory-bound) and the draft's passes, each reading the draft's
    weights on the device it runs on (plus a network hop on a worker's device). A ceiling, like the plain one."""

    kind: str
    n_max: int
    acceptance: float
    verify_seconds: float  # the target's pass: 1 / the plain ceiling
    draft_seconds: float  # one draft pass
    passes: int  # draft passes per step: n_max, or 1 for a type that drafts a block at once
    where: str  # where the draft runs, in words

    @property
    def tokens_per_step(self) -> float:
        return tokens_per_step(self.acceptance, self.n_max)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / (self.verify_seconds + self.passes * self.draft_seconds)

    @property
    def speedup(self) -> float:
        """Against the plain ceiling."""
        return self.tokens_per_s * self.verify_seconds

    def line(self) -> str:
        accepted = (self.tokens_per_step - 1) / self.n_max  # what llama-server's /metrics would show: accepted/drafted
        cost = (
            f"draft on {self.where}: {self.draft_seconds * 1e3:.2f} ms a pass"
            if self.draft_seconds
            else "n-gram drafting: no model to run, and drafts only where the text repeats"
        )
        return (
            f"speculative ({self.kind}, {cost}): at acceptance {self.acceptance:g}, n_max {self.n_max}: "
            f"{self.tokens_per_s:.1f} tok/s ({self.speedup:.2f} x the plain ceiling); "
            f"llama-server would count {accepted:.0%} of drafted tokens accepted"
        )


def render_shares(counts: list[int]) -> list[int]:
    """--tensor-split values that give exactly these layer counts under llama.cpp's rule: the output
    layer counts as one more layer on the last device."""
    return counts[:-1] + [counts[-1] + 1]


def ceiling(placements: list[Placement], hop_seconds: float = HOP_SECONDS) -> float:
    """Tokens/s when every token reads each device's weights once, device after device."""
    seconds = sum(p.weights / p.device.bandwidth for p in placements if p.weights)
    hops = sum(1 for p in placements if p.weights) - 1
    return 1.0 / (seconds + max(0, hops) * hop_seconds)


def auto_split(
    model: ModelInfo,
    devices: list[Device],
    context: Context,
    mmproj_bytes: int = 0,
    held: dict[str, int] | None = None,
) -> list[int] | None:
    """Layers per device (in device order) that maximize the ceiling within every device's memory, or
    None when no split fits. `held`: bytes a device holds besides the model, by device name (a draft model).

    llama.cpp gives each device a run of consecutive layers, in device order (remote first, local
    last), and the output layer to the last one. The time per token is the sum over devices of
    bytes_i / bandwidth_i plus a hop per boundary, so the best split is found exactly by dynamic
    programming over (device, first layer): a few thousand steps for 60 layers and 4 devices.
    """
    n, k = model.n_layer, len(devices)
    weights, memory = [0], [0]  # prefix sums over layers
    for layer, kv in zip(model.layer_bytes, kv_by_layer(model, context)):
        weights.append(weights[-1] + layer)
        memory.append(memory[-1] + layer + kv)

    def room(i: int) -> int:
        left = (
            devices[i].usable - COMPUTE_RESERVE - (mmproj_bytes if i == 0 else 0) - (held or {}).get(devices[i].name, 0)
        )
        if i == k - 1:
            left -= model.output_bytes + model.n_vocab * UBATCH * 4
        return left

    def seconds(i: int, a: int, b: int) -> float:
        held = weights[b] - weights[a] + (model.output_bytes if i == k - 1 else 0)
        return held / devices[i].bandwidth + (HOP_SECONDS if held else 0.0)

    @functools.lru_cache(maxsize=None)
    def best(i: int, start: int) -> tuple[float, tuple[int, ...]] | None:
        if i == k - 1:
            if memory[n] - memory[start] > room(i):
                return None
            return seconds(i, start, n), (n - start,)
        options = []
        for end in range(start, n + 1):
            if memory[end] - memory[start] > room(i):
                break
            rest = best(i + 1, end)
            if rest is not None:
                options.append((seconds(i, start, end) + rest[0], (end - start,) + rest[1]))
        return min(options) if options else None

    found = best(0, 0)
    return list(found[1]) if found else None


def largest_context(
    model: ModelInfo,
    devices: list[Device],
    context: Context,
    mmproj_bytes: int = 0,
    held: Callable[[Context], dict[str, int]] | None = None,
) -> int:
    """The largest context (a multiple of 256) whose auto split still holds every layer (and what `held` gives,
    for that context, beside them)."""
    per_request = model.n_ctx_train or (1 << 20)  # llama.cpp runs past the trained length, but warns
    lo, hi = 0, per_request * (1 if context.unified else context.parallel) // 256
    while lo < hi:
        mid = (lo + hi + 1) // 2
        trial = dataclasses.replace(context, ctx=mid * 256)
        if auto_split(model, devices, trial, mmproj_bytes, held(trial) if held else None) is not None:
            lo = mid
        else:
            hi = mid - 1
    return lo * 256


# --- the cluster's view ---


@dataclass
class CapacityPlan:
    placements: list[Placement]  # one per device, in device order
    host_bytes: int  # weights left in the coordinator's host memory (token embeddings, layers not offloaded)
    split: list  # --tensor-split values, in device order ([] for llama.cpp's default)
    tokens_per_s: float
    problems: list[str]  # each one stops the deploy
    warnings: list[str]
    context: Context | None = None
    n_layer: int = 0
    largest: dict[bool, int] = field(default_factory=dict)  # kv_unified -> the largest context whose auto split fits
    n_ctx_train: int = 0
    draft: DraftMemory | None = None
    speculative: SpeculativeSpeed | None = None

    @property
    def fits(self) -> bool:
        return not self.problems

    def table(self) -> str:
        rows = [
            f"{'device':<26} {'card':<18} {'layers':>6} {'weights':>9} {'KV':>8} {'reserve':>8} "
            f"{'usable':>8} {'free':>8}  fit"
        ]
        for p in self.placements:
            d = p.device
            memory = f"{d.usable / GIB:7.2f}G" if d.vram_bytes else "     n/a"
            free = f"{p.free / GIB:7.2f}G" if d.vram_bytes else "     n/a"
            fit = ("yes" if p.fits else "NO") if d.vram_bytes else "n/a"
            kv = f"{p.kv / GIB:7.2f}G" if self.context else "      ?"
            weights = p.weights + p.mmproj
            rows.append(
                f"{d.name + ' ' + d.host:<26} {d.gpu:<18} {len(p.layers):>6} {weights / GIB:8.2f}G "
                f"{kv} {p.reserve / GIB:7.2f}G {memory} {free}  {fit}"
            )
        kept = self.n_layer - sum(len(p.layers) for p in self.placements)
        rows.append(
            f"host memory of the coordinator: {self.host_bytes / GIB:.2f}G (token embeddings"
            f"{f', {kept} layers not offloaded' if kept else ''})"
        )
        d = self.draft
        if d:
            where = "the coordinator's CPU (host memory)" if d.device == speculation.CPU else f"{d.device}"
            kv = (
                "the target's KV (shared, none of its own)"
                if d.shared_kv
                else f"{d.kv / GIB:.2f}G KV (f16)"
                if d.counted
                else "KV not counted (architecture unknown to the planner)"
            )
            rows.append(
                f"draft model ({d.kind}) on {where}: {d.weights / GIB:.2f}G weights, {kv}"
                + (f", {d.reserve / GIB:.2f}G reserve" if d.reserve else "")
                + f"; its token embeddings {d.input_bytes / GIB:.2f}G in host memory"
            )
        if self.placements and self.placements[0].mmproj:
            rows.append(
                f"vision projector (mmproj): {self.placements[0].mmproj / GIB:.2f}G on "
                f"{self.placements[0].device.name}, the first of --device (in its weights above)"
            )
        c = self.context
        if c:
            how = (
                "every slot shares one cache (--kv-unified)"
                if c.unified
                else "each slot has its own ctx/parallel cells; llama_kv_unified: true lets any slot use all"
            )
            rows.append(
                f"context: {c.ctx} tokens, {c.parallel} slots: up to {c.per_slot} tokens per request "
                f"({how}); KV {c.type_k}/{c.type_v}, flash attention {'on' if c.flash_attn else 'off'}"
            )
        for unified, tokens in self.largest.items():
            largest = dataclasses.replace(c, ctx=tokens, unified=unified)
            rows.append(
                f"largest context that fits with {c.parallel} slots{' (kv unified)' if unified else ''}: "
                f"{tokens} tokens, {largest.per_slot} per request"
                f"{' (the model is trained for no more per request)' if largest.per_slot >= self.n_ctx_train > 0 else ''}"
            )
        split = ",".join(str(c) for c in self.split) if self.split else "by free memory (llama.cpp's default)"
        rows.append(f"tensor split: {split}   predicted ceiling: {self.tokens_per_s:.1f} tokens/s")
        if self.speculative:
            rows.append(self.speculative.line())
        rows += [f"warning: {w}" for w in self.warnings] + [f"does not fit: {p}" for p in self.problems]
        return "\n".join(rows)


CPU_DEVICE_BANDWIDTH = 40e9  # a CPU rpc-server's memory, roughly (DDR4 dual channel); no fit check on CPUs
ROPE_FLAGS = ("--rope-scaling", "--rope-scale", "--yarn-", "--rope-freq")  # context stretched past the trained length
# a draft model in llama_extra_args (common/arg.cpp: a file, or one from Hugging Face) ...
DRAFT_MODEL_FLAGS = (
    "-md",
    "--model-draft",
    "--spec-draft-model",
    "-hfd",
    "-hfrd",
    "--hf-repo-draft",
    "--spec-draft-hf",
)
DRAFT_DEVICE_FLAGS = ("-devd", "--device-draft", "--spec-draft-device")  # ... and where it runs


def devices_of(cluster, reported: dict[str, list[int]] | None = None) -> list[Device]:
    """Every worker's devices first (RPC0, RPC1, ...), the coordinator's GPUs last (CUDA0 or Vulkan0, ...), as
    llama-server sees them. A card's memory is the MiB that nvidia-smi reported on its host (`reported`: host -> [MiB per GPU]),
    or the GPU table's figure."""
    reported = reported or {}
    out = []

    def memory(host, i, gpu) -> int:
        found = reported.get(host, [])
        return (found[i] if i < len(found) else gpu.vram_mib) * MIB

    index = 0
    for worker in cluster.workers:
        for i, gpu in enumerate(worker.gpus or [None]):
            cpu = "CPU (lavapipe)" if worker.software_vulkan else "CPU"  # lavapipe: Vulkan on the CPU, its memory
            out.append(
                Device(
                    name=f"RPC{index}",
                    host=worker.name,
                    gpu=gpu.name if gpu else cpu,
                    vram_bytes=memory(worker.name, i, gpu) if gpu else 0,
                    bandwidth=gpu.bandwidth_gbs * 1e9 if gpu else CPU_DEVICE_BANDWIDTH,
                )
            )
            index += 1
    local = cluster.devices[index:]  # CUDA0, ... or Vulkan0, ...
    for i, gpu in enumerate(cluster.coordinator.gpus[: len(local)]):
        out.append(
            Device(
                name=local[i],
                host=cluster.coordinator.name,
                gpu=gpu.name,
                vram_bytes=memory(cluster.coordinator.name, i, gpu),
                bandwidth=gpu.bandwidth_gbs * 1e9,
            )
        )
    if cluster.coordinator.software_vulkan:  # Vulkan0 on the coordinator's CPU: its memory, no fit check
        out.append(Device(local[0], cluster.coordinator.name, "CPU (lavapipe)", 0, CPU_DEVICE_BANDWIDTH))
    return out


def context_of(settings) -> Context:
    return Context(
        ctx=settings["llama_ctx_size"],
        parallel=settings["llama_parallel"],
        type_k=settings["llama_cache_type_k"],
        type_v=settings["llama_cache_type_v"],
        flash_attn=settings["llama_flash_attn"] != "off",
        unified=settings["llama_kv_unified"],
    )


def plan_cluster(
    cluster,
    model: ModelInfo,
    reported: dict[str, list[int]] | None = None,
    mmproj_bytes: int = 0,
    draft: ModelInfo | None = None,
    acceptance: float = DEFAULT_ACCEPTANCE,
) -> CapacityPlan:
    s = cluster.settings
    devices = devices_of(cluster, reported)
    context = context_of(s)
    kind = s["llama_spec_type"] or (speculation.type_of_draft(draft) if draft else None)
    draft_on = speculation.draft_device(cluster, draft) if draft else None

    def held(c: Context) -> dict[str, int]:
        """What the draft holds on its device at context c (nothing on the CPU): the auto split leaves it room."""
        if draft is None or draft_on == speculation.CPU:
            return {}
        return {draft_on: draft_memory(draft, kind, draft_on, c).on_device}

    ngl = s["llama_n_gpu_layers"]
    split_setting = s["llama_tensor_split"]
    problems, warnings = [], []
    unknown = [f"{d.name} ({d.host})" for d in devices if not d.vram_bytes]
    if split_setting == "auto" and unknown:
        problems.append(
            f"llama_tensor_split = 'auto' needs every device's memory, and {', '.join(unknown)} "
            "is a CPU device: expected a list of shares for llama_tensor_split, or gpus on that host"
        )
        split_setting = None
    if not model.kv_modeled:
        modeled = ", ".join(sorted(gguf_header.KV_LAYOUTS))
        note = (
            f"the planner does not know how llama.cpp sizes the KV cache of architecture '{model.arch}' "
            f"(it knows {modeled}), so it does not guess: "
        )
        if split_setting == "auto":
            problems.append(note + "expected llama_tensor_split as a list of shares for this model")
            split_setting = None
        else:
            warnings.append(note + "no fit check; llama-server fits the context to the memory itself (--fit)")
    if split_setting == "auto":
        counts = auto_split(model, devices, context, mmproj_bytes, held(context))
        if counts is None:
            problems.append(
                f"no split of the {model.n_layer} layers with {context.ctx} context ({context.type_k}/"
                f"{context.type_v} KV, {context.parallel} slots) fits in the devices' memory"
            )
        shares = [float(x) for x in render_shares(counts)] if counts else [1.0] * len(devices)
    elif split_setting:
        shares = [float(x) for x in split_setting]
    else:  # llama.cpp's default: by free memory (total memory here; 1 for a CPU device)
        shares = [float(d.vram_bytes or 1) for d in devices]
    placements, host_bytes = place(model, devices, shares, context, ngl, mmproj_bytes)
    if not model.kv_modeled:
        for p in placements:
            p.kv = 0
    drafted = None
    if draft is not None and draft.arch in speculation.SHARED_KV_DRAFTS:  # where the KV it reads is, as placed
        draft_on, problem = speculation.assistant_device(model, placements, s["llama_extra_args"])
        problem = problem or speculation.placement_problem(cluster, draft, draft_on)
        if problem:
            problems.append(problem)
    if draft is not None:
        drafted = draft_memory(draft, kind, draft_on, context)
        host_bytes += drafted.input_bytes
        on = [p for p in placements if p.device.name == drafted.device]
        if on:
            on[0].draft = drafted.on_device
        else:  # the CPU
            host_bytes += drafted.on_device
    for p in placements:
        if p.device.vram_bytes and not p.fits and model.kv_modeled:
            need = p.weights + p.kv + p.reserve + p.mmproj + p.draft
            problems.append(
                f"{context.ctx // 1024}K context with {context.type_k} KV needs {need / GIB:.1f} GiB on the "
                f"{p.device.gpu} ({p.device.name}, {p.device.host}), it has {p.device.usable / GIB:.1f}"
            )
    quantized = context.type_k in QUANTIZED_CACHE_TYPES or context.type_v in QUANTIZED_CACHE_TYPES
    if quantized and model.kv_modeled:
        f16, _ = place(model, devices, shares, context.with_types("f16", "f16"), ngl, mmproj_bytes)
        if all(p.fits or not p.device.vram_bytes for p in f16):
            warnings.append(
                f"KV cache {context.type_k}/{context.type_v} although f16 fits: "
                "f16 measured faster over RPC (23.5 vs 20 tok/s)"
            )
    if model.mla and context.type_k != context.type_v:  # llama_init_from_model refuses it (llama-context.cpp)
        problems.append(
            f"{cluster.coordinator.origins['llama_cache_type_v']}: llama_cache_type_v = {context.type_v!r} "
            f"with llama_cache_type_k = {context.type_k!r}: {model.arch} uses latent attention (MLA), for "
            "which llama.cpp wants one type for K and V: expected the same type for both"
        )
    stretched = any(a.startswith(ROPE_FLAGS) for a in s["llama_extra_args"])
    if model.n_ctx_train and context.per_slot > model.n_ctx_train and not stretched:  # llama.cpp's n_ctx_seq
        problems.append(
            f"{cluster.coordinator.origins['llama_ctx_size']}: llama_ctx_size = {context.ctx} gives each "
            f"request {context.per_slot} tokens, more than the {model.n_ctx_train} {model.arch} was trained "
            f"for: expected at most {model.n_ctx_train} per request (or rope scaling, e.g. --rope-scaling "
            "yarn, in llama_extra_args)"
        )
    extra = s["llama_extra_args"]
    if any(a.startswith(DRAFT_MODEL_FLAGS) for a in extra) and not any(a.startswith(DRAFT_DEVICE_FLAGS) for a in extra):
        warnings.append(  # model-free drafting (ngram-*) by flags is not warned on: it measured 3.15x on the lab
            "a draft model in llama_extra_args follows --device onto the workers, and each drafted token waits on "
            "every worker (the lab: 1.11x against 1.95x on the coordinator; the article's MTP, 0.5x): set "
            "llama_spec_draft_path instead, which keeps it on the coordinator and checks it against the model"
        )
    in_place = draft is not None and draft.arch in speculation.SHARED_KV_DRAFTS  # it reads the target's KV where it is
    if drafted and drafted.device != speculation.CPU and drafted.device not in cluster.local_devices and not in_place:
        warnings.append(
            f"the draft model runs on {drafted.device}, a worker's device (llama_spec_draft_device): each "
            "drafted token waits on the network"
        )
    largest = {}
    if model.kv_modeled and devices and all(d.vram_bytes for d in devices) and ngl >= model.n_layer + 1:
        largest = {
            unified: largest_context(model, devices, dataclasses.replace(context, unified=unified), mmproj_bytes, held)
            for unified in (False, True)
        }
    rendered = [int(x) if float(x).is_integer() else x for x in shares] if split_setting else []
    plain = ceiling(placements) if any(p.weights for p in placements) else 0.0
    return CapacityPlan(
        placements=placements,
        host_bytes=host_bytes,
        split=rendered,
        tokens_per_s=plain,
        problems=problems,
        warnings=warnings,
        n_layer=model.n_layer,
        context=context if model.kv_modeled else None,
        largest=largest,
        n_ctx_train=model.n_ctx_train,
        draft=drafted,
        speculative=speculative_speed(cluster, model, placements, plain, kind, drafted, acceptance),
    )


def speculative_speed(
    cluster,
    model: ModelInfo,
    placements: list[Placement],
    plain: float,
    kind: str | None,
    drafted: DraftMemory | None,
    acceptance: float,
) -> SpeculativeSpeed | None:
    """The speculative tokens/s of these settings (None without speculation, or with a draft model the plan was not
    given). A draft model's pass reads its weights on its device (all but its token embeddings, which stay in host
    memory; its KV reads are not counted, as the target's are not); the target's own MTP head reads its last layer
    and the output layer where they are; n-gram drafting reads nothing."""
    s = cluster.settings
    if not kind or not plain:
        return None
    flags = speculation.bound_flags(kind)  # its maximum is ours, or else llama.cpp's default
    n_max = (s["llama_spec_draft_max"] or speculation.LLAMA_BOUNDS[flags[1]]) if flags else NGRAM_N_MAX[kind]
    if kind.startswith("ngram-"):
        return SpeculativeSpeed(kind, n_max, acceptance, 1 / plain, 0.0, n_max, "")
    bandwidths = {p.device.name: p.device.bandwidth for p in placements}
    if drafted:
        on = drafted.device
        seconds = drafted.weights / bandwidths.get(on, CPU_DEVICE_BANDWIDTH)
        if on != speculation.CPU and on not in cluster.local_devices:  # each pass crosses the network
            seconds += HOP_SECONDS
        where = "the coordinator's CPU" if on == speculation.CPU else on
    elif kind == "draft-mtp" and model.mtp_head:  # the target's own head, where its last layer is
        last = next((p for p in reversed(placements) if model.n_layer - 1 in p.layers), None)
        bandwidth = last.device.bandwidth if last else CPU_DEVICE_BANDWIDTH
        seconds = (model.layer_bytes[-1] + model.output_bytes) / bandwidth
        where = f"{last.device.name if last else 'the CPU'} (the model's own MTP head)"
    else:
        return None
    passes = 1 if kind in BLOCK_DRAFT_TYPES else n_max
    return SpeculativeSpeed(kind, n_max, acceptance, 1 / plain, seconds, passes, where)


# --- `llama-rpc plan`: the planner on an inventory (or on --gpus), offline ---

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
    path.write_text(
        f"coordinator = [({hosts[0][0]!r}, {data(hosts[0][1])!r})]\n"
        f"workers = [{', '.join(f'({h!r}, {data(g)!r})' for h, g in hosts[1:])}]\n"
    )
    return path


def command(args) -> int:
    """`llama-rpc plan`: each model's table; 2 when something does not fit or a file is missing."""
    with tempfile.TemporaryDirectory() as tmp:
        inventory = gpus_inventory(args.gpus, Path(tmp)) if args.gpus else args.inventory
        # offline arithmetic: an unedited checkout plans (the deploy still refuses what it must)
        cluster = offline_cluster(inventory, overrides=data_overrides(args.data), deploying=False)
    if getattr(args, "probe", False):
        if args.gpus:
            print(
                "error: --probe learns the inventory's hosts' cards: expected -i INVENTORY, not --gpus", file=sys.stderr
            )
            return 2
        from . import probe  # over SSH, as the deploy would learn them

        cluster = probe.learned_cluster(cluster, args.inventory)
    elif cluster.unlearned:
        names = ", ".join(h.name for h in cluster.unlearned)
        print(
            f"note: {names}: gpus not set: planned as a CPU device (the deploy learns the cards from the host; "
            "plan --probe learns them now, over SSH)",
            file=sys.stderr,
        )
    try:
        no_example_addresses(cluster, str(args.inventory))
    except SettingsError as error:
        if not args.gpus:
            print(f"note: {error} (the deploy refuses them; a plan does not need them)", file=sys.stderr)
    if cluster.settings["llama_models_folder"]:  # the folder's models, as this machine's copy has them
        folder = Path(cluster.settings["llama_model_path"]).parent
        if not folder.is_dir():
            print(
                f"error: llama_models_folder: {folder}: not on this machine: plan needs a copy of the "
                "folder (only the files' headers are read)",
                file=sys.stderr,
            )
            return 2
        cluster = cluster.with_folder([str(p) for p in folder.glob("*.gguf")])
    acceptance = getattr(args, "acceptance", None)
    acceptance = DEFAULT_ACCEPTANCE if acceptance is None else acceptance
    if not 0 <= acceptance <= 1:
        print(f"error: --acceptance {acceptance}: expected a probability from 0 to 1", file=sys.stderr)
        return 2
    failed = False
    for name in cluster.model_names():  # with llama_models, every model is planned with its own settings
        view = cluster.for_model(name)
        default = name == cluster.default_model
        model = (default and args.model) or Path(view.settings["llama_model_path"])
        if PLACEHOLDER in str(model):
            print(
                f"error: {view.coordinator.origins['llama_model_path']}: llama_model_path = {str(model)!r}: "
                "plan needs the model: pass --model LOCAL.gguf (only its header is read)",
                file=sys.stderr,
            )
            return 2
        mmproj = (default and args.mmproj) or (
            view.settings["llama_mmproj_path"] and Path(view.settings["llama_mmproj_path"])
        )
        draft = (default and args.draft) or (
            view.settings["llama_spec_draft_path"] and Path(view.settings["llama_spec_draft_path"])
        )
        read = {}
        for what, path, reader in (
            ("--model", model, gguf_header.read_model),
            ("--mmproj", mmproj, gguf_header.projector_bytes),
            ("--draft", draft, gguf_header.read_model),
        ):
            if not path:
                continue
            if not path.is_file():
                print(
                    f"error: {what} {path}: not on this machine: pass a copy of the GGUF file "
                    "(only its header is read)",
                    file=sys.stderr,
                )
                return 2
            try:
                read[what] = reader(path)
            except Exception as error:  # not a GGUF file, cut short, a shard missing
                print(f"error: {what} {path}: not a readable GGUF file: {error}", file=sys.stderr)
                return 2
        problem = speculation.files_problem(view.settings["llama_spec_type"], read["--model"], read.get("--draft"))
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 2
        capacity = plan_cluster(
            view,
            read["--model"],
            mmproj_bytes=read.get("--mmproj", 0),
            draft=read.get("--draft"),
            acceptance=acceptance,
        )
        if cluster.router:
            print(f"model {name!r}{' (loaded at start)' if default else ''}:")
        print(capacity.table())
        failed = failed or bool(capacity.problems)
    return 2 if failed else 0
