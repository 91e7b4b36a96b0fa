"""GGUF files with the metadata and tensor shapes of real models, but no weights.

The header and tensor table are written with the gguf package; the data region is a hole
(a sparse file), so a 16 GB model costs a few KB of disk. The planner reads only headers.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter

Q = GGMLQuantizationType


def nbytes(shape: tuple[int, ...], qtype: GGMLQuantizationType) -> int:
    block, size = GGML_QUANT_SIZES[qtype]
    return int(np.prod(shape)) // block * size


def write_shaped(path: Path, *, arch: str, n_layer: int, n_embd: int, n_head: int, n_head_kv: int, head_dim: int,
                 n_ff: int, n_vocab: int, qtype=Q.Q4_K, window: int = 0, tied: bool = False) -> Path:
    writer = GGUFWriter(str(path), arch)
    writer.add_block_count(n_layer)
    writer.add_embedding_length(n_embd)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_context_length(131072)
    if window:
        writer.add_sliding_window(window)
    tensors = [("token_embd.weight", (n_vocab, n_embd), Q.Q6_K)]
    q, kv = n_head * head_dim, n_head_kv * head_dim
    for i in range(n_layer):
        tensors += [(f"blk.{i}.attn_norm.weight", (n_embd,), Q.F32), (f"blk.{i}.ffn_norm.weight", (n_embd,), Q.F32),
                    (f"blk.{i}.attn_q.weight", (q, n_embd), qtype), (f"blk.{i}.attn_k.weight", (kv, n_embd), qtype),
                    (f"blk.{i}.attn_v.weight", (kv, n_embd), qtype), (f"blk.{i}.attn_output.weight", (n_embd, q), qtype),
                    (f"blk.{i}.ffn_gate.weight", (n_ff, n_embd), qtype), (f"blk.{i}.ffn_up.weight", (n_ff, n_embd), qtype),
                    (f"blk.{i}.ffn_down.weight", (n_embd, n_ff), qtype)]
    tensors.append(("output_norm.weight", (n_embd,), Q.F32))
    if not tied:
        tensors.append(("output.weight", (n_vocab, n_embd), Q.Q6_K))
    total = 0
    for name, shape, t in tensors:
        n = nbytes(shape, t)
        if t == Q.F32:
            writer.add_tensor_info(name, shape, np.dtype(np.float32), n)
        else:  # quantized: the writer takes the shape in bytes per row
            block, size = GGML_QUANT_SIZES[t]
            writer.add_tensor_info(name, (*shape[:-1], shape[-1] // block * size), np.dtype(np.uint8), n, raw_dtype=t)
        total += -(-n // writer.data_alignment) * writer.data_alignment
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.fout[0].flush()
    writer.fout[0].seek(0, 2)
    header_end = writer.fout[0].tell()
    writer.close()
    with open(path, "r+b") as f:
        f.truncate(-(-header_end // 32) * 32 + total)  # the data region: a hole
    return path
