"""The end-to-end tests' fixtures; what they share besides is in lab_helpers.py."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

from llama_rpc_deploy.deployment import from_cluster

from .lab_helpers import deployed_and_serving, on

COORDINATOR = 0
ALONE = "llama-rpc-tokens-alone"  # the single llama-server's container on the coordinator
ALONE_PORT = 18080


@pytest.fixture(scope="module")
def cluster():
    """The lab deployed as its inventory says, and serving (a module may define a cluster of its own). A module
    that breaks the lab uses serving_afterwards too (a fault test starts from a serving cluster and leaves one
    behind)."""
    return deployed_and_serving()


@pytest.fixture
def serving_afterwards(cluster):
    """Each test of a module that uses it (pytestmark) must leave the lab serving."""
    from llama_rpc_deploy.loadtest import until_serving

    yield
    assert until_serving(cluster, 240, expect_down=False).seconds is not None, "the lab is not serving after the test"


@pytest.fixture(scope="module")
def alone(cluster):
    """URL of one llama-server with the deployed image and model, on the coordinator, no RPC devices."""
    s = cluster.settings
    image = from_cluster(cluster, with_key=False).image
    host = cluster.coordinator.address
    args = [
        "--model",
        s["llama_model_path"],
        "--host",
        host,
        "--port",
        ALONE_PORT,
        "--ctx-size",
        s["llama_ctx_size"],
        "--parallel",
        s["llama_parallel"],
        "--cache-type-k",
        s["llama_cache_type_k"],
        "--cache-type-v",
        s["llama_cache_type_v"],
        "--flash-attn",
        s["llama_flash_attn"],
        *(["--threads", s["llama_threads"]] if s["llama_threads"] else []),
    ]
    model_dir = s["llama_model_path"].rsplit("/", 1)[0]
    on(COORDINATOR, f"docker rm -f {ALONE} >/dev/null 2>&1")
    started = on(
        COORDINATOR,
        f"docker run -d --rm --name {ALONE} --network host -v {model_dir}:{model_dir}:ro "
        f"{image} server {' '.join(str(a) for a in args)}",
    )
    assert started.returncode == 0, started.stderr
    url = f"http://{host}:{ALONE_PORT}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as response:
                    if json.load(response).get("status") == "ok":
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(
                    "the lone llama-server did not come up:\n" + on(COORDINATOR, f"docker logs {ALONE}").stderr[-3000:]
                )
            time.sleep(1)
        yield url
    finally:
        on(COORDINATOR, f"docker rm -f {ALONE} >/dev/null 2>&1")
