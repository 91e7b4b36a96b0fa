"""Models on demand on the lab: llama-server as a router over two generated models (llama_models).

The lab's sentence model (llama_model_path, served as "lab") and a second sentence model that recites
another text, with its own context, slots and split. Requests alternate between them and each must be
answered by its own model; each model's placement, as llama-server's load report gives it, must be the
one the planner computed with that model's settings.
"""

import json
import subprocess
import time

import pytest

from lab import lab
from llama_rpc_deploy import client, load_report
from llama_rpc_deploy.loading import offline_cluster
from llama_rpc_deploy.gguf_header import read_model
from llama_rpc_deploy.plan import MIB, plan_cluster
from lab.testmodel import PROMPT, PROMPT_2, SENTENCE, SENTENCE_2, write_sentence_model

from .lab_helpers import INVENTORY, api, changed, deployed_and_serving, needs_docker, on, operations, pyinfra

pytestmark = needs_docker
FOLDER = "/models/on-demand"  # on the coordinator: a folder of its own, so it is mounted apart (/models-1)
SECOND = {
    "llama_model_path": f"{FOLDER}/second.gguf",
    "llama_ctx_size": 1024,
    "llama_parallel": 1,
    "llama_tensor_split": [1, 3],
}
TEXTS = {
    "lab": (PROMPT, SENTENCE),
    "second": (PROMPT_2, SENTENCE_2),
    "first": (PROMPT, SENTENCE),
}  # first: a copy of lab


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    """The lab deployed with llama_models = {second: ...}; the lab's one model again afterwards."""
    deployed_and_serving()
    local = write_sentence_model(
        tmp_path_factory.mktemp("second") / "second.gguf", lab.MODEL_SHAPE, prompt=PROMPT_2, sentence=SENTENCE_2
    )
    container = f"{lab.PREFIX}-{lab.host_names(1)[0]}"
    assert on(0, f"rm -rf {FOLDER} && mkdir -p {FOLDER} && chmod 755 {FOLDER}").returncode == 0
    subprocess.run(["docker", "cp", str(local), f"{container}:{SECOND['llama_model_path']}"], check=True)
    assert on(0, f"chmod 644 {FOLDER}/*").returncode == 0
    data = {"llama_models": {"second": SECOND}}
    try:
        ops = operations(pyinfra("--data", f"llama_models={json.dumps(data['llama_models'])}", "--json"))
        yield offline_cluster(INVENTORY, overrides=data), local, ops
    finally:
        operations(pyinfra("--json"))
        on(0, f"rm -rf {FOLDER}")


def ask(cluster, model: str) -> str:
    prompt, sentence = TEXTS[model]
    reply = api(cluster).chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], temperature=0, max_tokens=len(sentence.split()) + 4
    )
    assert reply.model == model
    return reply.choices[0].message.content


def test_the_default_model_is_loaded_when_the_deploy_ends(router):
    cluster, _, _ = router
    assert cluster.router and cluster.served_models() == ["lab", "second"]
    models = {m["id"]: m["status"]["value"] for m in client.get(cluster, "/v1/models")["data"]}
    assert models == {"lab": "loaded", "second": "unloaded"}


def test_alternating_requests_are_all_answered_by_their_model(router):
    cluster, _, _ = router
    answers = [(model, ask(cluster, model)) for model in ["second", "lab"] * 3]
    for model, text in answers:
        assert text.startswith(TEXTS[model][1]), (model, text)


def test_an_unknown_model_is_refused(router):
    cluster, _, _ = router
    with pytest.raises(Exception) as error:
        api(cluster).chat.completions.create(model="third", messages=[{"role": "user", "content": "hi"}], max_tokens=1)
    assert "third" in str(error.value) and "not found" in str(error.value)


@pytest.mark.parametrize("model", ["second", "lab"])
def test_each_model_is_placed_as_planned_with_its_own_settings(router, model):
    """The load report of the model loaded last, against plan_cluster on that model's settings: its own
    split (second: 1,3 across the two workers) and its own context and slots."""
    cluster, second_file, _ = router
    ask(cluster, model)
    time.sleep(1)  # the child's last lines reach the journal
    log = on(0, "journalctl -u llama-server --no-pager -o cat -n 20000").stdout
    report = load_report.parse(log)
    local = second_file if model == "second" else lab.CACHE / "lab-sentence.gguf"
    plan = plan_cluster(cluster.for_model(model), read_model(local))
    for worker in cluster.workers:
        placement = next(p for p in plan.placements if p.device.host == worker.name)
        assert report.on(worker.rpc_endpoint, "model") == [pytest.approx(placement.weights / MIB, rel=0.03, abs=0.02)]
        assert report.on(worker.rpc_endpoint, "KV") == [pytest.approx(placement.kv / MIB, rel=0.03, abs=0.02)]
    if model == "second":  # its own split (1,3), not the shared one (1,1): the figures above tell them apart
        shared = plan_cluster(cluster, read_model(local))
        assert [round(p.weights / MIB) for p in shared.placements] != [round(p.weights / MIB) for p in plan.placements]


def test_a_redeploy_leaves_the_model_a_client_loaded(router):
    """Nothing changed: no restart, no wait, and the model the last request loaded stays loaded (the
    deploy's readiness check asks for llama_model_path's model only after a restart)."""
    cluster, _, _ = router
    ask(cluster, "second")
    ops = operations(pyinfra("--data", f"llama_models={json.dumps({'second': SECOND})}", "--json"))
    assert changed(ops, "llama-server running") == [] and changed(ops, "Wait for") == []
    models = {m["id"]: m["status"]["value"] for m in client.get(cluster, "/v1/models")["data"]}
    assert models == {"lab": "unloaded", "second": "loaded"}


def test_the_whole_folder_is_served_with_llama_models_folder(router):
    """llama_models_folder: every model in llama_model_path's folder, named after its file; the
    coordinator's own listing decides (a copy of the lab's model goes in next to the second one)."""
    cluster, _, _ = router
    on(0, f"cp {lab.MODEL} {FOLDER}/first.gguf && chmod 644 {FOLDER}/first.gguf")
    data = {"llama_model_path": SECOND["llama_model_path"], "llama_models_folder": True}
    operations(pyinfra(*[a for k, v in data.items() for a in ("--data", f"{k}={v}")], "--json"))
    folder = offline_cluster(INVENTORY, overrides=data)
    models = {m["id"]: m["status"]["value"] for m in client.get(folder, "/v1/models")["data"]}
    assert models == {"second": "loaded", "first": "unloaded"}
    for model in ("first", "second"):
        assert ask(folder, model).startswith(TEXTS[model][1])
