"""`bench` against the deployed lab: a table, JSON and a PNG, with the planner's ceiling."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from lab import lab
from lab.testmodel import sentence_vocabulary
from llama_rpc_deploy.paths import PROJECT

from .lab_helpers import INVENTORY, WORKERS, needs_docker, on, operations, pyinfra

pytestmark = needs_docker


def test_bench_writes_table_json_and_png(tmp_path):
    lab.up(workers=WORKERS)
    operations(pyinfra("--json"))
    out_json, out_png = tmp_path / "bench.json", tmp_path / "bench.png"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "llama_rpc_deploy",
            "bench",
            "-i",
            str(INVENTORY),
            "--streams",
            "1,2",
            "--json",
            str(out_json),
            "--png",
            str(out_png),
        ],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(out_json.read_text())
    assert figures["generation_tokens_per_s"] > 0 and figures["prompt_tokens_per_s"] > 0
    assert [p["streams"] for p in figures["parallel"]] == [1, 2]
    assert all(p["failed"] == 0 and p["total_tokens_per_s"] > 0 for p in figures["parallel"])
    assert figures["ceiling_tokens_per_s"] > 0  # the planner, on the header read from the coordinator over SSH
    assert figures["first_token_after_sleep_s"] is None and "never sleeps" in figures["first_token_after_sleep_note"]
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "planner's ceiling" in result.stdout and "streams   total tokens/s" in result.stdout
    # what crosses the wire per generated token, against a count by hand: in plain decoding each worker answers one
    # GET_TENSOR a token (ggml-rpc.cpp: send_msg, an 8-byte size and the payload), RPC0 the activations it hands on
    # (n_embd floats), RPC1, with the output layer, the logits (n_vocab floats)
    wire = figures["wire"]
    n_embd, n_vocab = lab.MODEL_SHAPE.n_embd, len(sentence_vocabulary()[0])
    down = [c["bytes_received"] for c in wire["per_token"].values()]
    assert down == pytest.approx([8 + 4 * n_embd, 8 + 4 * n_vocab], rel=0.01), wire
    assert all(c["bytes_acked"] > 0 for c in wire["per_token"].values()) and wire["drafted"] == 0
    assert "per generated token" in result.stdout
    # each worker's tensor cache, as bench read it over SSH, against the files counted on the worker itself
    for index, (worker, (size, limit)) in enumerate(figures["tensor_cache"].items(), start=1):
        files = on(index, "find /var/cache/llama-rpc/rpc -maxdepth 1 -type f -printf '%s\\n'").stdout.split()
        assert size == sum(int(n) for n in files) and limit == 64 * 2**30, worker
        assert f"tensor cache on {worker}: {size / 2**20:.1f} MiB of its 64 GiB limit" in result.stdout
