"""A small llama-architecture GGUF with random weights, for the lab and the tests.

It is a real model file as far as llama.cpp is concerned: the llama architecture,
f16 weights, a byte-level SentencePiece vocabulary, so llama-server loads it,
splits its layers across RPC devices and generates tokens. The tokens are
gibberish; that is fine, the lab checks the plumbing, not the prose.

    python -m llama_rpc_deploy.testmodel OUT.gguf [--layers 8 --embd 512 ...]
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFWriter, TokenType


@dataclass(frozen=True)
class Shape:
    n_layer: int = 8
    n_embd: int = 512
    n_head: int = 8
    n_head_kv: int = 4
    n_ff: int = 1536
    n_ctx_train: int = 4096
    seed: int = 1234


def vocabulary() -> tuple[list[bytes], list[float], list[int]]:
    """<unk> <s> </s>, the 256 byte tokens, then single characters with scores."""
    tokens = [b"<unk>", b"<s>", b"</s>"]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL]
    scores = [0.0, 0.0, 0.0]
    for b in range(256):
        tokens.append(f"<0x{b:02X}>".encode())
        types.append(TokenType.BYTE)
        scores.append(0.0)
    pieces = ["\u2581"] + [chr(c) for c in range(ord("a"), ord("z") + 1)] + [chr(c) for c in range(ord("A"), ord("Z") + 1)]
    pieces += ["\u2581" + chr(c) for c in range(ord("a"), ord("z") + 1)] + list(".,!?'0123456789")
    for i, piece in enumerate(pieces):
        tokens.append(piece.encode())
        types.append(TokenType.NORMAL)
        scores.append(-float(i + 1))
    return tokens, scores, [int(t) for t in types]


def write_model(path: Path, shape: Shape = Shape()) -> Path:
    rng = np.random.default_rng(shape.seed)
    tokens, scores, types = vocabulary()
    n_vocab = len(tokens)
    head_dim = shape.n_embd // shape.n_head
    n_embd_kv = head_dim * shape.n_head_kv

    writer = GGUFWriter(str(path), "llama")
    writer.add_name("llama-rpc-deploy test model (random weights)")
    writer.add_context_length(shape.n_ctx_train)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(1)  # mostly f16
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)

    def weight(*numpy_shape: int) -> np.ndarray:  # numpy shape is ggml's ne reversed
        return (rng.standard_normal(numpy_shape) * 0.02).astype(np.float16)

    def norm() -> np.ndarray:
        return np.ones(shape.n_embd, dtype=np.float32)

    writer.add_tensor("token_embd.weight", weight(n_vocab, shape.n_embd))
    for i in range(shape.n_layer):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", norm())
        writer.add_tensor(f"blk.{i}.attn_q.weight", weight(shape.n_embd, shape.n_embd))
        writer.add_tensor(f"blk.{i}.attn_k.weight", weight(n_embd_kv, shape.n_embd))
        writer.add_tensor(f"blk.{i}.attn_v.weight", weight(n_embd_kv, shape.n_embd))
        writer.add_tensor(f"blk.{i}.attn_output.weight", weight(shape.n_embd, shape.n_embd))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", norm())
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weight(shape.n_ff, shape.n_embd))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weight(shape.n_ff, shape.n_embd))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weight(shape.n_embd, shape.n_ff))
    writer.add_tensor("output_norm.weight", norm())
    # Zero output rows for the control and byte tokens: their logits stay at 0 while the letters'
    # spread around it, so the random model babbles in letters rather than in raw bytes.
    output = weight(n_vocab, shape.n_embd) * np.float16(8)
    output[: 3 + 256] = 0
    writer.add_tensor("output.weight", output)

    path.parent.mkdir(parents=True, exist_ok=True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    for field in ("n_layer", "n_embd", "n_head", "n_head_kv", "n_ff", "seed"):
        parser.add_argument("--" + field.replace("_", "-"), type=int, default=getattr(Shape(), field))
    args = parser.parse_args(argv)
    shape = Shape(**{f: getattr(args, f) for f in ("n_layer", "n_embd", "n_head", "n_head_kv", "n_ff", "seed")})
    print(write_model(args.out, shape))


if __name__ == "__main__":
    main()
