"""Shaped sparse GGUF files of real, popular models: header and tensor table only, the data a hole.

Each writer reproduces one model's GGUF as the pinned llama.cpp expects it: the architecture's keys
(as the converter writes them), every tensor the loader creates, with its exact name, shape and a
realistic quant type (a Q4_K_M-like mix; MXFP4 experts for gpt-oss), and a vocabulary of the
model's size. The data region is left a hole (the file is truncated to its full size), so a 17 GB
model costs a few MB of disk. llama.cpp loads these files (with no_alloc the data is never read),
so its own estimator (`llama-fit-params --fit-print on`) can serve as an oracle for the planner.

    python3 tests/families.py NAME OUT.gguf      (NAME: one of FAMILIES or DRAFTS)
"""

from __future__ import annotations

import struct
import sys
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any, Callable

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFEndian, GGUFValueType, GGUFWriter

Q = GGMLQuantizationType
F32 = Q.F32
Tensor = tuple[str, tuple[int, ...], GGMLQuantizationType]  # name, ggml ne (ne0 first), type

FTYPE_Q4_K_M = 15  # llama_ftype: the file type llama.cpp prints; it does not change any size
FTYPE_MXFP4_MOE = 38
FTYPE_Q8_0 = 7

# llama-quantize's fallback when a row (ne0) is not a whole number of the type's blocks
FALLBACK = {Q.Q2_K: Q.IQ4_NL, Q.Q3_K: Q.IQ4_NL, Q.IQ4_XS: Q.IQ4_NL, Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0}


def qtype(t: GGMLQuantizationType, ne0: int) -> GGMLQuantizationType:
    """`t`, or llama-quantize's fallback when ne0 is not a multiple of its block size."""
    if ne0 % GGML_QUANT_SIZES[t][0]:
        t = FALLBACK.get(t, Q.F16)
        if ne0 % GGML_QUANT_SIZES[t][0]:
            t = Q.F16
    return t


def nbytes(ne: tuple[int, ...], t: GGMLQuantizationType) -> int:
    block, size = GGML_QUANT_SIZES[t]
    assert ne[0] % block == 0, (ne, t)
    return int(np.prod(ne)) // block * size


def more_bits(i: int, n: int) -> bool:
    """llama-quantize's use_more_bits: the layers Q4_K_M gives Q6_K attn_v / ffn_down."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def q4km(i: int, n: int) -> GGMLQuantizationType:
    return Q.Q6_K if more_bits(i, n) else Q.Q4_K


# --- the vocabulary -------------------------------------------------------------------------------


def _byte_chars() -> list[str]:
    """GPT-2's byte-level alphabet: the 256 one-character tokens every BPE vocabulary starts from."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


@dataclass(frozen=True)
class Vocab:
    """A BPE ("gpt2") vocabulary of n tokens: the 256 byte tokens, then "t256", "t257", ... (all
    distinct, as llama-vocab.cpp asserts), token types, one merge (the key must exist), and the
    model's special ids. llama.cpp only needs the count to agree with token_embd / output."""

    n: int
    pre: str = "default"  # tokenizer.ggml.pre: one llama-vocab.cpp knows
    bos: int | None = None
    eos: int | None = None

    def write(self, w: GGUFWriter) -> None:
        tokens = _byte_chars() + [f"t{i}" for i in range(256, self.n)]
        types = [1] * self.n  # NORMAL
        for special in (self.bos, self.eos):
            if special is not None:
                types[special] = 3  # CONTROL
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(self.pre)
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(["Ġ t"])
        if self.bos is not None:
            w.add_bos_token_id(self.bos)
        if self.eos is not None:
            w.add_eos_token_id(self.eos)


# --- the file -------------------------------------------------------------------------------------


class _Writer(GGUFWriter):
    """GGUFWriter, with the metadata arrays packed in one go instead of item by item: the same bytes, but a
    262144-token vocabulary takes milliseconds instead of a second (the item-by-item path is what remains)."""

    def _pack_val(
        self, val: Any, vtype: GGUFValueType, add_vtype: bool, sub_type: GGUFValueType | None = None
    ) -> bytes:
        if (
            vtype != GGUFValueType.ARRAY
            or self.endianess != GGUFEndian.LITTLE
            or not isinstance(val, (list, tuple))
            or not val
        ):
            return super()._pack_val(val, vtype, add_vtype, sub_type)
        ltype = sub_type if sub_type is not None else GGUFValueType.get_type(val[0])
        fmt, types = self._simple_value_packing.get(ltype), set(map(type, val))
        if ltype == GGUFValueType.STRING and types == {str}:
            encoded = [v.encode("utf-8") for v in val]
            body = b"".join(chain.from_iterable(zip(map(struct.Struct("<Q").pack, map(len, encoded)), encoded)))
        elif fmt is not None and (types <= {int, float, bool} if sub_type is not None else len(types) == 1):
            body = struct.pack(f"<{len(val)}{fmt}", *val)  # without sub_type: one Python type, as the slow path checks
        else:
            return super()._pack_val(val, vtype, add_vtype, sub_type)
        return (struct.pack("<I", vtype) if add_vtype else b"") + struct.pack("<IQ", ltype, len(val)) + body


@dataclass
class Model:
    arch: str
    name: str
    vocab: Vocab | None  # None: no tokenizer (the planner's tests need none; llama.cpp does)
    ftype: int = FTYPE_Q4_K_M
    kv: list[tuple[str, Any, GGUFValueType, GGUFValueType | None]] = field(default_factory=list)
    tensors: list[Tensor] = field(default_factory=list)

    # keys: `key` without the "{arch}." prefix when it starts with "."
    def _key(self, key: str) -> str:
        return self.arch + key if key.startswith(".") else key

    def u32(self, key: str, value: int) -> None:
        self.kv.append((self._key(key), int(value), GGUFValueType.UINT32, None))

    def f32(self, key: str, value: float) -> None:
        self.kv.append((self._key(key), float(value), GGUFValueType.FLOAT32, None))

    def string(self, key: str, value: str) -> None:
        self.kv.append((self._key(key), value, GGUFValueType.STRING, None))

    def boolean(self, key: str, value: bool) -> None:
        self.kv.append((self._key(key), bool(value), GGUFValueType.BOOL, None))

    def ints(self, key: str, values: list[int]) -> None:  # INT32 array, as the converter writes lists
        self.kv.append((self._key(key), [int(v) for v in values], GGUFValueType.ARRAY, GGUFValueType.INT32))

    def bools(self, key: str, values: list[bool]) -> None:
        self.kv.append((self._key(key), [bool(v) for v in values], GGUFValueType.ARRAY, GGUFValueType.BOOL))

    def t(self, name: str, ne: tuple[int, ...], t: GGMLQuantizationType = F32) -> None:
        """One tensor; a quantized type falls back (as llama-quantize does) when ne0 needs it."""
        self.tensors.append((name, tuple(int(x) for x in ne), t if t == F32 else qtype(t, ne[0])))

    def data_bytes(self) -> int:
        return sum(nbytes(ne, t) for _, ne, t in self.tensors)

    def write(self, path: Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        w = _Writer(str(path), self.arch)
        w.add_name(self.name)
        w.add_quantization_version(2)
        w.add_file_type(self.ftype)
        for key, value, vtype, sub in self.kv:
            w.add_key_value(key, value, vtype, sub)
        if self.vocab:
            self.vocab.write(w)
        total = 0
        for name, ne, t in self.tensors:
            n = nbytes(ne, t)
            shape = tuple(reversed(ne))  # numpy order: ne reversed
            if t == F32:
                w.add_tensor_info(name, shape, np.dtype(np.float32), n)
            elif t == Q.F16:
                w.add_tensor_info(name, shape, np.dtype(np.float16), n)
            else:  # quantized: the writer takes the last dimension in bytes
                block, size = GGML_QUANT_SIZES[t]
                w.add_tensor_info(name, (*shape[:-1], shape[-1] // block * size), np.dtype(np.uint8), n, raw_dtype=t)
            total += -(-n // w.data_alignment) * w.data_alignment
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        w.fout[0].flush()
        w.fout[0].seek(0, 2)
        header_end = w.fout[0].tell()
        w.close()
        with open(path, "r+b") as f:
            f.truncate(-(-header_end // w.data_alignment) * w.data_alignment + total)  # the data: a hole
        return path


def _common(
    m: Model,
    *,
    n_layer: int,
    n_embd: int,
    n_ctx: int,
    n_head: int,
    n_head_kv: int | list[int],
    n_ff: int | None,
    rope_base: float,
    rms_eps: float,
) -> None:
    m.u32(".context_length", n_ctx)
    m.u32(".embedding_length", n_embd)
    m.u32(".block_count", n_layer)
    if n_ff is not None:
        m.u32(".feed_forward_length", n_ff)
    m.u32(".attention.head_count", n_head)
    if isinstance(n_head_kv, list):
        m.ints(".attention.head_count_kv", n_head_kv)
    else:
        m.u32(".attention.head_count_kv", n_head_kv)
    m.f32(".rope.freq_base", rope_base)
    m.f32(".attention.layer_norm_rms_epsilon", rms_eps)


def _embeddings(
    m: Model,
    n_vocab: int,
    n_embd: int,
    embd: GGMLQuantizationType,
    output: GGMLQuantizationType | None,
    norm: str = "output_norm.weight",
) -> None:
    m.t("token_embd.weight", (n_embd, n_vocab), embd)
    m.t(norm, (n_embd,))
    if output is not None:  # None: tied, llama.cpp reuses token_embd
        m.t("output.weight", (n_embd, n_vocab), output)


def _attention(m: Model, i: int, L: int, E: int, H: int, HKV: int, D: int, qk_norm: bool = False) -> None:
    """Layer i's grouped-query attention (Q4_K_M: attn_v in Q6_K on use_more_bits layers)."""
    b = f"blk.{i}."
    m.t(b + "attn_norm.weight", (E,))
    m.t(b + "attn_q.weight", (E, H * D), Q.Q4_K)
    m.t(b + "attn_k.weight", (E, HKV * D), Q.Q4_K)
    m.t(b + "attn_v.weight", (E, HKV * D), q4km(i, L))
    m.t(b + "attn_output.weight", (H * D, E), Q.Q4_K)
    if qk_norm:
        m.t(b + "attn_q_norm.weight", (D,))
        m.t(b + "attn_k_norm.weight", (D,))


def _ffn(
    m: Model,
    i: int,
    L: int,
    E: int,
    FF: int,
    norm: bool = True,
    gate_up: GGMLQuantizationType = Q.Q4_K,
    down: GGMLQuantizationType | None = None,
) -> None:
    """Layer i's gated FFN (Q4_K_M by default: ffn_down in Q6_K on use_more_bits layers; `down` overrides it)."""
    b = f"blk.{i}."
    if norm:
        m.t(b + "ffn_norm.weight", (E,))
    m.t(b + "ffn_gate.weight", (E, FF), gate_up)
    m.t(b + "ffn_up.weight", (E, FF), gate_up)
    m.t(b + "ffn_down.weight", (FF, E), q4km(i, L) if down is None else down)


_G4_D_SWA, _G4_HKV_SWA, _G4_D_FULL, _G4_HKV_FULL = 256, 16, 512, 4  # Gemma 4 31B's heads, shared by its assistant


def _gemma4_model(
    arch: str,
    name: str,
    ftype: int,
    *,
    L: int,
    E: int,
    FF: int,
    H: int,
    swa: list[bool],
    shared_kv_layers: int,
    embd: GGMLQuantizationType,
    extra_u32: dict[str, int] | None = None,
    heads: tuple[int, int, int, int] = (_G4_D_SWA, _G4_HKV_SWA, _G4_D_FULL, _G4_HKV_FULL),
    n_ctx: int = 262144,
    window: int = 1024,
    n_embd_per_layer: int = 0,
) -> tuple[Model, list[tuple[int, int]]]:
    """A Gemma 4-shaped model (the target or its assistant; 31B's heads, context and window unless given): the
    262144-token vocabulary, the metadata (sliding layers where `swa`, `extra_u32` right after the common keys), the
    tied embeddings in `embd`, and the global layers' rope factors. heads: (sliding head dim, sliding KV heads, global
    head dim, global KV heads). Returns the model and each layer's (head dim, KV heads), for the caller's layer
    tensors (and, with n_embd_per_layer, the per-layer embedding tensors)."""
    d_swa, hkv_swa, d_full, hkv_full = heads
    heads = [(d_swa, hkv_swa) if s else (d_full, hkv_full) for s in swa]
    V = 262144
    m = Model(arch, name, Vocab(V, "gemma4", bos=2, eos=1), ftype=ftype)
    _common(
        m,
        n_layer=L,
        n_embd=E,
        n_ctx=n_ctx,
        n_head=H,
        n_head_kv=[hkv for _, hkv in heads],
        n_ff=FF,
        rope_base=1000000.0,
        rms_eps=1e-6,
    )
    for key, value in (extra_u32 or {}).items():
        m.u32(key, value)
    m.u32(".attention.key_length", d_full)
    m.u32(".attention.value_length", d_full)
    m.u32(".attention.key_length_swa", d_swa)
    m.u32(".attention.value_length_swa", d_swa)
    m.u32(".rope.dimension_count", d_full)
    m.u32(".rope.dimension_count_swa", d_swa)
    m.f32(".rope.freq_base_swa", 10000.0)
    m.u32(".attention.sliding_window", window)
    m.bools(".attention.sliding_window_pattern", swa)
    m.u32(".attention.shared_kv_layers", shared_kv_layers)
    m.u32(".embedding_length_per_layer_input", n_embd_per_layer)
    m.f32(".final_logit_softcapping", 30.0)
    _embeddings(m, V, E, embd, None)  # tied
    if n_embd_per_layer:  # per-layer embeddings: the table in host memory (an input), its projection with layer 0
        m.t("per_layer_token_embd.weight", (n_embd_per_layer * L, V), embd)
        m.t("per_layer_model_proj.weight", (E, n_embd_per_layer * L), Q.F16)  # llama-quantize leaves it
        m.t("per_layer_proj_norm.weight", (n_embd_per_layer,))
    m.t("rope_freqs.weight", (d_full // 2,))  # proportional rope of the global layers
    return m, heads


# --- the families ---------------------------------------------------------------------------------


def llama3(path: Path) -> Path:
    """Llama-3.1-8B(-Instruct), Q4_K_M (real file: 4.92 GB)."""
    L, E, FF, H, HKV, D, V = 32, 4096, 14336, 32, 8, 128, 128256
    m = Model("llama", "Meta-Llama-3.1-8B-Instruct", Vocab(V, "llama-bpe", bos=128000, eos=128009))
    _common(m, n_layer=L, n_embd=E, n_ctx=131072, n_head=H, n_head_kv=HKV, n_ff=FF, rope_base=500000.0, rms_eps=1e-5)
    m.u32(".vocab_size", V)
    m.u32(".rope.dimension_count", D)
    _embeddings(m, V, E, Q.Q4_K, Q.Q6_K)
    m.t("rope_freqs.weight", (D // 2,))  # llama3 rope scaling factors
    for i in range(L):
        _attention(m, i, L, E, H, HKV, D)
        _ffn(m, i, L, E, FF)
    return m.write(path)


def gemma3(path: Path) -> Path:
    """Gemma-3-12B(-it), Q4_K_M (real file: 7.3 GB). Like the converter, a sliding window but no
    sliding_window_pattern key: llama.cpp's gemma3 loader applies its default pattern (every 6th
    layer global)."""
    L, E, FF, H, HKV, D, V = 48, 3840, 15360, 16, 8, 256, 262208
    m = Model("gemma3", "Gemma-3-12B-it", Vocab(V, "default", bos=2, eos=1))
    _common(m, n_layer=L, n_embd=E, n_ctx=131072, n_head=H, n_head_kv=HKV, n_ff=FF, rope_base=1000000.0, rms_eps=1e-6)
    m.u32(".attention.key_length", D)
    m.u32(".attention.value_length", D)
    m.u32(".attention.sliding_window", 1024)
    m.string(".rope.scaling.type", "linear")
    m.f32(".rope.scaling.factor", 8.0)
    _embeddings(m, V, E, Q.Q6_K, None)  # tied
    for i in range(L):
        _attention(m, i, L, E, H, HKV, D, qk_norm=True)
        m.t(f"blk.{i}.post_attention_norm.weight", (E,))
        _ffn(m, i, L, E, FF)
        m.t(f"blk.{i}.post_ffw_norm.weight", (E,))
    return m.write(path)


def gemma4(path: Path) -> Path:
    """Gemma-4-31B(-it), a UD-Q4_K_XL-like mix (17.4 GB; unsloth's is ~16 GiB, Q4_K_M 18.7 GB). Layers 5, 11, ..., 59 are global: 4 KV
    heads of 512, no V projection (K serves as V; llama.cpp still caches V); the other 50 slide
    over 1024 tokens with 16 KV heads of 256. Tied output, no shared-KV layers."""
    L, E, FF, H = 60, 5376, 21504, 32
    swa = [(i % 6) != 5 for i in range(L)]
    m, heads = _gemma4_model(
        "gemma4",
        "Gemma-4-31B-it",
        FTYPE_Q4_K_M,
        L=L,
        E=E,
        FF=FF,
        H=H,
        swa=swa,
        shared_kv_layers=0,
        embd=Q.Q6_K,
    )
    for i, (d, hkv) in enumerate(heads):
        b = f"blk.{i}."
        more = more_bits(i, L)
        m.t(b + "attn_norm.weight", (E,))
        m.t(b + "attn_q.weight", (E, H * d), Q.Q4_K)
        m.t(b + "attn_k.weight", (E, hkv * d), Q.Q5_K if more else Q.Q4_K)
        if swa[i]:
            m.t(b + "attn_v.weight", (E, hkv * d), Q.Q6_K if more else Q.Q5_K)
        m.t(b + "attn_output.weight", (H * d, E), Q.Q4_K)
        m.t(b + "attn_q_norm.weight", (d,))
        m.t(b + "attn_k_norm.weight", (d,))
        m.t(b + "post_attention_norm.weight", (E,))
        m.t(b + "layer_output_scale.weight", (1,))
        _ffn(m, i, L, E, FF, gate_up=Q.IQ4_XS, down=Q.Q4_K if more else Q.IQ4_XS)
        m.t(b + "post_ffw_norm.weight", (E,))
    return m.write(path)


def gemma4_e4b(path: Path) -> Path:
    """Gemma-4-E4B(-it), a Q4_K_M-like mix (5.3 GB; llama.cpp's docs list a 4.76 GiB Q4_K_M of 7.52 B parameters).
    Its config (google/gemma-4-E4B-it, as NVIDIA Megatron-Bridge's Gemma 4 E4B recipe restates it): 42 layers of
    2560, FFN 10240, 8 query heads; every 6th layer global (5, 11, ..., 41: 2 KV heads of 512), the others sliding
    over 512 tokens (2 KV heads of 256); per-layer embeddings of 256 (Q6_K here, as the file size implies); a
    131072-token context. Its last 18 layers (24..41) are shared-KV layers: they keep no cache of their own and read
    layer 22's (sliding) or 23's (global) (llama.cpp: n_layer_kv_from_start = 42 - shared_kv_layers). The file is
    taken to hold their K and V projections too (llama.cpp loads them when present, needs them only below 24)."""
    L, E, FF, H = 42, 2560, 10240, 8
    swa = [(i % 6) != 5 for i in range(L)]
    m, heads = _gemma4_model(
        "gemma4",
        "Gemma-4-E4B-it",
        FTYPE_Q4_K_M,
        L=L,
        E=E,
        FF=FF,
        H=H,
        swa=swa,
        shared_kv_layers=18,
        embd=Q.Q6_K,
        heads=(256, 2, 512, 2),
        n_ctx=131072,
        window=512,
        n_embd_per_layer=256,
    )
    for i, (d, hkv) in enumerate(heads):
        b = f"blk.{i}."
        m.t(b + "attn_norm.weight", (E,))
        m.t(b + "attn_q.weight", (E, H * d), Q.Q4_K)
        m.t(b + "attn_k.weight", (E, hkv * d), Q.Q4_K)
        m.t(b + "attn_v.weight", (E, hkv * d), q4km(i, L))
        m.t(b + "attn_output.weight", (H * d, E), Q.Q4_K)
        m.t(b + "attn_q_norm.weight", (d,))
        m.t(b + "attn_k_norm.weight", (d,))
        m.t(b + "post_attention_norm.weight", (E,))
        m.t(b + "layer_output_scale.weight", (1,))
        _ffn(m, i, L, E, FF)
        m.t(b + "post_ffw_norm.weight", (E,))
        m.t(b + "inp_gate.weight", (E, 256), Q.Q4_K)
        m.t(b + "proj.weight", (256, E), Q.Q4_K)
        m.t(b + "post_norm.weight", (E,))
    return m.write(path)


def qwen3(path: Path) -> Path:
    """Qwen3-8B, Q4_K_M (real file: 5.03 GB)."""
    L, E, FF, H, HKV, D, V = 36, 4096, 12288, 32, 8, 128, 151936
    m = Model("qwen3", "Qwen3-8B", Vocab(V, "qwen2", bos=151643, eos=151645))
    _common(m, n_layer=L, n_embd=E, n_ctx=40960, n_head=H, n_head_kv=HKV, n_ff=FF, rope_base=1000000.0, rms_eps=1e-6)
    m.u32(".attention.key_length", D)
    m.u32(".attention.value_length", D)
    _embeddings(m, V, E, Q.Q4_K, Q.Q6_K)
    for i in range(L):
        _attention(m, i, L, E, H, HKV, D, qk_norm=True)
        _ffn(m, i, L, E, FF)
    return m.write(path)


def qwen3moe(path: Path) -> Path:
    """Qwen3-30B-A3B, Q4_K_M (real file: 18.6 GB)."""
    L, E, H, HKV, D, V = 48, 2048, 32, 4, 128, 151936
    N_EXP, N_USED, FF_EXP = 128, 8, 768
    m = Model("qwen3moe", "Qwen3-30B-A3B", Vocab(V, "qwen2", bos=151643, eos=151645))
    _common(m, n_layer=L, n_embd=E, n_ctx=40960, n_head=H, n_head_kv=HKV, n_ff=6144, rope_base=1000000.0, rms_eps=1e-6)
    m.u32(".attention.key_length", D)
    m.u32(".attention.value_length", D)
    m.u32(".expert_count", N_EXP)
    m.u32(".expert_used_count", N_USED)
    m.u32(".expert_feed_forward_length", FF_EXP)
    _embeddings(m, V, E, Q.Q4_K, Q.Q6_K)
    for i in range(L):
        b = f"blk.{i}."
        _attention(m, i, L, E, H, HKV, D, qk_norm=True)
        m.t(b + "ffn_norm.weight", (E,))
        m.t(b + "ffn_gate_inp.weight", (E, N_EXP))
        m.t(b + "ffn_gate_exps.weight", (E, FF_EXP, N_EXP), Q.Q4_K)
        m.t(b + "ffn_up_exps.weight", (E, FF_EXP, N_EXP), Q.Q4_K)
        m.t(b + "ffn_down_exps.weight", (FF_EXP, E, N_EXP), q4km(i, L))
    return m.write(path)


def gpt_oss(path: Path) -> Path:
    """gpt-oss-20b, as ggml-org's MXFP4 file (12.1 GB): MXFP4 experts, Q8_0 attention and
    embeddings (2880 is no multiple of 256), F32 norms, biases and sinks. A sliding window of 128
    but no pattern key: llama.cpp's default makes the even layers SWA."""
    L, E, H, HKV, D, V = 24, 2880, 64, 8, 64, 201088
    N_EXP, N_USED, FF_EXP = 32, 4, 2880
    m = Model("gpt-oss", "gpt-oss-20b", Vocab(V, "gpt-4o", bos=199998, eos=200002), ftype=FTYPE_MXFP4_MOE)
    _common(
        m, n_layer=L, n_embd=E, n_ctx=131072, n_head=H, n_head_kv=HKV, n_ff=FF_EXP, rope_base=150000.0, rms_eps=1e-5
    )
    m.u32(".attention.key_length", D)
    m.u32(".attention.value_length", D)
    m.u32(".expert_count", N_EXP)
    m.u32(".expert_used_count", N_USED)
    m.u32(".expert_feed_forward_length", FF_EXP)
    m.u32(".attention.sliding_window", 128)
    m.string(".rope.scaling.type", "yarn")
    m.f32(".rope.scaling.factor", 32.0)
    m.u32(".rope.scaling.original_context_length", 4096)
    _embeddings(m, V, E, Q.Q8_0, Q.Q8_0)
    for i in range(L):
        b = f"blk.{i}."
        m.t(b + "attn_norm.weight", (E,))
        m.t(b + "post_attention_norm.weight", (E,))
        for name, n_out in (("attn_q", H * D), ("attn_k", HKV * D), ("attn_v", HKV * D)):
            m.t(b + name + ".weight", (E, n_out), Q.Q8_0)
            m.t(b + name + ".bias", (n_out,))
        m.t(b + "attn_output.weight", (H * D, E), Q.Q8_0)
        m.t(b + "attn_output.bias", (E,))
        m.t(b + "attn_sinks.weight", (H,))
        m.t(b + "ffn_gate_inp.weight", (E, N_EXP))
        m.t(b + "ffn_gate_inp.bias", (N_EXP,))
        m.t(b + "ffn_gate_exps.weight", (E, FF_EXP, N_EXP), Q.MXFP4)
        m.t(b + "ffn_gate_exps.bias", (FF_EXP, N_EXP))
        m.t(b + "ffn_up_exps.weight", (E, FF_EXP, N_EXP), Q.MXFP4)
        m.t(b + "ffn_up_exps.bias", (FF_EXP, N_EXP))
        m.t(b + "ffn_down_exps.weight", (FF_EXP, E, N_EXP), Q.MXFP4)
        m.t(b + "ffn_down_exps.bias", (E, N_EXP))
    return m.write(path)


def deepseek2(path: Path) -> Path:
    """DeepSeek-V2-Lite(-Chat), Q4_K_M (real file: 10.4 GB), written as current converters do: MLA
    as MQA with one KV head of kv_lora_rank + rope dims (key_length 576, value_length 512),
    key_length_mla / value_length_mla for the decompressed heads, kv_b split into attn_k_b / attn_v_b."""
    L, E, H, V = 27, 2048, 16, 102400
    KV_LORA, ROPE, NOPE, V_HEAD = 512, 64, 128, 128
    N_EXP, N_USED, N_SHARED, FF_EXP, FF_DENSE, N_DENSE = 64, 6, 2, 1408, 10944, 1
    m = Model("deepseek2", "DeepSeek-V2-Lite-Chat", Vocab(V, "deepseek-llm", bos=100000, eos=100001))
    _common(m, n_layer=L, n_embd=E, n_ctx=163840, n_head=H, n_head_kv=1, n_ff=FF_DENSE, rope_base=10000.0, rms_eps=1e-6)
    m.u32(".vocab_size", V)
    m.u32(".leading_dense_block_count", N_DENSE)
    m.u32(".attention.kv_lora_rank", KV_LORA)
    m.u32(".attention.key_length", KV_LORA + ROPE)
    m.u32(".attention.value_length", KV_LORA)
    m.u32(".attention.key_length_mla", NOPE + ROPE)
    m.u32(".attention.value_length_mla", V_HEAD)
    m.u32(".expert_feed_forward_length", FF_EXP)
    m.u32(".expert_count", N_EXP)
    m.u32(".expert_used_count", N_USED)
    m.u32(".expert_shared_count", N_SHARED)
    m.f32(".expert_weights_scale", 1.0)
    m.u32(".rope.dimension_count", ROPE)
    m.string(".rope.scaling.type", "yarn")
    m.f32(".rope.scaling.factor", 40.0)
    m.u32(".rope.scaling.original_context_length", 4096)
    m.f32(".rope.scaling.yarn_log_multiplier", 0.0707)
    _embeddings(m, V, E, Q.Q4_K, Q.Q6_K)
    for i in range(L):
        b = f"blk.{i}."
        m.t(b + "attn_norm.weight", (E,))
        m.t(b + "attn_kv_a_norm.weight", (KV_LORA,))
        m.t(b + "attn_q.weight", (E, H * (NOPE + ROPE)), Q.Q4_K)
        m.t(b + "attn_kv_a_mqa.weight", (E, KV_LORA + ROPE), Q.Q4_K)
        m.t(b + "attn_k_b.weight", (NOPE, KV_LORA, H), Q.Q4_K)  # ne0 128: Q5_0
        m.t(b + "attn_v_b.weight", (KV_LORA, V_HEAD, H), q4km(i, L))
        m.t(b + "attn_output.weight", (H * V_HEAD, E), Q.Q4_K)
        m.t(b + "ffn_norm.weight", (E,))
        if i < N_DENSE:
            m.t(b + "ffn_gate.weight", (E, FF_DENSE), Q.Q4_K)
            m.t(b + "ffn_up.weight", (E, FF_DENSE), Q.Q4_K)
            m.t(b + "ffn_down.weight", (FF_DENSE, E), q4km(i, L))  # ne0 10944: Q8_0 / Q5_0
        else:
            m.t(b + "ffn_gate_inp.weight", (E, N_EXP))
            m.t(b + "ffn_gate_exps.weight", (E, FF_EXP, N_EXP), Q.Q4_K)
            m.t(b + "ffn_up_exps.weight", (E, FF_EXP, N_EXP), Q.Q4_K)
            m.t(b + "ffn_down_exps.weight", (FF_EXP, E, N_EXP), q4km(i, L))  # ne0 1408: Q8_0 / Q5_0
            m.t(b + "ffn_gate_shexp.weight", (E, FF_EXP * N_SHARED), Q.Q4_K)
            m.t(b + "ffn_up_shexp.weight", (E, FF_EXP * N_SHARED), Q.Q4_K)
            m.t(b + "ffn_down_shexp.weight", (FF_EXP * N_SHARED, E), q4km(i, L))
    return m.write(path)


def lfm2(path: Path) -> Path:
    """LFM2-1.2B, Q4_K_M (real file: 731 MB). Hybrid: attention at layers 2, 5, 8, 10, 12, 14, the
    other ten short convolutions (head_count_kv 0 marks them). block_ff_dim 12288 auto-adjusted:
    2/3 of it, rounded up to a multiple of 256 = 8192. Tied output; the final norm is token_embd_norm."""
    L, E, FF, H, HKV, V = 16, 2048, 8192, 32, 8, 65536
    D = E // H
    attn = {2, 5, 8, 10, 12, 14}
    m = Model("lfm2", "LFM2-1.2B", Vocab(V, "lfm2", bos=1, eos=7))
    _common(
        m,
        n_layer=L,
        n_embd=E,
        n_ctx=128000,
        n_head=H,
        n_head_kv=[HKV if i in attn else 0 for i in range(L)],
        n_ff=FF,
        rope_base=1000000.0,
        rms_eps=1e-5,
    )
    m.u32(".vocab_size", V)
    m.u32(".shortconv.l_cache", 3)
    _embeddings(m, V, E, Q.Q6_K, None, norm="token_embd_norm.weight")
    for i in range(L):
        b = f"blk.{i}."
        m.t(b + "attn_norm.weight", (E,))
        if i in attn:
            m.t(b + "attn_q.weight", (E, E), Q.Q4_K)
            m.t(b + "attn_k.weight", (E, HKV * D), Q.Q4_K)
            m.t(b + "attn_v.weight", (E, HKV * D), q4km(i, L))
            m.t(b + "attn_output.weight", (E, E), Q.Q4_K)
            m.t(b + "attn_q_norm.weight", (D,))
            m.t(b + "attn_k_norm.weight", (D,))
        else:
            m.t(b + "shortconv.conv.weight", (3, E))
            m.t(b + "shortconv.in_proj.weight", (E, 3 * E), Q.Q4_K)
            m.t(b + "shortconv.out_proj.weight", (E, E), Q.Q4_K)
        m.t(b + "ffn_norm.weight", (E,))
        m.t(b + "ffn_gate.weight", (E, FF), Q.Q4_K)
        m.t(b + "ffn_up.weight", (E, FF), Q.Q4_K)
        m.t(b + "ffn_down.weight", (FF, E), q4km(i, L))
    return m.write(path)


def gemma4_assistant(path: Path) -> Path:
    """google/gemma-4-31B-it-assistant, Gemma 4 31B's MTP drafter (llama.cpp's gemma4-assistant), as
    `convert_hf_to_gguf.py --outtype q8_0` writes it: every matrix Q8_0, the rest F32, 49 tensors, 0.50 GB. Its config
    (ml-explore/mlx-swift-lm Tests/MLXLMTests/Gemma4AssistantTests.swift; 470M parameters on the model card):
    4 layers of 1024 (3 sliding, 1 global), 32 query heads of 256 (512 on the global layer), FFN 8192, the target's
    262144-token vocabulary, backbone_hidden_size 5376. It has no K or V projection: every layer reads the target's
    KV (src/models/gemma4-assistant.cpp; llama-model.cpp shares its cache with the target's last sliding and last
    global layer), and its token embeddings serve only as its output (tied; the input is the target's). The window
    is taken as the target's 1024 (the planner counts no KV for it)."""
    L, E, FF, H, E_TARGET = 4, 1024, 8192, 32, 5376
    m, heads = _gemma4_model(
        "gemma4-assistant",
        "Gemma-4-31B-it-assistant",
        FTYPE_Q8_0,
        L=L,
        E=E,
        FF=FF,
        H=H,
        swa=[True, True, True, False],
        shared_kv_layers=L,
        embd=Q.Q8_0,  # tied: the output projection
        extra_u32={".embedding_length_out": E_TARGET, ".nextn_predict_layers": L},
    )
    m.t("nextn.pre_projection.weight", (2 * E_TARGET, E), Q.Q8_0)
    m.t("nextn.post_projection.weight", (E, E_TARGET), Q.Q8_0)
    for i, (d, _) in enumerate(heads):
        b = f"blk.{i}."
        m.t(b + "attn_norm.weight", (E,))
        m.t(b + "attn_q.weight", (E, H * d), Q.Q8_0)
        m.t(b + "attn_output.weight", (H * d, E), Q.Q8_0)
        m.t(b + "attn_q_norm.weight", (d,))
        m.t(b + "post_attention_norm.weight", (E,))
        m.t(b + "layer_output_scale.weight", (1,))
        _ffn(m, i, L, E, FF, gate_up=Q.Q8_0, down=Q.Q8_0)
        m.t(b + "post_ffw_norm.weight", (E,))
    return m.write(path)


FAMILIES: dict[str, Callable[[Path], Path]] = {
    "llama3": llama3,
    "gemma3": gemma3,
    "gemma4": gemma4,
    "qwen3": qwen3,
    "qwen3moe": qwen3moe,
    "gpt-oss": gpt_oss,
    "deepseek2": deepseek2,
    "lfm2": lfm2,
    "gemma4-e4b": gemma4_e4b,
}


# drafts that read their target's memory (llama-fit-params cannot load them alone: not in the oracle's grid)
DRAFTS: dict[str, Callable[[Path], Path]] = {"gemma4-assistant": gemma4_assistant}


def write_family(name: str, path: Path) -> Path:
    """Write the shaped sparse GGUF of family (or draft) `name` to `path`; returns `path`."""
    writers = FAMILIES | DRAFTS
    if name not in writers:
        raise KeyError(f"unknown family {name!r}; one of {', '.join(writers)}")
    return writers[name](Path(path))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] not in FAMILIES | DRAFTS:
        sys.exit(f"usage: python3 tests/families.py NAME OUT.gguf   (NAME: {' | '.join(FAMILIES | DRAFTS)})")
    path = write_family(argv[0], Path(argv[1]))
    print(f"{path}: {path.stat().st_size / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
