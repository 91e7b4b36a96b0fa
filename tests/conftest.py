import functools
import inspect
import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# Importing pyinfra_cli (the tests load inventories with it) runs gevent's monkey.patch_all() for pyinfra's own
# SSH concurrency: the whole pytest process then has gevent's subprocess, threading and select. The tests connect
# to nothing through pyinfra, and patched, each of the hundreds of processes they start costs 4.4 ms instead of
# 0.65 ms (gevent forks the whole pytest process): the tests run unpatched, as a test module run alone already did.
# pyinfra's own runs (`pyinfra ... deploy.py`, in a process of their own) patch as always.
try:
    from gevent import monkey
except ImportError:
    pass
else:
    monkey.patch_all = lambda *args, **kwargs: None

try:  # the unit tests' (requirements.txt); `pytest tests/verify` on a machine of one's own may go without
    from hypothesis import settings
except ImportError:
    settings = None
if settings:
    # Hypothesis profiles (tests/unit/test_fuzz_settings.py), chosen with HYPOTHESIS_PROFILE:
    # "ci" (the default): 100 examples, the same ones every run, so CI cannot flake and the unit suite stays quick;
    # "explore": 3000 new examples every run, to hunt for a value the corpus misses.
    settings.register_profile("ci", max_examples=100, derandomize=True, database=None, deadline=None)
    settings.register_profile("explore", max_examples=3000, derandomize=False, deadline=None)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


class _SentenceModels(dict):
    """{"one": path, "two": path}, each model written the first time it is asked for."""

    def __init__(self, folder: Path):
        super().__init__()
        self.folder = folder

    def __missing__(self, name: str) -> Path:
        from lab.testmodel import PROMPT_2, SENTENCE_2, write_sentence_model

        text = {"one": {}, "two": {"prompt": PROMPT_2, "sentence": SENTENCE_2}}[name]
        self[name] = write_sentence_model(self.folder / f"{name}.gguf", **text)
        return self[name]


@pytest.fixture(scope="session")
def sentence_models(tmp_path_factory) -> dict[str, Path]:
    """The lab's two sentence models (lab.testmodel: PROMPT/SENTENCE and PROMPT_2/SENTENCE_2, 51 MB each),
    written once a session (a process: one per xdist worker), each when first asked for (half a second).
    Read-only: a test that wants one at a path of its own asks `place_sentence_model`. Tests that use them carry
    `@pytest.mark.xdist_group("sentence models")`, so one worker writes them."""
    return _SentenceModels(tmp_path_factory.mktemp("sentence-models"))


@pytest.fixture
def place_sentence_model(sentence_models):
    """place_sentence_model(NAME, PATH): sentence model NAME ("one" or "two") at PATH, as write_sentence_model
    would leave it there; a hard link to the session's file (no 51 MB write), a copy where no link can be made."""

    def place(name: str, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(sentence_models[name], path)
        except OSError:
            shutil.copyfile(sentence_models[name], path)
        return path

    return place


@pytest.fixture(scope="session", autouse=True)
def _connectors_looked_up_once():
    """pyinfra looks its connectors up in every installed package's entry points (importlib.metadata) three
    times per inventory it builds: 70% of building one (about 30 ms here), and the tests build hundreds. The
    packages cannot change during a run, so the lookup is made once; pyinfra's own code runs as it is."""
    try:
        from pyinfra.api import connectors
    except ImportError:
        yield
        return
    looked_up = connectors.entry_points
    connectors.entry_points = functools.cache(lambda *args, **selection: looked_up(*args, **selection))
    try:
        yield
    finally:
        connectors.entry_points = looked_up


@pytest.fixture(scope="session", autouse=True)
def _operation_order_without_source_lines():
    """pyinfra names each operation by the file names and line numbers of its call stack (pyinfra.api.util:
    inspect.stack() and getframeinfo()), and inspect reads each frame's source line for it too (context=1): for a
    frame of deploy.py, which pyinfra runs with exec() and is no module, inspect.getmodule then scans every module
    in sys.modules, per frame and per operation. With every unit test module loaded, a wiring run (tests/wiring.py)
    took 1.4 s, 0.4 s without. pyinfra reads nothing but the file name and the line number (util.py's only users of
    the two), and context=0 gives the same ones without reading any source."""
    try:
        from pyinfra.api import util
    except ImportError:
        yield
        return
    stack, getframeinfo = util.stack, util.getframeinfo
    util.stack = functools.partial(inspect.stack, 0)
    util.getframeinfo = functools.partial(inspect.getframeinfo, context=0)
    try:
        yield
    finally:
        util.stack, util.getframeinfo = stack, getframeinfo
