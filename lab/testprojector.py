"""A tiny multimodal projector ("mmproj") GGUF for the lab's small text models.

llama.cpp's libmtmd (tools/mtmd/clip.cpp) loads it as a LLaVA-1.5 style vision tower: a CLIP-like
ViT (patch embedding, learned position embeddings, pre-layernorm, pre-norm transformer blocks) and
the "mlp" projector (mm.0 -> GELU -> mm.2) whose output width is the text model's n_embd. The
weights are random, so what the text model makes of an image is nonsense; what it checks is the
plumbing: llama-server (or llama-mtmd-cli) started with `--mmproj` loads it next to the text model,
accepts an image, encodes it into VISION.n_patches embeddings and decodes after them.

Shape (VisionShape): 64x64 images in 16x16 patches (16 image tokens), hidden 128, 4 heads,
FFN 512, 2 blocks (the llava graph runs all but the last: the LLaVA "second to last layer"
feature), projector 128 -> n_embd_text -> n_embd_text. About 1.7 MB with n_embd_text 512.

    python -m lab.testprojector OUT.gguf [--n-embd-text 512] [--seed 1234]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFWriter

from .testmodel import write_tensors


@dataclass(frozen=True)
class VisionShape:
    image_size: int = 64
    patch_size: int = 16
    n_embd: int = 128
    n_head: int = 4
    n_ff: int = 512
    n_layer: int = 2

    @property
    def n_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2


VISION = VisionShape()
PROJECTOR_TYPE = "mlp"  # clip-impl.h PROJECTOR_TYPE_MLP: LLaVA's mm.0 / mm.2
LAYER_NORM_EPS = 1e-5
IMAGE_MEAN = (0.48145466, 0.4578275, 0.40821073)  # CLIP's
IMAGE_STD = (0.26862954, 0.26130258, 0.27577711)
WEIGHT_STD = 0.02


def projector_tensors(n_embd_text: int = 512, seed: int = 1234, vision: VisionShape = VISION) -> dict[str, np.ndarray]:
    """The tensors by GGUF name. numpy shape is ggml's ne reversed; matrices f16, vectors f32."""
    rng = np.random.default_rng(seed)
    d, ff, p = vision.n_embd, vision.n_ff, vision.patch_size

    def weight(*numpy_shape: int) -> np.ndarray:
        return (rng.standard_normal(numpy_shape) * WEIGHT_STD).astype(np.float16)

    def bias(n: int) -> np.ndarray:
        return (rng.standard_normal(n) * WEIGHT_STD).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + rng.standard_normal(n) * WEIGHT_STD).astype(np.float32)

    tensors: dict[str, np.ndarray] = {
        # conv2d kernel, ggml ne [p, p, 3, d]
        "v.patch_embd.weight": weight(d, 3, p, p),
        "v.patch_embd.bias": bias(d),
        # one row per patch (no class embedding: the llava graph then feeds every position on)
        "v.position_embd.weight": (rng.standard_normal((vision.n_patches, d)) * WEIGHT_STD).astype(np.float32),
        "v.pre_ln.weight": norm(d),
        "v.pre_ln.bias": bias(d),
    }
    for i in range(vision.n_layer):
        blk = f"v.blk.{i}"
        tensors.update(
            {
                f"{blk}.ln1.weight": norm(d),
                f"{blk}.ln1.bias": bias(d),
                f"{blk}.attn_q.weight": weight(d, d),
                f"{blk}.attn_q.bias": bias(d),
                f"{blk}.attn_k.weight": weight(d, d),
                f"{blk}.attn_k.bias": bias(d),
                f"{blk}.attn_v.weight": weight(d, d),
                f"{blk}.attn_v.bias": bias(d),
                f"{blk}.attn_out.weight": weight(d, d),
                f"{blk}.attn_out.bias": bias(d),
                f"{blk}.ln2.weight": norm(d),
                f"{blk}.ln2.bias": bias(d),
                # up: ne [d, ff]; down: ne [ff, d] (clip.cpp swaps them back only when down's ne[0] == d)
                f"{blk}.ffn_up.weight": weight(ff, d),
                f"{blk}.ffn_up.bias": bias(ff),
                f"{blk}.ffn_down.weight": weight(d, ff),
                f"{blk}.ffn_down.bias": bias(d),
            }
        )
    tensors.update(
        {
            "mm.0.weight": weight(n_embd_text, d),  # ne [d, n_embd_text]
            "mm.0.bias": bias(n_embd_text),
            "mm.2.weight": weight(n_embd_text, n_embd_text),  # ne[1] is clip_n_mmproj_embd
            "mm.2.bias": bias(n_embd_text),
        }
    )
    return tensors


def write_projector(path: Path, n_embd_text: int = 512, seed: int = 1234) -> Path:
    """Write the projector for a text model of width n_embd_text; returns path."""
    path = Path(path)
    vision = VISION
    writer = GGUFWriter(str(path), "clip")
    writer.add_name("llama-rpc-deploy test projector (random weights)")
    writer.add_description(
        f"LLaVA-style mlp projector, {vision.image_size}px images, {vision.n_patches} tokens of width {n_embd_text}"
    )
    writer.add_file_type(1)  # mostly f16
    writer.add_clip_has_vision_encoder(True)
    writer.add_clip_projector_type(PROJECTOR_TYPE)
    writer.add_vision_image_size(vision.image_size)
    writer.add_vision_patch_size(vision.patch_size)
    writer.add_vision_embedding_length(vision.n_embd)
    writer.add_vision_feed_forward_length(vision.n_ff)
    writer.add_vision_projection_dim(n_embd_text)
    writer.add_vision_block_count(vision.n_layer)
    writer.add_vision_head_count(vision.n_head)
    writer.add_vision_attention_layernorm_eps(LAYER_NORM_EPS)
    writer.add_vision_image_mean(list(IMAGE_MEAN))
    writer.add_vision_image_std(list(IMAGE_STD))
    writer.add_vision_use_gelu(True)
    return write_tensors(writer, path, projector_tensors(n_embd_text, seed, vision))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--n-embd-text", type=int, default=512, help="the text model's n_embd (default 512)")
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args(argv)
    print(write_projector(args.out, n_embd_text=args.n_embd_text, seed=args.seed))


if __name__ == "__main__":
    main()
