"""Small Gemma 4 GGUF files for speculative decoding with llama.cpp's Gemma 4 assistant (draft-mtp).

- `write_gemma4_sentence_model`: the sentence model of testmodel.py (same vocabulary, tokenizer and chat
  template: greedy decoding after PROMPT recites SENTENCE) in the gemma4 architecture, 8 layers of 512 like
  the lab's llama model. llama.cpp's gemma4 graph scales the input embedding by sqrt(n_embd), RMS-normalizes
  what every attention and FFN block adds (post norms) and softcaps the logits; the construction keeps the
  sentence model's (a word's embedding along its own basis vector, an untied output.weight mapping it to its
  successor) and sets the post norms small (POST_NORM): the layers compute with random weights, write real
  K and V, and move every logit a little, never the argmax (margins, layer_effect).
- `write_gemma4_assistant`: a gemma4-assistant (MTP drafter, --spec-type draft-mtp) for that target whose
  drafts follow testmodel.draft_successors, the lab's draft-simple draft's Markov machine (every third word
  skipped): the pre-projection reads the token half of [target embedding, target hidden state] (the
  assistant embeds its input token with the TARGET's token_embd) plus a little of the hidden state, the
  assistant's layers attend over the target's KV (its last SWA and global layers) with small post norms, and
  its tied output table maps each word's basis vector to the draft's successor (assistant_table).

    python -m lab.testgemma4 OUTDIR   # OUTDIR/gemma4-sentence.gguf and OUTDIR/gemma4-assistant.gguf
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFWriter

from .testmodel import (
    CHAT_TEMPLATE,
    EMBED_SCALE,
    LAYER_STD,
    OUTPUT_STD,
    PROMPT,
    SENTENCE_LOGIT,
    Shape,
    add_vocabulary,
    cycle,
    draft_successors,
    next_tokens,
    recital,
    sentence_vocabulary,
    write_tensors,
)

GEMMA4_SHAPE = Shape(n_layer=8, n_embd=512, n_head=8, n_head_kv=4, n_ff=1536, n_ctx_train=8192, seed=4444)
# The assistant: a smaller width (gemma4-assistant needs one other than the target's), the target's head size
# and KV head count (it attends over the target's cache), one global layer last like the target.
ASSISTANT_SHAPE = Shape(n_layer=4, n_embd=256, n_head=4, n_head_kv=4, n_ff=512, n_ctx_train=8192, seed=5555)

RMS_EPS = 1e-6
ROPE_FREQ_BASE = 1000000.0  # global layers
ROPE_FREQ_BASE_SWA = 10000.0
SLIDING_WINDOW = 512  # a 3/4-context prompt (1536 of 2048) runs past it
SOFTCAP = 30.0  # final logit softcapping, as Gemma 4 ships it: monotonic, the argmax stays
# What every attention and FFN block adds to the residual stream is RMS-normalized and multiplied by its post
# norm: a vector of length POST_NORM * sqrt(n_embd) (1.1 at 512) whatever the weights, next to the word's
# embedding of length EMBED_SCALE (20). Sixteen of them move the logits by a few tenths (layer_effect).
POST_NORM = 0.05
ASSISTANT_POST_NORM = 0.02
ASSISTANT_H_STD = 0.005  # the pre-projection's random reading of the target's hidden state (rms 1 a coordinate)


def is_global(i: int, n_layer: int) -> bool:
    """Gemma 4's pattern: sliding-window layers, every fourth global, and the last global (and the one before it
    sliding: the assistant's SWA layers read the target's layer n-2, its global ones layer n-1)."""
    return i % 4 == 3 or i == n_layer - 1


def _head_dim(shape: Shape) -> int:
    return shape.n_embd // shape.n_head


def _writer(path: Path, arch: str, shape: Shape, head_dim: int, name: str) -> GGUFWriter:
    """A GGUFWriter with the gemma4 family's keys (conversion/gemma.py) and the sentence vocabulary."""
    n = shape.n_layer
    writer = GGUFWriter(str(path), arch)
    writer.add_name(name)
    writer.add_context_length(shape.n_ctx_train)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(n)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv([shape.n_head_kv] * n)
    writer.add_rope_freq_base(ROPE_FREQ_BASE)
    writer.add_rope_freq_base_swa(ROPE_FREQ_BASE_SWA)
    writer.add_layer_norm_rms_eps(RMS_EPS)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_key_length_swa(head_dim)
    writer.add_value_length_swa(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_dimension_count_swa(head_dim)
    writer.add_sliding_window(SLIDING_WINDOW)
    writer.add_sliding_window_pattern([not is_global(i, n) for i in range(n)])
    writer.add_shared_kv_layers(0)
    writer.add_embedding_length_per_layer_input(0)
    writer.add_final_logit_softcapping(SOFTCAP)
    writer.add_file_type(1)  # mostly f16
    add_vocabulary(writer, sentence_vocabulary(), CHAT_TEMPLATE)
    return writer


def directions() -> np.ndarray:
    """For every token id, the basis vector its embedding lies along: word i of cycle() along i, every other
    token along len(cycle()) ("other"), as in testmodel.sentence_weights."""
    tokens = sentence_vocabulary()[0]
    ids = {t.decode(): i for i, t in enumerate(tokens)}
    words = cycle()
    out = np.full(len(tokens), len(words))
    for i, word in enumerate(words):
        out[ids[word]] = i
    return out


# --- the target ---------------------------------------------------------------------------------------------


def blocks(shape: Shape, head_dim: int, weight, post_norm: float, own_kv: bool) -> dict[str, np.ndarray]:
    """The transformer blocks of a gemma4 target (own_kv: its K and V projections and K norm) or of a
    gemma4-assistant (none: it reads the target's KV), weight(*numpy_shape) drawing each matrix in turn, unit
    pre-norms and post norms of post_norm."""
    n_q, n_kv, out = shape.n_head * head_dim, shape.n_head_kv * head_dim, {}
    for i in range(shape.n_layer):
        p = f"blk.{i}."
        out[p + "attn_norm.weight"] = _full(shape.n_embd, 1.0)
        out[p + "attn_q.weight"] = weight(n_q, shape.n_embd)
        if own_kv:
            out[p + "attn_k.weight"] = weight(n_kv, shape.n_embd)
            out[p + "attn_v.weight"] = weight(n_kv, shape.n_embd)
        out[p + "attn_output.weight"] = weight(shape.n_embd, n_q)
        out[p + "attn_q_norm.weight"] = _full(head_dim, 1.0)
        if own_kv:
            out[p + "attn_k_norm.weight"] = _full(head_dim, 1.0)
        out[p + "post_attention_norm.weight"] = _full(shape.n_embd, post_norm)
        out[p + "layer_output_scale.weight"] = _full(1, 1.0)
        out[p + "ffn_norm.weight"] = _full(shape.n_embd, 1.0)
        out[p + "ffn_gate.weight"] = weight(shape.n_ff, shape.n_embd)
        out[p + "ffn_up.weight"] = weight(shape.n_ff, shape.n_embd)
        out[p + "ffn_down.weight"] = weight(shape.n_embd, shape.n_ff)
        out[p + "post_ffw_norm.weight"] = _full(shape.n_embd, post_norm)
    return out


def _full(n: int, value: float) -> np.ndarray:
    return np.full(n, value, dtype=np.float32)


def gemma4_sentence_weights(shape: Shape = GEMMA4_SHAPE) -> dict[str, np.ndarray]:
    """Every tensor of the gemma4 sentence model, by GGUF name (numpy shape: ggml's ne reversed).

    token_embd is the sentence model's embedding divided by sqrt(n_embd) (gemma4 multiplies it back), so the
    residual stream starts at EMBED_SCALE along the word's basis vector; output.weight (untied) maps basis
    vector i to the successor of word i with SENTENCE_LOGIT after the final norm, on a dense N(0, OUTPUT_STD);
    the blocks are random N(0, LAYER_STD) with unit pre-norms and POST_NORM post norms."""
    rng = np.random.default_rng(shape.seed)
    n_vocab = len(sentence_vocabulary()[0])
    words = cycle()
    other = len(words)
    if shape.n_embd <= other:
        raise ValueError(f"n_embd {shape.n_embd} must exceed the {len(words)} words of the sentence")
    direction = directions()
    head_dim = _head_dim(shape)

    def weight(*numpy_shape: int) -> np.ndarray:
        return (rng.standard_normal(numpy_shape) * LAYER_STD).astype(np.float16)

    embd = rng.standard_normal((n_vocab, shape.n_embd)) * 0.02
    embd[np.arange(n_vocab), direction] += EMBED_SCALE
    tensors = {"token_embd.weight": (embd / np.sqrt(shape.n_embd)).astype(np.float16)}
    tensors["output_norm.weight"] = _full(shape.n_embd, 1.0)
    tensors["rope_freqs.weight"] = _full(head_dim // 2, 1.0)  # the global layers' frequency factors
    tensors |= blocks(shape, head_dim, weight, POST_NORM, own_kv=True)
    output = rng.standard_normal((n_vocab, shape.n_embd)) * OUTPUT_STD
    table = next_tokens()
    weight_logit = SENTENCE_LOGIT / np.sqrt(shape.n_embd)
    for i in range(other + 1):
        token = int(np.flatnonzero(direction == i)[0])  # any token along i: they share the successor
        output[table[token], i] += weight_logit
    tensors["output.weight"] = output.astype(np.float16)
    return tensors


def write_gemma4_sentence_model(path: Path, shape: Shape = GEMMA4_SHAPE) -> Path:
    """The gemma4 sentence model (about 50 MB in the default shape): greedy decoding after PROMPT recites
    SENTENCE, like testmodel.write_sentence_model, on the same vocabulary and chat template."""
    writer = _writer(
        path, "gemma4", shape, _head_dim(shape), "llama-rpc-deploy gemma4 sentence model (greedy output is known)"
    )
    return write_tensors(writer, path, gemma4_sentence_weights(shape))


# --- the assistant ------------------------------------------------------------------------------------------


def read_gguf(path: Path) -> tuple[dict[str, np.ndarray], dict[str, object]]:
    """The tensors of a GGUF file (float32, numpy shape: ggml's ne reversed) and its scalar keys."""
    reader = GGUFReader(str(path))
    keys = {}
    for name, field in reader.fields.items():
        if len(field.data) == 1 and not name.startswith("tokenizer."):
            part = field.parts[field.data[0]]
            keys[name] = bytes(part).decode() if part.dtype == np.uint8 else part[0].item()
    weights = {
        t.name: np.asarray(t.data, dtype=np.float32).reshape([int(n) for n in reversed(t.shape)])
        for t in reader.tensors
    }
    return weights, keys


def assistant_table(target_embd: np.ndarray, successors: list[int] | None = None) -> np.ndarray:
    """For each basis vector d (the words of cycle(), then "other"), the token the assistant drafts after a
    token embedded along d: the successor in next_tokens(successors) (default draft_successors). The
    directions are read off the target's own token_embd (its largest coordinate), and every token along one
    direction must have the same successor."""
    successors = draft_successors(len(cycle())) if successors is None else successors
    table = next_tokens(successors)
    n_dir = len(cycle()) + 1
    along = np.abs(target_embd).argmax(axis=1)
    if along.max() >= n_dir:
        raise ValueError("the target's token_embd is not the sentence model's (a token along no word)")
    out = np.full(n_dir, -1)
    for d in range(n_dir):
        succ = np.unique(table[along == d])
        if len(succ) != 1:
            raise ValueError(f"tokens along direction {d} have successors {succ.tolist()}, not one")
        out[d] = succ[0]
    return out


def gemma4_assistant_weights(
    target: Path | dict[str, np.ndarray], successors: list[int] | None = None, shape: Shape = ASSISTANT_SHAPE
) -> dict[str, np.ndarray]:
    """The assistant's tensors for the target (its GGUF file or its weights, as gemma4_sentence_weights).

    The assistant's input is [x, h]: x its token's TARGET embedding times sqrt(n_embd) (EMBED_SCALE along the
    token's basis vector d), h the target's final-norm hidden state. nextn.pre_projection copies the first
    len(cycle()) + 1 coordinates of x into its own and reads h with small random weights; the layers attend
    (over the target's KV) and compute with random weights and post norms of ASSISTANT_POST_NORM; the tied
    token_embd maps basis vector d to assistant_table()[d] with SENTENCE_LOGIT after the final norm."""
    weights = read_gguf(target)[0] if isinstance(target, Path) else target
    target_embd = np.asarray(weights["token_embd.weight"], dtype=np.float32)
    n_vocab, n_embd = target_embd.shape
    if shape.n_embd == n_embd:
        raise ValueError("gemma4-assistant needs a width other than its target's")
    table = assistant_table(target_embd, successors)
    n_dir = len(table)
    rng = np.random.default_rng(shape.seed)
    head_dim = weights["blk.0.attn_q_norm.weight"].shape[0]

    def weight(*numpy_shape: int, std: float = LAYER_STD) -> np.ndarray:
        return (rng.standard_normal(numpy_shape) * std).astype(np.float16)

    pre = rng.standard_normal((shape.n_embd, 2 * n_embd)) * ASSISTANT_H_STD
    pre[:, :n_embd] = 0.0
    pre[np.arange(n_dir), np.arange(n_dir)] = 1.0
    out = rng.standard_normal((n_vocab, shape.n_embd)) * OUTPUT_STD
    out[table, np.arange(n_dir)] += SENTENCE_LOGIT / np.sqrt(shape.n_embd)
    tensors = {
        "token_embd.weight": out.astype(np.float16),
        "output_norm.weight": _full(shape.n_embd, 1.0),
        "nextn.pre_projection.weight": pre.astype(np.float16),
        "nextn.post_projection.weight": weight(n_embd, shape.n_embd),
        "rope_freqs.weight": _full(head_dim // 2, 1.0),
    }
    tensors |= blocks(shape, head_dim, weight, ASSISTANT_POST_NORM, own_kv=False)
    return tensors


def write_gemma4_assistant(
    path: Path,
    target: Path | dict[str, np.ndarray],
    successors: list[int] | None = None,
    shape: Shape = ASSISTANT_SHAPE,
) -> Path:
    """The gemma4-assistant for `target` (write_gemma4_sentence_model's file or weights): llama-server -md PATH
    --spec-type draft-mtp drafts testmodel.draft_successors' words (the cycle, every third word skipped) by
    default, or the successor map given (as in testmodel.next_tokens)."""
    weights = read_gguf(target)[0] if isinstance(target, Path) else target
    n_embd = weights["token_embd.weight"].shape[1]
    head_dim = weights["blk.0.attn_q_norm.weight"].shape[0]
    writer = _writer(path, "gemma4-assistant", shape, head_dim, "llama-rpc-deploy gemma4 assistant (MTP drafter)")
    writer.add_embedding_length_out(n_embd)  # the target's hidden size: the width of h and of its embeddings
    writer.add_nextn_predict_layers(shape.n_layer)
    return write_tensors(writer, path, gemma4_assistant_weights(weights, successors, shape))


# --- a numpy reference of llama.cpp's gemma4 graph, for the margins -------------------------------------------


def _rms(x: np.ndarray, w: np.ndarray | None = None) -> np.ndarray:
    x = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + RMS_EPS)
    return x if w is None else x * w


def _rope_neox(x: np.ndarray, base: float) -> np.ndarray:
    """llama.cpp's NEOX RoPE (gemma4): the first half of a head rotates with the second. x: [tokens, heads, dim]."""
    n_tokens, _, dim = x.shape
    theta = np.arange(n_tokens)[:, None] * base ** (-np.arange(0, dim, 2) / dim)[None, :]
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    x0, x1 = x[..., : dim // 2], x[..., dim // 2 :]
    return np.concatenate([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1)


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def forward(weights: dict[str, np.ndarray], shape: Shape, token_ids: list[int], layers: bool = True) -> np.ndarray:
    """Softcapped logits [tokens, vocab] of the gemma4 graph (float32); layers=False leaves every block out."""
    w = {k: np.asarray(v, dtype=np.float32) for k, v in weights.items()}
    head_dim = _head_dim(shape)
    group = shape.n_head // shape.n_head_kv
    n = len(token_ids)
    pos = np.arange(n)
    causal = pos[None, :] > pos[:, None]
    h = w["token_embd.weight"][token_ids] * np.sqrt(shape.n_embd)
    for i in range(shape.n_layer if layers else 0):
        p = f"blk.{i}."
        glob = is_global(i, shape.n_layer)
        base = ROPE_FREQ_BASE if glob else ROPE_FREQ_BASE_SWA
        mask = causal if glob else causal | (pos[:, None] - pos[None, :] >= SLIDING_WINDOW)
        x = _rms(h, w[p + "attn_norm.weight"])
        q = _rms((x @ w[p + "attn_q.weight"].T).reshape(n, shape.n_head, head_dim), w[p + "attn_q_norm.weight"])
        k = _rms((x @ w[p + "attn_k.weight"].T).reshape(n, shape.n_head_kv, head_dim), w[p + "attn_k_norm.weight"])
        v = _rms((x @ w[p + "attn_v.weight"].T).reshape(n, shape.n_head_kv, head_dim))
        q, k = _rope_neox(q, base), _rope_neox(k, base)
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
        scores = np.where(mask[None], -np.inf, np.einsum("qhd,khd->hqk", q, k))  # attention scale 1
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        scores /= scores.sum(axis=-1, keepdims=True)
        attn = np.einsum("hqk,khd->qhd", scores, v).reshape(n, -1) @ w[p + "attn_output.weight"].T
        h = h + _rms(attn, w[p + "post_attention_norm.weight"])
        x = _rms(h, w[p + "ffn_norm.weight"])
        ffn = (_gelu(x @ w[p + "ffn_gate.weight"].T) * (x @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
        h = (h + _rms(ffn, w[p + "post_ffw_norm.weight"])) * w[p + "layer_output_scale.weight"]
    logits = _rms(h, w["output_norm.weight"]) @ w["output.weight"].T
    return SOFTCAP * np.tanh(logits / SOFTCAP)


def margins(weights: dict[str, np.ndarray] | None = None, shape: Shape = GEMMA4_SHAPE) -> np.ndarray:
    """At each step of testmodel.recital() from PROMPT's last token on: the next token's logit minus the
    largest other logit (numpy float32 reference of llama.cpp's gemma4 graph, on the f16 weights)."""
    weights = gemma4_sentence_weights(shape) if weights is None else weights
    ids, start = recital()
    logits = forward(weights, shape, ids)[start:-1]
    expected = np.array(ids[start + 1 :])
    rows = np.arange(len(expected))
    winner = logits[rows, expected]
    logits[rows, expected] = -np.inf
    return winner - logits.max(axis=1)


def layer_effect(weights: dict[str, np.ndarray] | None = None, shape: Shape = GEMMA4_SHAPE) -> float:
    """The largest change of a logit over the recital when every block is left out."""
    weights = gemma4_sentence_weights(shape) if weights is None else weights
    ids, start = recital()
    return float(np.abs(forward(weights, shape, ids)[start:] - forward(weights, shape, ids, False)[start:]).max())


def assistant_drafts(weights: dict[str, np.ndarray], target_embd: np.ndarray) -> np.ndarray:
    """For every token id, the assistant's greedy draft after it with its layers left out (they add at most
    2 * n_layer * ASSISTANT_POST_NORM * sqrt(n_embd) to a state of EMBED_SCALE along the token's direction) and
    a zero hidden state: argmax of the tied table on the pre-projected target embedding."""
    w = {k: np.asarray(v, dtype=np.float32) for k, v in weights.items()}
    n_embd = target_embd.shape[1]
    x = np.asarray(target_embd, dtype=np.float32) * np.sqrt(n_embd)
    state = x @ w["nextn.pre_projection.weight"][:, :n_embd].T
    return (_rms(state, w["output_norm.weight"]) @ w["token_embd.weight"].T).argmax(axis=1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", type=Path)
    args = parser.parse_args(argv)
    start = time.monotonic()
    target = write_gemma4_sentence_model(args.outdir / "gemma4-sentence.gguf")
    assistant = write_gemma4_assistant(args.outdir / "gemma4-assistant.gguf", target)
    print(target, assistant, f"{time.monotonic() - start:.1f} s")
    weights = read_gguf(target)[0]
    print(
        f"prompt {PROMPT!r}: smallest logit margin {margins(weights).min():.2f},"
        f" the layers move the logits by up to {layer_effect(weights):.2f}"
    )


if __name__ == "__main__":
    main()
