"""What the tool costs on top of llama.cpp, and where it went: the same cluster served by the deployed
containers and by bare llama.cpp processes on the same lab hosts, request by request, in two topologies.
The ratios come from one run.

    python3 -m benchmarks.tool_overhead [--rounds 120] [--out docs/results/tool-overhead.md]   (~8 minutes; the lab up)

Topologies: the lab's split (`llama_n_gpu_layers` 6 of the model's 8 layers on the workers, the rest and the
output on the coordinator's CPU), and every layer on the workers (999: `--device RPC0,RPC1` holds them all, as on
GPU machines, where the coordinator only samples and speaks RPC); each is deployed, then measured.

Ways (each round: one completion of 64 tokens by each, the order rotating; llama-server's own generation
tokens/s; both clusters are up the whole time and only one works at a time):
- deployed: the containers as the deploy runs them (docker run from systemd units, through the front);
- bare: a twin of the cluster beside it (start_twin): llama-server and rpc-server copied out of the deployed
  image with their libraries (/var/tmp/bare), run as the same unprivileged user with the same arguments as the
  launch scripts (render.py renders both) but their ports, the same model file, split, threads and tensor cache,
  through a second stunnel of the same configuration and keys; each a transient systemd service (systemd-run) with
  its log in the journal, as one runs llama.cpp without the tool; no container (no docker run, container cgroups,
  seccomp profile, read-only root, tini, or the log's way through containerd-shim, dockerd and the docker client);
- escaped: deployed, with the containers' processes moved out of their lab host's cpuset into this machine's root
  cpuset for the request, as they all ran before lab/host.Dockerfile gave the hosts' dockerd a cgroup-parent
  (cgroup v1 only): what `lab pin` left unpinned until then.
Every lab host is pinned to its own core (`lab pin`). From the scheduler's counters of every thread on the lab
hosts (benchmarks/cpu_account.py), each process's CPU time, context switches and moves between cores per
generated token. Writes docs/results/tool-overhead.md and docs/results/tool-overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import sys
from pathlib import Path

from benchmarks import cpu_account
from benchmarks.labkit import INVENTORY, RESULTS, deploy, interval, lab_hosts, on
from lab import lab
from llama_rpc_deploy import client, render, roles
from llama_rpc_deploy.cluster import SERVICE_USER
from llama_rpc_deploy.deployment import from_cluster
from llama_rpc_deploy.loading import offline_cluster

CPUSET = Path("/sys/fs/cgroup/cpuset")

BARE = "/var/tmp/bare"
SYSTEM_LIBS = ("libc.so", "libm.so", "ld-linux", "libpthread.so", "libdl.so", "librt.so")  # the host's own glibc


def copy_out(host: str, image: str) -> None:
    """The image's /app and the libraries its binaries need beyond glibc, onto the host."""
    needed = on(
        host,
        f"docker run --rm --entrypoint sh {image} -c "
        "'ldd /app/llama-server /app/rpc-server | awk \"/=> \\\\//{print \\$3}\" | sort -u'",
    ).split()
    libs = [lib for lib in needed if not lib.startswith("/app/") and not any(s in lib for s in SYSTEM_LIBS)]
    on(
        host,
        f"rm -rf {BARE} && mkdir -p {BARE}/lib && docker rm -f bare-copy >/dev/null 2>&1; "
        f"docker create --name bare-copy {image} >/dev/null && docker cp bare-copy:/app/. {BARE}/ && "
        + "".join(f"docker cp -L bare-copy:{lib} {BARE}/lib/ && " for lib in libs)
        + f"docker rm bare-copy >/dev/null && chmod -R a+rX {BARE} && "
        f"LD_LIBRARY_PATH={BARE}:{BARE}/lib {BARE}/llama-server --version >/dev/null 2>&1",
    )


def words(lines: list[str]) -> list[str]:
    return [w for line in lines for w in shlex.split(line)]


def with_value(args: list[str], option: str, value: str) -> list[str]:
    """args with option's value replaced (the option must be there)."""
    i = args.index(option)
    return args[: i + 1] + [value] + args[i + 2 :]


TWIN = 10  # the twin's ports: the deployed one's + 10 (rpc-server, tunnel, tunnel ends, llama-server)


def twin_tunnel(host: str, cluster) -> None:
    """A second stunnel on host, the deployed one's configuration with the twin's ports and the same keys
    (as the service user, as the deployed one: they are readable by it alone), the host's own stunnel4 under
    another name (stunnel-twin), so that the scheduler's counters tell the two apart."""
    s = cluster.settings
    ports = [s["rpc_port"], s["rpc_tunnel_port"]] + [
        s["rpc_tunnel_local_port"] + i for i in range(len(cluster.workers))
    ]
    if set(ports) & {p + TWIN for p in ports}:  # sed would move a port twice
        raise SystemExit(f"the twin's ports (+{TWIN}) collide with the deployed ones {ports}: space them further apart")
    edit = "; ".join(rf"s/:{p}$/:{p + TWIN}/" for p in ports)
    on(
        host,
        f"cp /usr/bin/stunnel4 {BARE}/stunnel-twin && sed -E '{edit}' {s['deploy_dir']}/rpc-tunnel.conf "
        f"> {BARE}/twin-tunnel.conf && chmod -R a+rX {BARE}",
    )
    run_bare(host, "stunnel-twin", [f"{BARE}/twin-tunnel.conf"])


def start_twin(cluster) -> str:
    """Bare llama.cpp beside the deployed cluster, on the same hosts and cores: rpc-server and a tunnel on each
    worker, a tunnel and llama-server on the coordinator, each with the deployed one's arguments but the ports
    (+TWIN), all from the image's own binaries copied out (copy_out). Only one cluster works at a time (the
    client alternates); the other sleeps. Returns the twin llama-server's URL."""
    s = cluster.settings
    stop_twin(cluster, keep_files=True)  # a killed run's transient units would make systemd-run refuse the names
    for i, worker in enumerate(cluster.workers, start=1):
        args = with_value(words(render.rpc_server_args(worker)), "--port", str(s["rpc_port"] + TWIN))
        run_bare(f"worker{i}", "rpc-server", args, {"LLAMA_CACHE": worker.settings["rpc_cache_dir"]})
        twin_tunnel(f"worker{i}", cluster)
    twin_tunnel("coordinator", cluster)
    # the key as llama-server's container gets it: readable by the service user only (/etc/llama-rpc is root's)
    on(
        "coordinator",
        f"install -m 400 -o {SERVICE_USER} -g {SERVICE_USER} {roles.API_KEY_PATH} {BARE}/api_key",
        check=False,
    )
    args = [
        f"{BARE}/api_key" if a == render.API_KEY_MOUNT else a
        for a in words(render.llama_server_args(cluster, bool(s["llama_api_key_file"])))
    ]
    ends = ",".join(f"127.0.0.1:{s['rpc_tunnel_local_port'] + i + TWIN}" for i in range(len(cluster.workers)))
    port = int(args[args.index("--port") + 1]) + TWIN
    args = with_value(
        with_value(with_value(args, "--rpc", ends), "--port", str(port)), "--host", cluster.coordinator.address
    )
    run_bare("coordinator", "llama-server", args)
    url = f"http://{cluster.coordinator.address}:{port}"
    on(
        "coordinator",
        f"for i in $(seq 300); do curl -fs {url}/health >/dev/null && exit 0; sleep 1; done; "
        "journalctl -u llama-twin-llama-server -n 20 --no-pager; exit 1",
    )
    return url


def run_bare(host: str, program: str, args: list[str], env: dict[str, str] | None = None) -> None:
    """program from BARE as a transient systemd service (llama-twin-PROGRAM) of the service user, its output in
    the journal: llama.cpp as one would run it without the tool, in a cgroup of its own beside the deploy's."""
    env = {"LD_LIBRARY_PATH": f"{BARE}:{BARE}/lib", **(env or {})}
    on(
        host,
        shlex.join(
            [
                "systemd-run",
                "--quiet",
                f"--unit=llama-twin-{program}",
                f"--uid={SERVICE_USER}",
                f"--gid={SERVICE_USER}",
                f"--working-directory={BARE}",
                *(f"--setenv={k}={v}" for k, v in env.items()),
                f"{BARE}/{program}",
                *args,
            ]
        ),
    )


def stop_twin(cluster, keep_files: bool = False) -> None:
    """The twin's services stopped (and forgotten by systemd), its files removed unless keep_files."""
    for host in lab_hosts(cluster):
        on(
            host,
            f"systemctl stop 'llama-twin-*' ; systemctl reset-failed 'llama-twin-*' ; pkill -f '^{BARE}/' ; "
            + ("true" if keep_files else f"rm -rf {BARE}"),
            check=False,
        )


def nested_cpusets() -> dict[str, str]:
    """pid -> cpuset cgroup of every process in the lab hosts' containers (cgroup v1: under lab-nested/)."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):  # processes, not threads
        try:
            match = re.search(r"^\d+:cpuset:(/.*/lab-nested/.*)$", Path(f"/proc/{pid}/cgroup").read_text(), re.M)
        except OSError:
            continue
        if match:
            found[pid] = match.group(1)
    return found


def escape(back: dict[str, str] | None = None) -> dict[str, str]:
    """Move every process of the lab hosts' containers into the root cpuset, every core, as before the lab's
    cgroup-parent; with back, return them to their own. Returns pid -> cgroup."""
    if back is not None:
        for pid, cgroup in back.items():
            try:
                (CPUSET / cgroup.lstrip("/") / "cgroup.procs").write_text(pid)
            except OSError:
                pass  # the process ended (or its container was replaced)
        return {}
    moved = {}
    for pid, cgroup in nested_cpusets().items():
        try:  # cgroup.procs moves all of a process's threads
            (CPUSET / "cgroup.procs").write_text(pid)
            moved[pid] = cgroup
        except OSError:
            continue  # it ended meanwhile
    if not moved:
        raise SystemExit(
            "escaped: no process in a lab-nested cpuset (cgroup v2, or the lab predates its cgroup-parent: "
            "python3 -m llama_rpc_deploy lab up, then deploy)"
        )
    return moved


def one(cluster, way: str, twin_url: str, owners: dict[str, str]) -> dict:
    """One completion of N_PREDICT tokens by a way: llama-server's generation tokens/s, and per (host, process)
    what the scheduler counted while it ran (every lab process: the idle cluster's too, which barely move)."""
    moved = escape() if way == "escaped" else None
    try:
        before = cpu_account.snapshot(owners)
        reply = client.complete(cluster, PROMPT, N_PREDICT, server=twin_url if way == "bare" else None)
        used = cpu_account.difference(before, cpu_account.snapshot(owners))
    finally:
        if moved is not None:
            escape(back=moved)
    return {
        "tokens_per_s": reply["timings"]["predicted_per_second"],
        "tokens": reply["timings"]["predicted_n"],
        "used": used,
    }


PROMPT, N_PREDICT = "Once upon a time", 64
WAYS = ("deployed", "bare", "escaped")
TOPOLOGIES = {"split": None, "all-remote": 999}  # llama_n_gpu_layers: the lab's own, every layer on the workers


def label(host: str, process: str, container: bool) -> str:
    return f"{host} {process}" + (" (container)" if container else "")


def rounds(cluster, twin_url: str, n: int) -> dict:
    """n rounds of one completion per way, the order rotating (each way first, second and last equally often),
    after a warm-up of each; per way the tokens/s of each round and the per-token medians of every process."""
    owners = cpu_account.container_ids()
    ways = WAYS if nested_cpusets() else WAYS[:2]  # escaped: cgroup v1 only
    for way in ways:
        one(cluster, way, twin_url, owners)
    tps: dict[str, list[float]] = {way: [] for way in ways}
    per_token: dict[str, dict[str, list[dict]]] = {way: {} for way in ways}
    for i in range(n):
        for way in ways[i % len(ways) :] + ways[: i % len(ways)]:
            r = one(cluster, way, twin_url, owners)
            tps[way].append(round(r["tokens_per_s"], 2))
            for (host, process, container), v in r["used"].items():
                per_token[way].setdefault(label(host, process, container), []).append(
                    {k: v[k] / r["tokens"] for k in ("cpu_ms", "system_ms", "page_faults", "migrations")}
                    | {
                        "switches": (v["voluntary_switches"] + v["involuntary_switches"]) / r["tokens"],
                        "cpus": v["cpus"],
                    }
                )
    return {
        "tokens_per_s": tps,
        "per_token": {
            way: {
                p: {
                    k: round(statistics.median(x[k] for x in xs), 4)
                    for k in ("cpu_ms", "system_ms", "page_faults", "migrations", "switches")
                }
                | {"cpus": ",".join(sorted({x["cpus"] for x in xs}))}
                for p, xs in procs.items()
            }
            for way, procs in per_token.items()
        },
    }


def summary(measured: dict) -> dict:
    """Per way against bare: the median of the rounds' ratios (a round's requests follow each other within a
    second or two, so the machine's drift, large on 2 shared cores, falls on both alike) with its 95% bootstrap
    interval over rounds, and how many rounds the way was at least as fast."""
    tps = measured["tokens_per_s"]
    out = {"median": {way: round(statistics.median(v), 2) for way, v in tps.items()}}
    for way in [w for w in ("deployed", "escaped") if w in tps]:
        ratios = [a / b for a, b in zip(tps[way], tps["bare"])]
        low, high = interval(ratios, seed=27)
        out[f"{way}_over_bare"] = {
            "ratio": round(statistics.median(ratios), 3),
            "interval": [round(low, 3), round(high, 3)],
            "rounds_ahead_of_bare": sum(r >= 1 for r in ratios),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=120)
    parser.add_argument("--out", type=Path, default=RESULTS / "tool-overhead.md")
    args = parser.parse_args()
    results: dict = {"rounds": args.rounds, "n_predict": N_PREDICT, "topologies": {}}
    lab.pin()
    cluster = None
    try:
        for topology, layers in TOPOLOGIES.items():
            deploy(INVENTORY, *([f"llama_n_gpu_layers={layers}"] if layers else []))
            cluster = offline_cluster(INVENTORY, overrides={"llama_n_gpu_layers": layers} if layers else None)
            image = from_cluster(cluster).image
            results.update(image=image, workers=len(cluster.workers))
            for host in lab_hosts(cluster):
                copy_out(host, image)
            try:
                url = start_twin(cluster)
                measured = rounds(cluster, url, args.rounds)
            finally:
                stop_twin(cluster)
            results["topologies"][topology] = {
                "llama_n_gpu_layers": cluster.settings["llama_n_gpu_layers"],
                **summary(measured),
                **measured,
            }
            t = results["topologies"][topology]
            print(
                f"{topology}: deployed/bare {t['deployed_over_bare']}, escaped/bare {t.get('escaped_over_bare')}",
                file=sys.stderr,
                flush=True,
            )
    finally:
        lab.pin(unpin=True)
        if cluster is not None:
            stop_twin(cluster)
        deploy(INVENTORY)  # the lab's own settings again
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    args.out.write_text(markdown(results))


def cpu(t: dict, way: str, process: str) -> float:
    return t["per_token"][way].get(process, {}).get("cpu_ms", 0.0)


def ratio_cell(t: dict, way: str) -> str:
    r = t.get(f"{way}_over_bare")
    return f"**{r['ratio']}** ({r['interval'][0]}-{r['interval'][1]})" if r else "not measured (cgroup v2)"


def where_it_went(r: dict) -> list[str]:
    """The summary: the targets, and what the counters say about the difference, from this run's figures."""
    lines = ["| topology | deployed / bare (95% interval) | target | escaped / bare |", "| --- | --- | --- | --- |"]
    for topology, t in r["topologies"].items():
        d = t["deployed_over_bare"]
        met = "met" if d["ratio"] >= 0.97 and d["interval"][0] >= 0.95 else "**not met**"
        lines.append(
            f"| {topology} | {ratio_cell(t, 'deployed')} | ≥ 0.97, low end ≥ 0.95: {met} | {ratio_cell(t, 'escaped')} |"
        )
    split = r["topologies"]["split"]
    server, host = "coordinator llama-server (container)", "coordinator (all of the host)"
    relay = ["coordinator containerd-shim", "coordinator dockerd", "coordinator docker"]
    lines += ["", "## Where the loss went", ""]
    if "escaped_over_bare" in split:
        lines += [
            "**The lab, not the product.** The lab's hosts are containers (`--cgroupns=host`, cgroup v1), and the "
            "containers each host's dockerd started had their cgroups beside the hosts at the top of this machine's "
            "tree, not inside them. `lab pin` confined each host to its core, and with it whatever the host ran "
            "itself (the bare processes), but not its containers: deployed llama-server and rpc-servers ran on both "
            "cores, moving between them and competing with the other hosts. The benchmark compared pinned bare "
            "processes with floating containers. The `escaped` way puts the containers back where they were: "
            f"{split['escaped_over_bare']['ratio']} of bare on the lab's split, the 14-25% loss of the earlier runs; "
            f"llama-server then moved between cores {split['per_token']['escaped'].get(server, {}).get('migrations', 0):.1f} "
            f"times a token (pinned: {split['per_token']['deployed'].get(server, {}).get('migrations', 0):.2f}) and "
            f"took {cpu(split, 'escaped', server):.2f} ms of CPU a token against {cpu(split, 'deployed', server):.2f} "
            "pinned. lab/host.Dockerfile now gives the hosts' dockerd a cgroup-parent below its own cgroups, and `lab "
            "pin` confines those cgroups too (lab.set_cpus; tests/e2e/test_lab_pin.py checks the deployed processes' "
            "cores). On a real machine no cgroup of an outer container exists to escape: the containers get the cores "
            "the machine's own processes get.",
            "",
        ]
    lines += [
        "**What a container still adds**, per generated token (medians over the rounds): "
        + "; ".join(
            (
                f"{name}: the coordinator in all {cpu(t, 'deployed', host):.3f} ms of CPU deployed against "
                f"{cpu(t, 'bare', host):.3f} bare, "
                if host in t["per_token"]["deployed"]
                else f"{name}: "
            )
            + f"of it the log's way through containerd-shim, dockerd and the attached docker client "
            f"{sum(cpu(t, 'deployed', p) for p in relay):.3f} ms, the front's HAProxy (deployed requests pass it, the "
            f"twin's do not) {cpu(t, 'deployed', 'coordinator haproxy'):.3f} against "
            f"{cpu(t, 'bare', 'coordinator haproxy'):.3f}, and llama-server {cpu(t, 'deployed', server):.3f} against "
            f"{cpu(t, 'bare', 'coordinator llama-server'):.3f}"
            for name, t in r["topologies"].items()
        )
        + ". llama-server writes its log at a request's start and end, not per token (at `llama_log_verbosity` 4, "
        "the level that keeps the load report); each line passes through three more processes than a bare "
        "service's, on the lab on llama-server's own core, on a machine with a spare core beside it. What makes the "
        "containerised llama-server itself use more CPU a token (its context switches are within a few percent of "
        "its twin's) is not separated further here: Docker's seccomp filter (ruled out as the 14-25% before: 0.861 "
        "without it), the deeper cgroups, or the log lines' wake-ups between its tokens.",
        "",
        "`--threads` in a cgroup: the lab sets `llama_threads` and `rpc_threads` to 1. Without them llama.cpp "
        "counts the machine's cores, not the cgroup's: checked on this 2-core machine, the image's llama-server "
        "without `--threads` starts a pool of 2 threads in a container, and 2 again in one confined by "
        "`--cpuset-cpus 0`. The deploy sets no cpuset, so a container sees the cores a bare process sees.",
        "",
    ]
    return lines


def markdown(r: dict) -> str:
    lines = [
        "# What the tool adds to llama.cpp's own speed, and where it went",
        "",
        f"`python3 -m benchmarks.tool_overhead --rounds {r['rounds']}`: one run; image {r['image']}, "
        f"{r['workers']} workers; `lab pin`: the coordinator on core 0, both workers on the last core (1). "
        "Raw figures: [tool-overhead.json](tool-overhead.json).",
        "",
    ]
    lines += where_it_went(r)
    for topology, t in r["topologies"].items():
        ways = [w for w in WAYS if w in t["tokens_per_s"]]
        lines += [
            f"## {topology} (`llama_n_gpu_layers` {t['llama_n_gpu_layers']})",
            "",
            f"Each round: one completion of {r['n_predict']} tokens by each way, the order rotating; llama-server's "
            "own generation tokens/s. / bare: the median of the rounds' ratios, with its 95% bootstrap interval.",
            "",
            "| way | median tokens/s (min-max) | / bare (95% interval) | rounds ≥ bare |",
            "| --- | ---: | --- | ---: |",
        ]
        for way in ways:
            v = t["tokens_per_s"][way]
            ahead = f"{t[f'{way}_over_bare']['rounds_ahead_of_bare']} of {len(v)}" if way != "bare" else "-"
            lines.append(
                f"| {way} | {t['median'][way]} ({min(v)}-{max(v)}) | "
                f"{ratio_cell(t, way) if way != 'bare' else '1'} | {ahead} |"
            )
        lines += [
            "",
            "Per generated token, the median over the rounds of each process's CPU time (of it in the kernel, "
            "from clock ticks), context switches and moves between cores, with the cores its threads may use "
            '(processes under 0.0005 ms in every way left out); "(all of the host)" is the host\'s cgroup, '
            "processes that ended included, CPU time only:",
            "",
            "| host process | " + " | ".join(ways) + " |",
            "| --- |" + " --- |" * len(ways),
        ]
        most = {p: max(cpu(t, w, p) for w in ways) for w in ways for p in t["per_token"][w]}
        for p in sorted((p for p in most if most[p] >= 0.0005), key=lambda p: (-most[p], p)):
            cells = []
            for way in ways:
                w = t["per_token"][way].get(p)
                cells.append(
                    "-"
                    if not w or w["cpu_ms"] < 0.0005
                    else f"{w['cpu_ms']:.3f} ms"
                    if p.endswith(TOTAL_MARK)
                    else f"{w['cpu_ms']:.3f} ms ({w['system_ms']:.2f}), {w['switches']:.1f} sw, "
                    f"{w['migrations']:.2f} moves, cpus {w['cpus'] or '-'}"
                )
            lines.append(f"| {p} | " + " | ".join(cells) + " |")
        lines += [""]
    return "\n".join(lines) + "\n"


TOTAL_MARK = cpu_account.TOTAL


if __name__ == "__main__":
    main()
