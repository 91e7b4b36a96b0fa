"""Common GPUs: their vendor, compute capability (NVIDIA: CMAKE_CUDA_ARCHITECTURES), memory and its bandwidth.

A host's `gpus` setting names cards from this table, e.g. gpus = ["RTX 4080"], or
gives a dict for a card that is not here: {"name": "...", "cuda_arch": "89", "vram_mib": 16376, "bandwidth_gbs": 717}
for an NVIDIA card, {"name": "...", "vendor": "amd", "vram_mib": 16368, "bandwidth_gbs": 640} for another (a dict
without bandwidth_gbs gets ASSUMED_BANDWIDTH_GBS's figure).
NVIDIA cards run on image_backend cuda; AMD and Intel cards on image_backend vulkan (llama.cpp names them
Vulkan0, Vulkan1, ... on their host).

Memory is in MiB as CUDA reports it (nvidia-smi --query-gpu=memory.total): a "16 GB" card has less
than 16384. When a host has nvidia-smi, the deploy uses the figure it reports instead of this table's.
AMD and Intel cards: the size of the card's device-local memory heap (vulkaninfo), which RADV and ANV
report as the whole card.

A host whose `gpus` is not set (None) has its cards learned from the host itself (phases/checks.learn_gpus in the
deploy, probe.py for `llama-rpc probe` and `plan --probe`): parse_nvidia_smi and parse_vulkaninfo read what the host
says (Found), and learned() makes each card a Gpu: a card of this table (table_entry matches names flexibly: nvidia-smi
says "NVIDIA GeForce RTX 4080") takes the table's bandwidth, the host's memory and compute capability; a card that is
not here gets what the host said, and ASSUMED_BANDWIDTH_GBS for its vendor (see there).
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
    # learned from a host and not in the table: bandwidth_gbs is ASSUMED_BANDWIDTH_GBS's, not the card's
    bandwidth_assumed: bool = False

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
    "arc a770": "arc a770 16gb",
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
        if "bandwidth_gbs" not in entry:  # the planner divides by it (0 failed there): assumed, as for a learned card
            return Gpu(gpu.name, gpu.cuda_arch, int(gpu.vram_mib), ASSUMED_BANDWIDTH_GBS[vendor], vendor, True)
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


# --- cards learned from the host ---

# A learned card that is not in the table: its bandwidth is not something nvidia-smi or vulkaninfo report. The planner
# needs one (the tokens/s ceiling, and how 'auto' weighs the card), so it assumes the lowest figure of the table's
# cards of that vendor: a floor for the cards people split models over, which understates most of them (the ceiling
# is then low, not high, and 'auto' gives the card fewer layers than it could take). The deploy warns when it assumes
# it; a `gpus` dict with bandwidth_gbs from the card's datasheet replaces it.
ASSUMED_BANDWIDTH_GBS = {
    vendor: min(g.bandwidth_gbs for g in KNOWN_GPUS.values() if g.vendor == vendor) for vendor in VENDORS
}
# vulkaninfo's vendorID: the PCI vendor
VULKAN_VENDORS = {"0x10de": "nvidia", "0x1002": "amd", "0x8086": "intel"}
# A learned card is the table's when their names match and the memory the host reports is within this share of the
# table's (nvidia-smi names the 8 GB and 12 GB RTX 3060 alike; their bandwidth differs).
MEMORY_TOLERANCE = 0.1


@dataclass(frozen=True)
class Found:
    """A card as its host reports it: nvidia-smi's name, memory (MiB, as CUDA reports it) and compute capability
    ("8.9"), or vulkaninfo's device name (no memory: 0, no compute capability: "")."""

    name: str
    vram_mib: int
    compute_cap: str
    vendor: str = "nvidia"

    @property
    def cuda_arch(self) -> str:
        """The compute capability without the dot: "89" for 8.9, "120" for 12.0; "" where none was reported."""
        return self.compute_cap.replace(".", "") if re.fullmatch(r"\d+\.\d+", self.compute_cap) else ""


def nvidia_smi_query() -> str:
    """The command that lists a host's NVIDIA cards for parse_nvidia_smi (facts.NvidiaGpus and probe.py run it)."""
    return "nvidia-smi --query-gpu=name,memory.total,compute_cap --format=csv,noheader,nounits"


def parse_nvidia_smi(lines: list[str]) -> list[Found]:
    """nvidia-smi_query()'s answer, a card a line ("NVIDIA GeForce RTX 4080, 16376, 8.9"); other lines (an error,
    "[N/A]" memory) are left out. The name may hold commas: the last two fields are memory and capability."""
    found = []
    for line in lines:
        parts = [p.strip() for p in line.rsplit(",", 2)]
        if len(parts) == 3 and parts[0] and parts[1].isdigit() and re.fullmatch(r"\d+\.\d+", parts[2]):
            found.append(Found(parts[0], int(parts[1]), parts[2]))
    return found


def parse_vulkaninfo(lines: list[str]) -> list[Found]:
    """`vulkaninfo --summary`'s devices (its "GPU0:" blocks of "key = value" lines): the discrete GPUs, or the
    integrated ones when there is no discrete one (as ggml-vulkan picks them by default); CPU devices (Mesa's
    lavapipe) and other types are left out, and so are vendors other than NVIDIA, AMD and Intel. The summary reports
    no memory: vram_mib is 0 (learned() takes the table's figure for a card it knows)."""
    devices, current = [], None
    for line in lines:
        if re.fullmatch(r"GPU\d+:", line.strip()):
            current = {}
            devices.append(current)
        elif current is not None and "=" in line:
            key, _, value = line.partition("=")
            current[key.strip()] = value.strip()
        elif current is not None and line.strip() and not line.startswith((" ", "\t")):
            current = None  # the next section
    kept = {}
    for kind in ("DISCRETE_GPU", "INTEGRATED_GPU"):
        kept[kind] = [
            Found(d["deviceName"], 0, "", VULKAN_VENDORS[d.get("vendorID", "").lower()])
            for d in devices
            if d.get("deviceType", "").endswith(kind)
            and d.get("deviceName")
            and d.get("vendorID", "").lower() in VULKAN_VENDORS
        ]
    return kept["DISCRETE_GPU"] or kept["INTEGRATED_GPU"]


def _plain_name(name: str) -> str:
    """A card's name as the table keys it: lower case, without the vendor's words, trademarks and a driver's
    "(RADV NAVI31)" ("NVIDIA GeForce RTX 4080" -> "rtx 4080", "Intel(R) Arc(tm) A770 Graphics (DG2)" -> "arc a770")."""
    name = re.sub(r"\((r|tm)\)", "", name.lower())
    name = re.sub(r"\s*\([^)]*\)\s*$", "", name)
    words = [w for w in name.split() if w not in ("nvidia", "geforce", "amd", "radeon", "intel", "graphics")]
    return " ".join(words)


def table_entry(found: Found) -> Gpu | None:
    """The table's card that a learned one is: the same name (flexibly, _plain_name; ALIASES) of the same vendor,
    and, where the host reports memory, within MEMORY_TOLERANCE of the table's; None when the table has no such card."""
    key = _plain_name(found.name)
    gpu = KNOWN_GPUS.get(ALIASES.get(key, key))
    if gpu is None or gpu.vendor != found.vendor:
        return None
    if found.vram_mib and abs(found.vram_mib - gpu.vram_mib) > MEMORY_TOLERANCE * gpu.vram_mib:
        return None
    return gpu


def learned(found: Found) -> Gpu:
    """The Gpu of a card its host reported: the table's card (its name and bandwidth) with the memory and compute
    capability the host reported; or, for a card not in the table, what the host said, with the vendor's
    ASSUMED_BANDWIDTH_GBS (bandwidth_assumed)."""
    known = table_entry(found)
    if known is not None:
        return Gpu(
            known.name,
            (found.cuda_arch or known.cuda_arch) if known.vendor == "nvidia" else "",
            found.vram_mib or known.vram_mib,
            known.bandwidth_gbs,
            known.vendor,
        )
    return Gpu(
        found.name,
        found.cuda_arch if found.vendor == "nvidia" else "",
        found.vram_mib,
        ASSUMED_BANDWIDTH_GBS[found.vendor],
        found.vendor,
        bandwidth_assumed=True,
    )


def inventory_entry(gpu: Gpu) -> str | dict:
    """What the inventory's `gpus` would list for a learned card: its table name, or a dict of what the host said
    (bandwidth_gbs left for the user to add from the card's datasheet: the host does not report it)."""
    if not gpu.bandwidth_assumed:
        return gpu.name
    entry: dict = {"name": gpu.name}
    if gpu.vendor == "nvidia":
        entry["cuda_arch"] = gpu.cuda_arch
    else:
        entry["vendor"] = gpu.vendor
    if gpu.vram_mib:
        entry["vram_mib"] = gpu.vram_mib
    return entry


def mismatch(listed: tuple[Gpu, ...], found: list[Found], tool: str) -> str:
    """How the cards an inventory lists differ from those the host reports (tool: what reported them), in words;
    "" when they agree (the same number, and each listed card the table's entry of the found one, or of its name)."""
    have = [learned(f) for f in found]
    if len(have) == len(listed) and all(
        gpu.name.lower() == h.name.lower() or _plain_name(gpu.name) == _plain_name(h.name)
        for gpu, h in zip(listed, have)
    ):
        return ""
    names = lambda gpus: ", ".join(g.name for g in gpus) or "none"  # noqa: E731
    return f"gpus lists {len(listed)} ({names(listed)}), {tool} reports {len(have)} ({names(have)})"
