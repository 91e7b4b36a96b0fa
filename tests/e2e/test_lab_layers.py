"""The image transfer sends only the layers a worker lacks (files/skip-layers.py), into a real dockerd.

A probe image is built on the coordinator on top of the deployed one, with one new layer of 3 MB of
random bytes. Sent with the deploy's command to a worker that has the deployed image, only that layer
crosses the link and the worker gets the same image ID; a stream that leaves out a layer the worker
lacks is refused and nothing is tagged.
"""

import json

import pytest

from llama_rpc_deploy import facts
from llama_rpc_deploy.deployment import from_cluster

from .lab_helpers import NEW_BYTES, deployed_and_serving, needs_docker, on, rx_bytes, send

pytestmark = needs_docker
PROBE = "llama-rpc-layer-probe"


@pytest.fixture(scope="module")
def probe():
    cluster = deployed_and_serving()
    image = from_cluster(cluster).image
    built = on(
        0,
        f"printf 'FROM {image}\\nRUN head -c {NEW_BYTES} /dev/urandom > /probe\\n' | "
        f"docker build -q -t {PROBE}:1 - && docker image inspect --format '{{{{.Id}}}}' {PROBE}:1",
    )
    assert built.returncode == 0, built.stderr
    try:
        yield cluster, built.stdout.split()[-1]
    finally:
        for host in (0, 1):
            on(host, f"docker rmi -f {PROBE}:1 {PROBE}:2 >/dev/null 2>&1")


def test_only_the_new_layer_crosses_and_the_image_id_is_the_same(probe):
    cluster, probe_id = probe
    fact = facts.DockerImageLayers()  # what the deploy reads from the worker
    have = fact.process(on(1, fact.command()).stdout.splitlines())
    image_bytes = int(on(0, f"docker image inspect --format '{{{{.Size}}}}' {PROBE}:1").stdout)
    before = rx_bytes(1)
    sent = send(cluster, f"{PROBE}:1", have)
    received = rx_bytes(1) - before
    assert sent.returncode == 0, sent.stderr
    assert "left out" in sent.stderr and "layers the receiver has" in sent.stderr
    assert on(1, f"docker image inspect --format '{{{{.Id}}}}' {PROBE}:1").stdout.strip() == probe_id
    # random bytes do not compress: the new layer, plus tar headers, the image's json and ssh's own
    assert NEW_BYTES < received < NEW_BYTES * 1.1 + 200_000 < image_bytes / 10


def test_a_stream_without_a_layer_the_worker_lacks_is_refused(probe):
    """The filter told the worker has every layer, the new one too: the load fails, nothing is tagged."""
    cluster, probe_id = probe
    on(0, f"docker tag {PROBE}:1 {PROBE}:2")
    on(1, f"docker rmi -f {PROBE}:1 >/dev/null 2>&1; docker image prune -f >/dev/null")
    layers = json.loads(on(0, f"docker image inspect --format '{{{{json .RootFS.Layers}}}}' {PROBE}:2").stdout)
    sent = send(cluster, f"{PROBE}:2", [tuple(layers)])
    assert sent.returncode != 0
    assert "docker load failed, nothing tagged" in sent.stderr
    assert on(1, f"docker image inspect {PROBE}:2").returncode != 0
    assert on(1, f"docker image inspect {probe_id}").returncode != 0
