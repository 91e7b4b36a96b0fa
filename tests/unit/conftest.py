"""The unit tests run in parallel workers (pytest-xdist), one per core, when a run holds nothing but them: they share
no port, no lab and no fixed path (each writes under its own tmp_path), and the suite takes a third of the time.
tests/front and tests/e2e share one lab and its ports, and always run in one process. `-n 0` runs the unit tests
in this process (for --pdb, or one quick test), `-n N` in N workers."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

# One BLAS thread a process: the workers take every core already, and OpenBLAS' threads beside them made the numpy
# reference of the sentence model (test_testmodel.py) twice as slow. Set before anything here has loaded numpy.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def only_unit_tests(config: pytest.Config) -> bool:
    """Whether every path the run was given (or the folder it runs in, given none) lies in tests/unit."""
    where = config.invocation_params.dir
    paths = [arg.split("::")[0] for arg in config.args] or [str(where)]
    return all(HERE == p or HERE in p.parents for p in ((where / path).resolve() for path in paths))


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """Before xdist reads its options: `-n auto --dist loadgroup` unless the command line says how many workers.
    loadgroup keeps the tests of one xdist_group (those that share a costly module fixture) on one worker."""
    if (getattr(config.option, "numprocesses", "absent") is not None  # given, or no xdist
            or "PYTEST_XDIST_WORKER" in os.environ or config.getoption("usepdb", False)
            or not only_unit_tests(config)):
        return
    config.option.numprocesses = "auto"
    if config.option.dist == "no":
        config.option.dist = "loadgroup"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """(xdist's controller) A worker reads the distribution mode from the command line alone, where the default
    above is not: it is told."""
    node.workerinput["llama_rpc_dist"] = node.config.option.dist


def pytest_configure(config: pytest.Config) -> None:
    """(a worker) As xdist's worker does for `--dist loadgroup` on the command line: the group joins each test's id,
    which is all the controller sees of it."""
    if getattr(config, "workerinput", {}).get("llama_rpc_dist") == "loadgroup":
        config.option.loadgroup = True
