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
"""
from __future__ import annotations

import os
import shlex
import string
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llama_rpc_deploy import facts, render, source, transfer
from llama_rpc_deploy.phases.services import health_probe
from llama_rpc_deploy.settings import BY_NAME, SETTINGS, SettingsError

from .helpers import cluster

IMAGE = "llama-rpc:b11312-0123456789ab"
CANARY = "CANARY_PWNED"
PAYLOADS = [f"$(touch {CANARY})", f"`touch {CANARY}`", f"; touch {CANARY}", f"\ntouch {CANARY}\n",
            f"' ; touch {CANARY} ; '", f'" ; touch {CANARY} ; "', f"& touch {CANARY} &", f"| touch {CANARY}",
            "%h$HOME${HOME}\\n\\\\", "\x00", "\r", "\t", "é中文🙂", "-", "--", " ", "", "/", "..", ":", ",",
            f"/models/it's & (1) [2] {CANARY}.gguf", f"/models/a'b'$(touch {CANARY}).gguf"]
ALPHABET = string.printable + "é中文🙂\x00\x1b\x7f"

text = st.one_of(st.sampled_from(PAYLOADS),
                 st.text(alphabet=ALPHABET, max_size=30),
                 st.builds(lambda a, p, b: a + p + b, st.sampled_from(["", "/", "/models/", "10.0.0.", "RTX 4080"]),
                           st.sampled_from(PAYLOADS), st.sampled_from(["", ".gguf", "/x", "0"])))
numbers = st.one_of(st.integers(min_value=-2 ** 70, max_value=2 ** 70), st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([0, 1, -1, 255, 256, 65535, 65536, 10 ** 9, 0.5, 1e308]))
scalars = st.one_of(st.none(), st.booleans(), numbers, text)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                        st.dictionaries(text, inner, max_size=3)), max_leaves=8)


def place(name: str, value) -> dict:
    """Where a setting goes: the coordinator reads some, the workers others; the rest on every host."""
    read_from = BY_NAME[name].read_from
    if read_from == "workers":
        return {"workers": [{name: value}, None]}
    if read_from == "coordinator":
        return {"all_data": {name: value}}
    return {"coordinator": {name: value}, "workers": [{name: value}, None]}


def printers(folder: Path) -> dict:
    """bin/ with argument printers; each appends its words, NUL-separated, to NAME.args."""
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    for tool in ("docker", "ssh", "zstd", "ss", "systemctl", "timeout", "curl", "journalctl", "iptables",
                 "iptables-restore", "ip6tables", "ip6tables-restore", "sleep", "flock", "setsid"):
        (bin_dir / tool).write_text(f'#!/bin/bash\nprintf "%s\\0" "$@" >> {folder}/{tool}.args\n'
                                    f'printf "\\0\\n" >> {folder}/{tool}.args\n')
        (bin_dir / tool).chmod(0o755)
    (bin_dir / "id").write_text("#!/bin/sh\necho 999\n")
    (bin_dir / "id").chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(folder)}


def calls(folder: Path, tool: str) -> list[list[str]]:
    path = folder / f"{tool}.args"
    if not path.exists():
        return []
    return [c.split("\0")[:-1] for c in path.read_text().split("\0\n") if c]


def run_bash(folder: Path, env: dict, script: str, *args) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script, "_", *args], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=20)


def check_rendered(c, folder: Path) -> None:
    """Everything rendered from cluster c, run in one bash process (a driver script) with printers on PATH."""
    folder.mkdir(parents=True, exist_ok=True)
    env = printers(folder)
    files = {**render.coordinator_files(c, IMAGE), **render.watchdog_files(c)}
    for w in c.workers:
        files |= {f"{w.name}:{p}": t for p, t in {**render.worker_files(c, w, IMAGE), **render.firewall_files(c, w),
                                                   **render.worker_watchdog_files(w),
                                                   **render.cache_prune_files(w)}.items()}
    driver, envs, launches = ["cd " + shlex.quote(str(folder))], {}, {}
    for i, (path, content) in enumerate(files.items()):
        assert all(ch.isprintable() or ch == "\n" for ch in content), path
        if path.endswith(".env"):  # read back exactly as written
            keys = [line.split("=", 1)[0] for line in content.splitlines()]
            (folder / f"{i}.env").write_text(content)
            envs[i] = (path, keys)
            driver.append(f"(set -u; . ./{i}.env; for k in {' '.join(keys)}; do printf '%s\\0' \"${{!k}}\"; done) > {i}.out")
        elif path.endswith((".service", ".timer")):  # systemd splits an Exec line like shlex (no % or $ can reach it)
            for line in content.splitlines():
                if line.startswith(("ExecStart=", "ExecStartPre=", "ExecReload=")):
                    words = shlex.split(line.split("=", 1)[1].lstrip("-"))
                    assert words and words[0].startswith("/"), (path, line)
        elif path.endswith(("llama-server.sh", "rpc-server.sh")):  # docker gets the words Python meant
            (folder / f"{i}.sh").write_text(content.replace("/usr/bin/docker", "docker"))
            body = content.split("exec ", 1)[1].replace("\\\n", " ").split('"$@"')[0]
            launches[i] = (path, shlex.split(body.replace('"$(id -u llama-rpc):$(id -g llama-rpc)"', "999:999"))[1:])
            driver.append(f"bash ./{i}.sh")
    # the commands the deploy runs on hosts
    for w in c.workers:
        driver += [transfer.send_command(IMAGE, w.address, w.ssh_port),
                   facts.TcpReachable().command(address=w.address, port=w.settings["rpc_port"])]
    url, probe = health_probe(c)
    driver += [probe, facts.GgufHeader().command(path=c.settings["llama_model_path"], limit=16),
               source.fetch_command(c.settings["llama_cpp_url"].format(ref=c.settings["llama_cpp_ref"]),
                                    str(folder / "out.tar.gz"), None)]
    (folder / "driver.sh").write_text("\n".join(f"( {line}\n) || true" for line in driver) + "\n")
    run_bash(folder, env, "bash ./driver.sh")
    for i, (path, keys) in envs.items():
        assert len((folder / f"{i}.out").read_text().split("\0")) == len(keys) + 1, path
    docker = calls(folder, "docker")
    for (path, intended), argv in zip(launches.values(), docker):
        assert argv == intended, path
    assert docker[-1][-1] == url  # the health probe's last word
    sent = calls(folder, "ssh")  # the image's ID comes from docker, a printer here: empty
    assert [call[-2:] for call in sent] == [[f"root@{w.address}", f"receive  {IMAGE}"] for w in c.workers], sent
    assert not list(folder.rglob(f"*{CANARY}*")), "a value ran as a command"


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


# The suite runs the same 200 examples every time (CI cannot flake); LLAMA_RPC_FUZZ=explore runs 3000 new ones.
EXPLORE = os.environ.get("LLAMA_RPC_FUZZ") == "explore"


@settings(max_examples=3000 if EXPLORE else 200, derandomize=not EXPLORE, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(name=st.sampled_from([s.name for s in SETTINGS]), data=st.data())
def test_a_value_is_refused_in_one_line_or_rendered_harmlessly(tmp_path_factory, name, data):
    value = data.draw(st.one_of(values, near(BY_NAME[name])), label="value")
    try:
        c = cluster(**place(name, value))
    except SettingsError as error:
        message = str(error)
        assert "\n" not in message and "expected" in message, message
        assert name in message or "gpus" in message, message
        return
    check_rendered(c, tmp_path_factory.mktemp("fuzz"))


@pytest.mark.parametrize("payload", PAYLOADS)
def test_every_string_setting_with_each_payload(tmp_path, payload):
    """The corpus, into every setting that takes a string, at the end of a valid value and alone."""
    for setting in SETTINGS:
        default = setting.default if isinstance(setting.default, str) else ""
        for value in (payload, default + payload, [payload], ["--alias", payload]):
            try:
                c = cluster(**place(setting.name, value))
            except SettingsError as error:
                assert "\n" not in str(error)
                continue
            check_rendered(c, tmp_path / f"{setting.name}-{len(list(tmp_path.iterdir()))}")
