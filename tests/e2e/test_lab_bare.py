"""From bare hosts to serving (issue 38): a coordinator and a worker with systemd and sshd only (lab/bare.py: no Docker,
zstd, iptables, python3 or curl), on Debian 12 and on Debian 13. Before anything is installed, the prepare phase's
refusals (an unsupported system, an NVIDIA host without its driver), each one line with nothing changed; then one
deploy brings them to the readable sentence, and a second changes nothing.

The one thing the lab hands them besides: the image its own coordinator built from the same source and settings, which
Docker loads at its first start (lab/bare.py says why), so no llama.cpp is compiled here."""

from __future__ import annotations

import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor


from lab import bare
from lab.testmodel import SENTENCE
from llama_rpc_deploy.loading import offline_cluster

from .lab_helpers import api, chat, needs_docker, pyinfra

pytestmark = needs_docker


def deploy(inventory, *args: str) -> subprocess.CompletedProcess:
    return pyinfra(*args, timeout=1500, inventory=inventory)


def on(version: str, role: int, command: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["docker", "exec", bare.containers(version)[role], "sh", "-c", command], capture_output=True, text=True
    )


# what a refused deploy must leave as it was: no package of ours, no file of ours
UNTOUCHED = (
    "dpkg -l docker.io zstd python3 2>/dev/null | grep -c '^ii' ; ls /opt/llama-rpc /var/lib/llama-rpc 2>&1 | wc -l"
)


def refused(version: str, inventory, host: str) -> str:
    """The deploy's refusal, as its last line of stderr, after checking it left both hosts as they were."""
    before = [on(version, r, UNTOUCHED).stdout for r in (0, 1)]
    result = deploy(inventory)
    assert result.returncode != 0
    assert [on(version, r, UNTOUCHED).stdout for r in (0, 1)] == before
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f"{host}: "), result.stderr[-2000:]
    return line


def test_bare_debian_12_and_13_hosts_are_refused_then_prepared_and_serve():
    """Both releases at once (each its own pair of hosts, its own pyinfra runs), as CI's time is short."""
    from lab import lab

    lab.ensure_images()  # what both pairs share, made once before they start
    lab.ensure_network()
    lab.ensure_key()
    lab.ensure_sdist()
    lab.ensure_api_key()
    for version in bare.RELEASES:
        bare.ensure_image(version)
    with ThreadPoolExecutor(max_workers=len(bare.RELEASES)) as pool:
        runs = {version: pool.submit(one_release, version) for version in bare.RELEASES}
    for version, run in runs.items():
        print(f"Debian {version}: bare to serving in {run.result():.0f} s")  # result(): its failure, raised here


def one_release(version: str) -> float:
    """The refusals, the deploy to the sentence (its seconds, returned), and the second deploy, on fresh bare hosts of
    that release, removed afterwards."""
    inventory = bare.up(version)
    try:
        return refused_prepared_served(version, inventory)
    finally:
        bare.down(version)


def refused_prepared_served(version: str, inventory) -> float:
    coordinator, worker = bare.addresses(version)
    assert "no docker" in on(version, 0, "command -v docker || echo no docker").stdout  # bare indeed

    # an unsupported system: the worker's os-release says Fedora (and is put back)
    on(
        version,
        1,
        "cp /etc/os-release /root/os-release && printf 'ID=fedora\\nVERSION_ID=40\\nPRETTY_NAME=\"Fedora Linux 40\"\\n' > /etc/os-release",
    )
    try:
        line = refused(version, inventory, worker)
    finally:
        on(version, 1, "rm -f /etc/os-release && cp /root/os-release /etc/os-release")
    assert line == (
        f"{worker}: Fedora Linux 40 (/etc/os-release: ID='fedora', VERSION_ID='40') is not supported by the prepare "
        "phase: expected Debian 12 or 13, Ubuntu 22.04 or 24.04, or host_prepare: False on this host and Docker "
        "Engine, zstd, iptables, python3 installed by you"
    )

    # an NVIDIA card named for the worker, whose driver is not there
    nvidia = inventory.with_name(f"bare-{version}-nvidia.py")
    nvidia.write_text(inventory.read_text() + 'workers[0][1].update(image_backend="cuda", gpus=["RTX 4080"])\n')
    line = refused(version, nvidia, worker)
    assert "nvidia-smi does not answer: the NVIDIA driver is missing (the deploy does not install drivers)" in line
    assert f"on Debian {version}, apt-get install nvidia-driver" in line

    # one deploy: from nothing to the sentence
    start = time.monotonic()
    result = deploy(inventory, "--json")
    seconds = time.monotonic() - start
    assert result.returncode == 0, result.stderr[-4000:]
    ops = json.loads(result.stdout)["results"]["operations"]
    prepared = [op for op in ops if "packages the deploy needs" in op["name"]]
    assert prepared and sorted(h for op in prepared for h in op["success"]) == sorted([coordinator, worker])
    cluster = offline_cluster(inventory)
    text, _ = chat(api(cluster))  # the lab's request: the sentence's length, greedy
    assert text == SENTENCE
    for role in (0, 1):
        assert on(version, role, "systemctl is-enabled docker && systemctl is-active docker").stdout.split() == [
            "enabled",
            "active",
        ]
        found = on(version, role, "for c in zstd python3 iptables docker; do command -v $c; done").stdout.split()
        assert [p.rsplit("/", 1)[1] for p in found] == ["zstd", "python3", "iptables", "docker"]
    assert on(version, 1, "systemctl is-active rpc-server").stdout.strip() == "active"

    # a second deploy changes nothing
    again = deploy(inventory, "--json")
    assert again.returncode == 0, again.stderr[-4000:]
    totals = json.loads(again.stdout)["results"]["totals"]
    assert totals["success"] == 0 and totals["error"] == 0, [
        op["name"] for op in json.loads(again.stdout)["results"]["operations"] if op["success"]
    ]
    return seconds
