"""The planner against llama.cpp's own estimator, on 8 families of real models (tests/oracle.py).

The expected figures are llama-fit-params' (the pinned b11312), recorded in tests/oracle_fit_params.json
with `python3 -m tests.oracle BIN_DIR tests/oracle_fit_params.json`; the lab runs the same grid live
from the deployed image (tests/e2e/test_lab_fit_params.py).
"""

import json

import pytest

from llama_rpc_deploy.gguf_header import KV_LAYOUTS, read_model

from .. import oracle
from ..families import FAMILIES

RECORDED = json.loads(oracle.RECORDED.read_text())
pytestmark = pytest.mark.xdist_group("plan oracle")  # one worker writes and reads the 8 models (a second)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("families")
    return {name: read_model(write(folder / f"{name}.gguf")) for name, write in FAMILIES.items()}


def test_the_recording_covers_the_whole_grid():
    assert len(FAMILIES) >= 8 and {m for m in FAMILIES} >= {
        "llama3",
        "gemma3",
        "gemma4",
        "qwen3",
        "qwen3moe",
        "gpt-oss",
        "deepseek2",
        "lfm2",
    }
    assert list(RECORDED) == [c.key for c in oracle.grid()]
    assert all(RECORDED[key] for key in RECORDED)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_planner_within_3_percent_of_llama_fit_params(models, family):
    cases = [c for c in oracle.grid() if c.family == family]
    bad = [line for c in cases for line in oracle.mismatches(models[family], c, RECORDED[c.key])]
    assert not bad, "\n".join(bad)


def test_every_family_is_an_architecture_the_planner_models(models):
    assert {m.arch for m in models.values()} == set(KV_LAYOUTS)


def test_the_comparison_can_fail(models):
    """The same figures with one layer's KV left out (the old planner's SWA head-size mistake, in miniature)
    are caught: the check is not loose enough to pass anything."""
    case = next(c for c in oracle.grid() if c.family == "gemma4" and c.ctx == 131072 and c.parallel == 4)
    recorded = RECORDED[case.key]
    wrong = {d: dict(f, context=f["context"] * 1.05) for d, f in recorded.items()}
    assert oracle.mismatches(models["gemma4"], case, wrong)
    assert not oracle.mismatches(models["gemma4"], case, recorded)


def test_latent_attention_wants_one_kv_type(models):
    """llama.cpp refuses K and V of different types for an MLA model (the oracle grid cannot run it)."""
    from llama_rpc_deploy.plan import plan_cluster

    from .helpers import cluster

    mixed = plan_cluster(
        cluster(
            all_data={
                "llama_cache_type_k": "q8_0",
                "llama_cache_type_v": "f16",
                "llama_ctx_size": 8192,
                "llama_parallel": 1,
            }
        ),
        models["deepseek2"],
    )
    assert any("uses latent attention (MLA)" in p and "expected the same type for both" in p for p in mixed.problems)
    same = plan_cluster(cluster(all_data={"llama_ctx_size": 8192, "llama_parallel": 1}), models["deepseek2"])
    assert not any("latent attention" in p for p in same.problems)
