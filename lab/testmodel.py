"""Small llama-architecture GGUF files for the lab and the tests.

Both are real model files as far as llama.cpp is concerned: the llama architecture, f16 weights,
a SentencePiece ("llama") vocabulary with byte fallback, so llama-server loads them, splits their
layers across RPC devices and generates tokens.

- `write_model`: random weights, a byte-level vocabulary. The tokens are gibberish; it checks the
  plumbing, not the prose (and the benchmarks use it in bigger shapes).
- `write_sentence_model`: a word-level vocabulary and weights built so that greedy decoding after
  PROMPT recites SENTENCE, every step won by a logit margin far wider than f16 rounding, while every
  layer still computes (small random attention and FFN weights that do change the logits). Two
  servers that split the model differently must therefore agree token for token, and a wrong split
  (a layer skipped, a tensor garbled on its way to a worker) shows up as different text.

- `write_draft_model` and `write_random_sentence_model`: for speculative decoding, a draft that
  predicts the sentence model's tokens most of the time (not always), and a target on the same
  vocabulary whose tokens it does not predict.

    python -m lab.testmodel OUT.gguf [--n-layer 8 --n-embd 512 ...] [--sentence | --draft | --random]
"""

from __future__ import annotations

import argparse
import heapq
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFWriter, TokenType


@dataclass(frozen=True)
class Shape:
    n_layer: int = 8
    n_embd: int = 512
    n_head: int = 8
    n_head_kv: int = 4
    n_ff: int = 1536
    n_ctx_train: int = 4096
    seed: int = 1234


SPACE = "\u2581"  # SentencePiece's visible space
UNK, BOS, EOS = 0, 1, 2
N_BYTES = 256
FIRST_PIECE = 3 + N_BYTES  # <unk> <s> </s>, then <0x00> .. <0xFF>, then the pieces
ROPE_FREQ_BASE = 10000.0  # llama.cpp's default for the llama architecture (no key written)
RMS_EPS = 1e-5


def _specials_and_bytes() -> tuple[list[bytes], list[float], list[int]]:
    tokens = [b"<unk>", b"<s>", b"</s>"]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL]
    scores = [0.0, 0.0, 0.0]
    for b in range(N_BYTES):
        tokens.append(f"<0x{b:02X}>".encode())
        types.append(TokenType.BYTE)
        scores.append(0.0)
    return tokens, scores, [int(t) for t in types]


def vocabulary() -> tuple[list[bytes], list[float], list[int]]:
    """<unk> <s> </s>, the 256 byte tokens, then single characters with scores."""
    tokens, scores, types = _specials_and_bytes()
    pieces = [SPACE] + [chr(c) for c in range(ord("a"), ord("z") + 1)] + [chr(c) for c in range(ord("A"), ord("Z") + 1)]
    pieces += [SPACE + chr(c) for c in range(ord("a"), ord("z") + 1)] + list(".,!?'0123456789")
    for i, piece in enumerate(pieces):
        tokens.append(piece.encode())
        types.append(int(TokenType.NORMAL))
        scores.append(-float(i + 1))
    return tokens, scores, types


def _write_gguf(
    path: Path,
    shape: Shape,
    name: str,
    vocab: tuple[list[bytes], list[float], list[int]],
    tensors: dict[str, np.ndarray],
    chat_template: str | None = None,
    split_max_tensors: int = 0,
) -> Path:
    """The GGUF file, or with split_max_tensors the shards llama-gguf-split would write
    (PATH-00001-of-0000N.gguf, …): the path of the first one."""
    head_dim = shape.n_embd // shape.n_head
    writer = GGUFWriter(str(path), "llama", split_max_tensors=split_max_tensors)
    writer.add_name(name)
    writer.add_context_length(shape.n_ctx_train)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(RMS_EPS)
    writer.add_file_type(1)  # mostly f16
    add_vocabulary(writer, vocab, chat_template)
    return write_tensors(writer, path, tensors)


def add_vocabulary(
    writer: GGUFWriter, vocab: tuple[list[bytes], list[float], list[int]], chat_template: str | None = None
) -> None:
    """The tokenizer's keys (llama.cpp's SentencePiece "llama" tokenizer, with BOS added), and the chat template."""
    tokens, scores, types = vocab
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(EOS)
    writer.add_unk_token_id(UNK)
    writer.add_add_bos_token(True)
    if chat_template is not None:
        writer.add_chat_template(chat_template)


def write_tensors(writer: GGUFWriter, path: Path, tensors: dict[str, np.ndarray]) -> Path:
    """Add the tensors to a writer whose keys are set, write the file (or its shards) and close it;
    the path of the (first) file."""
    for tensor_name, data in tensors.items():
        writer.add_tensor(tensor_name, data)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return writer.format_shard_names(path)[0]


def _random_layers(rng: np.random.Generator, shape: Shape, std: float) -> dict[str, np.ndarray]:
    """The repeating blocks: unit norms, f16 weights ~ N(0, std). numpy shape is ggml's ne reversed."""
    n_embd_kv = shape.n_embd // shape.n_head * shape.n_head_kv

    def weight(*numpy_shape: int) -> np.ndarray:
        return (rng.standard_normal(numpy_shape) * std).astype(np.float16)

    def norm() -> np.ndarray:
        return np.ones(shape.n_embd, dtype=np.float32)

    tensors = {}
    for i in range(shape.n_layer):
        tensors[f"blk.{i}.attn_norm.weight"] = norm()
        tensors[f"blk.{i}.attn_q.weight"] = weight(shape.n_embd, shape.n_embd)
        tensors[f"blk.{i}.attn_k.weight"] = weight(n_embd_kv, shape.n_embd)
        tensors[f"blk.{i}.attn_v.weight"] = weight(n_embd_kv, shape.n_embd)
        tensors[f"blk.{i}.attn_output.weight"] = weight(shape.n_embd, shape.n_embd)
        tensors[f"blk.{i}.ffn_norm.weight"] = norm()
        tensors[f"blk.{i}.ffn_gate.weight"] = weight(shape.n_ff, shape.n_embd)
        tensors[f"blk.{i}.ffn_up.weight"] = weight(shape.n_ff, shape.n_embd)
        tensors[f"blk.{i}.ffn_down.weight"] = weight(shape.n_embd, shape.n_ff)
    return tensors


def random_weights(shape: Shape, n_vocab: int) -> dict[str, np.ndarray]:
    """write_model's tensors for a vocabulary of n_vocab tokens (specials and bytes first): all random."""
    rng = np.random.default_rng(shape.seed)

    def weight(*numpy_shape: int) -> np.ndarray:
        return (rng.standard_normal(numpy_shape) * 0.02).astype(np.float16)

    tensors = {"token_embd.weight": weight(n_vocab, shape.n_embd)}
    tensors.update(_random_layers(rng, shape, 0.02))
    tensors["output_norm.weight"] = np.ones(shape.n_embd, dtype=np.float32)
    # Zero output rows for the control and byte tokens: their logits stay at 0 while the letters'
    # spread around it, so the random model babbles in letters rather than in raw bytes.
    output = weight(n_vocab, shape.n_embd) * np.float16(8)
    output[: 3 + N_BYTES] = 0
    tensors["output.weight"] = output
    return tensors


def write_model(path: Path, shape: Shape = Shape()) -> Path:
    vocab = vocabulary()
    tensors = random_weights(shape, len(vocab[0]))
    return _write_gguf(path, shape, "llama-rpc-deploy test model (random weights)", vocab, tensors)


# --- the sentence model ---------------------------------------------------------------------------

PROMPT = "Two computers, one model:"
SENTENCE = (
    " each layer computes on whichever machine holds its weights and the logits travel back"
    " so every answer arrives whole."
)
# The chat prompt is the messages' text and nothing else, so a chat completion continues exactly
# like /completion does on the same text (without a template llama-server would use ChatML; the
# model continues any unknown text with SENTENCE too, see write_sentence_model).
CHAT_TEMPLATE = "{%- for message in messages -%}{{- message['content'] -}}{%- endfor -%}"

# The lab's second model (models on demand): the same construction, another text (no word twice).
PROMPT_2 = "Another model, same cluster:"
SENTENCE_2 = " the router loads me on demand while workers keep cached tensors."

SENTENCE_LOGIT = 20.0  # the successor's logit on a clean one-hot state (before the layers' noise)
EMBED_SCALE = 20.0  # length of a word's embedding: the residual stream the layers add to
LAYER_STD = 0.02  # attention and FFN weights ~ N(0, LAYER_STD), as in write_model
OUTPUT_STD = 0.02  # dense random part of output.weight: every logit feels every layer


def pieces(text: str, first: bool = True) -> list[str]:
    """The word pieces `text` should tokenize into: words with their leading space, punctuation alone."""
    text = (" " + text) if first else text
    return [p.replace(" ", SPACE) for p in re.findall(r" ?[A-Za-z]+|[^\sA-Za-z]", text)]


def cycle(prompt: str = PROMPT, sentence: str = SENTENCE) -> list[str]:
    """PROMPT then SENTENCE, as pieces: each one's successor is the next, and the last's is the first,
    so the model recites "Two computers, one model: each layer ... whole. Two computers, ..." forever.
    (Another prompt and sentence give another model: the lab's second model for models on demand.)"""
    return pieces(prompt) + pieces(sentence, first=False)


def sentence_vocabulary(prompt: str = PROMPT, sentence: str = SENTENCE) -> tuple[list[bytes], list[float], list[int]]:
    """<unk> <s> </s>, the 256 byte tokens, then every word of cycle() with all its prefixes.

    llama.cpp's SentencePiece tokenizer starts from single characters and merges a neighbouring
    pair only when the pair is a token, so "▁each" is reached through "▁e", "▁ea", "▁eac". No piece
    starts inside a word or spans a word boundary, so every word comes out whole (and any other
    text falls back to these prefixes and byte tokens)."""
    tokens, scores, types = _specials_and_bytes()
    words = cycle(prompt, sentence)
    assert len(set(words)) == len(words), "a word twice in the cycle would need two successors"
    seen: set[str] = set()
    for word in words:
        for end in range(min(2, len(word)), len(word) + 1):
            piece = word[:end]
            if piece not in seen:
                seen.add(piece)
                tokens.append(piece.encode())
                scores.append(-float(len(seen)))
                types.append(int(TokenType.NORMAL))
    return tokens, scores, types


def tokenize(
    text: str, vocab: tuple[list[bytes], list[float], list[int]] | None = None, add_bos: bool = True
) -> list[int]:
    """llama.cpp's SentencePiece tokenizer (llm_tokenizer_spm_session in src/llama-vocab.cpp) for
    plain text: a space in front (add_space_prefix), spaces as "▁", characters merged pairwise by
    the highest-scoring pair that is a token (ties: leftmost), then symbols that are no token as bytes."""
    tokens, scores, _ = vocab or sentence_vocabulary()
    ids = {t.decode(): i for i, t in enumerate(tokens)}
    text = (" " + text).replace(" ", SPACE)
    symbols = list(text)  # merged symbols keep their text; None marks one merged away
    nxt = list(range(1, len(symbols))) + [-1]
    prv = list(range(-1, len(symbols) - 1))
    queue: list[tuple[float, int, int, int]] = []

    def try_add(left: int, right: int) -> None:
        if left == -1 or right == -1:
            return
        merged = symbols[left] + symbols[right]
        if merged in ids:  # max-heap on score, then the leftmost pair
            heapq.heappush(queue, (-scores[ids[merged]], left, right, len(merged)))

    for i in range(1, len(symbols)):
        try_add(i - 1, i)
    while queue:
        _, left, right, size = heapq.heappop(queue)
        if symbols[left] is None or symbols[right] is None or len(symbols[left]) + len(symbols[right]) != size:
            continue
        symbols[left] += symbols[right]
        symbols[right] = None
        nxt[left] = nxt[right]
        if nxt[right] >= 0:
            prv[nxt[right]] = left
        try_add(prv[left], left)
        try_add(left, nxt[left])
    out = [BOS] if add_bos else []
    i = 0
    while i != -1:
        if symbols[i] in ids:
            out.append(ids[symbols[i]])
        else:  # llama.cpp would first try to split it back into tokens; with prefix-closed words none are
            out.extend(3 + b for b in symbols[i].encode())
        i = nxt[i]
    return out


def sentence_tokens(prompt: str = PROMPT, sentence: str = SENTENCE) -> list[int]:
    """The token ids greedy decoding must produce after PROMPT: SENTENCE, one id per piece."""
    ids = {t.decode(): i for i, t in enumerate(sentence_vocabulary(prompt, sentence)[0])}
    return [ids[p] for p in pieces(sentence, first=False)]


def sentence_weights(
    shape: Shape = Shape(), prompt: str = PROMPT, sentence: str = SENTENCE, successors: list[int] | None = None
) -> dict[str, np.ndarray]:
    """Every tensor of the sentence model, by GGUF name (numpy shape: ggml's ne reversed).

    Word i of cycle() is embedded as EMBED_SCALE times basis vector i (plus a little noise); every
    other token (bytes, prefixes, <s>, ...) along one more basis vector ("other"). output.weight maps
    basis vector i to the successor of word i, and "other" to the first word of SENTENCE, with a
    logit of SENTENCE_LOGIT after the final RMS norm (which scales a one-hot state to sqrt(n_embd)),
    on top of a dense N(0, OUTPUT_STD) matrix. The layers are random and small next to the embedding,
    so they move every logit a little (see layer_effects) and the successor still wins by far.

    `successors[i]` is the index in cycle() of the word that follows word i; None is the cycle itself
    (i + 1). Another map gives a model that recites something else with the same vocabulary: the draft
    (write_draft_model) skips a word now and then."""
    rng = np.random.default_rng(shape.seed)
    tokens, _, _ = sentence_vocabulary(prompt, sentence)
    words = cycle(prompt, sentence)
    successors = _successors(len(words), successors)
    ids = {t.decode(): i for i, t in enumerate(tokens)}
    other = len(words)
    if shape.n_embd <= other:
        raise ValueError(f"n_embd {shape.n_embd} must exceed the {len(words)} words of the sentence")
    direction = np.full(len(tokens), other)
    for i, word in enumerate(words):
        direction[ids[word]] = i

    embd = rng.standard_normal((len(tokens), shape.n_embd)) * 0.02
    embd[np.arange(len(tokens)), direction] += EMBED_SCALE
    tensors = {"token_embd.weight": embd.astype(np.float16)}
    tensors.update(_random_layers(rng, shape, LAYER_STD))
    tensors["output_norm.weight"] = np.ones(shape.n_embd, dtype=np.float32)
    output = rng.standard_normal((len(tokens), shape.n_embd)) * OUTPUT_STD
    weight = SENTENCE_LOGIT / np.sqrt(shape.n_embd)
    for i in range(len(words)):
        output[ids[words[successors[i]]], i] += weight
    output[ids[pieces(sentence, first=False)[0]], other] += weight
    tensors["output.weight"] = output.astype(np.float16)
    return tensors


def write_sentence_model(
    path: Path,
    shape: Shape = Shape(),
    split_max_tensors: int = 0,
    prompt: str = PROMPT,
    sentence: str = SENTENCE,
    successors: list[int] | None = None,
) -> Path:
    """The sentence model (default shape: the lab's, 8 layers of 512, about 50 MB); split into shards
    of at most split_max_tensors tensors when that is set (the first shard's path is returned).
    `successors`: as in sentence_weights."""
    return _write_gguf(
        path,
        shape,
        "llama-rpc-deploy sentence model (greedy output is known)",
        sentence_vocabulary(prompt, sentence),
        sentence_weights(shape, prompt, sentence, successors),
        chat_template=CHAT_TEMPLATE,
        split_max_tensors=split_max_tensors,
    )


def _successors(n: int, successors: list[int] | None) -> list[int]:
    """The successor map of a cycle of n words: as given (checked), or the cycle itself."""
    if successors is None:
        return [(i + 1) % n for i in range(n)]
    if len(successors) != n or not all(0 <= s < n for s in successors):
        raise ValueError(f"successors must give each of the {n} words one of them: {successors}")
    return list(successors)


def next_tokens(successors: list[int] | None = None, prompt: str = PROMPT, sentence: str = SENTENCE) -> np.ndarray:
    """The Markov machine sentence_weights builds, as a table: for every token id, the id the model
    predicts after it (a word's successor; SENTENCE's first word after any other token)."""
    tokens = sentence_vocabulary(prompt, sentence)[0]
    words = cycle(prompt, sentence)
    successors = _successors(len(words), successors)
    ids = {t.decode(): i for i, t in enumerate(tokens)}
    table = np.full(len(tokens), ids[pieces(sentence, first=False)[0]])
    for i, word in enumerate(words):
        table[ids[word]] = ids[words[successors[i]]]
    return table


# --- models for speculative decoding (llama.cpp's draft-simple) ------------------------------------
#
# The draft is the sentence model with a few successors changed and in a small shape: same vocabulary
# (llama.cpp's draft-simple refuses a draft whose token texts differ from the target's), so it guesses
# the target's next token right most of the time but not always, and llama-server both accepts and
# rejects drafted tokens. The random model is write_model's construction on the sentence vocabulary: a
# target whose text no draft predicts (word prefixes and a word, each repeated many times).

DRAFT_SHAPE = Shape(n_layer=2, n_embd=128, n_head=2, n_head_kv=1, n_ff=256, seed=4321)


def draft_skips(i: int) -> bool:
    """Whether the draft skips the word after word i of the cycle: every third word (8 of 26)."""
    return i % 3 == 2


def draft_successors(n: int, skip: Callable[[int], bool] = draft_skips) -> list[int]:
    """The draft's successor map for a cycle of n words: i + 1, or i + 2 (a word skipped) where skip(i)."""
    return [(i + (2 if skip(i) else 1)) % n for i in range(n)]


def draft_weights(shape: Shape = DRAFT_SHAPE) -> dict[str, np.ndarray]:
    """The draft's tensors: the sentence model's construction with draft_successors."""
    return sentence_weights(shape, successors=draft_successors(len(cycle())))


def write_draft_model(path: Path, shape: Shape = DRAFT_SHAPE) -> Path:
    """The lab's draft for the sentence model (PROMPT, SENTENCE): the same vocabulary and chat template,
    greedy output the cycle with every third word skipped (draft_successors), about 0.7 of the target's
    tokens predicted right when it drafts from the target's own text (draft_agreement)."""
    return _write_gguf(
        path,
        shape,
        "llama-rpc-deploy lab draft model (the sentence model, every third word skipped)",
        sentence_vocabulary(),
        draft_weights(shape),
        chat_template=CHAT_TEMPLATE,
    )


def write_random_sentence_model(path: Path, shape: Shape = Shape()) -> Path:
    """write_model's random weights on the sentence model's vocabulary: a target that loads with the lab's
    draft (same tokens) and whose text the draft does not predict (random_agreement)."""
    vocab = sentence_vocabulary()
    return _write_gguf(
        path,
        shape,
        "llama-rpc-deploy random model (random weights, the sentence vocabulary)",
        vocab,
        random_weights(shape, len(vocab[0])),
        chat_template=CHAT_TEMPLATE,
    )


# --- a numpy reference of llama.cpp's llama graph, for the margins --------------------------------


def read_weights(path: Path) -> tuple[dict[str, np.ndarray], Shape]:
    """The tensors of a GGUF written here (as float32), and its shape."""
    reader = GGUFReader(str(path))
    field = lambda key: int(reader.fields[key].parts[-1][0])  # noqa: E731
    shape = Shape(
        n_layer=field("llama.block_count"),
        n_embd=field("llama.embedding_length"),
        n_head=field("llama.attention.head_count"),
        n_head_kv=field("llama.attention.head_count_kv"),
        n_ff=field("llama.feed_forward_length"),
        n_ctx_train=field("llama.context_length"),
    )
    weights = {
        t.name: np.asarray(t.data, dtype=np.float32).reshape([int(n) for n in reversed(t.shape)])
        for t in reader.tensors
    }
    return weights, shape


def _rms_norm(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + RMS_EPS) * w


def _rope(x: np.ndarray) -> np.ndarray:
    """llama.cpp's "normal" RoPE (the llama architecture): adjacent pairs rotate. x: [tokens, heads, head_dim]."""
    n_tokens, _, head_dim = x.shape
    theta = np.arange(n_tokens)[:, None] * ROPE_FREQ_BASE ** (-np.arange(0, head_dim, 2) / head_dim)[None, :]
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * cos - x1 * sin
    out[..., 1::2] = x0 * sin + x1 * cos
    return out


def forward(
    weights: dict[str, np.ndarray],
    shape: Shape,
    token_ids: list[int],
    skip: frozenset[str] = frozenset(),
    added: dict | None = None,
) -> np.ndarray:
    """Logits [tokens, vocab] in float32. `skip` names sublayers left out ("blk.3.attn", "blk.3.ffn");
    `added`, when given, receives what each sublayer adds to the residual stream."""
    w = {k: np.asarray(v, dtype=np.float32) for k, v in weights.items()}
    head_dim = shape.n_embd // shape.n_head
    group = shape.n_head // shape.n_head_kv
    n = len(token_ids)
    mask = np.triu(np.full((n, n), -np.inf, dtype=np.float32), k=1)
    h = w["token_embd.weight"][token_ids]
    for i in range(shape.n_layer):
        p = f"blk.{i}."
        if p + "attn" not in skip:
            x = _rms_norm(h, w[p + "attn_norm.weight"])
            q = _rope((x @ w[p + "attn_q.weight"].T).reshape(n, shape.n_head, head_dim))
            k = _rope((x @ w[p + "attn_k.weight"].T).reshape(n, shape.n_head_kv, head_dim))
            v = (x @ w[p + "attn_v.weight"].T).reshape(n, shape.n_head_kv, head_dim)
            k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
            scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(head_dim) + mask
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            scores /= scores.sum(axis=-1, keepdims=True)
            attn = np.einsum("hqk,khd->qhd", scores, v).reshape(n, shape.n_embd)
            delta = attn @ w[p + "attn_output.weight"].T
            if added is not None:
                added[p + "attn"] = delta
            h = h + delta
        if p + "ffn" not in skip:
            x = _rms_norm(h, w[p + "ffn_norm.weight"])
            gate = x @ w[p + "ffn_gate.weight"].T
            up = x @ w[p + "ffn_up.weight"].T
            delta = (gate / (1 + np.exp(-gate)) * up) @ w[p + "ffn_down.weight"].T
            if added is not None:
                added[p + "ffn"] = delta
            h = h + delta
    return _rms_norm(h, w["output_norm.weight"]) @ w["output.weight"].T


def recital() -> tuple[list[int], int]:
    """<s> PROMPT SENTENCE PROMPT SENTENCE as token ids (two turns of the cycle, teacher forced),
    and the index of PROMPT's last token: from there on every next token is the cycle's."""
    prompt = tokenize(PROMPT)
    turn = prompt[1:] + sentence_tokens()
    return prompt + sentence_tokens() + turn, len(prompt) - 1


def margins(
    weights: dict[str, np.ndarray] | None = None, shape: Shape = Shape(), successors: list[int] | None = None
) -> np.ndarray:
    """At each step of the recital from PROMPT's last token on: the expected next token's logit minus
    the largest other logit (numpy float32 reference of llama.cpp's graph, on the f16 weights). Expected
    is the next token of the recital, or with `successors` (a model built with them) the successor of
    the current token."""
    weights = sentence_weights(shape, successors=successors) if weights is None else weights
    ids, start = recital()
    logits = forward(weights, shape, ids)[start:-1]
    expected = next_tokens(successors)[ids[start:-1]]
    rows = np.arange(len(expected))
    winner = logits[rows, expected]
    logits[rows, expected] = -np.inf
    return winner - logits.max(axis=1)


def min_margin(path: Path | None = None) -> float:
    """The smallest margin by which greedy decoding picks SENTENCE (and the cycle after it): from the
    GGUF file at `path`, or from freshly generated weights in the default shape."""
    if path is None:
        return float(margins().min())
    weights, shape = read_weights(path)
    return float(margins(weights, shape).min())


def draft_agreement(weights: dict[str, np.ndarray] | None = None, shape: Shape = DRAFT_SHAPE) -> float:
    """The fraction of the recital's steps (from PROMPT's last token on, two turns of the cycle, teacher
    forced as draft-simple drafts from the target's tokens) where the draft's greedy token (numpy) is
    the target's next token."""
    weights = draft_weights(shape) if weights is None else weights
    ids, start = recital()
    greedy = forward(weights, shape, ids)[start:-1].argmax(axis=1)
    return float(np.mean(greedy == np.array(ids[start + 1 :])))


def greedy(weights: dict[str, np.ndarray], shape: Shape, token_ids: list[int], n: int) -> list[int]:
    """n tokens of greedy decoding after token_ids (numpy reference). Speculatively, as llama.cpp does it:
    guess that the last token repeats to the end, and one forward pass checks every guess at once (each
    position's greedy token holds while the guesses before it were right). Exact, and one pass per
    change of token rather than one per token: the random model repeats itself in long runs."""
    w = {k: np.asarray(v, dtype=np.float32) for k, v in weights.items()}
    ids, end = list(token_ids), len(token_ids) + n
    while len(ids) < end:
        start = len(ids)
        guess = ids + [ids[-1]] * (end - start - 1)
        for token in forward(w, shape, guess)[start - 1 :].argmax(axis=1):
            ids.append(int(token))
            if len(ids) == end or guess[len(ids) - 1] != ids[-1]:
                break
    return ids[len(token_ids) :]


def random_agreement(
    weights: dict[str, np.ndarray] | None = None, shape: Shape = Shape(), n: int = 32
) -> tuple[int, list[int]]:
    """How many of the random model's first n greedy tokens after PROMPT the draft's Markov machine
    (next_tokens with draft_successors) predicts from the token before, and those tokens."""
    weights = random_weights(shape, len(sentence_vocabulary()[0])) if weights is None else weights
    prompt = tokenize(PROMPT)
    tokens = greedy(weights, shape, prompt, n)
    draft = next_tokens(draft_successors(len(cycle())))
    return int(np.sum(draft[[prompt[-1]] + tokens[:-1]] == np.array(tokens))), tokens


def layer_effects(weights: dict[str, np.ndarray] | None = None, shape: Shape = Shape()) -> dict[str, float]:
    """How far the layers move the logits over the recital: under "all", the largest change when every
    sublayer is left out; under "blk.3.attn", "blk.3.ffn", ..., the largest logit that sublayer's own
    addition to the residual stream makes through the output head (normalized as the final hidden state
    is). Two forward passes, not one per sublayer."""
    weights = sentence_weights(shape) if weights is None else weights
    w = {k: np.asarray(v, dtype=np.float32) for k, v in weights.items()}
    ids, start = recital()
    added: dict[str, np.ndarray] = {}
    full = forward(w, shape, ids, added=added)[start:]
    sublayers = frozenset(added)
    effects = {"all": float(np.abs(full - forward(w, shape, ids, sublayers)[start:]).max())}
    h = w["token_embd.weight"][ids] + sum(added.values())  # the final hidden state
    scale = w["output_norm.weight"] / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + RMS_EPS)
    for name, delta in added.items():
        effects[name] = float(np.abs((delta * scale)[start:] @ w["output.weight"].T).max())
    return effects


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    fields = ("n_layer", "n_embd", "n_head", "n_head_kv", "n_ff", "seed")
    for field in fields:
        parser.add_argument(
            "--" + field.replace("_", "-"),
            type=int,
            help=f"default {getattr(Shape(), field)} ({getattr(DRAFT_SHAPE, field)} with --draft)",
        )
    kind = parser.add_mutually_exclusive_group()
    kind.add_argument("--sentence", action="store_true", help="the sentence model (greedy output: SENTENCE)")
    kind.add_argument(
        "--draft",
        action="store_true",
        help="the sentence model's draft for speculative decoding (llama-server -md, --spec-type draft-simple):"
        " same vocabulary, every third word skipped, a smaller shape",
    )
    kind.add_argument(
        "--random",
        action="store_true",
        help="random weights on the sentence model's vocabulary: a target whose text the draft does not predict",
    )
    args = parser.parse_args(argv)
    base = DRAFT_SHAPE if args.draft else Shape()
    shape = Shape(**{f: getattr(base, f) if getattr(args, f) is None else getattr(args, f) for f in fields})
    if args.sentence:
        print(write_sentence_model(args.out, shape))
        print(f"prompt {PROMPT!r} -> {SENTENCE!r}, smallest logit margin {min_margin(args.out):.2f}")
    elif args.draft:
        print(write_draft_model(args.out, shape))
        weights, _ = read_weights(args.out)
        successors = draft_successors(len(cycle()))
        print(
            f"smallest logit margin {margins(weights, shape, successors).min():.2f},"
            f" agrees with the sentence model on {draft_agreement(weights, shape):.2f} of its tokens"
        )
    elif args.random:
        print(write_random_sentence_model(args.out, shape))
    else:
        print(write_model(args.out, shape))


if __name__ == "__main__":
    main()
