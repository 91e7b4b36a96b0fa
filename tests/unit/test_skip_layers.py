"""files/skip-layers.py: the image archive without the layers the worker has (the lab test loads the
result into a real dockerd: tests/e2e/test_lab.py)."""

import hashlib
import importlib.util
import io
import json
import os
import subprocess
import sys
import tarfile

import pytest

from llama_rpc_deploy import roles, transfer
from llama_rpc_deploy.image import FILES

SCRIPT = FILES / roles.SKIP_LAYERS
spec = importlib.util.spec_from_file_location("skip_layers", SCRIPT)
skip_layers = importlib.util.module_from_spec(spec)
spec.loader.exec_module(skip_layers)

A, B, C, D = (f"sha256:{c * 64}" for c in "abcd")


@pytest.mark.parametrize(
    "mine, have, skipped",
    [
        ([A, B, C], [], set()),  # the worker has no image: everything goes
        ([A, B, C], [[A, B]], {A, B}),  # the previous version: base layers stay behind
        ([A, B, C], [[A, D], [A, B, D]], {A, B}),  # the longest shared bottom run of any image
        ([A, B, C], [[B, C]], set()),  # the same layers on another base are other layers
        ([A, B, C], [[A, B, C]], {A, B, C}),
        ([A, B, A], [[A, B]], {B}),  # A is needed again above: its file must go
    ],
)
def test_only_a_shared_bottom_run_is_left_out(mine, have, skipped):
    assert skip_layers.layers_to_skip(mine, have) == skipped


def archive(layout: str, layers: list[bytes]) -> bytes:
    """A docker save archive of either layout, with these layer tars (and a manifest naming them)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:

        def add(name, data):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

        names = []
        for i, data in enumerate(layers):
            digest = hashlib.sha256(data).hexdigest()
            if layout == "oci":
                names.append(f"blobs/sha256/{digest}")
            else:
                names.append(f"{i:064x}/layer.tar")
                add(f"{i:064x}/VERSION", b"1.0")
                add(f"{i:064x}/json", json.dumps({"id": f"{i:064x}"}).encode())
            add(names[-1], data)
        add("manifest.json", json.dumps([{"Config": "config.json", "Layers": names}]).encode())
    return buffer.getvalue()


def entries(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


@pytest.mark.parametrize("layout", ["legacy", "oci"])
def test_the_archive_keeps_everything_but_the_layers_the_worker_has(tmp_path, layout):
    layers = [os.urandom(3000) + b"base", os.urandom(100) + b"middle", os.urandom(5000) + b"top"]
    ids = [f"sha256:{hashlib.sha256(d).hexdigest()}" for d in layers]
    docker = tmp_path / "docker"  # what `docker image inspect --format {{json .RootFS.Layers}}` prints
    docker.write_text(f"#!/bin/sh\necho '{json.dumps(ids)}'\n")
    docker.chmod(0o755)
    source = archive(layout, layers)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    have = tmp_path / "layers"
    have.write_text(transfer.layers_text([tuple(ids[:2] + [A]), (ids[0],)]))
    which = subprocess.run(
        [sys.executable, str(SCRIPT), "which", "sha256:image", str(have)], capture_output=True, text=True, env=env
    )
    assert which.returncode == 0 and sorted(which.stdout.split()) == sorted(ids[:2])
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "drop", *which.stdout.split()], input=source, capture_output=True
    )
    assert result.returncode == 0, result.stderr
    before, after = entries(source), entries(result.stdout)
    gone = {name for name, data in before.items() if data in layers[:2]}
    assert len(gone) == 2 and set(after) == set(before) - gone
    assert all(after[name] == before[name] for name in after)  # the rest byte for byte
    assert b"left out 2 layers" in result.stderr


def test_the_filter_sits_in_the_pipeline_only_when_the_worker_has_images():
    plain = transfer.send_command("llama-rpc:tag", "10.0.0.2")
    assert "skip-layers" not in plain and 'docker save "$id" | zstd' in plain
    assert transfer.send_command("llama-rpc:tag", "10.0.0.2", skip_layers="/opt/llama-rpc/skip-layers.py") == plain
    filtered = transfer.send_command(
        "llama-rpc:tag",
        "10.0.0.2",
        layers_file="/var/lib/llama-rpc/layers-of-w 1",
        skip_layers="/opt/llama-rpc/skip-layers.py",
    )
    assert (
        "{ skip=$(python3 /opt/llama-rpc/skip-layers.py which \"$id\" '/var/lib/llama-rpc/layers-of-w 1') || skip=; }"
        in filtered
    )
    assert (
        'docker save "$id" | python3 /opt/llama-rpc/skip-layers.py drop $skip; else docker save "$id"; fi; } | zstd'
        in filtered
    )


def test_many_images_fit_in_the_file_not_on_the_command_line():
    have = [tuple(f"sha256:{i:02x}{j:062x}" for j in range(15)) for i in range(200)]
    text = transfer.layers_text(have)
    assert len(text) > 200_000 and text.count("\n") == 200  # 200 images of 15 layers: past one argument's 128 KiB
    assert len(transfer.send_command("llama-rpc:tag", "10.0.0.2", layers_file="/f", skip_layers="/s")) < 1000


@pytest.mark.parametrize(
    "which, sent",
    [
        ("echo $SKIP", f"DROPPED {A}"),  # layers to leave out
        ("echo", "ARCHIVE"),  # none: the plain stream
        ("exit 1", "ARCHIVE"),
    ],
)  # no usable python3: the plain stream
def test_the_pipeline_runs_under_bash(tmp_path, which, sent):
    """The filtered command, with docker, python3, zstd and ssh standing in."""
    for name, body in {
        "docker": 'case "$1" in image) echo sha256:ID;; save) echo ARCHIVE;; esac',
        "python3": f'if [ "$2" = which ]; then {which}; else echo "DROPPED ${{*:3}}"; cat >/dev/null; fi',
        "zstd": "cat",
        "ssh": 'cat > "$OUT"; echo "${@: -1}" >> "$OUT"',
    }.items():
        (tmp_path / name).write_text(f"#!/bin/bash\n{body}\n")
        (tmp_path / name).chmod(0o755)
    command = transfer.send_command("llama-rpc:tag", "10.0.0.2", layers_file="/f", skip_layers="/opt/f.py")
    out = tmp_path / "sent"
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "SKIP": A, "OUT": str(out)}
    assert subprocess.run(["bash", "-c", command], env=env).returncode == 0
    assert out.read_text().splitlines() == [sent, "receive sha256:ID llama-rpc:tag"]


def test_a_failing_stream_fails_the_command(tmp_path):
    """docker save dying halfway must not look like a sent image (pipefail)."""
    for name, body in {
        "docker": 'case "$1" in image) echo sha256:ID;; save) echo PART; exit 1;; esac',
        "python3": "echo",
        "zstd": "cat",
        "ssh": "cat > /dev/null",
    }.items():
        (tmp_path / name).write_text(f"#!/bin/bash\n{body}\n")
        (tmp_path / name).chmod(0o755)
    command = transfer.send_command("llama-rpc:tag", "10.0.0.2", layers_file="/f", skip_layers="/opt/f.py")
    assert subprocess.run(["bash", "-c", command], env={"PATH": f"{tmp_path}:/usr/bin:/bin"}).returncode != 0
