"""Speculative decoding as settings: what llama-server gets, what the headers must agree on, what the planner counts.

The settings alone are refused in tests/bad_configs.py (unit and lab); here: the rendered flags, the header checks
against files of the lab's own kinds, and the draft's memory against llama-fit-params (tests/oracle.py).
"""

import dataclasses
import json

import pytest

from lab.testmodel import Shape, write_model, write_sentence_model
from llama_rpc_deploy import speculation
from llama_rpc_deploy.gguf_header import read_model
from llama_rpc_deploy.plan import MIB, plan_cluster
from llama_rpc_deploy.render import models_preset

from .. import oracle
from ..families import FAMILIES
from .helpers import cluster, flag, server_script, words

TINY = Shape(n_layer=1, n_embd=64, n_head=2, n_head_kv=1, n_ff=128)
DRAFT_RECORDED = json.loads(oracle.DRAFTS_RECORDED.read_text())


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Models of the lab's kinds: the sentence model (target), a smaller one of its vocabulary (a draft), and one
    of another vocabulary (write_model's: the same specials and bytes, other pieces)."""
    folder = tmp_path_factory.mktemp("spec")
    return {
        "target": read_model(write_sentence_model(folder / "target.gguf", TINY)),
        "draft": read_model(write_sentence_model(folder / "draft.gguf", dataclasses.replace(TINY, seed=7))),
        "other": read_model(write_model(folder / "other.gguf", TINY)),
    }


def cpu_cluster(**data):
    return cluster(
        coordinator={"gpus": []},
        workers=[{"gpus": []}, {"gpus": []}],
        all_data={"image_backend": "cpu", "llama_model_path": "/models/lab.gguf", **data},
    )


def test_off_by_default_no_flag_reaches_llama_server():
    argv = words(server_script(cpu_cluster()))
    assert not [a for a in argv if a.startswith("--spec")]


def test_a_draft_runs_on_the_cpu_coordinators_cpu_not_on_the_workers():
    argv = words(server_script(cpu_cluster(llama_spec_draft_path="/models/draft.gguf", llama_spec_type="draft-simple")))
    assert flag(argv, "--spec-type") == "draft-simple"
    assert flag(argv, "--spec-draft-model") == "/models/draft.gguf"  # the model's folder, mounted once
    assert flag(argv, "--spec-draft-device") == "none"  # llama.cpp's word for no offload: the CPU
    assert "--spec-draft-ngl" not in argv
    assert "--spec-draft-n-max" not in argv  # unset: llama.cpp's default (3)


def test_a_draft_runs_on_the_coordinators_last_gpu_whole():
    c = cluster(
        coordinator={"gpus": ["RTX 4080", "RTX 4080"]},
        all_data={"llama_spec_draft_path": "/drafts/d.gguf", "llama_spec_type": "draft-simple"},
    )
    argv = words(server_script(c))
    assert flag(argv, "--device") == "RPC0,CUDA0,CUDA1"
    assert flag(argv, "--spec-draft-device") == "CUDA1"
    assert flag(argv, "--spec-draft-ngl") == "all"
    assert flag(argv, "--spec-draft-model") == "/models-1/d.gguf"  # a folder of its own: mounted read-only
    assert any(a.startswith("/drafts:/models-1:ro") for a in argv), argv


def test_a_device_asked_for_is_the_one_used():
    c = cluster(all_data={"llama_spec_draft_path": "/models/d.gguf", "llama_spec_draft_device": "RPC0"})
    assert flag(words(server_script(c)), "--spec-draft-device") == "RPC0"


def test_bounds_go_to_the_flags_of_the_type():
    draft = words(server_script(cpu_cluster(llama_spec_draft_path="/m/d.gguf", llama_spec_draft_max=2)))
    assert flag(draft, "--spec-draft-n-max") == "2" and "--spec-draft-n-min" not in draft
    ngram = words(
        server_script(cpu_cluster(llama_spec_type="ngram-mod", llama_spec_draft_min=8, llama_spec_draft_max=16))
    )
    assert (flag(ngram, "--spec-ngram-mod-n-min"), flag(ngram, "--spec-ngram-mod-n-max")) == ("8", "16")
    assert "--spec-draft-device" not in ngram and "--spec-draft-model" not in ngram


@pytest.mark.parametrize(
    "data, bounds, candidates",
    [
        ({"llama_spec_draft_path": "/m/d.gguf"}, (0, 3), [0, 1, 6]),  # llama.cpp's draft defaults
        ({"llama_spec_draft_path": "/m/d.gguf", "llama_spec_draft_max": 64}, (0, 64), [0, 32]),  # 128 > 64
        ({"llama_spec_draft_path": "/m/d.gguf", "llama_spec_draft_max": 1}, (0, 1), [0, 2]),  # 0 is off, not a max
        ({"llama_spec_type": "ngram-mod"}, (48, 64), [0, 32, 128]),  # ngram-mod's defaults, up to 1024
        ({"llama_spec_type": "ngram-simple"}, None, [0]),  # no bounds: on or off
        ({}, None, [0]),
    ],
)
def test_what_tune_compares(data, bounds, candidates):
    s = cpu_cluster(**data).settings
    assert speculation.bounds(s) == bounds
    assert speculation.max_candidates(s) == candidates


def test_a_candidate_renders_as_the_deploy_would():
    """Each of tune's candidates is a valid setting (the bad-config checks pass) and reaches the flags: off has
    no --spec flag; a lower maximum lowers a minimum above it."""
    base = {"llama_spec_type": "ngram-mod", "llama_spec_draft_min": 48, "llama_spec_draft_max": 64}
    s = cpu_cluster(**base).settings
    off = cpu_cluster(**{**base, **speculation.with_max(s, 0)})
    assert speculation.settings_problem(off) == "" and not [
        a for a in words(server_script(off)) if a.startswith("--spec")
    ]
    lower = cpu_cluster(**{**base, **speculation.with_max(s, 32)})
    argv = words(server_script(lower))
    assert speculation.settings_problem(lower) == ""
    assert (flag(argv, "--spec-ngram-mod-n-min"), flag(argv, "--spec-ngram-mod-n-max")) == ("32", "32")


def test_each_model_on_demand_has_its_own_speculation():
    c = cpu_cluster(
        llama_models={
            "lab": {"llama_model_path": "/models/lab.gguf", "llama_spec_type": "ngram-mod"},
            "big": {"llama_model_path": "/models/big.gguf", "llama_spec_draft_path": "/models/small.gguf"},
        }
    )
    preset = models_preset(c)
    lab, big = preset.split("[big]")
    assert "spec-type = ngram-mod" in lab and "spec-draft-model" not in lab
    assert "spec-draft-model = /models/small.gguf" in big and "spec-draft-device = none" in big
    assert "spec-type" not in big  # settled on the coordinator from the draft's header (phases/checks.settle)


def test_a_draft_of_the_targets_vocabulary_passes(files):
    assert speculation.files_problem("draft-simple", files["target"], files["draft"]) == ""
    assert speculation.files_problem(None, files["target"], files["draft"]) == ""
    assert speculation.type_of_draft(files["draft"]) == "draft-simple"


def test_a_draft_of_another_vocabulary_is_refused(files):
    problem = speculation.files_problem(None, files["target"], files["other"])
    assert problem == (
        f"the draft {files['other'].path} has other token texts than the target's: expected the target's "
        "vocabulary (llama-server would log the mismatch and serve without drafting)"
    )


@pytest.mark.parametrize(
    "change, words",
    [
        (dict(model="gpt2"), "tokenizer model 'gpt2', the target's 'llama'"),
        (dict(bos=7), "BOS (add True, id 7), the target's (add True, id 1)"),
        (dict(add_eos=True), "EOS (add True, id 2), the target's (add False, id 2)"),
    ],
)
def test_what_llama_cpp_compares_is_compared(files, change, words):
    draft = dataclasses.replace(files["draft"], vocab=dataclasses.replace(files["draft"].vocab, **change))
    assert words in speculation.files_problem("draft-simple", files["target"], draft)


def test_two_vocabularies_128_tokens_apart_may_pair_not_129(files):
    tokens = files["draft"].vocab.tokens

    def sized(count):
        return dataclasses.replace(
            files["draft"],
            vocab=dataclasses.replace(files["draft"].vocab, tokens=dataclasses.replace(tokens, count=count)),
        )

    assert speculation.vocab_problem(files["target"], sized(tokens.count + 128)) == ""
    assert "(llama.cpp allows 128 apart)" in speculation.vocab_problem(files["target"], sized(tokens.count + 129))


def test_a_type_the_drafts_architecture_cannot_serve_is_refused(files):
    problem = speculation.files_problem("draft-eagle3", files["target"], files["draft"])
    assert "llama_spec_type = 'draft-eagle3', but the draft" in problem
    assert "is architecture 'llama', which serves 'draft-simple': expected llama_spec_type: draft-simple" in problem
    assert "has none (no blk.0.nextn.eh_proj)" in speculation.files_problem("draft-mtp", files["target"], None)


def test_architectures_pick_their_types(files):
    def kind(**change):
        return speculation.type_of_draft(dataclasses.replace(files["draft"], **change))

    assert kind(arch="eagle3") == "draft-eagle3"
    assert kind(arch="gemma4-assistant") == "draft-mtp"
    assert kind(mtp_head=True) == "draft-mtp"
    assert (kind(arch="dflash"), kind(arch="dflash", markov_head=True)) == ("draft-dflash", "draft-dspark")


def test_the_planner_counts_the_draft_where_it_runs(files):
    c = cluster(
        coordinator={"gpus": ["RTX 4080"]},
        all_data={"llama_spec_draft_path": "/m/d.gguf", "llama_ctx_size": 4096, "llama_parallel": 1},
    )
    without = plan_cluster(c, files["target"])
    with_draft = plan_cluster(c, files["target"], draft=files["draft"])
    d = with_draft.draft
    assert (d.kind, d.device) == ("draft-simple", "CUDA0")
    assert with_draft.placements[-1].free == without.placements[-1].free - d.on_device
    assert with_draft.placements[0].free == without.placements[0].free  # nothing on the worker
    assert with_draft.host_bytes == without.host_bytes + files["draft"].input_bytes
    assert "draft model (draft-simple) on CUDA0" in with_draft.table()
    on_worker = plan_cluster(
        cluster(
            coordinator={"gpus": ["RTX 4080"]},
            all_data={"llama_spec_draft_path": "/m/d.gguf", "llama_spec_draft_device": "RPC0"},
        ),
        files["target"],
        draft=files["draft"],
    )
    assert any("runs on RPC0, a worker's device" in w for w in on_worker.warnings)


def test_the_draft_recording_covers_its_grid():
    assert list(DRAFT_RECORDED) == [c.key for c in oracle.draft_grid()]
    assert all(DRAFT_RECORDED.values())


@pytest.fixture(scope="module")
def family_models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("draft-families")
    return {name: read_model(write(folder / f"{name}.gguf")) for name, write in FAMILIES.items()}


@pytest.mark.xdist_group("plan oracle")
@pytest.mark.parametrize("family", list(FAMILIES))
def test_draft_memory_within_3_percent_of_llama_fit_params(family_models, family):
    """llama-fit-params -m DRAFT -c CTX -np PARALLEL: what llama-server adds for a draft on the CPU (weights, KV)."""
    cases = [c for c in oracle.draft_grid() if c.family == family]
    bad = [line for c in cases for line in oracle.mismatches(family_models[family], c, DRAFT_RECORDED[c.key])]
    assert not bad, "\n".join(bad)
    case = cases[-1]
    wrong = {d: dict(f, context=f["context"] * 1.05 + 2) for d, f in DRAFT_RECORDED[case.key].items()}
    assert oracle.mismatches(family_models[family], case, wrong)  # the comparison can fail
    assert DRAFT_RECORDED[case.key]["Host"]["model"] * MIB > 0
