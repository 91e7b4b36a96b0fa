"""Common GPUs: their vendor, compute capability (NVIDIA: CMAKE_CUDA_ARCHITECTURES), memory and its bandwidth.

A host's `gpus` setting names cards from this table, e.g. gpus = ["RTX 4080"], or
gives a dict for a card that is not here: {"name": "...", "cuda_arch": "89", "vram_mib": 16376, "bandwidth_gbs": 717}
for an NVIDIA card, {"name": "...", "vendor": "amd", "vram_mib": 16368, "bandwidth_gbs": 640} for another.
NVIDIA cards run on image_backend cuda; AMD and Intel cards on image_backend vulkan (llama.cpp names them
Vulkan0, Vulkan1, ... on their host).

Memory is in MiB as CUDA reports it (nvidia-smi --query-gpu=memory.total): a "16 GB" card has less
than 16384. When a host has nvidia-smi, the deploy uses the figure it reports instead of this table's.
AMD and Intel cards: the size of the card's device-local memory heap (vulkaninfo), which RADV and ANV
report as the whole card.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Gpu:
    name: str
    cuda_arch: str  # compute capability without the dot: "89" for 8.9; "" for a card of another vendor
    vram_mib: int  # total memory as CUDA reports it
    bandwidth_gbs: float  # memory bandwidth, GB/s
    vendor: str = "nvidia"  # nvidia, amd or intel

    @property
    def backend(self) -> str:
        """The image_backend that drives this card: cuda for NVIDIA's, vulkan for the others."""
        return "cuda" if self.vendor == "nvidia" else "vulkan"


KNOWN_GPUS = {
    g.name.lower(): g
    for g in (
        Gpu("RTX 3060 12GB", "86", 12288, 360),
        Gpu("RTX 3090", "86", 24576, 936),
        Gpu("RTX 4060 Ti 16GB", "89", 16380, 288),
        Gpu("RTX 4070 Ti Super", "89", 16376, 672),
        Gpu("RTX 4080", "89", 16375, 717),
        Gpu("RTX 4080 Super", "89", 16376, 736),
        Gpu("RTX 4090", "89", 24564, 1008),
        Gpu("RTX 5060 Ti 16GB", "120", 15849, 448),
        Gpu("RTX 5070 Ti", "120", 16303, 896),
        Gpu("RTX 5080", "120", 16303, 960),
        Gpu("RTX 5090", "120", 32607, 1792),
        Gpu("RTX A4000", "86", 16376, 448),
        Gpu("RTX A6000", "86", 49140, 768),
        Gpu("L4", "89", 23034, 300),
        # AMD and Intel (image_backend vulkan): memory as the card's nominal size, bandwidth from the datasheet
        Gpu("RX 6800 XT", "", 16368, 512, "amd"),
        Gpu("RX 7600 XT", "", 16368, 288, "amd"),
        Gpu("RX 7800 XT", "", 16368, 624, "amd"),
        Gpu("RX 7900 XT", "", 20464, 800, "amd"),
        Gpu("RX 7900 XTX", "", 24560, 960, "amd"),
        Gpu("RX 9070", "", 16304, 644, "amd"),
        Gpu("RX 9070 XT", "", 16304, 644, "amd"),
        Gpu("Arc A770 16GB", "", 16288, 560, "intel"),
        Gpu("Arc B580", "", 12216, 456, "intel"),
    )
}
VENDORS = ("nvidia", "amd", "intel")
DICT_KEYS = {"name", "cuda_arch", "vram_mib", "bandwidth_gbs", "vendor"}
ALIASES = {
    "rtx 5060 ti": "rtx 5060 ti 16gb",
    "rtx 4060 ti": "rtx 4060 ti 16gb",
    "rtx 3060": "rtx 3060 12gb",
    "a4000": "rtx a4000",
    "a6000": "rtx a6000",
}


def lookup(entry: str | dict) -> Gpu:
    """A Gpu from a card name in the table or from a dict that describes the card."""
    if isinstance(entry, dict):
        unknown = sorted(set(entry) - DICT_KEYS)
        if unknown:
            raise ValueError(f"GPU {entry!r}: unknown key {unknown[0]!r}: expected only {', '.join(sorted(DICT_KEYS))}")
        vendor = entry.get("vendor", "nvidia")
        if vendor not in VENDORS:
            raise ValueError(f"GPU {entry!r}: vendor = {vendor!r}: expected one of {', '.join(VENDORS)}")
        if vendor != "nvidia" and "cuda_arch" in entry:
            raise ValueError(
                f"GPU {entry!r}: cuda_arch on a card of {vendor}: expected cuda_arch only for NVIDIA cards"
            )
        try:
            gpu = Gpu(
                str(entry["name"]),
                str(entry["cuda_arch"]) if vendor == "nvidia" else "",
                entry.get("vram_mib", 0),
                entry.get("bandwidth_gbs", 0),
                vendor,
            )
        except KeyError as missing:
            raise ValueError(
                f"GPU {entry!r} lacks {missing}: expected a dict with at least name and cuda_arch "
                "(an NVIDIA card) or name and vendor (amd, intel)"
            ) from None
        for key, lo in (("vram_mib", 1024), ("bandwidth_gbs", 1)):
            value = getattr(gpu, key)
            if key in entry and not (
                isinstance(value, (int, float)) and not isinstance(value, bool) and lo <= value < 1e7
            ):
                raise ValueError(f"GPU {entry!r}: {key} = {value!r}: expected a number from {lo} to 10000000")
        if vendor == "nvidia" and not re.fullmatch(r"\d{2,3}", gpu.cuda_arch):
            raise ValueError(
                f"GPU {entry!r}: cuda_arch = {gpu.cuda_arch!r}: expected a compute capability "
                "without the dot, such as '89'"
            )
        return Gpu(gpu.name, gpu.cuda_arch, int(gpu.vram_mib), float(gpu.bandwidth_gbs), vendor)
    key = str(entry).strip().lower()
    key = ALIASES.get(key, key)
    if key not in KNOWN_GPUS:
        names = ", ".join(g.name for g in KNOWN_GPUS.values())
        raise ValueError(
            f"unknown GPU {entry!r}: expected one of {names}, or a dict with name and cuda_arch "
            "(NVIDIA) or name and vendor"
        )
    return KNOWN_GPUS[key]
