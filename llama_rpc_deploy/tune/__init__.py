"""`tune`: the fastest split of the layers, found by measuring it on the deployed cluster.

    python -m llama_rpc_deploy tune -i inventory.py [--objective generation|prompt|both] [--budget N] [--apply]

The planner splits by each card's datasheet bandwidth; real machines differ (PCIe lanes, the RPC hop, a busy
worker, a hot card). tune measures splits instead. A split is the layers on each place, in llama.cpp's order:
the coordinator's CPU first when llama_n_gpu_layers leaves layers there, then every device (each worker's, then
the coordinator's GPUs; the output layer always on the last). Only llama-server restarts for a candidate: its
launch script is rendered as the deploy renders it, with that split's llama_n_gpu_layers and llama_tensor_split,
and the front (HAProxy) drains and holds requests through each restart, so clients lose none. Workers, their
tensor caches and every other file stay. A candidate the planner finds too big for a card is never tried.

Each measurement: after a warm-up, llama-server's own timings for a short-prompt and a long-prompt completion
(generation tokens/s of both, the long prompt's processing tokens/s). The search (search.search) compares
candidates in alternation and keeps a move only when it is beyond the noise, then confirms the best against the
deployed split. At the end, or on Ctrl-C, the deployed launch script is put back and llama-server restarted.

When the model speculates (llama_spec_*), a second stage at the split the first one found measures whether to
speculate at all, and with which draft-token maximum: off, the deployed maximum halved and doubled, each compared
in turn with the best so far, the best then confirmed against the deployed settings (search.choose). Speculation
pays only where the drafts are accepted, so this stage measures on tune's own prompts: a workload of your own may
accept more or fewer.
"""

from __future__ import annotations

import json
import shlex
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .. import client, plan, render, roles, speculation
from ..bench import PLOT_HINT, can_plot, long_prompt, model_header
from ..cluster import Cluster
from ..loading import data_overrides, offline_cluster
from ..loadtest import until_serving
from ..remote import ssh_runner
from . import search

OBJECTIVES = ("generation", "prompt", "both")
KEYS = ("llama_n_gpu_layers", "llama_tensor_split")  # what a split sets (and --apply writes)


@dataclass(frozen=True)
class Layout:
    """How a split (layers per place) maps to llama-server's options, for one model and cluster."""

    n_layer: int
    devices: list  # plan.Device, in llama.cpp's order
    cpu: bool  # the coordinator's CPU is the first place (llama_n_gpu_layers leaves layers there)

    @property
    def places(self) -> list[str]:
        return (["CPU (coordinator)"] if self.cpu else []) + [f"{d.name} ({d.host})" for d in self.devices]

    def settings(self, split: tuple[int, ...]) -> dict:
        """llama_n_gpu_layers and llama_tensor_split for split: the device counts, the output layer on the
        last device (plan.render_shares); with the CPU place, the layers not offloaded are its count."""
        on_devices = list(split[1:] if self.cpu else split)
        return {
            "llama_n_gpu_layers": sum(on_devices) + 1 if self.cpu else 999,
            "llama_tensor_split": plan.render_shares(on_devices),
        }


def layout_of(cluster: Cluster, model) -> tuple[Layout, tuple[int, ...]]:
    """The places and the deployed split (as the planner places it: plan_cluster)."""
    capacity = plan.plan_cluster(cluster, model)
    counts = [len(p.layers) for p in capacity.placements]
    on_cpu = model.n_layer - sum(counts)
    layout = Layout(n_layer=model.n_layer, devices=[p.device for p in capacity.placements], cpu=on_cpu > 0)
    return layout, tuple(([on_cpu] if layout.cpu else []) + counts)


def fits(cluster: Cluster, model, layout: Layout, split: tuple[int, ...]) -> bool:
    """Whether every card holds its share (plan.place; a CPU device has no check, as in `plan`). The last
    device must hold at least the output layer, which it always does."""
    s = layout.settings(split)
    placements, _ = plan.place(
        model,
        layout.devices,
        [float(x) for x in s["llama_tensor_split"]],
        plan.context_of(cluster.settings),
        s["llama_n_gpu_layers"],
    )
    got = [len(p.layers) for p in placements]
    return got == list(split[1:] if layout.cpu else split) and all(
        p.fits or not p.device.vram_bytes for p in placements
    )


@dataclass
class Sample:
    generation: float  # tokens/s: the mean of the short- and the long-prompt completion's generation
    prompt: float  # tokens/s: the long prompt's processing

    def value(self, objective: str) -> float:
        if objective == "generation":
            return self.generation
        if objective == "prompt":
            return self.prompt
        return (self.generation * self.prompt) ** 0.5


def sample(cluster: Cluster, n_predict: int = 32, long_repeats: int = 12) -> Sample:
    """One measurement of the split being served: a warm-up, then llama-server's own timings."""
    client.complete(cluster, "warm up", 4)
    short = client.complete(cluster, "Once upon a time", n_predict, ignore_eos=True)["timings"]
    prompt = long_prompt(cluster, long_repeats, room=n_predict + 16)
    long = client.complete(cluster, prompt, n_predict, ignore_eos=True)["timings"]
    return Sample(
        generation=(short["predicted_per_second"] + long["predicted_per_second"]) / 2, prompt=long["prompt_per_second"]
    )


@dataclass
class Server:
    """llama-server on the coordinator, switched between splits by its launch script (as rendered by the deploy)."""

    cluster: Cluster
    inventory: Path
    run: Callable  # deployment.ssh_runner's
    layout: Layout
    overrides: dict = field(default_factory=dict)  # --data, as the deploy had it
    extra: dict = field(default_factory=dict)  # settings of the candidate beside its split (the speculation stage's)
    deployed_script: str = ""
    image: str = ""
    loaded: tuple | None = None  # (split, extra's items) of what llama-server runs now
    switch_seconds: list[float] = field(default_factory=list)

    @property
    def script_path(self) -> str:
        return roles.coordinator(self.cluster).launch_script

    def ssh(self, command: str, input: str | None = None, timeout: float = 600) -> str:
        result = self.run(self.cluster.coordinator.name, command, input=input, timeout=timeout)
        if result.returncode != 0:
            raise RuntimeError(f"{self.cluster.coordinator.name}: `{command}` failed: {result.stderr.strip()[-400:]}")
        return result.stdout

    def start(self, split: tuple[int, ...]) -> None:
        """Remember what is deployed: the launch script and the image the running llama-server came from."""
        self.deployed_script = self.ssh(f"cat {shlex.quote(self.script_path)}")
        self.image = self.ssh("docker inspect --format '{{.Config.Image}}' llama-server").strip()
        if not self.image:
            raise RuntimeError("llama-server is not running on the coordinator: deploy first")
        rendered = render.coordinator_files(offline_cluster(self.inventory, overrides=self.overrides), self.image)[
            self.script_path
        ]
        if rendered != self.deployed_script:  # the split measured as the start must be the one running
            raise RuntimeError(
                f"{self.cluster.coordinator.name}: {self.script_path} is not what {self.inventory} "
                "(with these --data) renders: expected the settings deployed; deploy first, or "
                "give tune the deploy's --data"
            )
        self.loaded = (split, ())

    def script(self, split: tuple[int, ...]) -> str:
        overrides = {**self.overrides, **self.layout.settings(split), **self.extra}
        return render.coordinator_files(offline_cluster(self.inventory, overrides=overrides), self.image)[
            self.script_path
        ]

    def restart_with(self, text: str, bound: float) -> None:
        path = shlex.quote(self.script_path)
        self.ssh(
            f"cat > {path}.tune && chmod 755 {path}.tune && mv {path}.tune {path} && "
            f"systemctl restart {roles.COORDINATOR_UNIT}",
            input=text,
        )
        if until_serving(self.cluster, bound, expect_down=False).seconds is None:
            raise RuntimeError(f"llama-server did not serve within {bound:.0f} s of its restart")

    def switch(self, split: tuple[int, ...]) -> None:
        wanted = (split, tuple(sorted(self.extra.items())))
        if wanted == self.loaded:
            return
        began = time.monotonic()
        self.restart_with(self.script(split), self.cluster.settings["llama_health_timeout"])
        self.loaded = wanted
        self.switch_seconds.append(time.monotonic() - began)

    def restore(self) -> None:
        """The deployed launch script back, and llama-server restarted on it (when a candidate was loaded)."""
        if self.deployed_script and self.ssh(f"cat {shlex.quote(self.script_path)}") != self.deployed_script:
            self.restart_with(self.deployed_script, self.cluster.settings["llama_health_timeout"])


@dataclass
class Report:
    layout: Layout
    start: tuple[int, ...]
    objective: str
    result: search.TuneResult | None = None
    sweep: dict | None = None  # split -> values, for an exhaustive sweep
    samples: list[dict] = field(default_factory=list)  # every measurement: split, generation, prompt, value
    switch_seconds: list[float] = field(default_factory=list)
    speculation: search.TuneResult | None = None  # the speculation stage's, its keys (draft-token max,), 0 = off
    spec_split: tuple[int, ...] | None = None  # the split it measured at
    spec_samples: list[dict] = field(default_factory=list)  # its measurements: max, generation, prompt, value
    spec_names: dict = field(default_factory=dict)  # (max,) -> what it means ("off", "deployed: max 3", ...)

    @property
    def places(self) -> list[str]:
        return self.layout.places

    def by_split(self) -> dict[tuple[int, ...], list[float]]:
        out: dict[tuple[int, ...], list[float]] = {}
        for s in self.samples:
            out.setdefault(tuple(s["split"]), []).append(s["value"])
        return out

    def table(self) -> str:
        rows = [
            f"{'split (' + ', '.join(self.places) + ')':<48} {'runs':>4} {self.objective + ' tokens/s':>22} {'vs deployed':>11}"
        ]
        base = statistics.median(self.by_split().get(self.start, [0.0])) or None
        for split, values in sorted(self.by_split().items(), key=lambda kv: -statistics.median(kv[1])):
            m = statistics.median(values)
            mark = " (deployed)" if split == self.start else ""
            rows.append(f"{str(list(split)) + mark:<48} {len(values):>4} {m:>22.1f} {(m / base if base else 0):>11.3f}")
        if self.switch_seconds:
            rows.append(
                f"a candidate's switch (llama-server restarted with it, serving again): median "
                f"{statistics.median(self.switch_seconds):.1f} s over {len(self.switch_seconds)}"
            )
        r = self.result
        if r:
            verdict = "beyond the noise" if r.significant else "within the noise: nothing to change"
            rows.append(
                f"best: {list(r.best)}, {r.gain:.3f}x the deployed split {list(r.start)} "
                f"(95% interval {r.interval[0]:.3f} to {r.interval[1]:.3f}): {verdict}"
            )
            rows.append(f"search: {len(r.measurements)} measurements; {r.reason}")
        rows += self.speculation_table()
        return "\n".join(rows)

    def speculation_table(self) -> list[str]:
        r = self.speculation
        if r is None:
            return []
        by: dict[tuple, list[float]] = {}
        for s in self.spec_samples:
            by.setdefault((s["max"],), []).append(s["value"])
        base = statistics.median(by.get(r.start, [0.0])) or None
        rows = [
            f"{'speculation at ' + str(list(self.spec_split)):<48} {'runs':>4} "
            f"{self.objective + ' tokens/s':>22} {'vs deployed':>11}"
        ]
        for key, values in sorted(by.items(), key=lambda kv: -statistics.median(kv[1])):
            m = statistics.median(values)
            rows.append(f"{self.spec_names[key]:<48} {len(values):>4} {m:>22.1f} {(m / base if base else 0):>11.3f}")
        verdict = "beyond the noise" if r.significant else "within the noise: nothing to change"
        rows.append(
            f"speculation: best {self.spec_names[r.best]}, {r.gain:.3f}x the deployed "
            f"{self.spec_names[r.start]} (95% interval {r.interval[0]:.3f} to {r.interval[1]:.3f}): {verdict}"
        )
        return rows

    def to_json(self) -> str:
        r = self.result
        return json.dumps(
            {
                "places": self.places,
                "start": list(self.start),
                "objective": self.objective,
                "best": list(r.best) if r else None,
                "gain": r.gain if r else None,
                "interval": list(r.interval) if r else None,
                "significant": r.significant if r else None,
                "reason": r.reason if r else None,
                "samples": self.samples,
                "switch_seconds": [round(s, 2) for s in self.switch_seconds],
                "speculation": {
                    "split": list(self.spec_split),
                    "start": self.spec_names[self.speculation.start],
                    "best": self.spec_names[self.speculation.best],
                    "gain": self.speculation.gain,
                    "interval": list(self.speculation.interval),
                    "significant": self.speculation.significant,
                    "samples": self.spec_samples,
                }
                if self.speculation
                else None,
            },
            indent=1,
        )

    def plot(self, path: Path) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        by = sorted(self.by_split().items())
        fig, ax = plt.subplots(figsize=(max(6.4, 0.5 * len(by)), 4.2), dpi=100)
        for i, (split, values) in enumerate(by):
            color = (
                "tab:green"
                if self.result and split == self.result.best
                else ("tab:orange" if split == self.start else "tab:blue")
            )
            ax.plot([i] * len(values), values, "o", color=color, alpha=0.6)
            ax.plot([i - 0.3, i + 0.3], [statistics.median(values)] * 2, "-", color=color)
        ax.set_xticks(range(len(by)), [",".join(map(str, s)) for s, _ in by], rotation=60, fontsize=8)
        ax.set_xlabel("layers per place: " + ", ".join(self.places))
        ax.set_ylabel(f"{self.objective} tokens/s")
        ax.set_title("llama-rpc tune: deployed (orange), best (green)")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)


def measurer(server: Server, report: Report, objective: str, log: Callable[[str], None]) -> Callable:
    def measure(split: tuple[int, ...]) -> float:
        server.switch(split)
        s = sample(server.cluster)
        value = s.value(objective)
        report.samples.append(
            {
                "split": list(split),
                "generation": round(s.generation, 2),
                "prompt": round(s.prompt, 2),
                "value": round(value, 2),
                "at": round(time.time(), 1),
            }
        )
        log(f"  {list(split)}: {objective} {value:.1f} tokens/s")
        return value

    return measure


def spec_names(settings: dict) -> dict[tuple[int], str]:
    """What each key of the speculation stage means: (0,) off, (n,) at most n draft tokens; the deployed key first."""
    found = speculation.bounds(settings)
    kind = settings["llama_spec_type"] or "draft"
    start = (found[1] if found else 1,)
    names = {start: f"{kind}" + (f", max {found[1]}" if found else "") + " (deployed)"}
    for n in speculation.max_candidates(settings):
        names.setdefault((n,), "off" if n == 0 else f"{kind}, max {n}")
    return names


def spec_overrides(settings: dict, start: tuple[int], key: tuple[int]) -> dict:
    """The settings beside the split for a key of the speculation stage (none for the deployed one)."""
    return {} if key == start else speculation.with_max(settings, key[0])


def tune_speculation(
    server: Server, report: Report, split: tuple[int, ...], repeats: int, confirm: int, log: Callable[[str], None]
) -> None:
    """The speculation stage at split: report.speculation, report.spec_samples (the deployed settings restored in
    server.extra when it returns or raises)."""
    settings = server.cluster.settings
    names = spec_names(settings)
    start = next(iter(names))
    report.spec_split, report.spec_names = split, names

    def measure(key: tuple[int]) -> float:
        server.extra = spec_overrides(settings, start, key)
        server.switch(split)
        s = sample(server.cluster)
        value = s.value(report.objective)
        report.spec_samples.append(
            {
                "max": key[0],
                "generation": round(s.generation, 2),
                "prompt": round(s.prompt, 2),
                "value": round(value, 2),
            }
        )
        log(f"  {names[key]}: {report.objective} {value:.1f} tokens/s")
        return value

    log(f"speculation at {list(split)}: {', '.join(names.values())}")
    try:
        report.speculation = search.choose(
            start, [k for k in names if k != start], measure, repeats=repeats, confirm=confirm, log=log
        )
    finally:
        server.extra = {}


def run(
    inventory: Path,
    *,
    objective: str = "generation",
    budget: int = 30,
    repeats: int = 3,
    confirm: int = 5,
    sweep: bool = False,
    model: Path | None = None,
    overrides: dict | None = None,
    only: str | None = None,
    log: Callable[[str], None] = print,
) -> Report:
    """Tune (or, with sweep, measure every split that fits, `repeats` rounds, each round in a new order) on the
    deployed cluster (as the inventory, with overrides as the deploy's --data, says), then, when the model
    speculates, the speculation stage at the best split; `only` ("split" or "speculation") runs one stage. The
    deployed launch script is back in place when it returns or raises."""
    if objective not in OBJECTIVES:
        raise ValueError(f"--objective {objective!r}: expected one of {', '.join(OBJECTIVES)}")
    overrides = overrides or {}
    cluster = offline_cluster(inventory, overrides=overrides)
    if cluster.router:
        raise ValueError(
            "tune measures one model's split: with llama_models (models on demand) set, expected "
            "llama_models empty while tuning (tune the model alone, then add the others)"
        )
    if only == "speculation" and not speculation.enabled(cluster.settings):
        raise ValueError(
            "--only speculation: the model does not speculate (llama_spec_type and llama_spec_draft_path are "
            "None): expected one of them set, as deployed"
        )
    header = model_header(cluster, inventory, model)
    if cluster.settings["llama_spec_draft_path"]:
        # the deploy renders the draft's own type, read from its header, and a Gemma 4 assistant on the device of
        # the KV it reads, as the planner places it (phases/checks.settle): so does tune
        draft = model_header(cluster, inventory, None, "llama_spec_draft_path")
        placed = plan.plan_cluster(cluster, header, draft=draft).draft
        overrides = {**overrides, **speculation.settled(cluster.settings, placed)}
        cluster = offline_cluster(inventory, overrides=overrides)
    layout, start = layout_of(cluster, header)
    ok = lambda split: fits(cluster, header, layout, split)  # noqa: E731
    report = Report(layout=layout, start=start, objective=objective)
    if not cluster.settings.get("llama_front_hold_seconds"):
        log("note: no front: the API is down while llama-server restarts with each candidate")
    with ssh_runner(inventory) as ssh:
        server = Server(cluster=cluster, inventory=inventory, run=ssh, layout=layout, overrides=overrides)
        server.start(start)
        measure = measurer(server, report, objective, log)
        try:
            if only == "speculation":
                pass
            elif sweep:
                candidates = search.all_splits(sum(start), len(start), ok)
                log(f"sweep: {len(candidates)} splits that fit, {repeats} rounds")
                for r in range(repeats):
                    for split in candidates if r % 2 == 0 else candidates[::-1]:
                        measure(split)
                report.sweep = {",".join(map(str, k)): v for k, v in report.by_split().items()}
            else:
                log(
                    f"tune: from the deployed split {list(start)} ({', '.join(layout.places)}), at most {budget} "
                    f"measurements"
                )
                report.result = search.search(
                    start, ok, measure, budget=budget, repeats=repeats, confirm=confirm, log=log
                )
            if only != "split" and speculation.enabled(cluster.settings):
                best = report.result.best if report.result else start
                tune_speculation(server, report, best, repeats, confirm, log)
        finally:
            report.switch_seconds = server.switch_seconds
            log("putting the deployed split back")
            server.restore()
    return report


def apply(inventory: Path, report: Report) -> list[Path]:
    """Write the best split, and the speculation stage's best settings, into the group_data file each belongs in
    (writeback), with what was measured and when: the files written (none when no gain was beyond the noise)."""
    from . import writeback

    r, written = report.result, []
    if r is not None and r.significant and r.best != r.start:
        path = writeback.target_file(offline_cluster(inventory), inventory, KEYS)
        comment = (
            f"{time.strftime('%Y-%m-%d')}, {report.objective} tokens/s {r.gain:.3f}x the split "
            f"{list(r.start)} ({r.interval[0]:.3f} to {r.interval[1]:.3f}), layers per place: "
            f"{', '.join(report.places)} = {list(r.best)}"
        )
        writeback.write_settings(path, report.layout.settings(r.best), comment)
        written.append(path)
    s = report.speculation
    if s is not None and s.significant and s.best != s.start:
        cluster = offline_cluster(inventory)
        values = speculation.with_max(cluster.settings, s.best[0])
        path = writeback.target_file(
            cluster, inventory, list(dict.fromkeys([*speculation.KEYS, *values]))
        )  # where the others are
        comment = (
            f"{time.strftime('%Y-%m-%d')}, {report.objective} tokens/s {s.gain:.3f}x "
            f"{report.spec_names[s.start]} ({s.interval[0]:.3f} to {s.interval[1]:.3f}): "
            f"{report.spec_names[s.best]}"
        )
        writeback.write_settings(path, values, comment)
        written.append(path)
    return written


def command(args) -> int:
    """`llama-rpc tune`: the report (and --json, --png); --apply writes the best split into group_data."""
    if args.png and not can_plot():
        print(f"error: {PLOT_HINT}", file=sys.stderr)
        return 2
    unlearned = offline_cluster(args.inventory, overrides=data_overrides(args.data)).unlearned
    if unlearned:  # tune renders the launch script from the inventory alone, and compares it with the deployed one
        print(
            f"error: tune: gpus is not set for {', '.join(h.name for h in unlearned)}: tune renders llama-server's "
            f"launch script from the inventory alone: expected gpus listed (llama-rpc probe -i {args.inventory} "
            "prints the lines to paste)",
            file=sys.stderr,
        )
        return 2
    try:
        report = run(
            args.inventory,
            objective=args.objective,
            budget=args.budget,
            repeats=args.repeats,
            sweep=args.sweep,
            model=args.model,
            overrides=data_overrides(args.data),
            only=args.only,
        )
    except KeyboardInterrupt:
        print("tune: stopped; the deployed split is back in place", file=sys.stderr)
        return 130
    print(report.table())
    if args.json:
        args.json.write_text(report.to_json() + "\n")
    if args.png:
        report.plot(args.png)
    if args.apply:
        written = apply(args.inventory, report)
        print(
            f"written to {', '.join(map(str, dict.fromkeys(written)))}: deploy again to use it (only llama-server restarts)"
            if written
            else "nothing written: nothing beyond the noise"
        )
    return 0
