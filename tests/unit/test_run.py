"""The decisions one host's operations take from another's, without hosts: Run's restart and rollback rules."""

from dataclasses import dataclass

import pytest

from llama_rpc_deploy import run as run_module
from llama_rpc_deploy.deployment import from_cluster
from llama_rpc_deploy.run import Run

from .helpers import cluster


@dataclass
class Op:
    """Stands in for a pyinfra operation's result, as the decisions see it when they run."""

    changed: bool = False
    complete: bool = True
    error: bool = False

    def did_change(self):
        return self.changed

    def is_complete(self):
        return self.complete

    def did_error(self):
        return self.error


@pytest.fixture
def run():
    return Run(from_cluster(cluster(workers=[None, None]), with_key=False))


@pytest.mark.parametrize(
    "started,workers,restart",
    [
        (False, [False, False], False),  # nothing changed anywhere: llama-server is left alone
        (False, [False, True], True),  # a worker restarted: llama-server cannot reconnect, so it restarts
        (True, [True, True], False),  # it just (re)started, after the workers: once is enough
        (True, [False, False], False),
    ],
)
def test_llama_server_restarts_after_its_workers_once(run, started, workers, restart):
    run.worker_services = {f"w{i}": Op(changed=c) for i, c in enumerate(workers)}
    assert run.coordinator_restart_needed(Op(changed=started)) is restart


def test_no_workers_recorded_means_no_restart(run):
    assert run.workers_restarted() is False


@pytest.mark.parametrize(
    "check,failed",
    [
        (None, False),  # the coordinator did not get that far
        (Op(complete=False, error=True), False),  # not run yet
        (Op(error=False), False),
        (Op(error=True), True),
    ],
)
def test_rollback_only_after_a_failed_health_check(run, check, failed):
    run.health_check = check
    assert run.health_failed() is failed


def test_run_of_builds_one_run_per_pyinfra_state(run, monkeypatch):
    """Every host's deploy.py calls Run.of: the first builds the Run (settings checked, source hashed),
    the others get that same object, so what one host's operations record the others see."""
    built = []

    def from_pyinfra(inventory, inventory_file="inventory.py"):
        built.append(inventory)
        return run.deployment

    monkeypatch.setattr(run_module, "from_pyinfra", from_pyinfra)

    class State:  # a fresh pyinfra State: nothing attached yet
        pass

    first, second = State(), State()
    a = Run.of(first, inventory="inventory")
    assert isinstance(a, Run) and a.deployment is run.deployment
    again = Run.of(first, inventory="inventory")  # the second host's deploy.py
    assert again is a, "Run.of gave a second Run for the same pyinfra state (not cached on it)"
    assert built == ["inventory"], f"Run.of built the Run {len(built)} times for one pyinfra state"
    b = Run.of(second, inventory="other")  # another pyinfra run gets its own
    assert b is not a, "a second pyinfra state got the first state's Run"
    assert built == ["inventory", "other"]
    assert Run.of(second, inventory="other") is b and Run.of(first, inventory="inventory") is a
    assert len(built) == 2, f"Run.of built {len(built)} Runs for two pyinfra states"


def test_one_run_per_pyinfra_state_and_the_settled_split_reaches_every_later_phase(run):
    class State:  # pyinfra's State: Run.of attaches itself to it
        llama_rpc_run = run

    assert Run.of(State, inventory=None) is run
    assert not run.settled
    run.settle(run.deployment.with_split([3, 5]))  # as phases/checks.settle does, once
    assert run.settled and Run.of(State, inventory=None).deployment.cluster.settings["llama_tensor_split"] == [3, 5]
    with pytest.raises(RuntimeError, match="settled already"):  # no phase changes the Cluster afterwards
        run.settle(run.deployment.with_split([4, 4]))
    assert run.deployment.cluster.settings["llama_tensor_split"] == [3, 5]
    run.keep_replaced("10.0.0.10", "/opt/llama-rpc/llama-server.sh")
    assert run.replaced["10.0.0.10"] == ["/opt/llama-rpc/llama-server.sh"]
