"""Speculative decoding: which kind, with which draft, where the draft runs, and what llama-server gets for it.

The settings (settings.py; a model of llama_models may set its own): llama_spec_type, llama_spec_draft_path,
llama_spec_draft_min, llama_spec_draft_max, llama_spec_draft_device. They are checked twice, each refusal one line:
- the settings alone, before connecting (`settings_problem`, from cluster_checks): a type llama.cpp has, a draft
  model where the type reads one and none where it does not, bounds in range, a device the cluster has;
- the model files' headers, on the coordinator before any change (`files_problem`, from phases/checks.settle):
  the draft's architecture serves the type, and its vocabulary is the target's. llama-server itself only logs a
  mismatch and serves without drafting, so the deploy refuses it.

Where the draft runs: on the coordinator's own device by default (its last GPU, or its CPU), never on a worker
unless asked. An MTP draft (a Gemma 4 assistant) is the exception: it reads the KV cache and hidden state of the
target's last layers (the cache of the layers they reuse, where they keep none: assistant_device), so it runs on that
cache's device (the coordinator's last GPU in a deploy with one; the last worker's where the coordinator has none),
and any other device is refused for it (llama.cpp aborts at load). A draft that
follows --device (llama.cpp's default) is split across the workers, and each drafted token then costs a network
round trip per worker (docs/speculative.md).
"""

from __future__ import annotations

from .gguf_header import ModelInfo
from .settings import SPEC_TYPES

DRAFT_MODEL_TYPES = tuple(t for t in SPEC_TYPES if t.startswith("draft-"))  # they read a draft model
NGRAM_TYPES = tuple(t for t in SPEC_TYPES if t.startswith("ngram-"))  # they read the text so far
MAX_DRAFT_TOKENS = 64  # a draft model's tokens are drafted one pass each, in turn: more is never faster
VOCAB_SIZE_SLACK = 128  # llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE
CPU = "CPU"  # llama_spec_draft_device: the coordinator's CPU (llama-server's --spec-draft-device none)
KEYS = ("llama_spec_type", "llama_spec_draft_path", "llama_spec_draft_min", "llama_spec_draft_max")
DEVICE_KEY = "llama_spec_draft_device"


def enabled(settings: dict) -> bool:
    return bool(settings["llama_spec_type"] or settings["llama_spec_draft_path"])


def anywhere(cluster) -> bool:
    """Some model the cluster serves speculates: llama-server then serves /metrics, where `status` reads the
    drafted and accepted tokens."""
    return any(enabled(cluster.for_model(name).settings) for name in cluster.model_names())


METRICS = {  # llama-server's /metrics (tools/server/server-task.cpp): counters since it started
    "drafted": "llamacpp:spec_decode_num_draft_tokens_total",
    "accepted": "llamacpp:spec_decode_num_accepted_tokens_total",
    "drafts": "llamacpp:spec_decode_num_drafts_total",
}


def counters(metrics: str) -> dict[str, int]:
    """The drafted and accepted tokens, and the drafts, from llama-server's Prometheus text."""
    values = dict(line.split()[:2] for line in metrics.splitlines() if line.startswith("llamacpp:") and " " in line)
    return {what: int(float(values[name])) for what, name in METRICS.items() if name in values}


def bound_flags(kind: str | None) -> tuple[str, str] | None:
    """llama-server's (min, max) flags for the draft-token bounds of a type (None: a draft model's, the type not
    yet read from its file), or None for a type that takes none."""
    if kind is None or kind in DRAFT_MODEL_TYPES:
        return "--spec-draft-n-min", "--spec-draft-n-max"
    if kind == "ngram-mod":
        return "--spec-ngram-mod-n-min", "--spec-ngram-mod-n-max"
    return None


LLAMA_BOUNDS = {  # llama.cpp's defaults (common/common.h: common_params_speculative)
    "--spec-draft-n-min": 0,
    "--spec-draft-n-max": 3,
    "--spec-ngram-mod-n-min": 48,
    "--spec-ngram-mod-n-max": 64,
}
NGRAM_MOD_MAX_TOKENS = 1024  # llama.cpp refuses more (common/arg.cpp)
OFF = {key: None for key in (*KEYS, DEVICE_KEY)}  # the settings of a model that does not speculate


def bounds(settings: dict) -> tuple[int, int] | None:
    """The draft-token bounds (min, max) llama-server uses for these settings, llama.cpp's defaults where they are
    None; None when speculation is off or its type takes no bounds."""
    flags = bound_flags(settings["llama_spec_type"])
    if not enabled(settings) or flags is None:
        return None
    low, high = settings["llama_spec_draft_min"], settings["llama_spec_draft_max"]
    return (LLAMA_BOUNDS[flags[0]] if low is None else low, LLAMA_BOUNDS[flags[1]] if high is None else high)


def with_max(settings: dict, n_max: int) -> dict:
    """The settings that change these into at most n_max draft tokens (the minimum lowered to it where it is
    above), or, for n_max 0, into no speculation at all."""
    if n_max == 0:
        return dict(OFF)
    low, _ = bounds(settings)
    return {"llama_spec_draft_min": min(low, n_max), "llama_spec_draft_max": n_max}


def max_candidates(settings: dict) -> list[int]:
    """What `tune` compares with the deployed speculation, in this order: off (0), then the deployed draft-token
    maximum halved and doubled, within llama.cpp's range (a type without bounds: off only)."""
    found = bounds(settings)
    if found is None:
        return [0]
    high = found[1]
    limit = NGRAM_MOD_MAX_TOKENS if settings["llama_spec_type"] == "ngram-mod" else MAX_DRAFT_TOKENS
    return [0] + [n for n in (high // 2, high * 2) if 1 <= n <= limit and n != high]


# Drafts whose every layer reads the target's KV cache: the Gemma 4 assistant (src/models/gemma4-assistant.cpp has no
# K or V projection; llama-model.cpp's create_memory shares each of its layers with the target's last sliding or
# last global layer, so its cache allocates nothing)
SHARED_KV_DRAFTS = ("gemma4-assistant",)


def draft_device(cluster, draft: ModelInfo | None = None) -> str:
    """Where the draft model runs: llama_spec_draft_device (for a Gemma 4 assistant, settled by the deploy to the
    device of the KV it reads: assistant_device), or else, for an assistant before the target is placed (draft
    given), the last device of --device that -ngl offloads to, or else the coordinator's own last device (its last
    GPU, which holds the target's last layers and output), or its CPU."""
    chosen = cluster.settings[DEVICE_KEY]
    if chosen:
        return chosen
    if draft is not None and draft.arch in SHARED_KV_DRAFTS:
        return cluster.devices[-1] if cluster.devices and cluster.settings["llama_n_gpu_layers"] else CPU
    return cluster.local_devices[-1] if cluster.local_devices else CPU


def settled(settings: dict, draft) -> dict:
    """What the deploy settles from a draft's header once the target is placed (draft: the plan's DraftMemory): the
    draft's own type where llama_spec_type is None, and an assistant's device, the KV it reads, where
    llama_spec_draft_device is None. phases/checks.settle and tune both take these."""
    out = {} if settings["llama_spec_type"] else {"llama_spec_type": draft.kind}
    if draft.shared_kv and not settings[DEVICE_KEY]:
        out[DEVICE_KEY] = draft.device
    return out


KV_OFF_FLAGS = ("-nkvo", "--no-kv-offload")  # llama_extra_args that keep every layer's KV in host memory


def assistant_device(target: ModelInfo, placements, extra_args: list[str]) -> tuple[str, str]:
    """(device, problem) for a Gemma 4 assistant on this target: the device of the KV cache it reads in place, from
    the planner's placements (llama.cpp's -ngl and split rule); the CPU where that cache is not offloaded. Its sliding
    layers read the cache of the target's layer n-2, its global one layer n-1's (llama-model.cpp's share callback),
    through the target's own layer map: where those layers keep no cache of their own (Gemma 4 E2B and E4B's shared-KV
    layers), the cache read is that of the layers they reuse, kv_from_start - 2 and - 1 (ModelInfo.kv_layer), and its
    device is theirs. problem: the two caches on two devices, which no placement of the assistant can serve."""
    if any(a.startswith(KV_OFF_FLAGS) for a in extra_args):
        return CPU, ""

    def device_of(layer: int) -> str:
        return next((p.device.name for p in placements if layer in p.layers), CPU)

    n = target.n_layer
    sliding, full = target.kv_layer(n - 2), target.kv_layer(n - 1)
    before, last = device_of(sliding), device_of(full)
    if before != last:
        reused = (
            f" (the cache of its layers {n - 2} and {n - 1}, which keep none of their own)" if sliding != n - 2 else ""
        )
        return last, (
            f"the target's layers {sliding} and {full}, whose KV cache the Gemma 4 assistant reads in place{reused}, "
            f"are on {before} and {last}: expected llama_tensor_split and llama_n_gpu_layers that keep them on one "
            "device"
        )
    return last, ""


def placement_problem(cluster, draft: ModelInfo, device: str) -> str:
    """A Gemma 4 assistant asked for anywhere but `device` (assistant_device's): llama.cpp aborts at load when its
    device cannot reach the KV it reads (the lab: on the CPU, "pre-allocated tensor cache_k_l4 in RPC0 buffer";
    on RPC0 with the KV on RPC1, "pre-allocated tensor (cache_k_l6) in a buffer ... that cannot run the
    operation")."""
    chosen = cluster.settings[DEVICE_KEY]
    if not chosen or chosen == device:
        return ""
    return (
        f"{cluster.coordinator.origins[DEVICE_KEY]}: {DEVICE_KEY} = {chosen!r}: the draft {draft.path} is a Gemma 4 "
        f"assistant, which reads the KV cache of the target's last layers where it is ({device}), and llama.cpp "
        f"aborts at load with it on another device: expected None (the assistant on {device}) or {device!r}"
    )


def settings_problem(cluster) -> str:
    """What is wrong with one model's speculative settings, read alone ('' when nothing is)."""
    s, origins = cluster.settings, cluster.coordinator.origins
    kind, draft, low, high = (s[k] for k in KEYS)

    def where(key: str) -> str:
        return f"{origins[key]}: {key} = {s[key]!r}"

    if kind in NGRAM_TYPES and draft:
        return (
            f"{where('llama_spec_draft_path')}: expected None with llama_spec_type = {kind!r} "
            "(n-gram drafting reads the text so far, no model)"
        )
    if kind in DRAFT_MODEL_TYPES and kind != "draft-mtp" and not draft:
        return (
            f"{where('llama_spec_type')} needs a draft model: expected llama_spec_draft_path, a GGUF file on the "
            "coordinator"
        )
    for key in ("llama_spec_draft_min", "llama_spec_draft_max", DEVICE_KEY):
        if s[key] is not None and not enabled(s):
            return f"{where(key)}: expected None, as speculative decoding is off (llama_spec_type and llama_spec_draft_path are None)"
    if (low is not None or high is not None) and bound_flags(kind) is None:
        key = "llama_spec_draft_min" if low is not None else "llama_spec_draft_max"
        return (
            f"{where(key)}: expected None with llama_spec_type = {kind!r}, which takes no draft-token bounds here "
            "(only draft-* and ngram-mod do; its own flags go in llama_extra_args)"
        )
    if low is not None and high is not None and low > high:
        return f"{where('llama_spec_draft_min')}: expected at most llama_spec_draft_max ({high})"
    if high is not None and (kind is None or kind in DRAFT_MODEL_TYPES) and high > MAX_DRAFT_TOKENS:
        return (
            f"{where('llama_spec_draft_max')}: expected at most {MAX_DRAFT_TOKENS} for a draft model, which drafts "
            "one token per pass, in turn"
        )
    device = s[DEVICE_KEY]
    if device is not None:
        if not draft:
            return f"{where(DEVICE_KEY)}: expected None without a draft model (llama_spec_draft_path)"
        known = [*cluster.devices, CPU]
        if device not in known:
            return f"{where(DEVICE_KEY)}: no such device in this cluster: expected one of {', '.join(known)}"
    return ""


def type_of_draft(draft: ModelInfo) -> str:
    """The type a draft file serves, from its architecture and heads, as llama.cpp would pick it
    (common_speculative_types_from_gguf, and each type's loader)."""
    if draft.arch == "eagle3":
        return "draft-eagle3"
    if draft.arch == "dflash":
        return "draft-dspark" if draft.markov_head else "draft-dflash"
    if draft.arch == "gemma4-assistant" or draft.mtp_head:
        return "draft-mtp"
    return "draft-simple"


def files_problem(kind: str | None, target: ModelInfo, draft: ModelInfo | None) -> str:
    """What is wrong with a type, its target and its draft, read from their headers ('' when nothing is). The caller
    prefixes where the setting came from."""
    if draft is None:
        if kind == "draft-mtp" and not target.mtp_head:
            return (
                f"llama_spec_type = 'draft-mtp' without a draft model needs the target's own MTP head, and "
                f"{target.path} ({target.arch}) has none (no blk.{target.n_layer - 1}.nextn.eh_proj): expected "
                "llama_spec_draft_path, an MTP draft (a Gemma 4 assistant)"
            )
        return ""
    served = type_of_draft(draft)
    if kind and kind != served and not (kind == "draft-simple" and served == "draft-mtp" and draft.mtp_head):
        return (
            f"llama_spec_type = {kind!r}, but the draft {draft.path} is architecture {draft.arch!r}, which serves "
            f"{served!r}: expected llama_spec_type: {served} (or None, to take the draft's)"
        )
    if served == "draft-mtp" and draft.arch == "gemma4-assistant" and target.arch != "gemma4":
        return (
            f"the draft {draft.path} is a Gemma 4 assistant, which reads a gemma4 target's own memory, and "
            f"{target.path} is {target.arch!r}: expected the assistant of this target"
        )
    if served == "draft-simple":
        return vocab_problem(target, draft)
    return ""


def vocab_problem(target: ModelInfo, draft: ModelInfo) -> str:
    """llama.cpp's own check of a draft-simple pair (common_speculative_are_compatible), from the headers."""
    t, d = target.vocab, draft.vocab
    if t is None or d is None:
        return f"{(draft if d is None else target).path} has no vocabulary (tokenizer.ggml.model): expected one"
    mismatch = ""
    if t.model != d.model:
        mismatch = f"tokenizer model {d.model!r}, the target's {t.model!r}"
    elif (t.add_bos, t.bos if t.add_bos else None) != (d.add_bos, d.bos if d.add_bos else None):
        mismatch = f"BOS (add {d.add_bos}, id {d.bos}), the target's (add {t.add_bos}, id {t.bos})"
    elif (t.add_eos, t.eos if t.add_eos else None) != (d.add_eos, d.eos if d.add_eos else None):
        mismatch = f"EOS (add {d.add_eos}, id {d.eos}), the target's (add {t.add_eos}, id {t.eos})"
    elif t.tokens and d.tokens and abs(t.tokens.count - d.tokens.count) > VOCAB_SIZE_SLACK:
        mismatch = f"{d.tokens.count} tokens, the target's {t.tokens.count} (llama.cpp allows {VOCAB_SIZE_SLACK} apart)"
    elif t.tokens and d.tokens and not t.tokens.agrees(d.tokens):
        mismatch = "other token texts than the target's"
    if not mismatch:
        return ""
    return (
        f"the draft {draft.path} has {mismatch}: expected the target's vocabulary (llama-server would log the "
        "mismatch and serve without drafting)"
    )


def options(cluster, folders_inside) -> tuple[list[tuple], list[tuple]]:
    """llama-server's options for one model's speculation, as (option, value) (value None for a flag): its file,
    then the rest. folders_inside(path) is where llama-server's container sees a file."""
    s = cluster.settings
    if not enabled(s):
        return [], []
    kind, draft, low, high = (s[k] for k in KEYS)
    files = [("--spec-draft-model", folders_inside(draft))] if draft else []
    rest = [("--spec-type", kind)] if kind else []
    flags = bound_flags(kind)
    if flags:
        rest += [(flag, value) for flag, value in zip(flags, (low, high)) if value is not None]
    if draft:
        device = draft_device(cluster)
        rest += [("--spec-draft-device", "none" if device == CPU else device)]
        if device != CPU:
            rest += [("--spec-draft-ngl", "all")]
    return files, rest
