"""A worker of another backend: the lab's second worker on Vulkan, beside a CPU worker (issue 26).

The lab has no GPU, so the Vulkan worker's device is Mesa's lavapipe, the CPU's Vulkan driver (the vulkan
image carries Mesa's drivers; a vulkan host without gpus uses it). The coordinator builds two images from the
one llama.cpp source, cpu and vulkan, each once, and sends the vulkan one to that worker alone. The split over
the CPU worker and the Vulkan worker must give the tokens of ONE llama-server (the cpu image, no RPC), and their
log-probabilities within VULKAN_LOGPROB_TOLERANCE. Afterwards the lab is deployed back as its inventory says.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from lab import lab
from lab.testmodel import SENTENCE, sentence_tokens
from llama_rpc_deploy.paths import PROJECT
from llama_rpc_deploy.deployment import from_cluster
from llama_rpc_deploy.loading import offline_cluster
from llama_rpc_deploy.loadtest import until_serving

from llama_rpc_deploy import facts

from .lab_helpers import (
    INVENTORY,
    NEW_BYTES,
    WORKERS,
    api,
    changed,
    chat,
    needs_docker,
    on,
    openai_client,
    operations,
    pyinfra,
    rx_bytes,
    same_tokens,
    send,
    streamed_chat,
)

pytestmark = needs_docker
COORDINATOR, WORKER1, WORKER2 = 0, 1, 2
MIXED = lab.LAB_DIR / "inventory-vulkan.py"
PROBE = "llama-rpc-vulkan-layer-probe:1"
# what the running rpc-server printed as it started (a line per client connection follows)
STARTED = (
    'journalctl -u rpc-server _SYSTEMD_INVOCATION_ID="$(systemctl show -p InvocationID --value rpc-server)" '
    "-o cat --no-pager | head -n 100"
)
# lavapipe against llama.cpp's CPU backend: two implementations of every kernel. Vulkan's matrix products take
# their activations in f16 (fp16: 1 on lavapipe) and sum in another order, so a layer's output differs at f16's
# 2**-11 relative rounding, as the split against one process already does through f16 KV (0.01 there); the
# worker holds 3 of the 8 layers, and each moves logits of about 20 by at most 20 * 2**-11 = 0.01, so 0.05 bounds
# the change of a log-probability by five such layer roundings. The sentence wins by more than 12 at every step,
# so no such difference can change a token, while a wrong kernel moves the logits by whole units.
VULKAN_LOGPROB_TOLERANCE = 0.05


def deploy(inventory, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["pyinfra", "-y", *args, str(inventory), "deploy.py"], cwd=PROJECT, capture_output=True, text=True, timeout=3000
    )


@pytest.fixture(scope="module")
def first_deploy():
    """The lab with its second worker on vulkan: its inventory, written beside the lab's, and the deploy's
    operations."""
    lab.up(workers=WORKERS)
    MIXED.write_text(
        INVENTORY.read_text() + "\n# tests/e2e/test_lab_vulkan.py: the second worker on Vulkan (lavapipe)\n"
        'workers = workers[:1] + [(workers[1][0], {**workers[1][1], "image_backend": "vulkan"})]\n'
    )
    result = deploy(MIXED, "--json")
    try:
        yield operations(result)
    finally:  # the lab as its inventory says, for whatever runs next
        operations(pyinfra("--json"))
        MIXED.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def cluster(first_deploy):
    cluster = offline_cluster(MIXED)
    assert until_serving(cluster, 300, expect_down=False).seconds is not None
    return cluster


def test_one_image_per_backend_each_where_it_is_needed(cluster, first_deploy):
    d = from_cluster(cluster, with_key=False)
    assert [w.backend for w in cluster.workers] == ["cpu", "vulkan"] and cluster.coordinator.backend == "cpu"
    assert set(d.images) == {"cpu", "vulkan"} and d.images["cpu"] != d.images["vulkan"]
    assert d.image_of(cluster.workers[1].name) == d.images["vulkan"]
    # the coordinator built both; the vulkan image went to the vulkan worker only, the cpu one never to it
    have = {i: on(i, "docker images --format '{{.Repository}}:{{.Tag}}'").stdout.split() for i in range(3)}
    assert d.images["cpu"] in have[COORDINATOR] and d.images["vulkan"] in have[COORDINATOR]
    assert d.images["vulkan"] in have[WORKER2] and d.images["vulkan"] not in have[WORKER1]
    assert not changed(first_deploy, f"Send {d.images['vulkan']} to {cluster.workers[0].name}")
    assert not changed(first_deploy, f"Send {d.images['cpu']} to {cluster.workers[1].name}")
    # each host runs its own backend's build
    assert on(WORKER2, "docker exec rpc-server cat /app/backend").stdout.strip() == "vulkan"
    assert on(WORKER1, "docker exec rpc-server cat /app/backend").stdout.strip() == "cpu"


def test_both_images_are_the_same_llama_cpp(cluster):
    """The same commit in both: the same build number and commit (llama-server --version) and RPC protocol (the
    handshake at start checks the protocol too: llama-server is serving)."""
    d = from_cluster(cluster, with_key=False)
    found = {}
    for backend, image in d.images.items():
        version = on(COORDINATOR, f"docker run --rm {image} version 2>&1")
        protocol = on(COORDINATOR, f"docker run --rm --entrypoint cat {image} /app/rpc-protocol")
        assert version.returncode == 0 and protocol.returncode == 0, version.stdout + protocol.stderr
        found[backend] = (re.search(r"^version: .*$", version.stdout, re.M).group(0), protocol.stdout.strip())
    assert found["cpu"] == found["vulkan"], found
    assert "build 11312, commit 0c1e5709" in found["cpu"][0] and found["cpu"][1] == "7.0.0", found


def test_the_vulkan_worker_serves_lavapipe(cluster):
    log = on(WORKER2, STARTED).stdout
    assert "ggml_vulkan: 0 = llvmpipe" in log, log[-2000:]
    assert "Vulkan0: llvmpipe" in log and "CPU:" not in log, log[-2000:]  # rpc-server serves it, not the CPU
    assert "CPU:" in on(WORKER1, STARTED).stdout


def test_status_shows_each_hosts_backend(cluster):
    result = subprocess.run(
        ["python3", "-m", "llama_rpc_deploy", "status", "-i", str(MIXED), "--json"],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    hosts = {h["name"]: h for h in json.loads(result.stdout)}
    assert [hosts[h.name]["backend"] for h in cluster.hosts] == ["cpu", "cpu", "vulkan"]
    assert hosts[cluster.workers[1].name]["rpc_devices"][0].startswith("Vulkan0: llvmpipe")
    assert hosts[cluster.workers[0].name]["rpc_devices"][0].startswith("CPU: ")
    text = subprocess.run(
        ["python3", "-m", "llama_rpc_deploy", "status", "-i", str(MIXED)],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    assert f"{cluster.workers[1].name} (workers)  backend vulkan" in text, text


@pytest.mark.parametrize("call", [chat, streamed_chat], ids=["chat", "streamed"])
def test_cpu_and_vulkan_workers_give_one_process_tokens(cluster, alone, call):
    split, one = call(api(cluster)), call(openai_client(alone, None))
    for name, (text, tokens) in {"split": split, "alone": one}.items():
        assert text == SENTENCE, name
        assert len(tokens) == len(sentence_tokens()), name
    same_tokens(split[1], one[1], VULKAN_LOGPROB_TOLERANCE)
    worst = max(abs(a[t] - b[t]) for (_, a), (_, b) in zip(split[1], one[1]) for t in a.keys() & b.keys())
    print(f"largest |log-probability difference|, CPU + Vulkan workers against one process: {worst:.5f}")


def test_a_new_layer_of_the_vulkan_image_is_all_that_crosses(cluster):
    """An upgrade of the vulkan image sends its worker only the layers it lacks, with the deploy's own transfer
    (as tests/e2e/test_lab_layers.py shows for the cpu image): a probe image on top of the deployed vulkan one, with
    one new layer of random bytes, sent to the vulkan worker."""
    image = from_cluster(cluster, with_key=False).image_of(cluster.workers[1].name)
    built = on(
        COORDINATOR,
        f"printf 'FROM {image}\\nRUN head -c {NEW_BYTES} /dev/urandom > /probe\\n' | "
        f"docker build -q -t {PROBE} - && docker image inspect --format '{{{{.Id}}}}' {PROBE}",
    )
    assert built.returncode == 0, built.stderr
    try:
        fact = facts.DockerImageLayers()  # what the deploy reads from the worker
        have = fact.process(on(WORKER2, fact.command()).stdout.splitlines())
        before = rx_bytes(WORKER2)
        sent = send(cluster, PROBE, have, worker=1)
        received = rx_bytes(WORKER2) - before
        assert sent.returncode == 0, sent.stderr
        assert "left out" in sent.stderr and "layers the receiver has" in sent.stderr
        assert (
            on(WORKER2, f"docker image inspect --format '{{{{.Id}}}}' {PROBE}").stdout.strip()
            == built.stdout.split()[-1]
        )
        image_bytes = int(on(COORDINATOR, f"docker image inspect --format '{{{{.Size}}}}' {PROBE}").stdout)
        assert NEW_BYTES < received < NEW_BYTES * 1.1 + 200_000 < image_bytes / 50, (received, image_bytes)
    finally:
        for host in (COORDINATOR, WORKER2):
            on(host, f"docker rmi -f {PROBE} >/dev/null 2>&1")


def test_a_second_deploy_changes_nothing(cluster):
    ops = operations(deploy(MIXED, "--json"))
    assert {op["name"]: op["success"] for op in ops if op["success"]} == {}
    assert not any(" | Send " in op["name"] or " | Build llama" in op["name"] for op in ops)
