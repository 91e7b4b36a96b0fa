"""A GGUF file's header: layer sizes and KV shapes, what the planner needs, read without the weights.

Uses the `gguf` package on the file itself, or on its first bytes with the rest left a hole
(the deploy reads only the header on the coordinator: `facts.GgufHeader`).
"""

from __future__ import annotations

import dataclasses
import math
import re
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

# How the pinned llama.cpp's loader (src/models/<arch>.cpp) lays out each architecture's memory, for
# the architectures whose figures tests/e2e/test_lab_fit_params.py checks against llama-fit-params:
# the default sliding-window pattern (every Nth layer global; None: no sliding-window layers, the
# window key is ignored) and whether a layer with no KV heads is recurrent (hybrid models).
KV_LAYOUTS = {
    "llama": None,
    "qwen3": None,
    "qwen3moe": None,
    "deepseek2": None,
    "lfm2": None,
    "gemma3": 6,
    "gemma4": 6,
    "gpt-oss": 2,
}
RECURRENT_WHEN_NO_KV_HEADS = {"lfm2"}
# Architectures whose last layers keep no KV cache of their own (llama.cpp's hparams.n_layer_kv_from_start): gemma4
# from block_count - {arch}.attention.shared_kv_layers (src/models/gemma4.cpp; Gemma 4 E2B and E4B), gemma3n from a
# fixed layer (src/models/gemma3n.cpp). Each such layer reads an earlier layer's cache (ModelInfo.kv_layer).
KV_SHARED_FROM = {"gemma3n": 20}
SHARED_KV_LAYERS_KEY = {"gemma4"}  # those that read the count of shared-KV layers from the file
# Default sliding-window patterns of architectures the planner does not size the KV of (not in KV_LAYOUTS), read for
# ModelInfo.kv_layer alone: gemma3n's loader takes the file's pattern or every 5th layer global (load_swa_pattern)
SWA_PATTERN_ONLY = {"gemma3n": 5}
# Tensors outside the layers that llama.cpp keeps in host memory (LLM_TENSOR_LAYER_INPUT: src/llama-arch.cpp) or with
# layer 0 (per_layer_model_proj and per_layer_proj_norm are created with layer number 0: a repeating layer's tensors)
INPUT_TENSORS = {"token_embd.weight", "per_layer_token_embd.weight"}
LAYER_0_TENSORS = {"per_layer_model_proj.weight", "per_layer_proj_norm.weight"}
SHARD = re.compile(r"^(?P<stem>.*)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")


@dataclass(frozen=True)
class ModelInfo:
    path: str
    arch: str
    n_layer: int
    n_embd: int
    n_vocab: int
    n_ctx_train: int
    layer_bytes: tuple[int, ...]  # weights of each repeating layer
    input_bytes: int  # token embeddings (and per-layer ones): kept in host memory by llama.cpp
    output_bytes: int  # output norm + output projection (the last device)
    kv_per_token: tuple[tuple[int, int], ...]  # per layer: (K elements, V elements) per token; (0, 0) without KV
    swa_window: int = 0  # sliding-window size, 0 when none
    swa_layers: tuple[bool, ...] = ()
    mla: bool = False  # multi-head latent attention: llama.cpp stores K only (V is a view of it)
    recurrent_per_seq: tuple[int, ...] = ()  # per layer: f32 elements of the recurrent state per sequence
    shards: tuple[str, ...] = ()  # every file of a split GGUF (…-00001-of-0000N.gguf), in order
    vocab: Vocab | None = None  # what llama.cpp compares between a target and its draft (speculation.py)
    mtp_head: bool = False  # its last layer has an MTP head (blk.N.nextn.eh_proj): llama.cpp's draft-mtp
    markov_head: bool = False  # a dflash draft with a Markov head (markov_w1): llama.cpp's draft-dspark
    # llama.cpp's n_layer_kv_from_start: layers from this one on keep no KV cache of their own (their kv_per_token is
    # (0, 0)) and read an earlier layer's (kv_layer); -1 when every layer keeps its own
    kv_from_start: int = -1

    @property
    def weight_bytes(self) -> int:
        return sum(self.layer_bytes) + self.input_bytes + self.output_bytes

    def kv_layer(self, il: int) -> int:
        """The layer whose KV cache layer il reads: il itself, or from kv_from_start on the last layer before it of
        the same kind (llama-model.cpp's reuse callback: kv_from_start - 2 for a sliding layer, - 1 for a global
        one)."""
        if 0 <= self.kv_from_start <= il:
            sliding = bool(self.swa_layers) and self.swa_layers[il]
            return self.kv_from_start - (2 if sliding else 1)
        return il

    @property
    def kv_modeled(self) -> bool:
        """Whether the planner knows how llama.cpp sizes this architecture's KV cache."""
        return self.arch in KV_LAYOUTS


TOKENS = "tokenizer.ggml.tokens"
FIRST_COMPARED_TOKEN = 5  # llama.cpp compares a draft's token texts from id 5 on (SPEC_VOCAB_CHECK_START_TOKEN_ID)


@dataclass(frozen=True)
class TokenTable:
    """tokenizer.ggml.tokens as llama.cpp compares a target's and a draft's: how many, and the texts from
    FIRST_COMPARED_TOKEN on, as the file stores them (each length-prefixed: one list, one byte string)."""

    count: int
    tail: bytes

    def agrees(self, other: TokenTable) -> bool:
        """Every token both have, from FIRST_COMPARED_TOKEN on, has the same text."""
        short, long = sorted((self, other), key=lambda t: t.count)
        return long.tail.startswith(short.tail)


@dataclass(frozen=True)
class Vocab:
    """A vocabulary as llama.cpp's draft check sees it (common/speculative.cpp, common_speculative_are_compatible)."""

    model: str  # tokenizer.ggml.model: llama (SentencePiece), gpt2 (BPE), gemma4, bert, t5, ...
    add_bos: bool
    bos: int | None
    add_eos: bool
    eos: int | None
    tokens: TokenTable | None


@dataclass(frozen=True)
class Header:
    """A GGUF file's metadata and tensor table: {key: value} (string arrays left out: a vocabulary of
    262144 tokens would cost gguf.GGUFReader seconds; tokenizer.ggml.tokens is kept as a TokenTable), [(name, ne,
    bytes)]."""

    fields: dict
    tensors: list[tuple[str, tuple[int, ...], int]]
    data_offset: int  # where the tensor data starts: the header's size
    tokens: TokenTable | None = None


_SCALARS = {
    GGUFValueType.UINT8: "B",
    GGUFValueType.INT8: "b",
    GGUFValueType.UINT16: "H",
    GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I",
    GGUFValueType.INT32: "i",
    GGUFValueType.FLOAT32: "f",
    GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "Q",
    GGUFValueType.INT64: "q",
    GGUFValueType.FLOAT64: "d",
}


class Truncated(ValueError):
    """The bytes end inside the GGUF header."""


def read_header(path: Path | str) -> Header:
    """The GGUF header (format: gguf-py's constants, little-endian, version 2 or 3), read in growing
    steps. Raises ValueError on a file that is not GGUF or ends inside its header."""
    size = Path(path).stat().st_size
    for limit in HEADER_STEPS:
        with open(path, "rb") as f:
            data = f.read(limit)
        try:
            return _parse_header(data, str(path))
        except Truncated:
            if limit >= size:
                break
    raise ValueError(f"{path}: the file ends inside its GGUF header")


def _parse_header(data: bytes, path: str) -> Header:
    pos = 0

    def take(fmt: str):
        nonlocal pos
        size = struct.calcsize(fmt)
        if pos + size > len(data):
            raise Truncated(path)
        values = struct.unpack_from("<" + fmt, data, pos)
        pos += size
        return values if len(values) > 1 else values[0]

    def string() -> str:
        nonlocal pos
        n = take("Q")
        if pos + n > len(data):
            raise Truncated(path)
        pos += n
        return data[pos - n : pos].decode("utf-8", "replace")

    def value(kind: int):
        nonlocal pos
        kind = GGUFValueType(kind)
        if kind == GGUFValueType.STRING:
            return string()
        if kind == GGUFValueType.ARRAY:
            inner, count = GGUFValueType(take("I")), take("Q")
            if inner == GGUFValueType.STRING:  # a vocabulary (262K tokens): skipped, in a tight loop
                end, length = len(data), struct.Struct("<Q").unpack_from
                for _ in range(count):
                    if pos + 8 > end:
                        raise Truncated(path)
                    pos += 8 + length(data, pos)[0]
                if pos > end:
                    raise Truncated(path)
                return None
            if inner == GGUFValueType.ARRAY:
                return [value(inner) for _ in range(count)]
            values = take(f"{count}{_SCALARS[inner]}") if count else ()
            return list(values) if count != 1 else [values]
        return take(_SCALARS[kind])

    if data[:4] != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file (it does not start with 'GGUF')")
    pos = 4
    version, n_tensors, n_fields = take("I"), take("Q"), take("Q")
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version}: expected 2 or 3")
    fields, tokens = {}, None
    for _ in range(n_fields):
        key = string()
        start = pos
        fields[key] = value(take("I"))
        if key == TOKENS and fields[key] is None:  # a string array: the vocabulary's texts
            tokens = _token_table(data, start + 4, pos)
    tensors = []
    for _ in range(n_tensors):
        name = string()
        n_dims = take("I")
        ne = tuple(take("Q") for _ in range(n_dims))
        kind = take("I")
        take("Q")  # the tensor's offset in the data: not needed
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
        tensors.append((name, ne, math.prod(ne) // block * size))
    alignment = int(fields.get("general.alignment", 32))
    return Header(fields, tensors, -(-pos // alignment) * alignment, tokens)


def _token_table(data: bytes, start: int, end: int) -> TokenTable:
    """The TokenTable of a string array at data[start:end] (after its value type: the item type, the count, the
    items, each a u64 length and the text)."""
    count = struct.unpack_from("<Q", data, start + 4)[0]
    pos = start + 12
    for _ in range(min(count, FIRST_COMPARED_TOKEN)):
        pos += 8 + struct.unpack_from("<Q", data, pos)[0]
    return TokenTable(count, bytes(data[pos:end]))


# llama.cpp's vocabulary types (src/llama-vocab.cpp, load) and, where a header leaves them out, the defaults of
# add_bos, the BOS id, add_eos and the EOS id for each
VOCAB_CLASS = {"llama": "SPM", "bert": "WPM", "t5": "UGM", "rwkv": "RWKV", "plamo2": "PLAMO2", "no_vocab": "NONE"}
VOCAB_CLASS |= dict.fromkeys(("gpt2", "hybriddna", "whitespace", "gemma4"), "BPE")
VOCAB_DEFAULTS = {
    "SPM": (True, 1, False, 2),
    "WPM": (True, 101, False, 102),
    "UGM": (False, None, True, 1),
    "BPE": (False, 11, False, 11),
}


def vocab_of(header: Header) -> Vocab | None:
    """The vocabulary of a GGUF header, with llama.cpp's defaults for what it leaves out; None without one."""
    fields = header.fields
    model = fields.get("tokenizer.ggml.model")
    if not isinstance(model, str):
        return None
    add_bos, bos, add_eos, eos = VOCAB_DEFAULTS.get(VOCAB_CLASS.get(model, model), (False, None, False, None))
    if model == "gemma4":
        add_bos = True  # the gemma4 pre-tokenizer sets it whatever the file says
    else:
        add_bos = bool(fields.get("tokenizer.ggml.add_bos_token", add_bos))
    add_eos = bool(fields.get("tokenizer.ggml.add_eos_token", add_eos))
    bos = fields.get("tokenizer.ggml.bos_token_id", bos)
    eos = fields.get("tokenizer.ggml.eos_token_id", eos)
    return Vocab(model, add_bos, bos, add_eos, eos, header.tokens)


def _per_layer(value, n_layer: int) -> list[int]:
    if isinstance(value, list):
        return [int(v) for v in value]
    return [int(value)] * n_layer


def shard_paths(path: Path | str) -> list[Path]:
    """Every file of a split GGUF, given any of them (llama-gguf-split's names); [path] otherwise."""
    path = Path(path)
    match = SHARD.match(path.name)
    if not match:
        return [path]
    count = int(match["count"])
    return [path.with_name(f"{match['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


def read_model(path: Path | str, shards: list | None = None) -> ModelInfo:
    """Layer sizes and KV shapes from a GGUF file's header and tensor table. A split model's tensors
    are in every shard: `shards` (their paths, the first one included) or the files next to
    `path` named like it."""
    header = read_header(path)
    fields = header.fields

    def field(key, default=None):
        return fields.get(key, default)

    arch = field("general.architecture")
    if not isinstance(arch, str) or not isinstance(field(f"{arch}.block_count"), int):
        raise ValueError(f"{path}: no general.architecture or block_count: not a model file")
    n_split = int(field("split.count", 1) or 1)
    if shards is None:
        shards = shard_paths(path) if n_split > 1 else [path]
    if len(shards) != n_split:
        raise ValueError(f"{path}: split.count = {n_split}, found {len(shards)} shards")
    for shard in shards[1:]:
        if not Path(shard).is_file():
            raise ValueError(f"{shard}: no such file (shard of a model split in {n_split})")
    tensors = header.tensors + [t for shard in shards[1:] for t in read_header(shard).tensors]
    n_layer = int(field(f"{arch}.block_count"))
    n_embd = int(field(f"{arch}.embedding_length"))
    n_head = _per_layer(field(f"{arch}.attention.head_count"), n_layer)
    n_head_kv = _per_layer(field(f"{arch}.attention.head_count_kv", n_head), n_layer)
    head_k = field(f"{arch}.attention.key_length")
    head_v = field(f"{arch}.attention.value_length")
    layer_bytes = [0] * n_layer
    input_bytes = output_bytes = token_embd_bytes = 0
    n_vocab = 0
    for name, ne, nbytes in tensors:
        match = re.match(r"blk\.(\d+)\.", name)
        if match:
            layer_bytes[int(match.group(1))] += nbytes
        elif name in INPUT_TENSORS:
            input_bytes += nbytes
            if name == "token_embd.weight":
                token_embd_bytes = nbytes
                n_vocab = int(ne[-1])
        elif name in LAYER_0_TENSORS and n_layer:
            layer_bytes[0] += nbytes
        else:
            output_bytes += nbytes
    if not any(name == "output.weight" for name, _, _ in tensors):
        output_bytes += token_embd_bytes  # tied embeddings: the output projection is token_embd again
    window = int(field(f"{arch}.attention.sliding_window", 0) or 0)
    default_pattern = KV_LAYOUTS.get(arch) or SWA_PATTERN_ONLY.get(arch)
    pattern = field(f"{arch}.attention.sliding_window_pattern", default_pattern)
    if not (window and default_pattern):
        swa = tuple(False for _ in range(n_layer))
    elif isinstance(pattern, list):
        swa = tuple(bool(p) for p in pattern)
    else:  # llama_hparams::set_swa_pattern: every Nth layer is global (0: every layer slides)
        p = int(pattern)
        swa = tuple(p == 0 or il % p < p - 1 for il in range(n_layer))
    head_k_swa = field(f"{arch}.attention.key_length_swa", head_k)
    head_v_swa = field(f"{arch}.attention.value_length_swa", head_v)
    recurrent = [arch in RECURRENT_WHEN_NO_KV_HEADS and n_head_kv[il] == 0 for il in range(n_layer)]
    l_cache = int(field(f"{arch}.shortconv.l_cache", 0) or 0)
    kv_from_start = KV_SHARED_FROM.get(arch, -1)
    shared = int(field(f"{arch}.attention.shared_kv_layers", 0) or 0) if arch in SHARED_KV_LAYERS_KEY else 0
    if shared > 0:
        kv_from_start = n_layer - shared
    if kv_from_start >= n_layer:
        kv_from_start = -1  # no layer reuses another's
    elif 0 <= kv_from_start < 2:  # llama.cpp asserts it (GGML_ASSERT(n_layer_kv_from_start >= 2))
        raise ValueError(f"{path}: {shared} shared-KV layers of {n_layer}: llama.cpp needs 2 layers with a KV cache")
    kv, state = [], []
    for il in range(n_layer):
        hk, hv = (head_k_swa, head_v_swa) if swa[il] else (head_k, head_v)
        hk = int(hk) if hk else n_embd // n_head[il]
        hv = int(hv) if hv else n_embd // n_head[il]
        own = not recurrent[il] and not 0 <= kv_from_start <= il  # a shared-KV layer allocates nothing
        kv.append((n_head_kv[il] * hk, n_head_kv[il] * hv) if own else (0, 0))
        state.append(n_embd * (l_cache - 1) if recurrent[il] and l_cache else 0)  # LFM2's short-conv state
    mla = bool(field(f"{arch}.attention.key_length_mla") and field(f"{arch}.attention.value_length_mla"))
    return ModelInfo(
        path=str(path),
        arch=arch,
        n_layer=n_layer,
        n_embd=n_embd,
        n_vocab=n_vocab,
        n_ctx_train=int(field(f"{arch}.context_length", 0)),
        layer_bytes=tuple(layer_bytes),
        input_bytes=input_bytes,
        output_bytes=output_bytes,
        kv_per_token=tuple(kv),
        swa_window=window if any(swa) else 0,
        swa_layers=swa,
        mla=mla,
        recurrent_per_seq=tuple(state),
        shards=tuple(str(s) for s in shards) if n_split > 1 else (),
        vocab=vocab_of(header),
        mtp_head=any(name == f"blk.{n_layer - 1}.nextn.eh_proj.weight" for name, _, _ in tensors),
        markov_head=any(name == "markov_w1.weight" for name, _, _ in tensors),
        kv_from_start=kv_from_start,
    )


def projector_bytes(path: Path | str, shards: list | None = None) -> int:
    """The weights of a vision projector (mmproj-*.gguf, architecture 'clip'): every tensor in it. (A
    projector is one file; `shards` is there because read_remote_model calls every reader the same way.)"""
    header = read_header(path)
    if header.fields.get("general.architecture") != "clip":
        raise ValueError(
            f"{path}: general.architecture = {header.fields.get('general.architecture')!r}: "
            "expected 'clip', a vision projector (mmproj) file"
        )
    return sum(nbytes for _, _, nbytes in header.tensors)


HEADER_STEPS = (256 << 10, 4 << 20, 32 << 20, 128 << 20)  # GGUF metadata + tensor table: KBs, MBs with a big vocabulary


def _header_file(header: bytes, file_size: int, out: Path) -> Path:
    """The first bytes of a GGUF file written at `out`, the rest a hole."""
    with open(out, "wb") as f:
        f.write(header)
        f.truncate(file_size)
    _parse_header(header, str(out))  # Truncated when the header goes on past these bytes
    return out


def _fetch_header(fetch, path: str, out: Path) -> Path:
    error: Exception | None = None
    for limit in HEADER_STEPS:
        found = fetch(path, limit)
        if found is None:
            raise ValueError(f"{path}: no such file")
        size, header = found
        try:
            return _header_file(header, size, out)
        except Truncated as e:  # cut inside the header: fetch more
            error = e
            if len(header) >= size:
                break
    raise ValueError(f"{path}: the file ends inside its GGUF header ({error})")


def read_remote_model(fetch, path: str, read=None):
    """read_model() (or another reader, such as projector_bytes) of a file on a host, every shard of a
    split model included; fetch(path, limit) returns (file size, its first `limit` bytes)."""
    with tempfile.TemporaryDirectory() as folder:
        first = _fetch_header(fetch, path, Path(folder) / "0.gguf")
        shards = shard_paths(path)
        if len(shards) == 1 and int(read_header(first).fields.get("split.count", 1) or 1) > 1:
            raise ValueError(f"{path}: a split model's first shard must be named like …-00001-of-0000N.gguf")
        local = [first] + [
            _fetch_header(fetch, str(p), Path(folder) / f"{i}.gguf") for i, p in enumerate(shards[1:], 1)
        ]
        info = (read or read_model)(first, shards=local)
    if not isinstance(info, ModelInfo):
        return info
    return dataclasses.replace(info, path=path, shards=tuple(str(p) for p in shards) if info.shards else ())
