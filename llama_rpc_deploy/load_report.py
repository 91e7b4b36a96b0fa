"""llama-server's load report: what llama.cpp says it put on each device when it loaded the model.

llama-server logs (at --log-verbosity 4, the deploy's default) one line per buffer it allocates:
    load_tensors:   RPC0[172.30.57.11:50052] model buffer size =    23.55 MiB
    llama_kv_cache: RPC0[172.30.57.11:50052] KV buffer size =     8.00 MiB
    llama_memory_recurrent: RPC1[…] RS buffer size = …
and the vision projector's backend (`clip_ctx: CLIP using RPC0[…] backend`). Only the last load in
the log counts: a restarted server logs a new report.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

LOAD_START = re.compile(r"load_model: loading model|llama_model_loader: loaded meta data")
BUFFER = re.compile(
    r"(?P<device>[A-Za-z_]+\d*(?:\[[^\]]*\])?) (?P<kind>model|KV|RS) buffer size =\s*(?P<mib>[0-9.]+) MiB"
)
CLIP = re.compile(r"CLIP using (?P<device>\S+) backend")


@dataclass
class LoadReport:
    model: dict[str, float] = field(default_factory=dict)  # device -> MiB of weights
    kv: dict[str, float] = field(default_factory=dict)  # device -> MiB of KV cache and recurrent state
    clip_device: str | None = None

    def on(self, endpoint: str, kind: str = "model") -> list[float]:
        """MiB on the devices of the rpc-server at endpoint (each server numbers its own from RPC0)."""
        table = self.model if kind == "model" else self.kv
        return [mib for device, mib in sorted(table.items()) if device.endswith(f"[{endpoint}]")]


def parse(log: str) -> LoadReport:
    """The last load report in a llama-server log."""
    lines = log.splitlines()
    starts = [i for i, line in enumerate(lines) if LOAD_START.search(line)]
    report = LoadReport()
    for line in lines[starts[-1] if starts else 0 :]:
        match = BUFFER.search(line)
        if match:
            table = report.model if match["kind"] == "model" else report.kv
            table[match["device"]] = table.get(match["device"], 0.0) + float(match["mib"])
        clip = CLIP.search(line)
        if clip:
            report.clip_device = clip["device"]
    return report
