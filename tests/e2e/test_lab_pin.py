"""`lab pin` confines what each lab host's dockerd runs, as it confines the host itself: the deployed
llama-server and rpc-servers (containers of the hosts' own dockerd) may run only on their host's core, a
container started afterwards too, and `lab unpin` gives every core back.

Before lab/host.Dockerfile gave the hosts' dockerd a cgroup-parent, those containers' cgroups sat beside the
lab hosts at the top of this machine's tree (cgroup v1, --cgroupns=host) and kept every core while the hosts'
own processes were pinned: benchmarks/tool_overhead.py compared pinned bare processes with floating containers
(issue 25; docs/results/tool-overhead.md).
"""

import os

import pytest

from lab import lab
from llama_rpc_deploy.deployment import from_cluster

from .lab_helpers import deployed_and_serving, needs_docker, on

pytestmark = [needs_docker, pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="pinning needs 2 cores to show")]
LAST = str((os.cpu_count() or 1) - 1)
EVERY = f"0-{LAST}"


def deployed_cores(host: int) -> set[str]:
    """The cores the deployed llama.cpp processes on a lab host may use (Cpus_allowed_list, as the kernel says)."""
    result = on(
        host,
        "for p in $(pgrep -f '^/app/(llama|rpc)-server'); do "
        "sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/$p/status 2>/dev/null; done; true",
    )
    assert result.stdout.split(), f"no deployed llama.cpp process on lab host {host}: {result.stderr}"
    return set(result.stdout.split())


def new_container_cores(host: int, image: str) -> str:
    result = on(
        host,
        f"docker run --rm --entrypoint sh {image} -c "
        "'sed -n \"s/^Cpus_allowed_list:[[:space:]]*//p\" /proc/self/status'",
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_pin_confines_the_hosts_containers_and_unpin_frees_them():
    cluster = deployed_and_serving()
    image = from_cluster(cluster).image
    try:
        lab.pin()
        assert deployed_cores(0) == {"0"}
        assert deployed_cores(1) == {LAST} and deployed_cores(2) == {LAST}
        assert new_container_cores(1, image) == LAST  # a container started while pinned is confined too
    finally:
        lab.pin(unpin=True)
    assert all(deployed_cores(host) == {EVERY} for host in (0, 1, 2))
    assert new_container_cores(0, image) == EVERY
