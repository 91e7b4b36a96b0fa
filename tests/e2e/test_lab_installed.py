"""The package installed with `pip install .` in a fresh venv (its packages from PyPI, none of this
machine's): it holds the product only (no lab, no test models, no matplotlib: that is the `plot` extra),
and `llama-rpc --help`, `plan` and `status` work from it with no lab (the first test, which needs no
Docker); `lab` and `testmodel` say in one line that they need a checkout, and work in one. Against the lab:
`plan`, `complete` and `status` work from it; and `status` shows a worker's crash and the coordinator's
watchdog restart after the lab's rpc-server-crash fault."""

import json
import subprocess
import sys

import pytest

from lab import lab
from lab.testmodel import write_sentence_model
from llama_rpc_deploy.paths import PROJECT
from llama_rpc_deploy.loadtest import until_serving

from .lab_helpers import INVENTORY, needs_docker, on


@pytest.fixture(scope="module")
def llama_rpc(tmp_path_factory):
    """The llama-rpc command of a fresh venv with this checkout installed. Its dependencies come from PyPI,
    not from this machine (no --system-site-packages): one missing from pyproject.toml fails here."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check", str(PROJECT)],
        check=True,
        timeout=1800,
    )
    return str(venv / "bin" / "llama-rpc")


def run(llama_rpc, *args, cwd=None):
    """The installed package, not the checkout's (a console script does not put the current folder on sys.path);
    from "/" unless told, or from the checkout, where the deploy runs and whose group_data/ it reads."""
    return subprocess.run([llama_rpc, *args], capture_output=True, text=True, timeout=300, cwd=cwd or "/")


def one_line(done: subprocess.CompletedProcess, code: int, starts: str) -> str:
    assert done.returncode == code and done.stdout == "", done.stdout + done.stderr
    assert done.stderr.startswith(starts) and done.stderr.count("\n") == 1, done.stderr
    return done.stderr


def test_the_fresh_venv_holds_the_product_and_its_commands_work_without_the_lab(llama_rpc, tmp_path):
    python = llama_rpc.replace("llama-rpc", "python")
    for module in ("matplotlib", "lab", "lab.testmodel", "llama_rpc_deploy.testmodel", "llama_rpc_deploy.lab"):
        missing = subprocess.run([python, "-c", f"import {module}"], capture_output=True, text=True, cwd="/")
        assert missing.returncode == 1 and "ModuleNotFoundError" in missing.stderr, (module, missing.stderr)
    helped = run(llama_rpc, "--help")
    assert helped.returncode == 0 and helped.stdout.startswith("usage: llama-rpc"), helped.stdout + helped.stderr

    inventory = tmp_path / "inventory.py"  # two hosts this machine never reaches: plan reads only the model's header
    inventory.write_text(
        'coordinator = [("10.0.0.10", {"gpus": ["RTX 4080"]})]\nworkers = [("10.0.0.20", {"gpus": ["RTX 5060 Ti"]})]\n'
    )
    model = write_sentence_model(tmp_path / "m.gguf")
    plan = run(
        llama_rpc,
        "plan",
        "-i",
        str(inventory),
        "--model",
        str(model),
        "--data",
        "llama_model_path=/models/m.gguf",
        "--data",
        "llama_ctx_size=4096",
    )
    assert plan.returncode == 0 and "tensor split:" in plan.stdout, plan.stdout + plan.stderr

    nowhere = tmp_path / "nowhere.py"  # SSH and the API on ports nothing listens on: every host unreachable
    nowhere.write_text(
        'coordinator = [("127.0.0.1", {"llama_model_path": "/m.gguf", "image_backend": "cpu", '
        '"llama_port": 9, "ssh_port": 1})]\nworkers = [("127.0.0.2", {"ssh_port": 1})]\n'
    )
    status = run(llama_rpc, "status", "-i", str(nowhere))
    assert status.returncode == 1 and "unreachable (ssh)" in status.stdout and "NOT WELL" in status.stdout, (
        status.stdout + status.stderr
    )
    assert "Traceback" not in status.stderr

    png = tmp_path / "x.png"
    assert (
        one_line(run(llama_rpc, "bench", "--png", str(png)), 2, "error: bench --png needs matplotlib")
        == "error: bench --png needs matplotlib: pip install 'llama-rpc-deploy[plot]'\n"
    )
    assert not png.exists()
    for command in (("lab", "up"), ("lab", "down"), ("testmodel", str(tmp_path / "t.gguf"))):
        said = one_line(run(llama_rpc, *command, cwd=tmp_path), 2, f"error: {command[0]} needs a checkout")
        assert "python3 -m llama_rpc_deploy " in said
    assert not (tmp_path / "t.gguf").exists()

    # in a checkout (a folder below its top, as a user may stand), the installed command finds lab/ there
    made = run(
        llama_rpc,
        "testmodel",
        str(tmp_path / "t.gguf"),
        "--n-layer",
        "1",
        "--n-embd",
        "32",
        "--n-head",
        "2",
        "--n-head-kv",
        "1",
        "--n-ff",
        "64",
        cwd=PROJECT / "tests",
    )
    assert made.returncode == 0 and (tmp_path / "t.gguf").is_file(), made.stdout + made.stderr


@needs_docker
def test_the_installed_command_plans_completes_and_reports(llama_rpc, cluster):
    where = subprocess.run(
        [llama_rpc.replace("llama-rpc", "python"), "-c", "import llama_rpc_deploy; print(llama_rpc_deploy.__file__)"],
        capture_output=True,
        text=True,
        cwd="/",
    ).stdout
    assert "site-packages" in where and str(PROJECT) not in where
    plan = run(llama_rpc, "plan", "-i", str(INVENTORY), "--model", str(lab.CACHE / "lab-sentence.gguf"), cwd=PROJECT)
    assert plan.returncode == 0 and "tensor split: 1,1" in plan.stdout, plan.stdout + plan.stderr
    complete = run(llama_rpc, "complete", "-i", str(INVENTORY), "-n", "4", cwd=PROJECT)
    assert complete.returncode == 0 and "4 tokens at" in complete.stdout, complete.stdout + complete.stderr
    status = run(llama_rpc, "status", "-i", str(INVENTORY), cwd=PROJECT)
    assert status.returncode == 0 and status.stdout.rstrip().endswith("all well"), status.stdout + status.stderr
    assert "RPC protocol 7.0.0" in status.stdout and "tensor cache" in status.stdout


@needs_docker
def test_status_shows_a_worker_crash_and_the_watchdog_restart_it_caused(llama_rpc, cluster):
    before = json.loads(run(llama_rpc, "status", "-i", str(INVENTORY), "--json", cwd=PROJECT).stdout)
    on(1, "docker kill rpc-server")  # the lab's rpc-server-crash fault
    assert until_serving(cluster, 180).seconds is not None
    after = json.loads(run(llama_rpc, "status", "-i", str(INVENTORY), "--json", cwd=PROJECT).stdout)
    worker = {h["name"]: h for h in after}[cluster.workers[0].name]
    worker_before = {h["name"]: h for h in before}[cluster.workers[0].name]
    assert worker["services"][0]["crashes"] == worker_before["services"][0]["crashes"] + 1
    coordinator, coordinator_before = after[0], before[0]
    assert coordinator["services"][0]["watchdog_restarts"] >= coordinator_before["services"][0]["watchdog_restarts"] + 1
    assert (
        f"rpc-server at {cluster.workers[0].rpc_endpoint} closed" in coordinator["services"][0]["last_watchdog_reason"]
    )
    assert all(h["ok"] for h in after)
