from gguf import GGUFReader

from llama_rpc_deploy.testmodel import Shape, vocabulary, write_model


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
