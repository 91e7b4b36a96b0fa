"""GGUF headers for the planner's hand-computed tests: a llama-like layout of any architecture name
and shape, no vocabulary (the planner reads none), the data a hole. Written with tests/families.py's
Model, as the 8 families llama.cpp itself loads are."""

from __future__ import annotations

from pathlib import Path

from gguf import GGMLQuantizationType

from ..families import Model

Q = GGMLQuantizationType


def write_shaped(
    path: Path,
    *,
    arch: str,
    n_layer: int,
    n_embd: int,
    n_head: int,
    n_head_kv: int,
    head_dim: int,
    n_ff: int,
    n_vocab: int,
    qtype=Q.Q4_K,
    window: int = 0,
    tied: bool = False,
) -> Path:
    m = Model(arch, f"shaped {arch}", None)
    for key, value in (
        (".block_count", n_layer),
        (".embedding_length", n_embd),
        (".feed_forward_length", n_ff),
        (".attention.head_count", n_head),
        (".attention.head_count_kv", n_head_kv),
        (".attention.key_length", head_dim),
        (".attention.value_length", head_dim),
        (".context_length", 131072),
    ):
        m.u32(key, value)
    if window:
        m.u32(".attention.sliding_window", window)
    m.t("token_embd.weight", (n_embd, n_vocab), Q.Q6_K)
    q, kv = n_head * head_dim, n_head_kv * head_dim
    for i in range(n_layer):
        b = f"blk.{i}."
        for name, ne, t in (
            ("attn_norm", (n_embd,), Q.F32),
            ("ffn_norm", (n_embd,), Q.F32),
            ("attn_q", (n_embd, q), qtype),
            ("attn_k", (n_embd, kv), qtype),
            ("attn_v", (n_embd, kv), qtype),
            ("attn_output", (q, n_embd), qtype),
            ("ffn_gate", (n_embd, n_ff), qtype),
            ("ffn_up", (n_embd, n_ff), qtype),
            ("ffn_down", (n_ff, n_embd), qtype),
        ):
            m.t(b + name + ".weight", ne, t)
    m.t("output_norm.weight", (n_embd,))
    if not tied:
        m.t("output.weight", (n_embd, n_vocab), Q.Q6_K)
    return m.write(path)
