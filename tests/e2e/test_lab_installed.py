"""The package installed with `pip install .` in a fresh venv: `llama-rpc plan`, `complete` and `status`
work from it, against the lab; and `status` shows a worker's crash and the coordinator's watchdog restart
after the lab's rpc-server-crash fault."""
import json
import subprocess
import sys

import pytest

from llama_rpc_deploy import lab
from llama_rpc_deploy.deployment import PROJECT
from llama_rpc_deploy.loadtest import until_serving

from . import INVENTORY, deployed_and_serving, needs_docker, on

pytestmark = needs_docker


@pytest.fixture(scope="module")
def llama_rpc(tmp_path_factory):
    """The llama-rpc command of a venv with this checkout installed (its dependencies: this machine's)."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", str(PROJECT)], check=True, timeout=600)
    return str(venv / "bin" / "llama-rpc")


@pytest.fixture(scope="module")
def cluster():
    return deployed_and_serving()


def run(llama_rpc, *args, cwd=None):
    """From a folder outside the checkout: the installed package, not the checkout's."""
    return subprocess.run([llama_rpc, *args], capture_output=True, text=True, timeout=300, cwd=cwd or "/")


def test_the_installed_command_plans_completes_and_reports(llama_rpc, cluster):
    where = subprocess.run([llama_rpc.replace("llama-rpc", "python"), "-c", "import llama_rpc_deploy; print(llama_rpc_deploy.__file__)"],
                           capture_output=True, text=True, cwd="/").stdout
    assert "site-packages" in where and str(PROJECT) not in where
    plan = run(llama_rpc, "plan", "-i", str(INVENTORY), "--model", str(lab.CACHE / "lab-sentence.gguf"))
    assert plan.returncode == 0 and "tensor split: 1,1" in plan.stdout, plan.stdout + plan.stderr
    complete = run(llama_rpc, "complete", "-i", str(INVENTORY), "-n", "4")
    assert complete.returncode == 0 and "4 tokens at" in complete.stdout, complete.stdout + complete.stderr
    status = run(llama_rpc, "status", "-i", str(INVENTORY))
    assert status.returncode == 0 and status.stdout.rstrip().endswith("all well"), status.stdout + status.stderr
    assert "RPC protocol 7.0.0" in status.stdout and "tensor cache" in status.stdout


def test_status_shows_a_worker_crash_and_the_watchdog_restart_it_caused(llama_rpc, cluster):
    before = json.loads(run(llama_rpc, "status", "-i", str(INVENTORY), "--json").stdout)
    on(1, "docker kill rpc-server")  # the lab's rpc-server-crash fault
    assert until_serving(cluster, 180).seconds is not None
    after = json.loads(run(llama_rpc, "status", "-i", str(INVENTORY), "--json").stdout)
    worker = {h["name"]: h for h in after}[cluster.workers[0].name]
    worker_before = {h["name"]: h for h in before}[cluster.workers[0].name]
    assert worker["services"][0]["crashes"] == worker_before["services"][0]["crashes"] + 1
    coordinator, coordinator_before = after[0], before[0]
    assert coordinator["services"][0]["watchdog_restarts"] >= coordinator_before["services"][0]["watchdog_restarts"] + 1
    assert f"rpc-server at {cluster.workers[0].rpc_endpoint} closed" in coordinator["services"][0]["last_watchdog_reason"]
    assert all(h["ok"] for h in after)
