"""The planner's speculative speed (Leviathan et al.'s arithmetic on the plain ceiling) against figures computed by
hand, and Gemma 4 31B with its assistant on the seed pair: the draft's room on the coordinator's card, its KV the
target's."""

import argparse
import dataclasses

import pytest

from llama_rpc_deploy import speculation
from llama_rpc_deploy.__main__ import main
from llama_rpc_deploy.gguf_header import read_model
from llama_rpc_deploy.paths import PROJECT
from llama_rpc_deploy.plan import (
    HOP_SECONDS,
    SpeculativeSpeed,
    command,
    plan_cluster,
    tokens_per_step,
)

from ..families import gemma4, gemma4_assistant, gemma4_e4b
from .helpers import cluster, flag, server_script, words

SEED = {"llama_ctx_size": 65536, "llama_parallel": 4, "llama_tensor_split": "auto"}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemma4-assistant")
    return {
        "target": gemma4(folder / "gemma-4-31B-it.gguf"),
        "assistant": gemma4_assistant(folder / "gemma-4-31B-it-assistant.gguf"),
    }


@pytest.fixture(scope="module")
def models(files):
    return {name: read_model(path) for name, path in files.items()}


@pytest.fixture(scope="module")
def e4b(tmp_path_factory):
    """Gemma 4 E4B: its layers 24..41 keep no KV, and read layer 22's (sliding) or 23's (global)."""
    return read_model(gemma4_e4b(tmp_path_factory.mktemp("gemma4-e4b") / "gemma-4-E4B-it.gguf"))


def test_tokens_per_step_by_hand():
    assert tokens_per_step(0.0, 3) == 1.0  # every draft rejected: the target's own token
    assert tokens_per_step(1.0, 3) == 4.0  # every draft accepted, and the target's next one
    assert tokens_per_step(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert tokens_per_step(0.7, 3) == pytest.approx(1 + 0.7 + 0.49 + 0.343)


def speed(acceptance, n_max=3, verify=1 / 32, draft=0.0007):
    return SpeculativeSpeed("draft-mtp", n_max, acceptance, verify, draft, n_max, "CUDA0")


def test_nothing_accepted_costs_the_drafts():
    """a = 0: one token per step, the target's, and the step costs the draft's passes on top of the plain token."""
    s = speed(0.0)
    assert s.tokens_per_s == pytest.approx(1 / (1 / 32 + 3 * 0.0007))
    assert s.tokens_per_s < 32 and s.speedup == pytest.approx(1 / (1 + 3 * 0.0007 * 32))


def test_everything_accepted_is_k_plus_one_over_one_plus_k_r():
    r = 0.0007 * 32  # the draft's pass against the target's
    assert speed(1.0).speedup == pytest.approx(4 / (1 + 3 * r))
    assert speed(1.0, n_max=5).speedup == pytest.approx(6 / (1 + 5 * r))
    assert speed(1.0, draft=0.0).speedup == pytest.approx(4)  # n-gram drafting: the whole k + 1


def test_the_speed_grows_with_the_acceptance():
    speeds = [speed(a / 20).tokens_per_s for a in range(21)]
    assert speeds == sorted(speeds) and len(set(speeds)) == len(speeds)


def test_the_line_says_acceptance_n_max_and_the_ratio():
    s = speed(0.7)
    line = s.line()
    assert "draft-mtp, draft on CUDA0: 0.70 ms a pass" in line
    assert f"at acceptance 0.7, n_max 3: {s.tokens_per_s:.1f} tok/s ({s.speedup:.2f} x the plain ceiling)" in line
    assert "count 51% of drafted tokens accepted" in line  # (0.7 + 0.49 + 0.343) / 3


def test_gemma4_31b_and_its_assistant_fit_the_seed_pair_with_the_draft_on_the_4080(models):
    target, assistant = models["target"], models["assistant"]
    assert (assistant.arch, assistant.n_layer, assistant.n_embd) == ("gemma4-assistant", 4, 1024)
    # on its device: its layers, projections and tied output (the token embeddings again): the Q8_0 file's 0.50 GB
    assert 0.49e9 < assistant.weight_bytes - assistant.input_bytes < 0.51e9
    without = plan_cluster(cluster(all_data=SEED), target)
    with_draft = plan_cluster(cluster(all_data=SEED), target, draft=assistant)
    assert with_draft.fits, with_draft.problems
    d = with_draft.draft
    assert (d.kind, d.device, d.kv, d.shared_kv) == ("draft-mtp", "CUDA0", 0, True)  # the target's KV
    assert "the target's KV (shared, none of its own)" in with_draft.table()
    # the auto split leaves the draft its room: layers move to the 5060 Ti, and the 4080 still fits
    gpu = with_draft.placements[-1]
    assert gpu.device.name == "CUDA0" and gpu.draft == d.on_device and gpu.free >= 0
    assert len(gpu.layers) < len(without.placements[-1].layers)
    assert all(p.fits for p in with_draft.placements)
    # the speed: the target's pass (the plain ceiling) and 3 passes of the assistant's weights at the 4080's 717 GB/s
    s = with_draft.speculative
    assert (s.kind, s.n_max, s.acceptance, s.passes) == ("draft-mtp", 3, 0.7, 3)
    assert s.draft_seconds == pytest.approx(d.weights / 717e9)
    by_hand = (1 + 0.7 + 0.49 + 0.343) / (1 / with_draft.tokens_per_s + 3 * d.weights / 717e9)
    assert s.tokens_per_s == pytest.approx(by_hand)
    assert 2 < s.speedup < 2.5
    assert s.line() in with_draft.table().splitlines()


def test_a_draft_on_a_workers_card_pays_a_hop_a_pass(models):
    """A draft of its own KV (the assistant's weights under another architecture: its KV is then not counted)."""
    c = cluster(all_data={**SEED, "llama_spec_draft_path": "/m/a.gguf", "llama_spec_draft_device": "RPC0"})
    plan = plan_cluster(c, models["target"], draft=dataclasses.replace(models["assistant"], arch="other-draft"))
    assert plan.fits, plan.problems
    assert plan.speculative.draft_seconds == pytest.approx(plan.draft.weights / 448e9 + HOP_SECONDS)


def cpu_lab(**data):
    """The lab's layout: a coordinator without a GPU, two CPU workers holding the offloaded layers."""
    return cluster(
        coordinator={"gpus": []},
        workers=[{"gpus": []}, {"gpus": []}],
        all_data={"image_backend": "cpu", "llama_n_gpu_layers": 6, "llama_tensor_split": [1, 1], **data},
    )


def test_an_assistant_runs_where_the_targets_last_layers_are(models):
    """Its KV is the target's last two layers': on the coordinator's card (local last) in the seed pair, on the last
    worker where the coordinator has no card; a draft-simple draft stays on the coordinator's CPU there. The
    deploy settles the device from the plan (phases/checks.settle), and renders it."""
    seed = plan_cluster(
        cluster(all_data={**SEED, "llama_spec_draft_path": "/m/a.gguf"}), models["target"], draft=models["assistant"]
    )
    assert seed.fits and seed.draft.device == "CUDA0", seed.problems
    lab = plan_cluster(cpu_lab(llama_spec_draft_path="/m/a.gguf"), models["target"], draft=models["assistant"])
    assert lab.draft.device == "RPC1" and not lab.problems
    assert not [w for w in lab.warnings if "draft" in w], lab.warnings  # by the KV it reads: no worker warning
    simple = cpu_lab(llama_spec_draft_path="/m/a.gguf")
    assert speculation.draft_device(simple) == speculation.CPU  # any other draft: the coordinator's own
    settled = cpu_lab(llama_spec_draft_path="/m/a.gguf", llama_spec_type="draft-mtp", llama_spec_draft_device="RPC1")
    assert flag(words(server_script(settled)), "--spec-draft-device") == "RPC1"


@pytest.mark.parametrize(
    "data, device",
    [
        ({"llama_tensor_split": [10, 0.5]}, "RPC0"),  # RPC1's share holds no layer of the 6 offloaded
        ({"llama_n_gpu_layers": 1}, "CPU"),  # only the output offloaded: every layer's KV in host memory
        ({"llama_n_gpu_layers": 0}, "CPU"),
        ({"llama_extra_args": ["--no-kv-offload"]}, "CPU"),
    ],
)
def test_the_assistants_device_is_the_placed_kvs_not_the_last_device(models, data, device):
    plan = plan_cluster(cpu_lab(llama_spec_draft_path="/m/a.gguf", **data), models["target"], draft=models["assistant"])
    assert plan.draft.device == device and not plan.problems, plan.problems


def test_an_assistant_whose_two_layers_are_apart_is_refused(models):
    """-ngl 2: layer n-1 offloaded, layer n-2 not; the assistant reads both in place."""
    n = models["target"].n_layer
    plan = plan_cluster(
        cpu_lab(llama_spec_draft_path="/m/a.gguf", llama_n_gpu_layers=2), models["target"], draft=models["assistant"]
    )
    assert [p for p in plan.problems if f"the target's layers {n - 2} and {n - 1}, whose KV cache" in p], plan.problems


@pytest.mark.parametrize(
    "data, device, naive",
    [
        # -ts 3,1: layers 0..32 on RPC0 (22 and 23 among them), 33..41 on RPC1
        ({"llama_n_gpu_layers": 43, "llama_tensor_split": [3, 1]}, "RPC0", "RPC1"),
        # -ngl 19: 24..41 offloaded, 22 and 23 not: their cache is in host memory
        ({"llama_n_gpu_layers": 19}, "CPU", "RPC1"),
        ({"llama_n_gpu_layers": 43, "llama_tensor_split": [1, 1]}, "RPC1", "RPC1"),  # 22..41 on RPC1
    ],
)
def test_an_assistant_on_a_shared_kv_target_runs_where_the_reused_cache_is(models, e4b, data, device, naive):
    """On Gemma 4 E4B the last two layers (40 and 41) keep no cache: the assistant reads layer 22's and 23's (llama.cpp
    maps the shared layer through the target's own map), so it runs on their device, not on layer 40 and 41's."""
    lab = cpu_lab(llama_spec_draft_path="/m/a.gguf", **data)
    plan = plan_cluster(lab, e4b, draft=models["assistant"])
    assert plan.draft.device == device and not plan.problems, plan.problems
    device_of = {il: p.device.name for p in plan.placements for il in p.layers}
    assert device_of.get(40, "CPU") == device_of.get(41, "CPU") == naive  # where layers n-2 and n-1 are
    assert speculation.assistant_device(e4b, plan.placements, []) == (device, "")


def test_an_assistant_whose_reused_caches_are_apart_is_refused_by_their_layers(models, e4b):
    """-ngl 20: layers 23..41 offloaded, 22 not. Layers 40 and 41 are both on RPC1 (the naive check passes), but the
    caches the assistant reads, 22's and 23's, are on the CPU and RPC0."""
    plan = plan_cluster(
        cpu_lab(llama_spec_draft_path="/m/a.gguf", llama_n_gpu_layers=20), e4b, draft=models["assistant"]
    )
    assert [p.device.name for p in plan.placements if {40, 41} <= set(p.layers)] == ["RPC1"]
    problems = [p for p in plan.problems if "the target's layers 22 and 23, whose KV cache" in p]
    assert len(problems) == 1 and "(the cache of its layers 40 and 41, which keep none of their own)" in problems[0]
    assert "are on CPU and RPC0" in problems[0]


@pytest.mark.parametrize("device", ["CPU", "RPC0"])
def test_an_assistant_anywhere_but_by_the_targets_last_layers_is_refused(models, device):
    """llama.cpp aborts at load (the lab, b11312): on the CPU, and on RPC0 with the KV on RPC1."""
    away = cpu_lab(llama_spec_draft_path="/m/a.gguf", llama_spec_draft_device=device)
    problems = plan_cluster(away, models["target"], draft=models["assistant"]).problems
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"group_data/all.py: llama_spec_draft_device = {device!r}: the draft ")
    assert "expected None (the assistant on RPC1) or 'RPC1'" in problems[0]
    there = cpu_lab(llama_spec_draft_path="/m/a.gguf", llama_spec_draft_device="RPC1")
    assert not plan_cluster(there, models["target"], draft=models["assistant"]).problems


def test_an_assistant_on_the_cpu_with_the_whole_target_there_is_not_refused(models):
    cpu_target = cpu_lab(llama_spec_draft_path="/m/a.gguf", llama_spec_draft_device="CPU", llama_n_gpu_layers=0)
    assert not plan_cluster(cpu_target, models["target"], draft=models["assistant"]).problems


def test_the_targets_own_mtp_head_reads_its_last_layer_and_the_output(models):
    target = dataclasses.replace(models["target"], mtp_head=True)
    plan = plan_cluster(cluster(all_data={**SEED, "llama_spec_type": "draft-mtp"}), target)
    assert plan.draft is None
    assert plan.speculative.draft_seconds == pytest.approx((target.layer_bytes[-1] + target.output_bytes) / 717e9)


def test_ngram_drafting_costs_nothing_and_takes_llama_cpps_n_max(models):
    plan = plan_cluster(cluster(all_data={**SEED, "llama_spec_type": "ngram-mod"}), models["target"], acceptance=0)
    s = plan.speculative
    assert (s.kind, s.n_max, s.draft_seconds) == ("ngram-mod", 64, 0.0)
    assert s.tokens_per_s == pytest.approx(plan.tokens_per_s)  # nothing accepted, nothing lost
    bounded = plan_cluster(
        cluster(all_data={**SEED, "llama_spec_type": "ngram-mod", "llama_spec_draft_max": 16}), models["target"]
    )
    assert bounded.speculative.n_max == 16
    simple = plan_cluster(cluster(all_data={**SEED, "llama_spec_type": "ngram-simple"}), models["target"])
    assert simple.speculative.n_max == 48
    assert "drafts only where the text repeats" in simple.table()


def test_no_speculation_no_line(models):
    plan = plan_cluster(cluster(all_data=SEED), models["target"])
    assert plan.speculative is None and "speculative" not in plan.table()


def test_plan_prints_the_speculative_speed(files, monkeypatch, capsys):
    monkeypatch.chdir(PROJECT)
    gpus = ["--gpus", "RTX 4080", "RTX 5060 Ti 16GB"]
    data = [x for key, value in SEED.items() for x in ("--data", f"{key}={value}")]
    assert main(["plan", *gpus, "--model", str(files["target"]), "--draft", str(files["assistant"]), *data]) == 0
    out = capsys.readouterr().out.splitlines()
    ceiling = next(i for i, line in enumerate(out) if "predicted ceiling" in line)
    assert out[ceiling + 1].startswith("speculative (draft-mtp, draft on CUDA0: ")
    assert "at acceptance 0.7, n_max 3: " in out[ceiling + 1]

    def args(acceptance):
        return argparse.Namespace(
            inventory=PROJECT / "inventory.py",
            gpus=gpus[1:],
            model=files["target"],
            mmproj=None,
            draft=files["assistant"],
            data=[*data[1::2], "llama_spec_draft_path=/models/assistant.gguf", "llama_spec_draft_max=5"],
            acceptance=acceptance,
        )

    assert command(args(0.9)) == 0
    assert "at acceptance 0.9, n_max 5: " in capsys.readouterr().out
    assert command(args(1.5)) == 2
    assert "--acceptance 1.5: expected a probability from 0 to 1" in capsys.readouterr().err
