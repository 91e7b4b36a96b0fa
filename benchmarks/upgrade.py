"""An upgrade on the lab: the bytes and the time it takes to carry the new image to a worker that has
the previous one, against a full-image transfer in the same run; and the first deploy's transfer with
the layer filter in place against today's plain stream. Each figure is measured in one run.

    python3 -m benchmarks.upgrade [--out docs/results/upgrade.md]

1. The lab deployed as it is (image OLD everywhere), then again with llama_cpp_build_number + 1: a new
   build (ccache makes it quick) whose bottom layers are OLD's, llama.cpp's binaries on top (NEW).
2. On worker1, with links limited to 1 Gbit/s (tc tbf, both directions) and rpc-server stopped, NEW is
   removed and sent again three ways, alternating: the deploy's command (it leaves out the layers the
   worker has), the plain stream (every layer), and the deploy's command as a first deploy sees it when
   the worker's images share no layer with NEW (the filter decides to leave nothing out). Bytes are the
   worker's eth0 receive counter; time is the command's.
3. The reference the target is set against: the compressed size (zstd -3, as sent) of each layer of NEW
   that OLD does not have, each layer tar compressed on its own, from a plain `docker save`.
The lab's own settings are deployed again at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from benchmarks.labkit import INVENTORY, LINK, RESULTS, deploy, lab_hosts, limit_links, on
from lab import lab
from llama_rpc_deploy import facts, roles, transfer
from llama_rpc_deploy.deployment import from_cluster
from llama_rpc_deploy.loading import offline_cluster

UNRELATED = ("sha256:" + "0" * 64,)
LAYERS = "/var/tmp/layers-of-worker1"  # on the coordinator, as the deploy writes it  # an image of the worker that shares no layer with NEW


def layers(host: str, image: str) -> list[str]:
    return json.loads(on(host, f"docker image inspect --format '{{{{json .RootFS.Layers}}}}' {image}"))


def changed_layers_compressed(old: str, new: str) -> tuple[int, int]:
    """(how many layers NEW has that OLD's chain does not, their zstd -3 size), from a plain docker save."""
    mine, theirs = layers("coordinator", new), layers("coordinator", old)
    shared = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
    changed = " ".join(d.split(":")[1] for d in mine[shared:])
    size = on(
        "coordinator",
        f"rm -rf /var/tmp/upgrade && mkdir /var/tmp/upgrade && cd /var/tmp/upgrade && "
        f"docker save {new} | tar -x && total=0; "
        "for f in $(find . -name layer.tar -o -path './blobs/sha256/*' -type f); do "
        "  d=$(sha256sum < $f | cut -d' ' -f1); "
        f"  case ' {changed} ' in *\" $d \"*) total=$((total + $(zstd -3 -c < $f | wc -c)));; esac; "
        "done; echo $total; rm -rf /var/tmp/upgrade",
    )
    return len(mine) - shared, int(size)


def rx_bytes(host: str) -> int:
    return int(on(host, "cat /sys/class/net/eth0/statistics/rx_bytes"))


def send(image: str, worker_ip: str, way: str, skip_layers: str) -> tuple[float, int]:
    """Remove NEW from worker1, send it one way: (seconds, bytes worker1 received). upgrade: the deploy's
    command with what worker1 has (the deploy's own fact, read after the removal); full: the plain stream;
    first_deploy_filter: the deploy's command when none of the worker's images shares a layer."""
    on("worker1", f"docker rmi {image} >/dev/null 2>&1; docker image prune -f >/dev/null")
    assert on("worker1", f"docker image inspect {image} >/dev/null 2>&1 && echo yes", check=False) != "yes"
    fact = facts.DockerImageLayers()
    have = {
        "upgrade": lambda: fact.process(on("worker1", fact.command()).splitlines()),
        "full": lambda: [],
        "first_deploy_filter": lambda: [UNRELATED],
    }[way]()
    lab.put_file("coordinator", LAYERS, transfer.layers_text(have))
    before, start = rx_bytes("worker1"), time.monotonic()
    on(
        "coordinator",
        transfer.send_command(image, worker_ip, layers_file=LAYERS if have else None, skip_layers=skip_layers),
    )
    seconds, received = time.monotonic() - start, rx_bytes("worker1") - before
    assert on("worker1", f"docker image inspect --format '{{{{.Id}}}}' {image}") == on(
        "coordinator", f"docker image inspect --format '{{{{.Id}}}}' {image}"
    )
    return seconds, received


def save_and_filter(image: str) -> dict:
    """What bounds the upgrade's time: docker save reads every layer (it cannot export some), and the
    filter hashes every layer tar of the legacy layout to know which to leave out."""
    timed = {}
    for name, command in (
        ("docker_save_alone_s", f"docker save {image} > /dev/null"),
        ("save_and_filter_s", f"docker save {image} | python3 /opt/llama-rpc/{roles.SKIP_LAYERS} drop > /dev/null"),
    ):
        start = time.monotonic()
        on("coordinator", command)
        timed[name] = round(time.monotonic() - start, 2)
    return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "upgrade.md")
    args = parser.parse_args()
    deploy(INVENTORY)
    cluster = offline_cluster(INVENTORY)
    old = from_cluster(cluster).image
    bumped = cluster.settings["llama_cpp_build_number"] + 1
    start = time.monotonic()
    deploy(INVENTORY, f"llama_cpp_build_number={bumped}")
    upgrade_deploy_s = time.monotonic() - start
    new = from_cluster(offline_cluster(INVENTORY, overrides={"llama_cpp_build_number": bumped})).image
    n_changed, changed_bytes = changed_layers_compressed(old, new)
    worker_ip, filter_path = cluster.workers[0].address, f"{cluster.settings['deploy_dir']}/{roles.SKIP_LAYERS}"
    hosts = lab_hosts(cluster)
    image_bytes = int(on("coordinator", f"docker image inspect --format '{{{{.Size}}}}' {new}"))
    on("worker1", "systemctl stop rpc-server-watchdog rpc-server")
    limit_links(hosts)
    figures: dict[str, list] = {}
    try:
        for _ in range(args.runs):  # the three ways alternate
            for way in ("upgrade", "full", "first_deploy_filter"):
                seconds, received = send(new, worker_ip, way, filter_path)
                figures.setdefault(f"{way}_s", []).append(seconds)
                figures.setdefault(f"{way}_bytes", []).append(received)
    finally:
        limit_links(hosts, on_=False)
        on("worker1", "systemctl start rpc-server rpc-server-watchdog")
        deploy(INVENTORY)
    r = {
        "old": old,
        "new": new,
        "image_bytes": image_bytes,
        "link": LINK,
        "runs": args.runs,
        "upgrade_deploy_s": round(upgrade_deploy_s, 1),
        "changed_layers": n_changed,
        "changed_layers_zstd_bytes": changed_bytes,
        **{k: round(statistics.median(v), 2 if k.endswith("_s") else None) for k, v in figures.items()},
    }
    r.update(save_and_filter(new))
    r["upgrade_bytes_over_changed_layers"] = round(r["upgrade_bytes"] / changed_bytes, 3)
    r["upgrade_bytes_over_full"] = round(r["upgrade_bytes"] / r["full_bytes"], 3)
    r["upgrade_s_over_full"] = round(r["upgrade_s"] / r["full_s"], 3)
    r["first_deploy_s_over_plain"] = round(r["first_deploy_filter_s"] / r["full_s"], 3)
    print(json.dumps(r, indent=2))
    args.out.write_text(markdown(r))


def markdown(r: dict) -> str:
    mb = lambda b: f"{b / 1e6:.1f} MB"  # noqa: E731
    return f"""# Upgrades: only the layers that changed

`python3 -m benchmarks.upgrade` (a few minutes; the lab up). An upgrade of llama.cpp rebuilt as
`llama_cpp_build_number` + 1: the image {r["new"]} ({mb(r["image_bytes"])}) replaces {r["old"]}; {r["changed_layers"]}
of its layers are new, {mb(r["changed_layers_zstd_bytes"])} compressed. Sent to a worker that has the previous
image, over a {r["link"]}/s link, medians of {r["runs"]} runs of each way, the ways alternating; bytes are what the
worker's network interface received.

| way | bytes on the wire | time |
| --- | ---: | ---: |
| upgrade: the deploy's command (the worker has the previous image) | {mb(r["upgrade_bytes"])} | {r["upgrade_s"]:.2f} s |
| full image: the plain stream (today's before the filter) | {mb(r["full_bytes"])} | {r["full_s"]:.2f} s |
| first deploy: the deploy's command, no layer shared | {mb(r["first_deploy_filter_bytes"])} | {r["first_deploy_filter_s"]:.2f} s |

- Upgrade bytes / compressed size of the changed layers: **{r["upgrade_bytes_over_changed_layers"]}** (target at most 1.1).
- Upgrade against the full image: {r["upgrade_bytes_over_full"]} of the bytes, {r["upgrade_s_over_full"]} of the time.
- First deploy with the filter against the plain stream: **{r["first_deploy_s_over_plain"]}** of the time (target at most 1.05).

What limits the upgrade's time: not the link ({mb(r["upgrade_bytes"])} take {r["upgrade_bytes"] / 125e6:.2f} s at 1 Gbit/s) but
the coordinator's `docker save`, which reads every layer of the image ({r["docker_save_alone_s"]} s alone here; with
the filter hashing each layer tar on its way through, {r["save_and_filter_s"]} s), and `docker load` on the worker.
Over a slower link, or with the CUDA image's few GB of base layers, the bytes saved dominate.

```json
{json.dumps(r, indent=2)}
```
"""


if __name__ == "__main__":
    main()
