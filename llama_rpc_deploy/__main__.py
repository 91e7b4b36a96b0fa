"""llama-rpc COMMAND, or python -m llama_rpc_deploy COMMAND   (each command runs the module of the same name)

  lab up [--workers N]     the local lab (containers that behave like hosts); writes .lab/inventory.py
  lab down                 remove everything the lab made
  lab pin | lab unpin      each lab host on its own core (for measurements) / back on all cores
  complete [-i INVENTORY]  ask the deployed llama-server for a completion; print it and tokens/s
  bench [-i INVENTORY] [--streams 1,2,4] [--json OUT] [--png OUT] [--model LOCAL.gguf]
                           tokens/s for 1 and N parallel streams against the planner's ceiling,
                           time to first token after idle sleep; a table, JSON, a PNG plot
  plan [-i INVENTORY | --gpus GPU...] [--model LOCAL.gguf] [--mmproj LOCAL.gguf] [--data KEY=VALUE]
                           the capacity planner, offline: per device layers, weights, KV cache, free memory;
                           the tokens/s ceiling; exits 2 when something does not fit
  status [-i INVENTORY] [--json]  every host's services, restarts and their cause, image, RPC protocol,
                           tensor cache, GPU memory; the load report per device; whether the API answers;
                           exits 1 when something is wrong
  tune [-i INVENTORY] [--objective generation|prompt|both] [--budget N] [--apply] [--json OUT] [--png OUT]
                           the fastest split of the layers, measured on the deployed cluster (only llama-server
                           restarts, behind the front); --apply writes it into group_data; --sweep measures them all
  settings [--write-readme]  the settings table (Markdown), from the schema
  testmodel OUT.gguf       write a small random-weight llama GGUF
lab and testmodel run in a checkout (its lab/ folder is not installed with the package).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from . import client, gguf_header, plan, settings
from .cluster_checks import no_example_addresses
from .deployment import data_overrides, gpus_inventory, group_data_folders, offline_cluster
from .settings import PLACEHOLDER, SettingsError


def complete(inventory: Path, prompt: str, n_predict: int, timeout: float = 300, model: str | None = None) -> dict:
    return client.complete(offline_cluster(inventory), prompt, n_predict, timeout=timeout, model=model)


def find_checkout(start: Path | None = None) -> Path | None:
    """The checkout that holds the lab: the current folder or the first one above it with
    lab/host.Dockerfile and lab/lab.py in it."""
    start = (start or Path.cwd()).resolve()
    for folder in (start, *start.parents):
        if (folder / "lab" / "host.Dockerfile").is_file() and (folder / "lab" / "lab.py").is_file():
            return folder
    return None


def checkout_module(name: str, usage: str):
    """lab.lab or lab.testmodel, imported from the checkout (put on sys.path when it is not there, as
    for the installed `llama-rpc` command run in a checkout); None, with one line said, outside one."""
    checkout = find_checkout()
    if checkout is None:
        print(f"error: {usage.split()[0]} needs a checkout of llama-rpc-deploy (its lab/ folder is not "
              f"installed with the package): run `python3 -m llama_rpc_deploy {usage}` there", file=sys.stderr)
        return None
    if str(checkout) not in sys.path:
        sys.path.insert(0, str(checkout))
    import importlib
    return importlib.import_module(name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llama-rpc", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_lab = sub.add_parser("lab")
    p_lab.add_argument("action", choices=("up", "down", "pin", "unpin"))
    p_lab.add_argument("--workers", type=int, default=1)
    p_complete = sub.add_parser("complete")
    p_complete.add_argument("-i", "--inventory", type=Path, default=Path("inventory.py"))
    p_complete.add_argument("--prompt", default="Two computers, one model:")
    p_complete.add_argument("-n", "--n-predict", type=int, default=32)
    p_complete.add_argument("--model", help="with llama_models: the model to answer (default: llama_model_path's)")
    p_bench = sub.add_parser("bench")
    p_bench.add_argument("-i", "--inventory", type=Path, default=Path("inventory.py"))
    p_bench.add_argument("--streams", default="1,2,4", help="parallel streams to measure, comma separated")
    p_bench.add_argument("--json", type=Path, help="write the figures here")
    p_bench.add_argument("--png", type=Path, help="plot tokens/s against streams, with the ceiling, here")
    p_bench.add_argument("--model", type=Path, help="a local copy of the GGUF (default: its header is read "
                                                    "on the coordinator over SSH)")
    p_bench.add_argument("--sleep-wait", type=float, default=300,
                         help="at most this many seconds to wait for the server to fall asleep")
    p_plan = sub.add_parser("plan")
    p_plan.add_argument("-i", "--inventory", type=Path, default=Path("inventory.py"))
    p_plan.add_argument("--model", type=Path, help="a local copy of the GGUF file (default: llama_model_path, "
                                                    "when this machine has it); a split model's first shard")
    p_plan.add_argument("--mmproj", type=Path, help="a local copy of llama_mmproj_path's file")
    p_plan.add_argument("--data", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting for this plan only, as pyinfra's --data takes it (e.g. llama_ctx_size=131072)")
    p_plan.add_argument("--gpus", nargs="+", metavar="GPU",
                        help="plan without an inventory: the coordinator's GPU, then one per worker "
                             '(e.g. --gpus "RTX 4080" "RTX 5060 Ti 16GB"; names from llama_rpc_deploy/gpus.py)')
    p_status = sub.add_parser("status")
    p_status.add_argument("-i", "--inventory", type=Path, default=Path("inventory.py"))
    p_status.add_argument("--json", action="store_true", help="the same, as JSON")
    p_tune = sub.add_parser("tune")
    p_tune.add_argument("-i", "--inventory", type=Path, default=Path("inventory.py"))
    p_tune.add_argument("--objective", choices=("generation", "prompt", "both"), default="generation",
                        help="what to make faster: generation tokens/s, prompt processing, or both (their geometric mean)")
    p_tune.add_argument("--budget", type=int, default=30, help="at most this many measurements (each restarts llama-server)")
    p_tune.add_argument("--repeats", type=int, default=3, help="measurements of each side of a comparison (with --sweep: rounds)")
    p_tune.add_argument("--apply", action="store_true", help="write the best split into group_data when it is beyond the noise")
    p_tune.add_argument("--sweep", action="store_true", help="measure every split that fits instead (slow: a reference)")
    p_tune.add_argument("--json", type=Path, help="write every measurement here")
    p_tune.add_argument("--png", type=Path, help="plot tokens/s per split here")
    p_tune.add_argument("--model", type=Path, help="a local copy of the GGUF (default: its header is read on the coordinator)")
    p_tune.add_argument("--data", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting the deploy was given with pyinfra's --data (tune checks the running server is that)")
    p_settings = sub.add_parser("settings")
    p_settings.add_argument("--write-readme", action="store_true", help="replace the table in README.md")
    p_model = sub.add_parser("testmodel")
    p_model.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)

    inventory = getattr(args, "inventory", None)
    if inventory and inventory.is_file() and not getattr(args, "gpus", None) and not group_data_folders(inventory):
        print(f"note: no group_data/ in {Path.cwd()} or beside {inventory}: only the inventory's settings and the "
              "defaults apply (run this where you run the deploy)", file=sys.stderr)
    try:
        if args.command == "lab":
            lab = checkout_module("lab.lab", f"lab {args.action}")
            if lab is None:
                return 2
            if args.action == "up":
                print(lab.up(workers=args.workers))
            elif args.action == "down":
                lab.down()
            else:
                lab.pin(unpin=args.action == "unpin")
        elif args.command == "complete":
            result = complete(args.inventory, args.prompt, args.n_predict, model=args.model)
            t = result.get("timings", {})
            print(f"prompt: {args.prompt!r}")
            print(f"completion: {result.get('content', '')!r}")
            print(f"{t.get('predicted_n', 0)} tokens at {t.get('predicted_per_second', 0):.1f} tokens/s "
                  f"(prompt {t.get('prompt_n', 0)} tokens at {t.get('prompt_per_second', 0):.1f} tokens/s)")
        elif args.command == "bench":
            from . import bench
            if args.png and not bench.can_plot():  # said now, not after the measurements
                print(f"error: {bench.PLOT_HINT}", file=sys.stderr)
                return 2
            streams = [int(n) for n in args.streams.split(",")]
            result = bench.run(args.inventory, offline_cluster(args.inventory), streams, args.model, args.json,
                               args.png, args.sleep_wait)
            print(bench.table(result))
        elif args.command == "plan":
            with tempfile.TemporaryDirectory() as tmp:
                inventory = gpus_inventory(args.gpus, Path(tmp)) if args.gpus else args.inventory
                # offline arithmetic: an unedited checkout plans (the deploy still refuses what it must)
                cluster = offline_cluster(inventory, overrides=data_overrides(args.data), deploying=False)
            try:
                no_example_addresses(cluster, str(args.inventory))
            except SettingsError as error:
                if not args.gpus:
                    print(f"note: {error} (the deploy refuses them; a plan does not need them)", file=sys.stderr)
            if cluster.settings["llama_models_folder"]:  # the folder's models, as this machine's copy has them
                folder = Path(cluster.settings["llama_model_path"]).parent
                if not folder.is_dir():
                    print(f"error: llama_models_folder: {folder}: not on this machine: plan needs a copy of the "
                          "folder (only the files' headers are read)", file=sys.stderr)
                    return 2
                cluster = cluster.with_folder([str(p) for p in folder.glob("*.gguf")])
            failed = False
            for name in cluster.model_names():  # with llama_models, every model is planned with its own settings
                view = cluster.for_model(name)
                default = name == cluster.default_model
                model = (default and args.model) or Path(view.settings["llama_model_path"])
                if PLACEHOLDER in str(model):
                    print(f"error: {view.coordinator.origins['llama_model_path']}: llama_model_path = {str(model)!r}: "
                          "plan needs the model: pass --model LOCAL.gguf (only its header is read)", file=sys.stderr)
                    return 2
                mmproj = (default and args.mmproj) or (view.settings["llama_mmproj_path"]
                                                       and Path(view.settings["llama_mmproj_path"]))
                read = {}
                for what, path, reader in (("--model", model, gguf_header.read_model),
                                           ("--mmproj", mmproj, gguf_header.projector_bytes)):
                    if not path:
                        continue
                    if not path.is_file():
                        print(f"error: {what} {path}: not on this machine: pass a copy of the GGUF file "
                              "(only its header is read)", file=sys.stderr)
                        return 2
                    try:
                        read[what] = reader(path)
                    except Exception as error:  # not a GGUF file, cut short, a shard missing
                        print(f"error: {what} {path}: not a readable GGUF file: {error}", file=sys.stderr)
                        return 2
                capacity = plan.plan_cluster(view, read["--model"], mmproj_bytes=read.get("--mmproj", 0))
                if cluster.router:
                    print(f"model {name!r}{' (loaded at start)' if default else ''}:")
                print(capacity.table())
                failed = failed or bool(capacity.problems)
            return 2 if failed else 0
        elif args.command == "status":
            from . import status

            hosts = status.collect(offline_cluster(args.inventory), args.inventory)
            print(status.to_json(hosts) if args.json else status.table(hosts))
            return 0 if all(h.ok for h in hosts) else 1
        elif args.command == "tune":
            from . import bench, tune
            if args.png and not bench.can_plot():
                print(f"error: {bench.PLOT_HINT}", file=sys.stderr)
                return 2
            try:
                report = tune.run(args.inventory, objective=args.objective, budget=args.budget, repeats=args.repeats,
                                  sweep=args.sweep, model=args.model, overrides=data_overrides(args.data))
            except KeyboardInterrupt:
                print("tune: stopped; the deployed split is back in place", file=sys.stderr)
                return 130
            print(report.table())
            if args.json:
                args.json.write_text(report.to_json() + "\n")
            if args.png:
                report.plot(args.png)
            if args.apply:
                written = tune.apply(args.inventory, report)
                print(f"written to {written}: deploy again to use it (only llama-server restarts)" if written else
                      "nothing written: no split beyond the noise")
        elif args.command == "settings":
            if args.write_readme:
                readme = Path(__file__).resolve().parent.parent / "README.md"
                readme.write_text(settings.with_table(readme.read_text()))
            else:
                print(settings.settings_table())
        elif args.command == "testmodel":
            testmodel = checkout_module("lab.testmodel", "testmodel OUT.gguf")
            if testmodel is None:
                return 2
            testmodel.main(args.rest)
    except SettingsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except (OSError, ValueError, subprocess.SubprocessError) as error:  # a host that does not answer, a bad file
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        print(f"error: {args.command}: {reason}", file=sys.stderr)
        return 1
    return 0


def cli() -> None:
    """The installed `llama-rpc` command (pyproject.toml)."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
