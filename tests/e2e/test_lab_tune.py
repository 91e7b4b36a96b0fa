"""`llama-rpc tune` on the lab (issue 24): a candidate split reaches llama.cpp as asked (its own load report is
the oracle), clients lose no request while tune restarts llama-server, and the deployed split is back afterwards,
also after Ctrl-C. The search's figures (a sweep against tune, asymmetric and symmetric lab) come from
benchmarks/tune_lab.py, in docs/results/tune.md.
"""

from __future__ import annotations

import threading

import pytest

from llama_rpc_deploy import load_report, tune
from llama_rpc_deploy.bench import model_header
from llama_rpc_deploy.remote import ssh_runner
from llama_rpc_deploy.loadtest import run_load
from llama_rpc_deploy.plan import MIB, Context, place

from .lab_helpers import INVENTORY, deployed_and_serving, needs_docker, on

pytestmark = needs_docker
SCRIPT = "/opt/llama-rpc/llama-server.sh"


@pytest.fixture(scope="module")
def deployed():
    cluster = deployed_and_serving()
    model = model_header(cluster, INVENTORY, None)
    layout, start = tune.layout_of(cluster, model)
    return cluster, model, layout, start


def loaded_report():
    """llama.cpp's last load report in llama-server's journal (the lines `status` reads too)."""
    return load_report.parse(
        on(
            0,
            "journalctl -u llama-server -o cat --no-pager -n 20000 | "
            "grep -E 'buffer size|loaded meta data|load_model: loading'",
        ).stdout
    )


def test_the_lab_split_is_read_as_llama_cpp_loaded_it(deployed):
    cluster, model, layout, start = deployed
    assert layout.places == [
        "CPU (coordinator)",
        f"RPC0 ({cluster.workers[0].name})",
        f"RPC1 ({cluster.workers[1].name})",
    ]
    assert start == (3, 3, 2)  # the lab's llama_n_gpu_layers 6 and llama_tensor_split [1, 1]
    report = loaded_report()
    for worker, count in zip(cluster.workers, start[1:]):
        assert report.on(worker.rpc_endpoint, "model") and count > 0


def test_a_candidate_loads_as_asked_with_no_request_lost_and_the_deployed_split_comes_back(deployed):
    """Switch to (1, 2, 5) under load: llama.cpp's load report puts on each worker the weights the planner
    places there for that split; 4 clients meanwhile all answered; then restore() puts back the deployed script
    byte for byte."""
    cluster, model, layout, start = deployed
    deployed_script = on(0, f"cat {SCRIPT}").stdout
    candidate = (1, 2, 5)
    with ssh_runner(INVENTORY) as run:
        server = tune.Server(cluster=cluster, inventory=INVENTORY, run=run, layout=layout)
        server.start(start)
        result = {}
        load = threading.Thread(
            target=lambda: result.setdefault(
                "load", run_load(cluster, clients=4, requests_each=12, n_predict=16, timeout=300)
            )
        )
        load.start()
        try:
            server.switch(candidate)
            settings = layout.settings(candidate)
            assert (
                f"--tensor-split {','.join(map(str, settings['llama_tensor_split']))}" in on(0, f"cat {SCRIPT}").stdout
            )
            report = loaded_report()
            placements, _ = place(
                model,
                layout.devices,
                [float(x) for x in settings["llama_tensor_split"]],
                Context(cluster.settings["llama_ctx_size"], cluster.settings["llama_parallel"]),
                settings["llama_n_gpu_layers"],
            )
            for worker, p in zip(cluster.workers, placements):
                assert len(p.layers) == candidate[1 + cluster.workers.index(worker)]
                assert report.on(worker.rpc_endpoint, "model") == [pytest.approx(p.weights / MIB, rel=0.03, abs=0.02)]
            assert sample_ok(tune.sample(cluster))
        finally:
            server.restore()
            load.join(600)
    assert on(0, f"cat {SCRIPT}").stdout == deployed_script
    load_result = result["load"]
    assert len(load_result.requests) == 48 and not load_result.failed, load_result.failed[:3]
    report = loaded_report()
    assert [len(report.on(w.rpc_endpoint, "model")) for w in cluster.workers] == [1, 1]


def sample_ok(s: tune.Sample) -> bool:
    return s.generation > 1 and s.prompt > 1


def test_ctrl_c_during_a_tune_puts_the_deployed_split_back(deployed):
    """KeyboardInterrupt raised after the first candidate was loaded and measured: tune.run restores the
    deployed launch script and llama-server serves from it."""
    deployed_script = on(0, f"cat {SCRIPT}").stdout
    seen = []

    def interrupt(line: str) -> None:
        seen.append(line)
        if line.startswith("  [") and len(seen) > 3:  # a measurement was logged after the first comparison began
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tune.run(INVENTORY, budget=16, repeats=2, confirm=2, log=interrupt)
    assert any(line.startswith("  [") for line in seen)
    assert on(0, f"cat {SCRIPT}").stdout == deployed_script
    assert on(0, "systemctl is-active llama-server").stdout.strip() == "active"


def test_tune_refuses_a_server_that_is_not_what_the_inventory_says(deployed):
    """Settings changed and not deployed (here a --data the deploy did not get): the split running is not the
    one tune would call the start, so it stops before any restart."""
    before = on(0, "systemctl show -p ActiveEnterTimestampMonotonic llama-server").stdout
    with pytest.raises(RuntimeError, match="is not what .* renders"):
        tune.run(INVENTORY, budget=16, repeats=2, confirm=2, overrides={"llama_ctx_size": 1024}, log=lambda line: None)
    assert on(0, "systemctl show -p ActiveEnterTimestampMonotonic llama-server").stdout == before
