"""Models on demand on the lab: how long a switch between two models takes, with and without rpc-server's
tensor cache, each figure measured in one run.

    python3 -m benchmarks.model_switch [--rounds 3] [--out docs/results/model-switch.md]

Two generated models of the same shape (about 760 MB each, FFN tensors past rpc-server's 10 MiB
hash threshold, so they are cached) are served with llama_models next to the lab's own model, over
links limited to 1 Gbit/s (tc tbf, both directions), as between two home computers. In each round
and for each model: a request that names it while the other one is loaded (its time to first token
includes the switch: the router unloads the other model and loads this one across the workers), then
the next request's; then the switch alone (POST /models/load until /v1/models says loaded). "Without cache" empties every worker's cache folder before each switch; the two
kinds of round alternate. The lab's own settings are deployed again at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import urllib.error
from pathlib import Path

from benchmarks.labkit import INVENTORY, RESULTS, ROOT, deploy, lab_hosts, limit_links, on, sh
from lab import lab
from llama_rpc_deploy import client, render
from llama_rpc_deploy.bench import time_to_first_token
from llama_rpc_deploy.loading import offline_cluster
from lab.testmodel import Shape, write_model

FOLDER = "/models/switch"
SHAPE = Shape(n_layer=8, n_embd=2048, n_head=16, n_head_kv=8, n_ff=5632)  # FFN tensors 23 MB each
MODELS = ("switch-a", "switch-b")


def place(name: str, seed: int) -> int:
    local = ROOT / ".cache" / f"{name}.gguf"
    if not local.exists():
        write_model(local, Shape(**{**SHAPE.__dict__, "seed": seed}))
    if on("coordinator", f"test -s {FOLDER}/{name}.gguf && echo yes", check=False) != "yes":
        on("coordinator", f"mkdir -p {FOLDER} && chmod 755 {FOLDER}")
        sh("docker", "cp", str(local), f"{lab.PREFIX}-coordinator:{FOLDER}/{name}.gguf")
        on("coordinator", f"chmod 644 {FOLDER}/{name}.gguf")
    return local.stat().st_size


def switch(cluster, model: str, timeout: float = 600) -> float:
    """Seconds from asking the router to load `model` until it says the model is loaded."""
    start = time.monotonic()
    try:
        client.post(cluster, "/models/load", {"model": model})
    except urllib.error.HTTPError as error:
        raise RuntimeError(f"POST /models/load {model}: {error.code} {error.read()[:300]!r}") from None
    while time.monotonic() - start < timeout:
        states = {m["id"]: m["status"]["value"] for m in client.get(cluster, "/v1/models")["data"]}
        if states[model] == "loaded":
            return time.monotonic() - start
        time.sleep(0.05)
    raise TimeoutError(f"{model} not loaded after {timeout} s")


def empty_caches(cluster) -> None:
    for i, worker in enumerate(cluster.workers, start=1):
        on(f"worker{i}", f"find {render.cache_dir(worker)} -maxdepth 1 -type f -delete")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "model-switch.md")
    args = parser.parse_args()
    sizes = {name: place(name, seed) for seed, name in enumerate(MODELS, start=1)}
    models = {name: {"llama_model_path": f"{FOLDER}/{name}.gguf"} for name in MODELS}
    deploy(INVENTORY, f"llama_models={json.dumps(models)}")
    cluster = offline_cluster(INVENTORY, overrides={"llama_models": models})
    hosts = lab_hosts(cluster)
    limit_links(hosts)
    try:
        for name in MODELS:  # fill the caches once
            switch(cluster, name)
        figures: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            for cache in (True, False):  # the two kinds of round alternate
                kind = "with" if cache else "without"
                for name in MODELS:  # the other model is loaded: this request switches
                    if not cache:
                        empty_caches(cluster)
                    figures.setdefault(f"first_request_{kind}_cache_s", []).append(
                        time_to_first_token(cluster, model=name)
                    )
                    figures.setdefault(f"next_request_{kind}_cache_s", []).append(
                        time_to_first_token(cluster, model=name)
                    )
                for name in MODELS:  # the switch alone
                    if not cache:
                        empty_caches(cluster)
                    figures.setdefault(f"switch_{kind}_cache_s", []).append(switch(cluster, name))
    finally:
        limit_links(hosts, on_=False)
        deploy(INVENTORY)
    result = {
        "model_bytes": sizes[MODELS[0]],
        "workers": len(cluster.workers),
        "rounds": args.rounds,
        "link": "1gbit",
        **{k: round(statistics.median(v), 3) for k, v in figures.items()},
    }
    result["switch_with_over_without"] = round(result["switch_with_cache_s"] / result["switch_without_cache_s"], 3)
    print(json.dumps(result, indent=2))
    args.out.write_text(markdown(result))


def markdown(r: dict) -> str:
    rows = "\n".join(
        f"| {what} | {r[f'{key}_with_cache_s']:.2f} s | {r[f'{key}_without_cache_s']:.2f} s |"
        for what, key in (
            ("switch (load until loaded)", "switch"),
            ("first request naming the other model (time to first token, switch included)", "first_request"),
            ("the request after that", "next_request"),
        )
    )
    return f"""# Models on demand: switching models

`python3 -m benchmarks.model_switch` (about 10 minutes; the lab up, `python3 -m llama_rpc_deploy lab up`).

Two generated models of {r["model_bytes"] / 1e6:.0f} MB each, served with `llama_models` next to the lab's own
model, split across {r["workers"]} CPU workers and the coordinator, links limited to 1 Gbit/s. Medians of
{r["rounds"]} rounds per model; the rounds with and without the workers' tensor cache alternate
("without": every worker's cache folder emptied before each switch).

| | with the tensor cache | without |
| --- | --- | --- |
{rows}

Switch with the cache / without: **{r["switch_with_over_without"]}**.

```json
{json.dumps(r, indent=2)}
```
"""


if __name__ == "__main__":
    main()
