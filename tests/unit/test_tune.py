"""tune's own arithmetic: a split (layers per place) to llama_n_gpu_layers and llama_tensor_split, and back
through the planner's placement (llama.cpp's layer rule, plan.assign_layers); which candidates fit. The
measurements themselves run on the lab (tests/e2e/test_lab_tune.py, benchmarks/tune_lab.py)."""

import json

import pytest

from llama_rpc_deploy import plan, tune
from llama_rpc_deploy.plan import GIB, Device

from .helpers import cluster, seed_model

CPU_RPC = [Device("RPC0", "w1", "CPU", 0, 40e9), Device("RPC1", "w2", "CPU", 0, 40e9)]
CARDS = [
    Device("RPC0", "server", "RTX 5060 Ti 16GB", 16 * GIB, 448e9),
    Device("CUDA0", "desktop", "RTX 4080", 16 * GIB, 717e9),
]


@pytest.mark.parametrize("split", [(3, 3, 2), (0, 4, 4), (8, 0, 0), (2, 0, 6), (1, 6, 1)])
def test_a_split_with_the_coordinators_cpu_is_placed_as_asked(split):
    """The lab's shape: 8 layers, the coordinator's CPU first (layers not offloaded), two RPC devices; the
    output layer on the last device."""
    layout = tune.Layout(n_layer=8, devices=CPU_RPC, cpu=True)
    s = layout.settings(split)
    assert s["llama_n_gpu_layers"] == split[1] + split[2] + 1
    placements, _ = plan.place(
        seed_model(n_layer=8),
        CPU_RPC,
        [float(x) for x in s["llama_tensor_split"]],
        plan.Context(2048),
        s["llama_n_gpu_layers"],
    )
    assert [len(p.layers) for p in placements] == list(split[1:])
    on_devices = [il for p in placements for il in p.layers]
    assert on_devices == list(range(split[0], 8))  # the first layers stay on the CPU, the rest in device order


def test_the_lab_split_is_found_from_its_settings():
    c = cluster(
        coordinator={"gpus": []},
        workers=({"gpus": []}, {"gpus": []}),
        all_data={"llama_n_gpu_layers": 6, "llama_tensor_split": [1, 1], "image_backend": "cpu"},
    )
    layout, start = tune.layout_of(c, seed_model(n_layer=8))
    assert start == (3, 3, 2) and layout.cpu
    assert layout.places == ["CPU (coordinator)", "RPC0 (10.0.0.20)", "RPC1 (10.0.0.21)"]
    assert layout.settings(start) == {"llama_n_gpu_layers": 6, "llama_tensor_split": [3, 3]}


def test_without_layers_on_the_cpu_every_place_is_a_device():
    c = cluster(all_data={"llama_tensor_split": [30, 31]})
    layout, start = tune.layout_of(c, seed_model())
    assert not layout.cpu and start == (30, 30)
    assert layout.settings((20, 40)) == {"llama_n_gpu_layers": 999, "llama_tensor_split": [20, 41]}


def test_a_split_too_big_for_a_card_is_not_a_candidate():
    """17 GB over two 16 GB cards: 60 of 60 layers on one card cannot fit; an even split does."""
    c = cluster(all_data={"llama_tensor_split": [30, 31], "llama_ctx_size": 4096, "llama_parallel": 1})
    model = seed_model()
    layout, start = tune.layout_of(c, model)
    assert tune.fits(c, model, layout, start)
    assert not tune.fits(c, model, layout, (60, 0)) and not tune.fits(c, model, layout, (0, 60))
    assert tune.fits(c, model, layout, (26, 34))


def test_samples_give_the_objective():
    s = tune.Sample(generation=20.0, prompt=500.0)
    assert s.value("generation") == 20.0 and s.value("prompt") == 500.0
    assert s.value("both") == pytest.approx(100.0)


def test_the_speculation_stage_names_its_candidates_and_reports_them():
    """A draft at llama.cpp's default maximum (3): the stage compares it with off, 1 and 6; the table and the JSON
    say which won and by how much."""
    from llama_rpc_deploy.tune.search import TuneResult

    c = cluster(
        coordinator={"gpus": []},
        workers=({"gpus": []},),
        all_data={"image_backend": "cpu", "llama_spec_draft_path": "/models/d.gguf"},
    )
    names = tune.spec_names(c.settings)
    assert names == {(3,): "draft, max 3 (deployed)", (0,): "off", (1,): "draft, max 1", (6,): "draft, max 6"}
    assert tune.spec_overrides(c.settings, (3,), (3,)) == {}
    assert tune.spec_overrides(c.settings, (3,), (6,)) == {"llama_spec_draft_min": 0, "llama_spec_draft_max": 6}
    report = tune.Report(layout=tune.Layout(8, [], cpu=True), start=(8,), objective="generation")
    report.spec_split, report.spec_names = (8,), names
    report.spec_samples = [{"max": 3, "value": 100.0}, {"max": 0, "value": 125.0}, {"max": 0, "value": 124.0}]
    report.speculation = TuneResult((3,), (0,), 1.245, (1.2, 1.3), True, [], "")
    lines = report.table().splitlines()
    assert "speculation: best off, 1.245x the deployed draft, max 3 (deployed)" in lines[-1] and "beyond" in lines[-1]
    assert [line.split()[0] for line in lines[-3:-1]] == ["off", "draft,"]  # fastest first
    assert json.loads(report.to_json())["speculation"]["best"] == "off"
