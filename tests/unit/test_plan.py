"""The planner's arithmetic against figures computed by hand, on GGUF headers shaped like real models."""

import pytest

from llama_rpc_deploy.gguf_header import read_model
from llama_rpc_deploy.plan import (
    GIB,
    Context,
    Device,
    auto_split,
    ceiling,
    kv_bytes,
    kv_by_layer,
    place,
    plan_cluster,
    render_shares,
)

from .helpers import cluster, seed_model
from .shaped import write_shaped


@pytest.fixture(scope="module")
def llama8b(tmp_path_factory):
    """Llama-3.1-8B's shapes in Q4_K (Q6_K embeddings and output)."""
    path = tmp_path_factory.mktemp("m") / "llama-8b.gguf"
    return read_model(
        write_shaped(
            path,
            arch="llama",
            n_layer=32,
            n_embd=4096,
            n_head=32,
            n_head_kv=8,
            head_dim=128,
            n_ff=14336,
            n_vocab=128256,
        )
    )


@pytest.fixture(scope="module")
def gemma27b(tmp_path_factory):
    """Gemma-3-27B's shapes: 62 layers, sliding window 1024 on 5 of every 6, tied embeddings."""
    path = tmp_path_factory.mktemp("m") / "gemma-27b.gguf"
    return read_model(
        write_shaped(
            path,
            arch="gemma3",
            n_layer=62,
            n_embd=5376,
            n_head=32,
            n_head_kv=16,
            head_dim=128,
            n_ff=21504,
            n_vocab=262208,
            window=1024,
            tied=True,
        )
    )


@pytest.fixture(scope="module")
def dense31b(tmp_path_factory):
    """A dense 31B-class model (60 layers, 4 KV heads): 18 GB in Q4_K, too big for one 16 GB card."""
    path = tmp_path_factory.mktemp("m") / "dense-31b.gguf"
    return read_model(
        write_shaped(
            path,
            arch="llama",
            n_layer=60,
            n_embd=5120,
            n_head=40,
            n_head_kv=4,
            head_dim=128,
            n_ff=27648,
            n_vocab=262144,
        )
    )


def test_dense_layer_bytes_by_hand(llama8b):
    q4k = 144 / 256  # bytes per weight
    by_hand = (2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 14336 * 4096) * q4k + 2 * 4096 * 4
    assert llama8b.layer_bytes[0] == by_hand == 122_716_160
    assert llama8b.input_bytes == 128256 * 4096 * 210 // 256  # Q6_K: 210 bytes per 256
    assert llama8b.kv_per_token[0] == (8 * 128, 8 * 128)
    assert 4.7e9 < llama8b.weight_bytes < 4.9e9  # the real Q4_K_M file is 4.9 GB


def test_dense_kv_cache_by_hand(llama8b):
    # 32 layers x 8192 cells x (1024 K + 1024 V) x 2 bytes = 1 GiB
    assert kv_bytes(llama8b, list(range(32)), Context(8192, 1, "f16", "f16")) == 32 * 8192 * 2048 * 2 == GIB
    assert kv_bytes(llama8b, list(range(32)), Context(8192, 1, "q8_0", "q8_0")) == 32 * 8192 * 2048 * 34 // 32


def test_sliding_window_kv_by_hand(gemma27b):
    assert gemma27b.swa_window == 1024 and sum(gemma27b.swa_layers) == 52  # every 6th of 62 layers is global
    assert gemma27b.output_bytes == gemma27b.input_bytes + 5376 * 4  # tied: token_embd again, plus the norm
    # each of the 4 slots is a stream of 16384 cells: global: 10 layers x 4 x 16384 cells; sliding: 52 layers x
    # 4 x min(16384, 1024 + 512) cells;
    # each cell (16 x 128 K + 16 x 128 V) x 2 bytes = 8192 bytes
    assert (
        kv_bytes(gemma27b, list(range(62)), Context(65536, 4, "f16", "f16")) == 10 * 65536 * 8192 + 52 * 4 * 1536 * 8192
    )
    # --kv-unified: one stream of 65536 cells; the window holds 1024 x 4 slots + 512
    unified = Context(65536, 4, "f16", "f16", unified=True)
    assert kv_bytes(gemma27b, list(range(62)), unified) == 10 * 65536 * 8192 + 52 * 4608 * 8192


DESKTOP_4080 = Device("CUDA0", "desktop", "RTX 4080", 16 * GIB, 717e9)
SERVER_5060TI = Device("RPC0", "server", "RTX 5060 Ti 16GB", 16 * GIB, 448e9)


def test_seed_ceiling_is_about_32_tokens_per_second():
    """17 GB split in half over a 4080 (717 GB/s) and a 5060 Ti (448 GB/s): 1 / (8.5/717 + 8.5/448) s."""
    placements, _ = place(seed_model(), [SERVER_5060TI, DESKTOP_4080], [30, 31], Context(4096))
    assert [len(p.layers) for p in placements] == [30, 30]  # the output layer counts as the 61st
    by_hand = 1 / (8.5e9 / 448e9 + 8.5e9 / 717e9 + 0.0003)
    assert ceiling(placements) == pytest.approx(by_hand)
    assert 31.5 < ceiling(placements) < 33.5


def test_auto_split_fills_the_faster_card_first():
    counts = auto_split(seed_model(), [SERVER_5060TI, DESKTOP_4080], Context(8192))
    assert sum(counts) == 60 and counts[1] > counts[0]
    placements, _ = place(seed_model(), [SERVER_5060TI, DESKTOP_4080], render_shares(counts), Context(8192))
    assert [len(p.layers) for p in placements] == counts
    assert all(p.fits for p in placements)
    half, _ = place(seed_model(), [SERVER_5060TI, DESKTOP_4080], [30, 31], Context(8192))
    assert ceiling(placements) > ceiling(half)


def test_plan_for_the_seed_pair_fits_64k_and_refuses_128k(dense31b):
    assert dense31b.weight_bytes > 16 * GIB  # fits neither card alone
    fits = plan_cluster(
        cluster(all_data={"llama_ctx_size": 65536, "llama_parallel": 4, "llama_tensor_split": "auto"}), dense31b
    )
    assert fits.fits, fits.problems
    assert [p.device.name for p in fits.placements] == ["RPC0", "CUDA0"]
    assert sum(len(p.layers) for p in fits.placements) == 60 and fits.host_bytes == dense31b.input_bytes
    # KV at 128K: 60 layers x 131072 cells x (512 + 512) x 2 bytes = 15 GiB on top of 18 GB of weights
    assert kv_bytes(dense31b, list(range(60)), Context(131072, 4, "f16", "f16")) == 60 * 131072 * 1024 * 2 == 15 * GIB
    too_big = plan_cluster(
        cluster(all_data={"llama_ctx_size": 131072, "llama_parallel": 4, "llama_tensor_split": [1, 1]}), dense31b
    )
    assert not too_big.fits
    assert any(p.startswith("128K context with f16 KV needs ") and "it has 15.1" in p for p in too_big.problems)


def test_sliding_window_makes_128k_fit_where_dense_does_not(gemma27b):
    plan = plan_cluster(
        cluster(all_data={"llama_ctx_size": 131072, "llama_parallel": 4, "llama_tensor_split": [1, 1]}), gemma27b
    )
    assert plan.fits, plan.problems


@pytest.mark.parametrize("flag", ["-hfd", "--spec-draft-hf", "-md"])
def test_plan_warns_on_a_draft_model_of_llama_extra_args_from_a_file_or_hugging_face(gemma27b, flag):
    extra = [flag, "google/gemma-3-270m-it"]
    plan = plan_cluster(cluster(all_data={"llama_ctx_size": 8192, "llama_extra_args": extra}), gemma27b)
    assert any("a draft model in llama_extra_args follows --device" in w for w in plan.warnings), plan.warnings


def test_plan_warns_on_quantized_kv_that_is_not_needed_and_on_a_draft_model_past_the_settings(gemma27b):
    plan = plan_cluster(
        cluster(
            all_data={
                "llama_ctx_size": 8192,
                "llama_cache_type_k": "q8_0",
                "llama_cache_type_v": "q8_0",
                "llama_extra_args": ["--spec-draft-model", "/models/d.gguf"],
            }
        ),
        gemma27b,
    )
    assert any("although f16 fits" in w for w in plan.warnings)
    assert any("a draft model in llama_extra_args follows --device" in w for w in plan.warnings)


@pytest.mark.parametrize(
    "extra",
    [
        ["--spec-type", "ngram-mod", "--spec-ngram-mod-n-max", "16"],  # measured 3.15x on the lab: no warning
        ["-md", "/models/d.gguf", "--spec-draft-device", "CUDA0"],  # placed by hand
    ],
)
def test_plan_does_not_warn_on_speculation_that_measured_faster(gemma27b, extra):
    plan = plan_cluster(cluster(all_data={"llama_ctx_size": 8192, "llama_extra_args": extra}), gemma27b)
    assert not [w for w in plan.warnings if "draft" in w or "speculat" in w], plan.warnings


def test_partial_offload_keeps_the_first_layers_on_the_host(llama8b):
    c = cluster(
        coordinator={"gpus": []},
        workers=[{"gpus": []}, {"gpus": []}],
        all_data={"image_backend": "cpu", "llama_n_gpu_layers": 6, "llama_tensor_split": [1, 1]},
    )
    plan = plan_cluster(c, llama8b)
    # llama.cpp counts the output layer as layer 32: -ngl 6 offloads layers 27..31 and the output
    assert [p.layers for p in plan.placements] == [[27, 28, 29], [30, 31]]
    assert plan.placements[1].weights == 2 * llama8b.layer_bytes[0] + llama8b.output_bytes
    assert plan.host_bytes == llama8b.input_bytes + 27 * llama8b.layer_bytes[0]


def test_auto_split_refuses_cpu_devices_whose_memory_it_cannot_know(llama8b):
    c = cluster(
        coordinator={"gpus": []},
        workers=[{"gpus": []}],
        all_data={"image_backend": "cpu", "llama_tensor_split": "auto"},
    )
    plan = plan_cluster(c, llama8b)
    assert any(
        "llama_tensor_split = 'auto' needs every device's memory, and RPC0 (10.0.0.20) is a CPU device" in p
        for p in plan.problems
    )


def test_auto_split_reaches_the_launch_script(dense31b):
    """What deploy.py does for llama_tensor_split = 'auto': plan, then render the planner's split."""
    from llama_rpc_deploy.deployment import from_cluster
    from llama_rpc_deploy.render import coordinator_files

    dep = from_cluster(cluster(all_data={"llama_ctx_size": 65536, "llama_tensor_split": "auto"}), with_key=False)
    with pytest.raises(ValueError, match="must be resolved by the planner"):
        coordinator_files(dep.cluster, dep.image)
    plan = plan_cluster(dep.cluster, dense31b)
    script = coordinator_files(dep.with_split(plan.split).cluster, dep.image)["/opt/llama-rpc/llama-server.sh"]
    assert f"--tensor-split {','.join(str(x) for x in plan.split)} " in script
    assert plan.split[-1] == len(plan.placements[-1].layers) + 1  # the output layer rides on the last device


def test_cards_count_what_nvidia_smi_reports_less_the_cuda_context():
    from llama_rpc_deploy.plan import CUDA_CONTEXT, MIB, devices_of

    c = cluster()
    table = devices_of(c)
    assert [(d.name, d.vram_bytes // MIB) for d in table] == [("RPC0", 15849), ("CUDA0", 16375)]
    reported = devices_of(c, reported={"10.0.0.20": [16311]})
    assert reported[0].vram_bytes == 16311 * MIB and reported[1].vram_bytes == 16375 * MIB
    assert reported[0].usable == 16311 * MIB - CUDA_CONTEXT


def test_an_architecture_the_planner_does_not_model_is_named_not_guessed(tmp_path):
    phi = read_model(
        write_shaped(
            tmp_path / "phi.gguf",
            arch="phi3",
            n_layer=32,
            n_embd=3072,
            n_head=32,
            n_head_kv=32,
            head_dim=96,
            n_ff=8192,
            n_vocab=32064,
        )
    )
    assert not phi.kv_modeled
    auto = plan_cluster(cluster(all_data={"llama_tensor_split": "auto"}), phi)
    assert any("architecture 'phi3'" in p and "expected llama_tensor_split as a list" in p for p in auto.problems)
    given = plan_cluster(cluster(all_data={"llama_tensor_split": [1, 1]}), phi)
    assert given.fits and given.context is None and all(p.kv == 0 for p in given.placements)
    assert any("architecture 'phi3'" in w and "does not guess" in w for w in given.warnings)
    assert "      ?" in given.table()


def test_the_auto_split_is_the_fastest_split_that_fits(gemma27b):
    """Against every split of the layers between the two cards, placed by llama.cpp's rule."""
    devices = [SERVER_5060TI, DESKTOP_4080]
    context = Context(65536, 4)
    counts = auto_split(gemma27b, devices, context)
    splits = []
    for first in range(gemma27b.n_layer + 1):
        placements, _ = place(gemma27b, devices, render_shares([first, gemma27b.n_layer - first]), context)
        if all(p.fits for p in placements):
            splits.append((ceiling(placements), first))
    assert splits and counts[0] == max(splits)[1]


def test_the_largest_context_is_where_the_auto_split_stops_fitting(dense31b):
    from llama_rpc_deploy.plan import largest_context

    devices = [SERVER_5060TI, DESKTOP_4080]
    for unified in (False, True):
        edge = largest_context(dense31b, devices, Context(4096, 4, unified=unified))
        assert 4096 < edge < dense31b.n_ctx_train
        assert auto_split(dense31b, devices, Context(edge, 4, unified=unified)) is not None
        assert auto_split(dense31b, devices, Context(edge + 256, 4, unified=unified)) is None


def test_the_plan_says_how_much_context_each_request_gets(gemma27b):
    per_slot = plan_cluster(cluster(all_data={"llama_ctx_size": 65536, "llama_parallel": 4}), gemma27b)
    assert "up to 16384 tokens per request" in per_slot.table()
    unified = plan_cluster(
        cluster(all_data={"llama_ctx_size": 65536, "llama_parallel": 4, "llama_kv_unified": True}), gemma27b
    )
    assert "up to 65536 tokens per request" in unified.table()
    assert unified.placements[0].kv < per_slot.placements[0].kv  # one window of 4 x 1024 + 512 instead of 4 of 1536


def test_a_split_model_is_read_from_every_shard_and_a_missing_one_is_named(tmp_path):
    from lab.testmodel import Shape, write_sentence_model

    small = Shape(n_embd=64, n_head=4, n_head_kv=2, n_ff=128)  # the lab's 8 layers (75 tensors), 0.7 MB, not 51
    whole = read_model(write_sentence_model(tmp_path / "whole" / "m.gguf", small))
    first = write_sentence_model(tmp_path / "split" / "m.gguf", small, split_max_tensors=30)
    split = read_model(first)
    assert first.name == "m-00001-of-00003.gguf" and len(split.shards) == 3
    assert split.layer_bytes == whole.layer_bytes and split.weight_bytes == whole.weight_bytes
    (tmp_path / "split" / "m-00002-of-00003.gguf").unlink()
    with pytest.raises(ValueError, match="m-00002-of-00003.gguf: no such file"):
        read_model(first)


def test_plan_ends_in_one_line_on_a_file_that_is_not_gguf(tmp_path, capsys):
    from llama_rpc_deploy.__main__ import main

    inventory = tmp_path / "inventory.py"
    inventory.write_text(
        'coordinator = [("10.0.0.10", {"gpus": ["RTX 4080"]})]\nworkers = [("10.0.0.20", {"gpus": ["RTX 5060 Ti"]})]\n'
    )
    junk = tmp_path / "model.gguf"
    junk.write_text("not a model\n")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(
        write_shaped(
            tmp_path / "whole.gguf",
            arch="llama",
            n_layer=2,
            n_embd=256,
            n_head=4,
            n_head_kv=4,
            head_dim=64,
            n_ff=512,
            n_vocab=256,
        ).read_bytes()[:100]
    )
    for path, words in ((junk, "not a GGUF file"), (cut, "ends inside its GGUF header")):
        assert main(["plan", "-i", str(inventory), "--model", str(path), "--data", "llama_model_path=/m.gguf"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"--model {path}" in err and words in err, err


def test_a_context_past_the_trained_length_is_refused_unless_rope_scaling_stretches_it(llama8b):
    """llama.cpp compares each request's share (n_ctx_seq) with the trained length, not the whole context."""
    past = plan_cluster(
        cluster(all_data={"llama_ctx_size": 262144, "llama_parallel": 1, "llama_tensor_split": [1, 1]}), llama8b
    )
    assert any(
        "llama_ctx_size = 262144 gives each request 262144 tokens, more than the 131072 llama was trained for: "
        "expected at most 131072 per request" in p
        for p in past.problems
    )
    shared = plan_cluster(
        cluster(all_data={"llama_ctx_size": 262144, "llama_parallel": 4, "llama_tensor_split": [1, 1]}), llama8b
    )
    assert not any("trained for" in p for p in shared.problems)  # 65536 a request
    stretched = plan_cluster(
        cluster(
            all_data={
                "llama_ctx_size": 262144,
                "llama_parallel": 1,
                "llama_tensor_split": [1, 1],
                "llama_extra_args": ["--rope-scaling", "yarn"],
            }
        ),
        llama8b,
    )
    assert not any("trained for" in p for p in stretched.problems)


def test_a_command_whose_server_does_not_answer_ends_in_one_line(tmp_path, capsys):
    import socket

    from llama_rpc_deploy.__main__ import main

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    inventory = tmp_path / "inventory.py"
    inventory.write_text(
        f'coordinator = [("127.0.0.1", {{"llama_model_path": "/m.gguf", "image_backend": "cpu", '
        f'"llama_port": {port}}})]\nworkers = [("127.0.0.2", {{}})]\n'
    )
    assert main(["complete", "-i", str(inventory), "-n", "1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: complete: ") and err.count("\n") == 1, err


# llama.cpp's own map for the Gemma 4 E4B family: `llama-fit-params -v` logs "layer 24: reuse layer 22, is_swa = 1",
# ..., "layer 41: reuse layer 23, is_swa = 0" (llama_kv_cache, the pinned b11312), and "does not have KV cache" for
# each of 24..41
E4B_REUSE = {il: 23 if il % 6 == 5 else 22 for il in range(24, 42)}


def test_shared_kv_layers_keep_no_cache_and_read_the_reused_layers(tmp_path):
    """Gemma 4 E4B: its last 18 layers (shared_kv_layers) allocate no KV and read layer 22's or 23's; its per-layer
    embeddings are an input (host memory), their projection is layer 0's (the oracle agrees: test_plan_oracle)."""
    from ..families import gemma4, gemma4_e4b

    e4b = read_model(gemma4_e4b(tmp_path / "e4b.gguf"))
    assert e4b.kv_from_start == 24
    assert {il: e4b.kv_layer(il) for il in range(24, 42)} == E4B_REUSE
    assert [e4b.kv_layer(il) for il in range(24)] == list(range(24))
    assert all(kv == (0, 0) for kv in e4b.kv_per_token[24:]) and all(k and v for k, v in e4b.kv_per_token[:24])
    per_layer = kv_by_layer(e4b, Context(ctx=32768, parallel=1))
    assert per_layer[24:] == [0] * 18 and per_layer[22] and per_layer[23] > per_layer[22]  # 23: global, every cell
    embd = 262144 * 2560 * 210 // 256  # token_embd, Q6_K
    assert e4b.input_bytes == embd + 262144 * 256 * 42 * 210 // 256  # and per_layer_token_embd, Q6_K
    assert e4b.output_bytes == embd + 2560 * 4 + 256 * 4  # tied: token_embd again, the norm, rope_freqs (no table)
    assert e4b.layer_bytes[0] - e4b.layer_bytes[1] == 2560 * 256 * 42 * 2 + 256 * 4  # per_layer_model_proj (F16), norm
    dense = read_model(gemma4(tmp_path / "31b.gguf"))
    assert dense.kv_from_start == -1 and all(dense.kv_layer(il) == il for il in range(dense.n_layer))


def test_gemma3n_reuses_the_kv_from_layer_20(tmp_path):
    """llama.cpp's gemma3n loader fixes n_layer_kv_from_start at 20 and, without a pattern key, makes every 5th layer
    global: 20.. read 18 (sliding) or 19 (global). Its KV is not modeled (no fit check), the map is still read."""
    g3n = read_model(
        write_shaped(
            tmp_path / "gemma3n.gguf",
            arch="gemma3n",
            n_layer=35,
            n_embd=2048,
            n_head=8,
            n_head_kv=2,
            head_dim=256,
            n_ff=16384,
            n_vocab=262400,
            window=512,
        )
    )
    assert not g3n.kv_modeled and g3n.kv_from_start == 20
    assert [g3n.kv_layer(il) for il in range(18, 26)] == [18, 19, 18, 18, 18, 18, 19, 18]
    assert g3n.kv_per_token[19] != (0, 0) and set(g3n.kv_per_token[20:]) == {(0, 0)}
