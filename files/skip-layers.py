#!/usr/bin/env python3
"""Leave out of an image transfer the layers the worker already has. On the coordinator:

    skip-layers.py which ID FILE    the diff IDs of ID's layers that the worker has, one a line
    docker save ID | skip-layers.py drop DIFF_ID... | zstd | ssh worker receive ...

Each line of FILE is one of the worker's images as its layers' diff IDs, bottom up, joined by commas
(a file, not arguments: a worker that kept many images would pass the kernel's limit). The worker has the bottom layers of ID that one of them shares with it (the whole chain up to a layer, not
the layer alone: a layer's identity in Docker's store includes the layers below it).

`drop` copies the image archive from stdin to stdout without those layers' tars. docker load does not
open the file of a layer it already has (the chain up to it is in its layer store:
image/tarexport/load.go), and the worker's receive-image.sh still tags the image only when exactly the
expected image ID came out of the load, so a layer the worker lacks makes the load fail rather than
give a different image. It reports what it left out on stderr.

Both archive layouts are handled: Docker 25 and later name each layer blobs/sha256/DIGEST (the diff
ID, nothing to compute); older ones name it ID/layer.tar, so each layer tar is hashed on its way
through (spooled to disk first, since the decision comes before its bytes are written).
"""
from __future__ import annotations  # (Python 3.8, Ubuntu 20.04's, has no list[str] at run time)

import hashlib
import json
import subprocess
import sys
import tarfile
import tempfile

CHUNK = 1 << 20


def drop(skip: set[str]) -> None:
    dropped, dropped_bytes = 0, 0
    with tarfile.open(fileobj=sys.stdin.buffer, mode="r|") as archive, \
            tarfile.open(fileobj=sys.stdout.buffer, mode="w|", format=tarfile.PAX_FORMAT) as out:
        for member in archive:
            data = archive.extractfile(member) if member.isfile() else None
            if data is None:
                out.addfile(member)
            elif member.name.startswith("blobs/sha256/"):
                if "sha256:" + member.name.rsplit("/", 1)[1] in skip:
                    dropped, dropped_bytes = dropped + 1, dropped_bytes + member.size
                    continue
                out.addfile(member, data)
            elif member.name.endswith("/layer.tar"):
                with tempfile.TemporaryFile() as spool:
                    digest = hashlib.sha256()
                    while chunk := data.read(CHUNK):
                        digest.update(chunk)
                        spool.write(chunk)
                    if "sha256:" + digest.hexdigest() in skip:
                        dropped, dropped_bytes = dropped + 1, dropped_bytes + member.size
                        continue
                    spool.seek(0)
                    out.addfile(member, spool)
            else:
                out.addfile(member, data)
    print(f"skip-layers: left out {dropped} layers the receiver has ({dropped_bytes} bytes)", file=sys.stderr)


def layers_to_skip(mine: list[str], have: list[list[str]]) -> set[str]:
    """The diff IDs of the longest bottom run of `mine` that one image of `have` starts with, less any
    that `mine` needs again above it (so that a file a kept layer needs is never left out)."""
    shared = max((next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
                  for theirs in have), default=0)
    return set(mine[:shared]) - set(mine[shared:])


def which(image: str, have: list[list[str]]) -> None:
    mine = json.loads(subprocess.run(["docker", "image", "inspect", "--format", "{{json .RootFS.Layers}}", image],
                                     capture_output=True, text=True, check=True).stdout)
    print("\n".join(sorted(layers_to_skip(mine, have))))


if __name__ == "__main__":
    if sys.argv[1:2] == ["which"] and len(sys.argv) == 4:
        with open(sys.argv[3]) as lines:
            which(sys.argv[2], [line.strip().split(",") for line in lines if line.strip()])
    elif sys.argv[1:2] == ["drop"]:
        drop(set(sys.argv[2:]))
    else:
        sys.exit("usage: skip-layers.py which IMAGE FILE | skip-layers.py drop [DIFF_ID...] < archive > archive")
