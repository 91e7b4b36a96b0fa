"""Common NVIDIA cards: compute capability (for CMAKE_CUDA_ARCHITECTURES), memory and its bandwidth.

A host's `gpus` setting names cards from this table, e.g. gpus = ["RTX 4080"], or
gives a dict for a card that is not here: {"name": "...", "cuda_arch": "89", "vram_gib": 16, "bandwidth_gbs": 717}.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Gpu:
    name: str
    cuda_arch: str  # compute capability without the dot: "89" for 8.9
    vram_gib: float
    bandwidth_gbs: float  # memory bandwidth, GB/s


KNOWN_GPUS = {g.name.lower(): g for g in (
    Gpu("RTX 3060 12GB", "86", 12, 360),
    Gpu("RTX 3090", "86", 24, 936),
    Gpu("RTX 4060 Ti 16GB", "89", 16, 288),
    Gpu("RTX 4070 Ti Super", "89", 16, 672),
    Gpu("RTX 4080", "89", 16, 717),
    Gpu("RTX 4080 Super", "89", 16, 736),
    Gpu("RTX 4090", "89", 24, 1008),
    Gpu("RTX 5060 Ti 16GB", "120", 16, 448),
    Gpu("RTX 5070 Ti", "120", 16, 896),
    Gpu("RTX 5080", "120", 16, 960),
    Gpu("RTX 5090", "120", 32, 1792),
    Gpu("RTX A4000", "86", 16, 448),
    Gpu("RTX A6000", "86", 48, 768),
    Gpu("L4", "89", 24, 300),
)}
ALIASES = {"rtx 5060 ti": "rtx 5060 ti 16gb", "rtx 4060 ti": "rtx 4060 ti 16gb", "rtx 3060": "rtx 3060 12gb",
           "a4000": "rtx a4000", "a6000": "rtx a6000"}


def lookup(entry: str | dict) -> Gpu:
    """A Gpu from a card name in the table or from a dict that describes the card."""
    if isinstance(entry, dict):
        try:
            return Gpu(str(entry["name"]), str(entry["cuda_arch"]), float(entry.get("vram_gib", 0)),
                       float(entry.get("bandwidth_gbs", 0)))
        except KeyError as missing:
            raise ValueError(f"GPU {entry!r} lacks {missing}: a dict needs at least name and cuda_arch") from None
    key = str(entry).strip().lower()
    key = ALIASES.get(key, key)
    if key not in KNOWN_GPUS:
        names = ", ".join(g.name for g in KNOWN_GPUS.values())
        raise ValueError(f"unknown GPU {entry!r}: expected one of {names}, or a dict with name and cuda_arch")
    return KNOWN_GPUS[key]
