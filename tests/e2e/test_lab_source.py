"""The path every real user takes: the coordinator downloads the pinned llama.cpp commit from GitHub (here a
lab host that serves the tarball at GitHub's path), checks its sha256, and builds it; a corrupted or
substituted tarball is refused with a clear message, and nothing changes on any host."""

from __future__ import annotations

import json
import re

import pytest

from lab import lab
from llama_rpc_deploy.paths import STATE as CONTROL_STATE
from llama_rpc_deploy.phases.build import FIRST_LOOK_SECONDS
from llama_rpc_deploy.settings import DEFAULTS
from llama_rpc_deploy.source import pack_tree, record, sha256_file

from .lab_helpers import WORKERS, changed, needs_docker, on, operations, pyinfra, snapshot

pytestmark = needs_docker
REF = DEFAULTS["llama_cpp_ref"]
LOCK = CONTROL_STATE / "sources.lock"


@pytest.fixture(scope="module")
def github(tmp_path_factory):
    """The mirror host, serving a GitHub-shaped tarball of the pinned commit (top folder llama.cpp-COMMIT)."""
    lab.up(workers=WORKERS)
    good = pack_tree(lab.ensure_sdist(), lab.CACHE / "github", top=f"llama.cpp-{REF}")
    substituted = tmp_path_factory.mktemp("bad") / "substituted.tar.gz"
    substituted.write_bytes(good.read_bytes()[:-4096] + bytes(4096))  # the same size, other bytes at the end
    path = lab.GITHUB_PATH.format(ref=REF)
    base = lab.mirror({path: good})
    url = f"{base}{lab.GITHUB_PATH}"
    if LOCK.is_file():  # start from first use: nothing recorded for this URL
        LOCK.write_text(json.dumps({k: v for k, v in json.loads(LOCK.read_text()).items() if k != url.format(ref=REF)}))
    on(0, "rm -f /var/lib/llama-rpc/build/llama.cpp.tar.gz")
    yield {
        "args": ["--data", "llama_cpp_source=null", "--data", f"llama_cpp_url={url}"],
        "url": url.format(ref=REF),
        "good": good,
        "substituted": substituted,
        "path": path,
    }
    lab.mirror({path: good})
    operations(pyinfra("--json"))  # back on the lab's own source (that image is still there: no build)


def test_first_deploy_downloads_checks_builds_and_records_the_sha256(github):
    result = pyinfra("--json", *github["args"])
    ops = operations(result)
    assert changed(ops, f"llama.cpp source: download {github['url']}") == [lab.ip_of(0)]
    assert json.loads(LOCK.read_text())[github["url"]] == sha256_file(github["good"])
    built = re.search(rf"\[{re.escape(lab.ip_of(0))}\] built in (\d+) s", result.stderr)
    assert bool(built) == bool(changed(ops, "Build llama-rpc:"))
    if built and int(built.group(1)) > FIRST_LOOK_SECONDS + 1:  # a build that takes a while shows it is alive
        assert f"[{lab.ip_of(0)}] building, " in result.stderr
    build_info = json.loads(
        on(
            0,
            f"curl -fsS -H 'Authorization: Bearer {lab.ensure_api_key().read_text().strip()}' "
            f"http://{lab.ip_of(0)}:8080/props",
        ).stdout
    )["build_info"]
    assert build_info == f"b{DEFAULTS['llama_cpp_build_number']}-{REF[:8]}"


def test_second_deploy_downloads_nothing(github):
    ops = operations(pyinfra("--json", *github["args"]))
    assert {op["name"]: op["success"] for op in ops if op["success"]} == {}


def test_a_substituted_tarball_is_refused_and_nothing_changes(github):
    on(0, "rm -f /var/lib/llama-rpc/build/llama.cpp.tar.gz")  # a coordinator that must download again
    lab.mirror({github["path"]: github["substituted"]})
    before = snapshot()
    result = pyinfra(*github["args"])
    assert result.returncode == 1
    expected = sha256_file(github["good"])
    assert (
        f"the llama.cpp source from {github['url']} has sha256 {sha256_file(github['substituted'])}, "
        f"expected {expected}"
    ) in result.stdout + result.stderr
    assert snapshot() == before
    assert json.loads(LOCK.read_text())[github["url"]] == expected  # the record stands


def test_a_pin_that_disagrees_with_the_record_is_refused_before_connecting(github):
    record(LOCK, github["url"], sha256_file(github["good"]))  # as the first test left it
    result = pyinfra(*github["args"], "--data", "llama_cpp_sha256=" + "ab" * 32)
    assert result.returncode == 1 and "Connecting" not in result.stdout + result.stderr
    assert f"was recorded with sha256 {sha256_file(github['good'])} in {LOCK}" in result.stdout + result.stderr


def test_the_good_tarball_again_deploys_without_a_build(github):
    lab.mirror({github["path"]: github["good"]})
    ops = operations(pyinfra("--json", *github["args"]))
    assert changed(ops, "llama.cpp source: download") == [lab.ip_of(0)]
    assert changed(ops, "Build llama-rpc:") == [] and changed(ops, "Send ") == []
