"""A GGUF file's header: layer sizes and KV shapes, what the planner needs, read without the weights.

Uses the `gguf` package on the file itself, or on its first bytes with the rest left a hole
(the deploy reads only the header on the coordinator: `facts.GgufHeader`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from gguf import GGUFReader

# architectures whose GGUF carries a window but no pattern: llama.cpp hard-codes "every Nth layer is global"
DEFAULT_SWA_PATTERN = {"gemma2": 2, "gemma3": 6}


@dataclass(frozen=True)
class ModelInfo:
    path: str
    arch: str
    n_layer: int
    n_embd: int
    n_vocab: int
    n_ctx_train: int
    layer_bytes: tuple[int, ...]  # weights of each repeating layer
    input_bytes: int  # token embeddings: kept in host memory by llama.cpp
    output_bytes: int  # output norm + output projection (the last device)
    kv_per_token: tuple[tuple[int, int], ...]  # per layer: (K elements, V elements) per token
    swa_window: int = 0  # sliding-window size, 0 when none
    swa_layers: tuple[bool, ...] = ()

    @property
    def weight_bytes(self) -> int:
        return sum(self.layer_bytes) + self.input_bytes + self.output_bytes


def _field(reader: GGUFReader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    value = f.parts[f.data[0]] if f.data else None
    if value is None:
        return default
    if f.types and f.types[0].name == "STRING":
        return bytes(value).decode()
    if f.types and f.types[0].name == "ARRAY":
        return [f.parts[i][0] if len(f.parts[i]) == 1 else bytes(f.parts[i]).decode() for i in f.data]
    return value[0].item() if hasattr(value[0], "item") else value[0]


def _per_layer(value, n_layer: int) -> list[int]:
    if isinstance(value, list):
        return [int(v) for v in value]
    return [int(value)] * n_layer


def read_model(path: Path | str) -> ModelInfo:
    """Layer sizes and KV shapes from a GGUF file's header and tensor table."""
    reader = GGUFReader(str(path))
    arch = _field(reader, "general.architecture")
    n_layer = int(_field(reader, f"{arch}.block_count"))
    n_embd = int(_field(reader, f"{arch}.embedding_length"))
    n_head = _per_layer(_field(reader, f"{arch}.attention.head_count"), n_layer)
    n_head_kv = _per_layer(_field(reader, f"{arch}.attention.head_count_kv", n_head), n_layer)
    head_k = _field(reader, f"{arch}.attention.key_length")
    head_v = _field(reader, f"{arch}.attention.value_length")
    layer_bytes = [0] * n_layer
    input_bytes = output_bytes = 0
    n_vocab = 0
    for tensor in reader.tensors:
        match = re.match(r"blk\.(\d+)\.", tensor.name)
        if match:
            layer_bytes[int(match.group(1))] += int(tensor.n_bytes)
        elif tensor.name.startswith("token_embd"):
            input_bytes += int(tensor.n_bytes)
            n_vocab = int(tensor.shape[-1])
        else:
            output_bytes += int(tensor.n_bytes)
    if not any(t.name == "output.weight" for t in reader.tensors):
        output_bytes += input_bytes  # tied embeddings: the output projection is token_embd again
    kv = []
    for il in range(n_layer):
        hk = int(head_k) if head_k else n_embd // n_head[il]
        hv = int(head_v) if head_v else n_embd // n_head[il]
        kv.append((n_head_kv[il] * hk, n_head_kv[il] * hv))
    window = int(_field(reader, f"{arch}.attention.sliding_window", 0) or 0)
    pattern = _field(reader, f"{arch}.attention.sliding_window_pattern", DEFAULT_SWA_PATTERN.get(arch))
    if window and isinstance(pattern, list):
        swa = tuple(bool(p) for p in pattern)
    elif window and pattern:
        swa = tuple((il + 1) % int(pattern) != 0 for il in range(n_layer))  # every Nth layer is global
    else:
        swa = tuple(False for _ in range(n_layer))
    return ModelInfo(path=str(path), arch=arch, n_layer=n_layer, n_embd=n_embd, n_vocab=n_vocab,
                     n_ctx_train=int(_field(reader, f"{arch}.context_length", 0)), layer_bytes=tuple(layer_bytes),
                     input_bytes=input_bytes, output_bytes=output_bytes, kv_per_token=tuple(kv),
                     swa_window=window, swa_layers=swa)


HEADER_STEPS = (256 << 10, 4 << 20, 32 << 20, 128 << 20)  # GGUF metadata + tensor table: KBs, MBs with a big vocabulary


def read_model_header(header: bytes, file_size: int) -> ModelInfo:
    """read_model() from the first bytes of a GGUF file: the rest becomes a hole. Raises ValueError
    when the header does not end within those bytes."""
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".gguf") as tmp:
        tmp.write(header)
        tmp.truncate(file_size)
        tmp.flush()
        if len(header) < file_size and GGUFReader(tmp.name).data_offset > len(header):
            raise ValueError(f"the GGUF header is longer than {len(header)} bytes")
        return read_model(tmp.name)


def read_remote_model(fetch) -> ModelInfo:
    """read_model() of a file on a host; fetch(limit) returns (file size, its first `limit` bytes)."""
    error: Exception | None = None
    for limit in HEADER_STEPS:
        size, header = fetch(limit)
        try:
            return read_model_header(header, size)
        except Exception as e:  # cut inside the tensor table: fetch more
            error = e
            if len(header) >= size:
                break
    raise ValueError(f"cannot read the GGUF header: {error}")
