"""The unit suite runs in parallel workers (pytest-xdist), one per core, when a run is the folder tests/unit and
nothing else: the tests share no port, no lab and no fixed path (each writes under its own tmp_path), and the suite
takes a third of the time. A run of some files or tests (a few seconds at most) stays in one process, and so do
tests/front and tests/e2e, which share one lab and its ports. `-n 0` runs the whole suite in one process (--pdb
does too), `-n N` any run in N workers."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

# One BLAS thread a process: the workers take every core already, and OpenBLAS' threads beside them made the numpy
# reference of the sentence model (test_testmodel.py) twice as slow. Set before anything here has loaded numpy.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def the_unit_suite(config: pytest.Config) -> bool:
    """Whether the run is the folder tests/unit (given as its path, or run in it with no path)."""
    where = config.invocation_params.dir
    return all((where / path).resolve() == HERE for path in config.args or [where])


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """Before xdist reads its options: `-n auto --dist loadgroup` unless the command line says how many workers.
    loadgroup keeps the tests of one xdist_group (those that share a costly module fixture) on one worker."""
    if (
        getattr(config.option, "numprocesses", "absent") is not None  # given, or no xdist
        or "PYTEST_XDIST_WORKER" in os.environ
        or config.getoption("usepdb", False)
        or not the_unit_suite(config)
    ):
        return
    config.option.numprocesses = "auto"
    if config.option.dist == "no":
        config.option.dist = "loadgroup"


def pytest_collection_finish(session: pytest.Session) -> None:
    """What the imports and the collection made (about 110,000 objects: modules, functions, the tests) lives until the
    end of the run, yet every full garbage collection walked it again, and pytest collects 5 times at the end of a run:
    0.75 s of gc in a run of the suite. gc.freeze() leaves it out of every collection (0.35 s); what the tests make
    is collected as before."""
    gc.freeze()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """(xdist's controller) A worker reads the distribution mode from the command line alone, where the default
    above is not: it is told."""
    node.workerinput["llama_rpc_dist"] = node.config.option.dist


def pytest_configure(config: pytest.Config) -> None:
    """(a worker) As xdist's worker does for `--dist loadgroup` on the command line: the group joins each test's id,
    which is all the controller sees of it. (The marker is xdist's; declared here too for a run without it.)"""
    config.addinivalue_line("markers", "xdist_group(name): tests that run on one xdist worker (--dist loadgroup)")
    if getattr(config, "workerinput", {}).get("llama_rpc_dist") == "loadgroup":
        config.option.loadgroup = True
