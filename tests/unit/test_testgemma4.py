import numpy as np
import pytest
from gguf import GGUFReader

from lab.testgemma4 import (
    GEMMA4_SHAPE,
    assistant_drafts,
    assistant_table,
    gemma4_sentence_weights,
    layer_effect,
    margins,
    read_gguf,
    write_gemma4_assistant,
    write_gemma4_sentence_model,
)
from lab.testmodel import Shape, cycle, draft_successors, next_tokens, sentence_tokens, sentence_vocabulary

pytestmark = pytest.mark.xdist_group("gemma4 models")  # one worker writes the module's files once


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The target in the default (lab) shape and its assistant, written once."""
    folder = tmp_path_factory.mktemp("gemma4")
    target = write_gemma4_sentence_model(folder / "target.gguf")
    assistant = write_gemma4_assistant(folder / "assistant.gguf", target)
    return read_gguf(target), read_gguf(assistant), GGUFReader(str(target)), GGUFReader(str(assistant))


def token_list(reader: GGUFReader) -> list[bytes]:
    field = reader.fields["tokenizer.ggml.tokens"]
    return [bytes(field.parts[i]) for i in field.data]


def swa_pattern(reader: GGUFReader, arch: str) -> list[bool]:
    field = reader.fields[f"{arch}.attention.sliding_window_pattern"]
    return [bool(field.parts[i][0]) for i in field.data]


def test_target_is_a_gemma4_of_the_lab_shape_on_the_sentence_vocabulary(models):
    (weights, keys), _, reader, _ = models
    assert keys["general.architecture"] == "gemma4"
    assert (
        keys["gemma4.block_count"] == GEMMA4_SHAPE.n_layer == 8
    )  # the lab's -ngl 6: layers 3..7 and the output on the workers
    assert keys["gemma4.embedding_length"] == GEMMA4_SHAPE.n_embd == 512
    assert keys["gemma4.feed_forward_length"] == GEMMA4_SHAPE.n_ff == 1536
    assert token_list(reader) == sentence_vocabulary()[0]
    assert "output.weight" in weights  # untied: the output maps words to their successors
    # the last layer global and the one before it sliding: the assistant's layers read those two
    pattern = swa_pattern(reader, "gemma4")
    assert pattern[-1] is False and pattern[-2] is True
    assert sum(name.startswith("blk.") and name.endswith("attn_k.weight") for name in weights) == 8


def test_assistant_header_matches_its_target(models):
    (target, tkeys), (weights, keys), treader, reader = models
    assert keys["general.architecture"] == "gemma4-assistant"
    assert keys["gemma4-assistant.embedding_length_out"] == tkeys["gemma4.embedding_length"]
    assert keys["gemma4-assistant.embedding_length"] != tkeys["gemma4.embedding_length"]
    assert keys["gemma4-assistant.nextn_predict_layers"] == keys["gemma4-assistant.block_count"]
    assert keys["gemma4-assistant.attention.key_length"] == tkeys["gemma4.attention.key_length"]
    assert token_list(reader) == token_list(treader)
    assert swa_pattern(reader, "gemma4-assistant")[-1] is False
    assert weights["nextn.pre_projection.weight"].shape == (
        keys["gemma4-assistant.embedding_length"],
        2 * tkeys["gemma4.embedding_length"],
    )
    assert not any(name.endswith(("attn_k.weight", "attn_v.weight")) for name in weights)  # the target's KV


def test_assistant_drafts_the_lab_drafts_successors(models):
    (target, _), (weights, _), _, _ = models
    drafts = assistant_drafts(weights, target["token_embd.weight"])
    expected = next_tokens(draft_successors(len(cycle())))
    np.testing.assert_array_equal(drafts, expected)
    # and so it disagrees with the target on the words the lab's draft skips (every third)
    words = sentence_tokens()
    assert 0 < np.sum(drafts[words] != next_tokens()[words]) < len(words) / 2


def test_target_recites_the_sentence_with_wide_margins_and_the_layers_count(models):
    (weights, _), _, _, _ = models
    assert margins(weights).min() > 10.0
    assert 0.1 < layer_effect(weights) < 3.0


def test_assistant_table_refuses_a_target_that_is_not_the_sentence_model(models):
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="not the sentence model"):
        assistant_table(rng.standard_normal((len(sentence_vocabulary()[0]), 64)))
    # any shape of the target: the directions are the words' (and "other"), the table the draft's successors
    shape = Shape(n_layer=2, n_embd=64, n_head=2, n_head_kv=1, n_ff=64)
    small = assistant_table(gemma4_sentence_weights(shape)["token_embd.weight"].astype(np.float32))
    (target, _), _, _, _ = models
    large = assistant_table(target["token_embd.weight"])
    np.testing.assert_array_equal(small, large)
    assert len(small) == len(cycle()) + 1
