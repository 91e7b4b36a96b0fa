"""The tensor cache's limit on the lab (rpc_cache_max_gib, files/rpc-cache-prune.sh).

rpc-server caches the weight tensors it receives that are over 10 MiB. The lab's own model has none,
so this test deploys a generated model whose FFN tensors are 12 MiB (6 layers, all on the workers,
split 1:1 with the output counted as a layer: 4 layers, 144 MiB cached on the first, 2, 72 MiB, on the
second) with a limit of 0.04 GiB (41 MiB), below each worker's share. Through three reloads
of llama-server, each worker's cache is under the limit once its timer has run, the pruner did
remove files, and the model answers after every reload.
"""

import re
import subprocess
import time

import pytest

from lab import lab
from llama_rpc_deploy import client
from llama_rpc_deploy.loading import offline_cluster
from llama_rpc_deploy.loadtest import until_serving
from llama_rpc_deploy.render import CACHE_PRUNE_EVERY, cache_dir
from llama_rpc_deploy.roles import CACHE_PRUNE_UNIT
from lab.testmodel import Shape, write_model

from .lab_helpers import INVENTORY, WORKERS, deployed_and_serving, needs_docker, on, operations, pyinfra

pytestmark = needs_docker
SHAPE = Shape(n_layer=6, n_embd=1536, n_head=12, n_head_kv=4, n_ff=4096)  # FFN tensors: 1536 x 4096 x 2 bytes
MODEL = "/models/lab-cache.gguf"
LIMIT_GIB = 0.04
RELOADS = 3


def cache_bytes(index: int, folder: str) -> int:
    out = on(index, f"find {folder} -maxdepth 1 -type f -printf '%s\\n' | awk '{{ s += $1 }} END {{ print s + 0 }}'")
    return int(out.stdout.strip() or 0)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    deployed_and_serving()
    local = write_model(tmp_path_factory.mktemp("cache") / "lab-cache.gguf", SHAPE)
    container = f"{lab.PREFIX}-{lab.host_names(1)[0]}"
    subprocess.run(["docker", "cp", str(local), f"{container}:{MODEL}"], check=True)
    assert on(0, f"chmod 644 {MODEL}").returncode == 0
    data = {"llama_model_path": MODEL, "llama_n_gpu_layers": 999, "rpc_cache_max_gib": LIMIT_GIB}
    try:
        operations(pyinfra(*[a for k, v in data.items() for a in ("--data", f"{k}={v}")], "--json"))
        yield offline_cluster(INVENTORY, overrides=data)
    finally:
        operations(pyinfra("--json"))
        on(0, f"rm -f {MODEL}")


def test_the_cache_stays_under_its_limit_across_reloads_and_the_model_serves(cluster):
    limit = int(LIMIT_GIB * 2**30)
    folders = [cache_dir(w) for w in cluster.workers]
    since = on(1, "date '+%Y-%m-%d %H:%M:%S'").stdout.strip()
    for reload in range(RELOADS):
        assert on(0, "systemctl restart llama-server").returncode == 0
        assert until_serving(cluster, 180, expect_down=False).seconds is not None, f"reload {reload + 1}"
        assert client.complete(cluster, "Cache or no cache:", 4)["timings"]["predicted_n"] == 4
        deadline = time.monotonic() + 2 * CACHE_PRUNE_EVERY + 15
        while True:
            sizes = [cache_bytes(1 + i, folder) for i, folder in enumerate(folders)]
            if all(0 < size <= limit for size in sizes) or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert all(0 < size <= limit for size in sizes), (reload + 1, sizes, limit)
    for index in range(1, WORKERS + 1):
        log = on(index, f"journalctl -u {CACHE_PRUNE_UNIT} --since '{since}' --no-pager -o cat").stdout
        removed = [int(n) for n in re.findall(r"removed (\d+) files", log)]
        assert removed and sum(removed) > 0, log[-2000:]  # the limit did bind
