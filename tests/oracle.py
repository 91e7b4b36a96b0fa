"""llama.cpp's own memory estimator as the planner's oracle.

`llama-fit-params --fit-print on` (tools/fit-params in the pinned tree) loads a model without
allocating it and prints, per device, the MiB of weights ("model"), KV cache and recurrent state
("context") and compute buffers that llama.cpp would allocate. Two rpc-servers on loopback stand in
for two GPUs, so the figures are per RPC device, exactly the devices a deploy splits across.

The grid: every family of tests/families.py (shaped sparse GGUF headers of real models), f16 and
q8_0 KV, flash attention on and off, 1 and 4 slots, contexts from 4K to 256K: 248 cases. (Quantized V
needs flash attention, so with it off the q8_0 case quantizes K only; the MLA model refuses that mix,
so it has f16 only without flash attention.) `--kv-unified` is not an option of
llama-fit-params in the pinned tree, so the unified cache is checked against llama-server's own load
report on the lab instead (tests/e2e/test_lab_split_model.py).

    python3 -m tests.oracle BIN_DIR tests/oracle_fit_params.json   # the grid with local binaries
    python3 -m tests.oracle BIN_DIR tests/oracle_fit_params.json FAMILY...   # only these families' cases, merged
                                                                             # into the recorded files, the rest kept

tests/oracle_fit_params.json holds the figures of the pinned llama.cpp (b11312), recorded that way,
for the unit tests (tests/unit/test_plan_oracle.py); the e2e test runs the same grid live with the
binaries of the lab's image (tests/e2e/test_lab_fit_params.py). Re-record after changing the pin.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from llama_rpc_deploy.gguf_header import ModelInfo
from llama_rpc_deploy.plan import MIB, Context, Device, draft_memory, place

from .families import FAMILIES

CONTEXTS = (4096, 32768, 131072, 262144)
KV_TYPES = {True: (("f16", "f16"), ("q8_0", "q8_0")), False: (("f16", "f16"), ("q8_0", "f16"))}
MLA = {"deepseek2"}  # llama.cpp wants K and V of one type there, and a quantized V wants flash attention
SHARES = (1, 1)  # -ts 1,1: half the layers on each device, the output layer on the second
PORTS = (50190, 50191)
TOLERANCE = 0.03
SLACK_MIB = 1  # llama-fit-params prints whole MiB (rounded down)


@dataclass(frozen=True)
class Case:
    family: str
    ctx: int
    parallel: int
    type_k: str
    type_v: str
    flash_attn: bool

    @property
    def key(self) -> str:
        return (
            f"{self.family} c={self.ctx} np={self.parallel} k={self.type_k} v={self.type_v} "
            f"fa={'on' if self.flash_attn else 'off'}"
        )

    def args(self, model: str, rpc: str) -> list[str]:
        return [
            "-m",
            model,
            "--rpc",
            rpc,
            "-ngl",
            "999",
            "-ts",
            ",".join(map(str, SHARES)),
            "-c",
            str(self.ctx),
            "-np",
            str(self.parallel),
            "-ctk",
            self.type_k,
            "-ctv",
            self.type_v,
            "-fa",
            "on" if self.flash_attn else "off",
            "--fit-print",
            "on",
        ]

    def context(self) -> Context:
        return Context(
            ctx=self.ctx, parallel=self.parallel, type_k=self.type_k, type_v=self.type_v, flash_attn=self.flash_attn
        )


def grid(families=tuple(FAMILIES)) -> list[Case]:
    return [
        Case(f, ctx, np, tk, tv, fa)
        for f in families
        for ctx in CONTEXTS
        for np in (1, 4)
        for fa in (True, False)
        for tk, tv in KV_TYPES[fa]
        if fa or f not in MLA or tk == tv
    ]


@dataclass(frozen=True)
class DraftCase:
    """A family as a draft model where the deploy puts one by default: whole on one device of its own (the
    coordinator's last GPU, --spec-draft-ngl all; a loopback rpc-server stands in for it), with the target's context
    and slots (llama-server fits a draft with these, common_fit_extra_model). (On a CPU llama.cpp counts no weights:
    they stay mapped from the file.)"""

    family: str
    ctx: int
    parallel: int

    @property
    def key(self) -> str:
        return f"draft {self.family} c={self.ctx} np={self.parallel}"

    def args(self, model: str, rpc: str = "") -> list[str]:
        first = rpc.split(",")[0]
        return [
            "-m",
            model,
            "--rpc",
            first,
            "-ngl",
            "999",
            "-c",
            str(self.ctx),
            "-np",
            str(self.parallel),
            "--fit-print",
            "on",
        ]

    def context(self) -> Context:
        return Context(ctx=self.ctx, parallel=self.parallel)


def draft_grid(families=tuple(FAMILIES)) -> list[DraftCase]:
    return [DraftCase(f, ctx, np) for f in families for ctx in (4096, 32768) for np in (1, 4)]


def parse(stdout: str) -> dict[str, dict[str, int]]:
    """llama-fit-params' lines 'DEVICE model context compute' (MiB) -> {device: {model, context, compute}}."""
    out = {}
    for line in stdout.splitlines():
        words = line.split()
        if len(words) == 4 and all(w.isdigit() for w in words[1:]):
            out[words[0]] = dict(zip(("model", "context", "compute"), map(int, words[1:])))
    return out


def script(cases: list[Case], folder: str, bin_dir: str = "") -> str:
    """A sh script that starts two loopback rpc-servers and prints each case's estimate after a
    '== KEY' line (the binaries on PATH, or in bin_dir)."""
    b = f"{bin_dir.rstrip('/')}/" if bin_dir else ""
    rpc = ",".join(f"127.0.0.1:{p}" for p in PORTS)
    lines = [
        "set -u",
        f'rpc="{b}ggml-rpc-server"; [ -x "$rpc" ] || rpc="{b}rpc-server"',
        *[f'"$rpc" -H 127.0.0.1 -p {p} >/dev/null 2>&1 & pids="${{pids:-}} $!"' for p in PORTS],
        "sleep 2",
    ]
    for case in cases:
        args = " ".join(case.args(f"{folder}/{case.family}.gguf", rpc))
        lines += [f"echo '== {case.key}'", f"{b}llama-fit-params {args} 2>/dev/null || echo FAILED"]
    lines.append("kill $pids; wait 2>/dev/null; true")
    return "\n".join(lines) + "\n"


def results(stdout: str) -> dict[str, dict[str, dict[str, int]]]:
    """The script's output -> {case key: parse()}."""
    out, key, chunk = {}, None, []
    for line in stdout.splitlines() + ["== end"]:
        if line.startswith("== "):
            if key is not None:
                out[key] = parse("\n".join(chunk))
            key, chunk = line[3:], []
        else:
            chunk.append(line)
    return out


def planned(model: ModelInfo, case: Case) -> dict[str, dict[str, float]]:
    """The planner's figures for the same case, in MiB per RPC device."""
    devices = [Device(f"RPC{i}", "loopback", "CPU", 0, 1e9) for i in range(len(SHARES))]
    placements, _ = place(model, devices, [float(s) for s in SHARES], case.context())
    return {p.device.name: {"model": p.weights / MIB, "context": p.kv / MIB} for p in placements}


def draft_planned(model: ModelInfo, case: DraftCase) -> dict[str, dict[str, float]]:
    """The planner's figures for a draft on a device of its own (plan.draft_memory), in MiB."""
    d = draft_memory(model, "draft-simple", "RPC0", case.context())
    return {"RPC0": {"model": d.weights / MIB, "context": d.kv / MIB}, "Host": {"model": d.input_bytes / MIB}}


def mismatches(model: ModelInfo, case: Case | DraftCase, oracle: dict[str, dict[str, int]]) -> list[str]:
    """Every (device, figure) where the planner is off llama.cpp's by more than 3% (and 1 MiB)."""
    bad = []
    mine = draft_planned(model, case) if isinstance(case, DraftCase) else planned(model, case)
    if set(mine) - set(oracle):
        return [f"{case.key}: llama-fit-params printed no figures for {sorted(set(mine) - set(oracle))}: {oracle}"]
    for device, figures in mine.items():
        for what, value in figures.items():
            expected = oracle[device][what]
            if abs(value - expected) > max(TOLERANCE * expected, SLACK_MIB):
                bad.append(f"{case.key}: {device} {what}: planner {value:.0f} MiB, llama.cpp {expected} MiB")
    return bad


def main(argv: list[str]) -> None:
    import subprocess
    import tempfile

    bin_dir, out, *only = argv
    unknown = set(only) - set(FAMILIES)
    if unknown:
        sys.exit(f"unknown families {sorted(unknown)}: expected some of {', '.join(FAMILIES)}")
    families = tuple(only) or tuple(FAMILIES)
    with tempfile.TemporaryDirectory() as folder:
        for name in families:
            FAMILIES[name](Path(folder) / f"{name}.gguf")
        for every, path in ((grid(), Path(out)), (draft_grid(), Path(out).with_name(DRAFTS_RECORDED.name))):
            cases = [c for c in every if c.family in families]
            stdout = subprocess.run(
                ["sh", "-c", script(cases, folder, str(Path(bin_dir).resolve()))],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            found = results(stdout)
            kept = json.loads(path.read_text()) if only and path.exists() else {}
            figures = {c.key: found.get(c.key) if c.family in families else kept.get(c.key) for c in every}
            write_figures(path, {key: value for key, value in figures.items() if value is not None or key in found})


RECORDED = Path(__file__).with_name("oracle_fit_params.json")
DRAFTS_RECORDED = Path(__file__).with_name("oracle_draft_fit_params.json")


def write_figures(path: Path, figures: dict) -> None:
    """{case key: llama-fit-params' figures}, one case a line."""
    lines = [f" {json.dumps(key)}: {json.dumps(value, sort_keys=True)}" for key, value in figures.items()]
    path.write_text("{\n" + ",\n".join(lines) + "\n}\n")


if __name__ == "__main__":
    main(sys.argv[1:])
