"""testinfra verification of a deployed inventory: the local lab or your own machines.

    pytest tests/verify --inventory inventory.py          # your machines (SSH as in inventory.py)
    pytest tests/verify --inventory .lab/inventory.py     # the lab

Hosts and settings come from the inventory and group_data, read the same way
the deploy reads them; testinfra reaches the hosts over SSH with the
inventory's user, port, key and known_hosts.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import testinfra

from llama_rpc_deploy.gguf_header import read_remote_model
from llama_rpc_deploy.plan import plan_cluster
from llama_rpc_deploy.deployment import from_cluster
from llama_rpc_deploy.loading import load_inventory, offline_cluster
from llama_rpc_deploy.remote import write_ssh_config
from llama_rpc_deploy.facts import GgufHeader


def pytest_addoption(parser):
    parser.addoption(
        "--inventory",
        default=os.environ.get("LLAMA_RPC_INVENTORY", "inventory.py"),
        help="inventory file of the deployed hosts (default: inventory.py)",
    )


def _inventory_path(config) -> Path:
    return Path(config.getoption("--inventory")).resolve()


@pytest.fixture(scope="session")
def offline(request):
    """The deployment as computed from inventory and group_data alone."""
    return from_cluster(offline_cluster(_inventory_path(request.config)), with_key=False)


@pytest.fixture(scope="session")
def model(offline, connect):
    """The model's GGUF header, read on the coordinator the way the deploy reads it."""
    coordinator = connect(offline.cluster.coordinator.name)
    fact, path = GgufHeader(), offline.cluster.settings["llama_model_path"]
    return read_remote_model(
        lambda file, limit: fact.process(coordinator.check_output(fact.command(file, limit)).splitlines()), path
    )


@pytest.fixture(scope="session")
def deployment(offline, request):
    """What the deploy computed: with llama_tensor_split = 'auto', the planner's split."""
    if offline.cluster.settings["llama_tensor_split"] == "auto":
        return offline.with_split(plan_cluster(offline.cluster, request.getfixturevalue("model")).split)
    return offline


@pytest.fixture(scope="session")
def connect(request, tmp_path_factory):
    config = write_ssh_config(_inventory_path(request.config), tmp_path_factory.mktemp("ssh"))
    cache = {}

    def get(name: str):
        if name not in cache:
            cache[name] = testinfra.get_host(f"ssh://{name}", ssh_config=str(config))
        return cache[name]

    return get


@pytest.fixture(scope="session")
def coordinator(deployment, connect):
    return connect(deployment.cluster.coordinator.name)


def pytest_generate_tests(metafunc):
    """Tests that take `worker` run once per worker in the inventory."""
    if "worker_name" in metafunc.fixturenames:
        inventory = _inventory_path(metafunc.config)
        names = [h.name for h in load_inventory(inventory).get_group("workers", [])] if inventory.is_file() else []
        metafunc.parametrize("worker_name", names)


@pytest.fixture
def worker(worker_name, connect):
    return connect(worker_name)


@pytest.fixture
def worker_plan(worker_name, deployment):
    return deployment.cluster.host(worker_name)
