"""What LM Studio folders hold, on the lab: a model split in shards, a vision projector next to it.

The sentence model split in 3 shards the way llama-gguf-split names them (gguf-py writes them), and a
small generated projector (testprojector.py), deployed with llama_kv_unified on. The split model must
load and recite SENTENCE; an image request must be answered (the image's 16 tokens counted); the
projector must sit where the planner put it (RPC0, the first of --device), and the unified KV cache
must be the size the planner says, per device, as llama-server's own load report gives it.
"""

import base64
import io
import subprocess

import numpy as np
import pytest
from matplotlib import image as mpimg

from lab import lab
from llama_rpc_deploy import load_report
from llama_rpc_deploy.loading import offline_cluster
from llama_rpc_deploy.gguf_header import projector_bytes, read_model
from llama_rpc_deploy.plan import MIB, plan_cluster
from lab.testmodel import PROMPT, SENTENCE, sentence_tokens, write_sentence_model
from lab.testprojector import write_projector

from .lab_helpers import INVENTORY, api, deployed_and_serving, needs_docker, on, operations, pyinfra

pytestmark = needs_docker
FOLDER = "/models/lmstudio"  # on the coordinator
SHARDS = 3


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    """The lab deployed with the split model, its projector and a unified KV cache; the lab's own
    model again afterwards."""
    deployed_and_serving()
    local = tmp_path_factory.mktemp("lmstudio")
    first = write_sentence_model(local / "lab-sentence.gguf", lab.MODEL_SHAPE, split_max_tensors=30)
    projector = write_projector(local / "mmproj-lab-sentence.gguf", lab.MODEL_SHAPE.n_embd)
    files = sorted(local.iterdir())
    assert len(files) == SHARDS + 1, files
    container = f"{lab.PREFIX}-{lab.host_names(1)[0]}"
    assert on(0, f"rm -rf {FOLDER} && mkdir -p {FOLDER} && chmod 755 {FOLDER}").returncode == 0
    for path in files:
        subprocess.run(["docker", "cp", str(path), f"{container}:{FOLDER}/{path.name}"], check=True)
    assert on(0, f"chmod 644 {FOLDER}/*").returncode == 0
    data = {
        "llama_model_path": f"{FOLDER}/{first.name}",
        "llama_mmproj_path": f"{FOLDER}/{projector.name}",
        "llama_kv_unified": True,
    }
    args = [a for key, value in data.items() for a in ("--data", f"{key}={value}")]
    try:
        ops = operations(pyinfra(*args, "--json"))
        cluster = offline_cluster(INVENTORY, overrides=data)
        yield cluster, read_model(first), projector_bytes(projector), ops
    finally:
        operations(pyinfra("--json"))
        on(0, f"rm -rf {FOLDER}")


def png() -> str:
    """A 48x48 picture as a data URI."""
    pixels = np.zeros((48, 48, 3))
    pixels[:, :24, 0] = 1.0
    pixels[12:36, 12:36, 2] = 1.0
    buffer = io.BytesIO()
    mpimg.imsave(buffer, pixels, format="png")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def test_the_split_model_is_read_shard_by_shard(deployed):
    cluster, model, _, _ = deployed
    assert len(model.shards) == SHARDS
    assert cluster.settings["llama_model_path"].endswith("-00001-of-00003.gguf")


def test_the_split_model_recites_the_sentence(deployed):
    cluster, _, _, _ = deployed
    reply = api(cluster).chat.completions.create(
        model="lab", messages=[{"role": "user", "content": PROMPT}], temperature=0, max_tokens=len(sentence_tokens())
    )
    assert reply.choices[0].message.content == SENTENCE


def test_an_image_request_is_answered(deployed):
    """The image goes first: a prompt that ends with an image makes the pinned llama-server abort
    (GGML_ASSERT(batch.size() > 0), tools/server/server-context.cpp:3576) with this model's bare template."""
    cluster, _, _, _ = deployed
    content = [{"type": "image_url", "image_url": {"url": png()}}, {"type": "text", "text": PROMPT}]
    reply = api(cluster).chat.completions.create(
        model="lab", messages=[{"role": "user", "content": content}], temperature=0, max_tokens=8
    )
    text_only = api(cluster).chat.completions.create(
        model="lab", messages=[{"role": "user", "content": PROMPT}], temperature=0, max_tokens=1
    )
    assert reply.usage.completion_tokens > 0 and reply.choices[0].message.content
    assert reply.usage.prompt_tokens == text_only.usage.prompt_tokens + 16  # 64x64 / 16x16 patches


def test_the_load_report_agrees_with_the_planner(deployed):
    """The projector on RPC0 (the first worker's device), and the unified KV cache per device, as planned."""
    cluster, model, projector, _ = deployed
    log = on(0, "journalctl -u llama-server --no-pager -o cat -n 5000").stdout
    report = load_report.parse(log)
    first = cluster.workers[0].rpc_endpoint
    assert report.clip_device == f"RPC0[{first}]", report
    plan = plan_cluster(cluster, model, mmproj_bytes=projector)
    assert plan.context.unified and plan.placements[0].mmproj == projector
    for worker in cluster.workers:
        placement = next(p for p in plan.placements if p.device.host == worker.name)
        assert report.on(worker.rpc_endpoint, "KV") == [pytest.approx(placement.kv / MIB, rel=0.03, abs=0.02)]
        assert report.on(worker.rpc_endpoint, "model") == [pytest.approx(placement.weights / MIB, rel=0.03, abs=0.02)]
