import hashlib

import numpy as np
import pytest
from gguf import GGUFReader

from lab import testmodel
from lab.testmodel import (
    DRAFT_SHAPE,
    PROMPT,
    SENTENCE,
    SPACE,
    Shape,
    cycle,
    draft_agreement,
    draft_successors,
    draft_weights,
    layer_effects,
    next_tokens,
    pieces,
    random_agreement,
    read_weights,
    sentence_tokens,
    sentence_vocabulary,
    sentence_weights,
    tokenize,
    vocabulary,
    write_draft_model,
    write_model,
    write_random_sentence_model,
)

pytestmark = pytest.mark.xdist_group("sentence models")  # tests/conftest.py: written once, on one worker


def test_model_is_a_llama_gguf_with_the_asked_shape(tmp_path):
    shape = Shape(n_layer=3, n_embd=64, n_head=4, n_head_kv=2, n_ff=128)
    reader = GGUFReader(write_model(tmp_path / "m.gguf", shape))
    fields = reader.fields
    assert bytes(fields["general.architecture"].parts[-1]).decode() == "llama"
    assert int(fields["llama.block_count"].parts[-1][0]) == 3
    assert int(fields["llama.attention.head_count_kv"].parts[-1][0]) == 2
    names = {t.name: t for t in reader.tensors}
    assert len(names) == 2 + 9 * 3 + 1
    assert list(names["blk.0.attn_k.weight"].shape) == [64, 32]  # ggml order: n_embd, n_embd_kv
    assert list(names["token_embd.weight"].shape) == [64, len(vocabulary()[0])]


def test_vocabulary_has_every_byte_for_fallback():
    tokens, scores, types = vocabulary()
    assert tokens[:3] == [b"<unk>", b"<s>", b"</s>"]
    assert b"<0x00>" in tokens and b"<0xFF>" in tokens
    assert len(tokens) == len(scores) == len(types) == len(set(tokens))


# --- the sentence model (issue 14): its greedy output is known, by a margin rounding cannot cross ---


@pytest.fixture(scope="module")
def sentence_model(sentence_models):
    """The model in the lab's shape (8 layers of 512), as write_sentence_model writes it (tests/conftest.py)."""
    return sentence_models["one"]


@pytest.fixture(scope="module")
def weights(sentence_model):
    """As the file holds them (float32 copies of the f16 values), checked against a fresh generation."""
    weights, shape = read_weights(sentence_model)
    assert shape == Shape()
    fresh = sentence_weights()
    assert weights.keys() == fresh.keys()
    for name, tensor in fresh.items():
        assert np.array_equal(weights[name], tensor.astype(np.float32)), name
    return weights


def text(field) -> str:
    return bytes(field.parts[-1]).decode()


def test_sentence_model_is_a_valid_llama_gguf(sentence_model):
    reader = GGUFReader(sentence_model)
    fields = reader.fields
    assert text(fields["general.architecture"]) == "llama"
    assert text(fields["tokenizer.ggml.model"]) == "llama"
    assert text(fields["tokenizer.chat_template"]) == testmodel.CHAT_TEMPLATE
    assert int(fields["llama.block_count"].parts[-1][0]) == 8
    assert int(fields["llama.embedding_length"].parts[-1][0]) == 512
    tokens = sentence_vocabulary()[0]
    assert len(fields["tokenizer.ggml.tokens"].data) == len(tokens)
    names = {t.name: t for t in reader.tensors}
    assert len(names) == 2 + 9 * 8 + 1
    assert list(names["output.weight"].shape) == [512, len(tokens)]
    for name, tensor in names.items():  # every weight is there and non-zero: every layer computes
        assert np.count_nonzero(tensor.data) > 0.99 * tensor.data.size, name


def test_prompt_and_sentence_tokenize_into_whole_words():
    """Checked here with a Python copy of llama.cpp's SentencePiece merge loop (`tokenize`); by hand it
    gave the same ids as llama-server's /tokenize, and tests/e2e/test_lab_tokens.py checks that on the lab."""
    tokens = [t.decode() for t in sentence_vocabulary()[0]]
    prompt = tokenize(PROMPT)
    assert prompt[0] == 1  # <s>
    assert [tokens[i] for i in prompt[1:]] == [
        SPACE + "Two",
        SPACE + "computers",
        ",",
        SPACE + "one",
        SPACE + "model",
        ":",
    ]
    # The sentence as generated is also how the tokenizer writes it (no byte tokens, no half words)
    assert tokenize(SENTENCE[1:], add_bos=False) == sentence_tokens()
    assert "".join(tokens[i] for i in sentence_tokens()).replace(SPACE, " ") == SENTENCE
    assert 15 <= len(SENTENCE.split()) <= 25
    # Every word is reachable by pairwise merges: its prefixes are tokens too
    for word in pieces(PROMPT) + pieces(SENTENCE, first=False):
        assert all(word[:n] in tokens for n in range(2, len(word) + 1)), word


def test_vocabulary_falls_back_to_bytes_for_other_text():
    tokens, scores, types = sentence_vocabulary()
    assert tokens[:3] == [b"<unk>", b"<s>", b"</s>"] and len(tokens) == len(set(tokens)) == len(scores) == len(types)
    ids = tokenize("xyz é")
    assert all(3 <= i < 3 + 256 for i in ids[1:])  # no piece for these: every byte as its own token
    assert ids[-2:] == [3 + 0xC3, 3 + 0xA9]


# f16 rounding cannot flip a token at a margin of 12: llama.cpp computes on these same f16 weights
# (the numpy reference reads them back from the file), so what differs is rounding the activations
# and the KV cache to f16 (relative 2**-11, about 5e-4) and the order of sums. The logits are at
# most about 20, so even 100 such errors all pushing one way would move a logit by about
# 20 * 100 * 5e-4 = 1, and a token flips only when two logits move 12 apart. Measured: llama-server's
# log-probabilities differ from this reference by at most 0.006 (24 steps, top 5 each), and the
# split lab from one server by 0.0005. The layers themselves move the logits by at most 3 (asserted
# below), so even a split that computed the layers badly but in range could not flip a token, only
# the logprobs: tests/e2e/test_lab_tokens.py compares those too.
MARGIN = 12.0


def test_greedy_margin_is_wide(weights):
    margins = testmodel.margins(weights)
    assert len(margins) == len(sentence_tokens()) + len(testmodel.cycle())  # SENTENCE, then a whole turn
    assert margins.min() >= MARGIN, margins.round(2)


def test_every_layer_contributes_but_cannot_flip_a_token(weights):
    """What each attention and each FFN block adds reaches some logit by far more than f16 rounding does (0.01
    at these magnitudes); all of them together by less than the margin."""
    effects = layer_effects(weights)
    assert 0.5 < effects.pop("all") < 3.0
    assert len(effects) == 2 * Shape().n_layer
    assert min(effects.values()) > 0.1, effects


def test_other_text_leads_into_the_sentence_too(weights):
    """Any text the model has no word for (byte tokens, <s>) continues with SENTENCE's first word: a chat
    prompt wrapped in ChatML (llama-server's template when a model has none) still recites SENTENCE."""
    ids = tokenize(f"<|im_start|>user\n{PROMPT}<|im_end|>\n<|im_start|>assistant\n")
    logits = testmodel.forward(weights, Shape(), ids)[-1]
    first = sentence_tokens()[0]
    assert int(np.argmax(logits)) == first
    assert logits[first] - np.delete(logits, first).max() >= MARGIN


# --- models for speculative decoding: the sentence model's draft, and a random target on its vocabulary ---

# The files as written before the successor map and random_weights were factored out (gguf is pinned): the
# defaults must not move a byte, or the lab would copy a new model onto the coordinator and every pinned
# expectation about it would need checking again.
SENTENCE_MODEL_SHA256 = "9909323ec26d899f2c6fbfa1c0885ac8228933ac14bcdfadacdb2621e0232ea0"
SMALL_RANDOM_MODEL_SHA256 = "4a8484632ebde6ca29d02dc865380c7feaa47c621d71cda9505e06ff9866af8c"  # the shape below


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_default_successors_keep_the_sentence_model_as_it_was(sentence_model, weights):
    assert sha256(sentence_model) == SENTENCE_MODEL_SHA256
    n = len(cycle())
    explicit = sentence_weights(successors=[(i + 1) % n for i in range(n)])
    assert all(np.array_equal(weights[name], tensor) for name, tensor in explicit.items())


def test_write_model_keeps_its_bytes(tmp_path):
    shape = Shape(n_layer=3, n_embd=64, n_head=4, n_head_kv=2, n_ff=128)
    assert sha256(write_model(tmp_path / "m.gguf", shape)) == SMALL_RANDOM_MODEL_SHA256


def test_a_successor_map_must_name_one_word_for_each(tmp_path):
    n = len(cycle())
    for bad in ([0] * (n - 1), [n] * n, [-1] * n):
        with pytest.raises(ValueError, match="successors"):
            sentence_weights(DRAFT_SHAPE, successors=bad)


def test_draft_skips_every_third_word():
    n = len(cycle())
    successors = draft_successors(n)
    assert [i for i in range(n) if successors[i] != (i + 1) % n] == list(range(2, n, 3))
    assert all(successors[i] == (i + 2) % n for i in range(2, n, 3))
    assert draft_successors(5, skip=lambda i: i == 4) == [1, 2, 3, 4, 1]
    # the tables the models implement: the draft's next token is the target's, or the one after it
    target, draft = next_tokens(), next_tokens(successors)
    assert np.mean(target == draft) > 0.95  # every token but 8 words: the same
    words = {t.decode(): i for i, t in enumerate(sentence_vocabulary()[0])}
    assert draft[words[cycle()[2]]] == words[cycle()[4]]


def vocabulary_fields(reader: GGUFReader) -> dict:
    fields = reader.fields
    keys = [k for k in fields if k.startswith("tokenizer.")]
    return {k: [bytes(fields[k].parts[i]) for i in fields[k].data] for k in keys}


def test_draft_and_random_model_share_the_targets_vocabulary(sentence_model, tmp_path):
    """llama.cpp's draft-simple compares the vocabularies' type, bos/eos and token texts; here every tokenizer
    key is the same (tokens, scores, types, ids, the chat template). The random model, in a small shape here,
    is write_model's construction on the same vocabulary."""
    target = vocabulary_fields(GGUFReader(sentence_model))
    assert "tokenizer.ggml.tokens" in target and "tokenizer.chat_template" in target
    draft = GGUFReader(write_draft_model(tmp_path / "draft.gguf"))
    assert vocabulary_fields(draft) == target
    assert "draft" in text(draft.fields["general.name"])
    assert int(draft.fields["llama.block_count"].parts[-1][0]) == DRAFT_SHAPE.n_layer
    assert int(draft.fields["llama.embedding_length"].parts[-1][0]) == DRAFT_SHAPE.n_embd
    small = Shape(n_layer=1, n_embd=64, n_head=2, n_head_kv=1, n_ff=128)
    random = GGUFReader(write_random_sentence_model(tmp_path / "random.gguf", small))
    assert vocabulary_fields(random) == target
    assert "random" in text(random.fields["general.name"])


def test_draft_recites_its_own_map_by_a_wide_margin():
    """Like the target: whatever backend runs the draft, its greedy token is the one its successor map names."""
    margins = testmodel.margins(draft_weights(), DRAFT_SHAPE, draft_successors(len(cycle())))
    assert len(margins) == len(sentence_tokens()) + len(cycle())
    assert margins.min() >= MARGIN, margins.round(2)


def test_draft_agrees_with_the_target_on_most_tokens_but_not_all(tmp_path):
    """Drafting from the target's own tokens (as draft-simple does after each check), two turns of the cycle:
    18 of the 26 words' successors are right, so llama-server both accepts and rejects drafted tokens. From the
    file as llama.cpp reads it, and from the weights as generated."""
    weights, shape = read_weights(write_draft_model(tmp_path / "draft.gguf"))
    agreement = draft_agreement(weights, shape)
    assert 0.6 <= agreement <= 0.85, agreement
    assert agreement == draft_agreement()


def test_random_model_says_what_the_draft_does_not_predict():
    """The random target's greedy text (numpy reference, 32 tokens after PROMPT): word prefixes and a word
    repeated, which the draft's successor map (and the target's) names at most a few times."""
    hits, tokens = random_agreement()
    assert len(tokens) == 32
    assert hits <= 3, hits
    before = [tokenize(PROMPT)[-1]] + tokens[:-1]
    assert np.sum(next_tokens()[before] == tokens) <= 3
