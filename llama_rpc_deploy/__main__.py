"""llama-rpc COMMAND, or python -m llama_rpc_deploy COMMAND   (this module only dispatches: each command is
the `command(args)` of its module: plan.py, probe.py, status.py, bench.py, tune/, settings.py; `complete` is client.py's;
`lab` and `testmodel` are lab/'s, in the checkout)

  lab up [--workers N]     the local lab (containers that behave like hosts); writes .lab/inventory.py
  lab down                 remove everything the lab made
  lab pin | lab unpin      each lab host on its own core (for measurements) / back on all cores
  lab wake-listener        the lab's stand-in for sleeping hardware: freezes a worker on its sleep command,
                           thaws it on its magic packet (docs/sleep.md)
  complete [-i INVENTORY]  ask the deployed llama-server for a completion; print it and tokens/s
  bench [-i INVENTORY] [--streams 1,2,4] [--json OUT] [--png OUT] [--model LOCAL.gguf]
                           tokens/s for 1 and N parallel streams against the planner's ceiling,
                           time to first token after idle sleep; a table, JSON, a PNG plot
  plan [-i INVENTORY | --gpus GPU...] [--model LOCAL.gguf] [--mmproj LOCAL.gguf] [--draft LOCAL.gguf] [--data KEY=VALUE]
       [--acceptance A] [--probe]
                           the capacity planner, offline: per device layers, weights, KV cache, free memory;
                           the tokens/s ceiling (and with speculation, at acceptance A); exits 2 when something
                           does not fit; --probe learns the cards of hosts without gpus over SSH first (as the deploy)
  probe [-i INVENTORY]     read-only, over SSH: each host's cards (name, memory MiB, compute capability), system,
                           NIC (speed, link); the inventory lines to paste; exits 1 when a host does not answer
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
from pathlib import Path

from . import client, plan, settings
from .loading import group_data_folders
from .settings import SettingsError


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
        print(
            f"error: {usage.split()[0]} needs a checkout of llama-rpc-deploy (its lab/ folder is not "
            f"installed with the package): run `python3 -m llama_rpc_deploy {usage}` there",
            file=sys.stderr,
        )
        return None
    if str(checkout) not in sys.path:
        sys.path.insert(0, str(checkout))
    import importlib

    return importlib.import_module(name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llama-rpc", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_lab = sub.add_parser("lab")
    p_lab.add_argument("action", choices=("up", "down", "pin", "unpin", "wake-listener"))
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
    p_bench.add_argument(
        "--model", type=Path, help="a local copy of the GGUF (default: its header is read on the coordinator over SSH)"
    )
    p_bench.add_argument(
        "--sleep-wait", type=float, default=300, help="at most this many seconds to wait for the server to fall asleep"
    )
    p_plan = sub.add_parser("plan")
    p_plan.add_argument("-i", "--inventory", type=Path, default=Path("inventory.py"))
    p_plan.add_argument(
        "--model",
        type=Path,
        help="a local copy of the GGUF file (default: llama_model_path, "
        "when this machine has it); a split model's first shard",
    )
    p_plan.add_argument("--mmproj", type=Path, help="a local copy of llama_mmproj_path's file")
    p_plan.add_argument("--draft", type=Path, help="a local copy of llama_spec_draft_path's file")
    p_plan.add_argument(
        "--acceptance",
        type=float,
        metavar="A",
        help="with speculation: the chance that each drafted token is accepted, given the ones before it were "
        "(default 0.7); the predicted tokens/s is printed for it",
    )
    p_plan.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting for this plan only, as pyinfra's --data takes it (e.g. llama_ctx_size=131072)",
    )
    p_plan.add_argument(
        "--gpus",
        nargs="+",
        metavar="GPU",
        help="plan without an inventory: the coordinator's GPU, then one per worker "
        '(e.g. --gpus "RTX 4080" "RTX 5060 Ti 16GB"; names from llama_rpc_deploy/gpus.py)',
    )
    p_plan.add_argument(
        "--probe",
        action="store_true",
        help="learn the cards of the hosts whose gpus are not set from the hosts themselves, over SSH (as the deploy does)",
    )
    p_probe = sub.add_parser("probe")
    p_probe.add_argument("-i", "--inventory", type=Path, default=Path("inventory.py"))
    p_status = sub.add_parser("status")
    p_status.add_argument("-i", "--inventory", type=Path, default=Path("inventory.py"))
    p_status.add_argument("--json", action="store_true", help="the same, as JSON")
    p_tune = sub.add_parser("tune")
    p_tune.add_argument("-i", "--inventory", type=Path, default=Path("inventory.py"))
    p_tune.add_argument(
        "--objective",
        choices=("generation", "prompt", "both"),
        default="generation",
        help="what to make faster: generation tokens/s, prompt processing, or both (their geometric mean)",
    )
    p_tune.add_argument(
        "--budget", type=int, default=30, help="at most this many measurements (each restarts llama-server)"
    )
    p_tune.add_argument(
        "--repeats", type=int, default=3, help="measurements of each side of a comparison (with --sweep: rounds)"
    )
    p_tune.add_argument(
        "--apply", action="store_true", help="write the best split into group_data when it is beyond the noise"
    )
    p_tune.add_argument(
        "--sweep", action="store_true", help="measure every split that fits instead (slow: a reference)"
    )
    p_tune.add_argument(
        "--only",
        choices=("split", "speculation"),
        help="one stage: the split, or (with llama_spec_* set) whether to speculate and with which draft-token maximum",
    )
    p_tune.add_argument("--json", type=Path, help="write every measurement here")
    p_tune.add_argument("--png", type=Path, help="plot tokens/s per split here")
    p_tune.add_argument(
        "--model", type=Path, help="a local copy of the GGUF (default: its header is read on the coordinator)"
    )
    p_tune.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting the deploy was given with pyinfra's --data (tune checks the running server is that)",
    )
    p_settings = sub.add_parser("settings")
    p_settings.add_argument("--write-readme", action="store_true", help="replace the table in README.md")
    p_model = sub.add_parser("testmodel")
    p_model.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)

    inventory = getattr(args, "inventory", None)
    if inventory and inventory.is_file() and not getattr(args, "gpus", None) and not group_data_folders(inventory):
        print(
            f"note: no group_data/ in {Path.cwd()} or beside {inventory}: only the inventory's settings and the "
            "defaults apply (run this where you run the deploy)",
            file=sys.stderr,
        )
    try:
        if args.command == "lab":
            lab = checkout_module("lab.lab", f"lab {args.action}")
            if lab is None:
                return 2
            if args.action == "up":
                print(lab.up(workers=args.workers))
            elif args.action == "down":
                lab.down()
            elif args.action == "wake-listener":
                lab.wake_listener()  # until interrupted
            else:
                lab.pin(unpin=args.action == "unpin")
        elif args.command == "complete":
            return client.complete_command(args)
        elif args.command == "bench":
            from . import bench  # (each command's module is imported when it runs)

            return bench.command(args)
        elif args.command == "plan":
            return plan.command(args)
        elif args.command == "probe":
            from . import probe

            return probe.command(args)
        elif args.command == "status":
            from . import status

            return status.command(args)
        elif args.command == "tune":
            from . import tune

            return tune.command(args)
        elif args.command == "settings":
            return settings.command(args)
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
