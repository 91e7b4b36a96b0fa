"""Every setting, fuzzed (Hypothesis): a value is refused with one line before any host is touched,
or everything rendered from it still parses to the intended words and runs nothing.

Values of every type and shape: strings with shell and systemd metacharacters, unicode, control
characters, huge and negative numbers, NaN and infinities, nested lists and dicts. Strings carry
payloads that would create a canary file if any shell ran them (`$(touch …)`, backticks, `;`,
newlines, quotes). For a value that passes the schema and the cluster checks:
- every launch script and program runs under bash with docker, id, ssh, zstd, ss and systemctl
  replaced by argument printers: docker gets exactly the words Python meant (shlex reads the lines
  render.py wrote), and no canary appears;
- every env file reads back in bash as written;
- every unit's Exec lines split (systemd's quoting) into the intended words, without control characters;
- the commands the deploy runs over SSH (image transfer, reachability, health probe, source download)
  run with the same printers and create no canary.

Everything rendered is run in one bash process per core (a `Batch`), each distinct file or command once,
in a folder of its own; a failure names the setting, the value and the rendered file or command.

How many examples Hypothesis tries is its profile's (registered in tests/conftest.py):
    HYPOTHESIS_PROFILE=ci       the default: the same 100 examples every run (derandomized: CI cannot flake)
    HYPOTHESIS_PROFILE=explore  3000 new examples a run, for a hunt; the corpus test below is always whole
e.g. `HYPOTHESIS_PROFILE=explore python3 -m pytest tests/unit/test_fuzz_settings.py`.
"""

from __future__ import annotations

import os
import shlex
import string
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from llama_rpc_deploy import facts, render, source, transfer
from llama_rpc_deploy.phases.services import health_probe
from llama_rpc_deploy.settings import BY_NAME, SETTINGS, SettingsError

from .helpers import IMAGE, cluster

CANARY = "CANARY_PWNED"
PAYLOADS = [
    f"$(touch {CANARY})",
    f"`touch {CANARY}`",
    f"; touch {CANARY}",
    f"\ntouch {CANARY}\n",
    f"' ; touch {CANARY} ; '",
    f'" ; touch {CANARY} ; "',
    f"& touch {CANARY} &",
    f"| touch {CANARY}",
    "%h$HOME${HOME}\\n\\\\",
    "\x00",
    "\r",
    "\t",
    "é中文🙂",
    "-",
    "--",
    " ",
    "",
    "/",
    "..",
    ":",
    ",",
    f"/models/it's & (1) [2] {CANARY}.gguf",
    f"/models/a'b'$(touch {CANARY}).gguf",
]
ALPHABET = string.printable + "é中文🙂\x00\x1b\x7f"

text = st.one_of(
    st.sampled_from(PAYLOADS),
    st.text(alphabet=ALPHABET, max_size=30),
    st.builds(
        lambda a, p, b: a + p + b,
        st.sampled_from(["", "/", "/models/", "10.0.0.", "RTX 4080"]),
        st.sampled_from(PAYLOADS),
        st.sampled_from(["", ".gguf", "/x", "0"]),
    ),
)
numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, -1, 255, 256, 65535, 65536, 10**9, 0.5, 1e308]),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, text)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(text, inner, max_size=3)),
    max_leaves=8,
)

PRINTED = (
    "docker",
    "ssh",
    "zstd",
    "ss",
    "systemctl",
    "timeout",
    "curl",
    "journalctl",
    "iptables",
    "iptables-restore",
    "ip6tables",
    "ip6tables-restore",
    "sleep",
    "flock",
    "setsid",
)


def place(name: str, value) -> dict:
    """Where a setting goes: the coordinator reads some, the workers others; the rest on every host."""
    read_from = BY_NAME[name].read_from
    if read_from == "workers":
        return {"workers": [{name: value}, None]}
    if read_from == "coordinator":
        return {"all_data": {name: value}}
    return {"coordinator": {name: value}, "workers": [{name: value}, None]}


def printers(folder: Path) -> Path:
    """A bin/ of argument printers: each appends its words, NUL-separated, to NAME.args in $FUZZ_OUT (the
    folder the file or command under test runs in); `id` says 999."""
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    for tool in PRINTED:
        (bin_dir / tool).write_text(
            f'#!/bin/sh\n{{ printf "%s\\0" "$@"; printf "\\0\\n"; }} >> "${{FUZZ_OUT:?}}/{tool}.args"\n'
        )
        (bin_dir / tool).chmod(0o755)
    (bin_dir / "id").write_text("#!/bin/sh\necho 999\n")
    (bin_dir / "id").chmod(0o755)
    return bin_dir


def calls(folder: Path, tool: str) -> list[list[str]]:
    path = folder / f"{tool}.args"
    if not path.exists():
        return []
    return [c.split("\0")[:-1] for c in path.read_text().split("\0\n") if c]


@dataclass
class Unit:
    """One distinct rendered file or command, run once in a folder of its own; `check` reads what it left there
    and says what is wrong (None: nothing), once: every case that rendered the same reports it."""

    folder: Path
    script: str  # bash, run in a subshell of the batch with the folder as its working directory
    check: Callable[[Path], str | None] = lambda folder: None
    ran: bool = False
    _problem: list = field(default_factory=list)

    def problem(self) -> str | None:
        if not self._problem:
            problem = self.check(self.folder)
            if problem is None and list(self.folder.rglob(f"*{CANARY}*")):
                problem = "a value ran as a command"
            self._problem.append(problem)
        return self._problem[0]


@dataclass
class Case:
    """Everything rendered from one cluster: (what, unit) pairs, `what` the rendered file or the command."""

    label: str
    units: list[tuple[str, Unit]] = field(default_factory=list)

    def verify(self) -> None:
        for what, unit in self.units:
            problem = unit.problem()
            assert problem is None, f"{self.label}: {what}: {problem}"


def env_check(keys: list[str]) -> Callable[[Path], str | None]:
    def check(folder: Path) -> str | None:
        out = folder / "env.out"
        values = out.read_text().split("\0") if out.exists() else None
        if values is None or len(values) != len(keys) + 1:
            return f"bash read back {values!r} for {keys}"
        return None

    return check


def launch_check(intended: list[str]) -> Callable[[Path], str | None]:
    def check(folder: Path) -> str | None:
        docker = calls(folder, "docker")
        return None if docker[:1] == [intended] else f"docker got {docker[:1]}, not {intended}"

    return check


def probe_check(url: str) -> Callable[[Path], str | None]:
    def check(folder: Path) -> str | None:
        docker = calls(folder, "docker")
        return None if docker and docker[-1][-1] == url else f"docker got {docker}: the last word is not {url}"

    return check


def send_check(address: str) -> Callable[[Path], str | None]:
    def check(folder: Path) -> str | None:
        sent = calls(folder, "ssh")  # the image's ID comes from docker, a printer here: empty
        wanted = [[f"root@{address}", f"receive  {IMAGE}"]]
        return None if [call[-2:] for call in sent] == wanted else f"ssh got {sent}, expected to end in {wanted}"

    return check


def intended_words(launch: str) -> list[str]:
    """The words docker gets from a launch script, as Python meant them (shlex reads the lines render.py wrote)."""
    body = launch.split("exec ", 1)[1].replace("\\\n", " ").split('"$@"')[0]
    return shlex.split(body.replace('"$(id -u llama-rpc):$(id -g llama-rpc)"', "999:999"))[1:]


def exec_lines_problem(content: str) -> str | None:
    """systemd splits an Exec line like shlex (no % or $ can reach it): into words, the first an absolute path."""
    for line in content.splitlines():
        if line.startswith(("ExecStart=", "ExecStartPre=", "ExecReload=")):
            words = shlex.split(line.split("=", 1)[1].lstrip("-+@:!"))  # systemd's prefixes
            if not (words and words[0].startswith("/")):
                return f"{line!r} splits into {words}"
    return None


class Batch:
    """Many clusters' files and commands, each distinct one run once, all in one bash process per core."""

    def __init__(self, root: Path, bin_dir: Path):
        self.root, self.bin_dir = root, bin_dir
        self.units: dict[tuple, Unit] = {}
        self.units_checked: dict[str, str | None] = {}  # unit files, checked in Python: content -> problem

    def unit(self, key: tuple, make: Callable[[Path], Unit]) -> Unit:
        if key not in self.units:
            folder = self.root / f"u{len(self.units)}"
            folder.mkdir(parents=True)
            self.units[key] = make(folder)
        return self.units[key]

    def add(self, c, label: str) -> Case:
        """Render everything from cluster c (the Python-side checks run here) and queue it."""
        case = Case(label)
        files = {**render.coordinator_files(c, IMAGE), **render.watchdog_files(c)}
        for w in c.workers:
            files |= {
                f"{w.name}:{p}": t
                for p, t in {
                    **render.worker_files(c, w, IMAGE),
                    **render.firewall_files(c, w),
                    **render.worker_watchdog_files(w),
                    **render.cache_prune_files(w),
                }.items()
            }
        for path, content in files.items():
            assert content.replace("\n", "").isprintable(), f"{label}: {path}: a control character"
            if path.endswith(".env"):  # read back exactly as written

                def env_unit(folder, content=content):
                    keys = [line.split("=", 1)[0] for line in content.splitlines()]
                    (folder / "x.env").write_text(content)
                    return Unit(
                        folder,
                        f"(set -u; . ./x.env; for k in {' '.join(keys)}; do printf '%s\\0' \"${{!k}}\"; "
                        "done) > env.out",
                        env_check(keys),
                    )

                case.units.append((path, self.unit(("env", content), env_unit)))
            elif path.endswith((".service", ".timer")):
                if content not in self.units_checked:
                    self.units_checked[content] = exec_lines_problem(content)
                assert self.units_checked[content] is None, f"{label}: {path}: {self.units_checked[content]}"
            elif path.endswith(("llama-server.sh", "rpc-server.sh")):  # docker gets the words Python meant

                def launch_unit(folder, content=content):
                    (folder / "launch.sh").write_text(content.replace("/usr/bin/docker", "docker"))
                    return Unit(folder, "bash ./launch.sh", launch_check(intended_words(content)))

                case.units.append((path, self.unit(("launch", content), launch_unit)))
        # the commands the deploy runs on hosts
        for w in c.workers:
            send = transfer.send_command(IMAGE, w.address, w.ssh_port)
            case.units.append(
                (send, self.unit(("send", send, w.address), lambda folder: Unit(folder, send, send_check(w.address))))
            )
            reachable = facts.TcpReachable().command(address=w.address, port=w.settings["rpc_port"])
            case.units.append((reachable, self.unit(("command", reachable), lambda folder: Unit(folder, reachable))))
        url, probe = health_probe(c)
        case.units.append(
            (probe, self.unit(("probe", probe, url), lambda folder: Unit(folder, probe, probe_check(url))))
        )
        for command in (
            facts.GgufHeader().command(path=c.settings["llama_model_path"], limit=16),
            source.fetch_command(
                c.settings["llama_cpp_url"].format(ref=c.settings["llama_cpp_ref"]), "out.tar.gz", None
            ),
        ):
            case.units.append((command, self.unit(("command", command), lambda folder: Unit(folder, command))))
        return case

    def run(self) -> None:
        """Every unit not run yet, in one bash process per core, each in a subshell in its own folder."""
        todo = [u for u in self.units.values() if not u.ran]
        if not todo:
            return
        jobs = max(1, min(os.cpu_count() or 1, len(todo) // 8))
        scripts, procs = [], []
        for j in range(jobs):
            lines = []
            for unit in todo[j::jobs]:
                q = shlex.quote(str(unit.folder))
                lines.append(
                    f"( cd {q} && export HOME={q} FUZZ_OUT={q} && {{\n{unit.script}\n}} ) > {q}/log 2>&1 || true\n"
                    f": > {q}/ran"
                )
            script = self.root / f"batch{j}.sh"
            script.write_text("\n".join(lines) + "\n")
            scripts.append(script)
        for script in scripts:
            procs.append(
                subprocess.Popen(
                    ["bash", str(script)],
                    cwd=self.root,
                    env={"PATH": f"{self.bin_dir}:/usr/bin:/bin"},
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        try:
            for proc in procs:
                proc.wait(timeout=20 + len(todo))
        except subprocess.TimeoutExpired:
            for proc in procs:
                proc.kill()
            stuck = [u.script for u in todo if not (u.folder / "ran").exists()]
            raise AssertionError(f"a rendered file or command did not finish: {stuck[:3]}") from None
        for unit in todo:
            unit.ran = True


def near(setting) -> st.SearchStrategy:
    """Values of the setting's own type, near its default: most pass the schema, so the rendering is fuzzed too."""
    default = setting.default
    if isinstance(default, bool):
        return st.booleans()
    if isinstance(default, int):
        return st.integers(min_value=-10, max_value=2 * max(default, 1000))
    if isinstance(default, str):
        return st.builds(lambda p, s: default + s if p else s + default, st.booleans(), text)
    if isinstance(default, list):
        return st.lists(text, max_size=3)
    return st.one_of(text, st.integers(min_value=0, max_value=100000), st.lists(text, max_size=2))


@pytest.fixture(scope="module")
def bin_dir(tmp_path_factory) -> Path:
    return printers(tmp_path_factory.mktemp("printers"))


@pytest.fixture(scope="module")
def examples(tmp_path_factory, bin_dir) -> Batch:
    """The examples' batch: a file or command an earlier example rendered the same is not run again."""
    return Batch(tmp_path_factory.mktemp("examples"), bin_dir)


# The number of examples is the Hypothesis profile's (tests/conftest.py; see the docstring above).
@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from([s.name for s in SETTINGS]), data=st.data())
def test_a_value_is_refused_in_one_line_or_rendered_harmlessly(examples, name, data):
    value = data.draw(st.one_of(values, near(BY_NAME[name])), label="value")
    try:
        c = cluster(**place(name, value))
    except SettingsError as error:
        message = str(error)
        assert "\n" not in message and "expected" in message, message
        assert name in message or "gpus" in message, message
        event("refused")  # --hypothesis-show-statistics counts both kinds
        return
    event("rendered")
    case = examples.add(c, f"{name} = {value!r}")
    examples.run()
    case.verify()


def corpus_values(payload: str):
    """(setting, value) for the payload in every setting that takes a string, at the end of a valid value and alone."""
    for setting in SETTINGS:
        default = setting.default if isinstance(setting.default, str) else ""
        for value in (payload, default + payload, [payload], ["--alias", payload]):
            yield setting, value


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, bin_dir) -> dict[str, list]:
    """For each payload: per (setting, value), its refusal's message, or its Case (run, in one batch for the whole
    corpus), or the exception that building or rendering raised (the payload's test raises it)."""
    batch = Batch(tmp_path_factory.mktemp("corpus"), bin_dir)
    outcomes: dict[str, list] = {}
    for payload in PAYLOADS:
        outcomes[payload] = []
        for setting, value in corpus_values(payload):
            label = f"{setting.name} = {value!r}"
            try:
                c = cluster(**place(setting.name, value))
            except SettingsError as error:
                outcomes[payload].append((label, str(error)))
                continue
            except Exception as error:  # noqa: BLE001 - raised again by the payload's own test
                outcomes[payload].append((label, error))
                continue
            try:
                outcomes[payload].append((label, batch.add(c, label)))
            except Exception as error:  # noqa: BLE001
                outcomes[payload].append((label, error))
    batch.run()
    return outcomes


@pytest.mark.xdist_group("fuzz corpus")  # one worker runs the corpus (its batch takes a second)
@pytest.mark.parametrize("payload", PAYLOADS)
def test_every_string_setting_with_each_payload(corpus, payload):
    """The corpus, into every setting that takes a string, at the end of a valid value and alone."""
    assert len(corpus[payload]) == 4 * len(SETTINGS)
    for label, outcome in corpus[payload]:
        if isinstance(outcome, BaseException):
            raise outcome
        if isinstance(outcome, str):  # refused
            assert "\n" not in outcome, f"{label}: {outcome}"
            continue
        outcome.verify()
