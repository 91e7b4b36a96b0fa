"""The llama.cpp source that the coordinator builds from.

Either a pinned ref, fetched by the coordinator as a GitHub tarball, or a local
tree or tarball on the control machine, uploaded by the deploy (offline use).
A local tree is packed into a reproducible tarball (sorted names, fixed owner
and times), so the same tree always gives the same bytes, the same checksum
and therefore the same image tag, and an unchanged tree uploads nothing.
"""
from __future__ import annotations

import gzip
import hashlib
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path

# Parts of a llama.cpp tree that a build of llama-server and rpc-server never reads.
EXCLUDED_TOP_LEVEL = {
    ".git", ".github", ".devops", "models", "docs", "media", "tests", "examples",
    "pocs", "benches", "gguf-py", "conversion", "requirements", "ci", "skills",
}
TARBALL_SUFFIXES = (".tar.gz", ".tgz")
GITHUB_TARBALL = "https://github.com/ggml-org/llama.cpp/archive/{ref}.tar.gz"


@dataclass(frozen=True)
class Source:
    """What the deploy puts (or fetches) on the coordinator as llama.cpp.tar.gz."""

    ident: str  # goes into the image tag: the tarball's sha256, or the pinned ref
    local_tarball: Path | None  # uploaded from the control machine, or
    url: str | None  # fetched by the coordinator


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def find_tree(root: Path) -> Path:
    """The folder holding ggml/ and src/: root itself or, for an sdist, vendor/llama.cpp."""
    for candidate in (root, root / "vendor" / "llama.cpp"):
        if (candidate / "ggml" / "CMakeLists.txt").is_file() and (candidate / "tools").is_dir():
            return candidate
    raise FileNotFoundError(f"{root} is not a llama.cpp tree (no ggml/CMakeLists.txt and tools/ in it or in vendor/llama.cpp)")


def _tree_files(tree: Path) -> list[Path]:
    files = []
    for dirpath, dirnames, filenames in os.walk(tree):
        rel = Path(dirpath).relative_to(tree)
        if rel == Path("."):
            dirnames[:] = [d for d in dirnames if d not in EXCLUDED_TOP_LEVEL]
        dirnames.sort()
        files.extend(Path(dirpath, name) for name in sorted(filenames))
    return files


PACK_FORMAT = "2"  # bump when pack_tree's output changes, so packs cached by an older version are made again


def _tree_key(tree: Path, files: list[Path]) -> str:
    digest = hashlib.sha256(f"{PACK_FORMAT}\0{tree.resolve()}".encode())
    for path in files:
        st = path.lstat()
        digest.update(f"{path.relative_to(tree)}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_mode}\n".encode())
    return digest.hexdigest()[:16]


def pack_tree(tree: Path, cache_dir: Path) -> Path:
    """Pack a llama.cpp tree into cache_dir/llama.cpp-KEY.tar.gz; reuse it while the tree is unchanged."""
    tree = find_tree(tree)
    files = _tree_files(tree)
    out = cache_dir / f"llama.cpp-{_tree_key(tree, files)}.tar.gz"
    if out.is_file():
        return out
    cache_dir.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")

    def reset(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = 0
        info.mode = 0o755 if info.mode & 0o111 or info.isdir() else 0o644
        return info

    # no name and no time in the gzip header: the same tree gives the same bytes in any checkout
    with open(partial, "wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", compresslevel=6, mtime=0) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for path in files:
                tar.add(path, arcname=f"llama.cpp/{path.relative_to(tree)}", recursive=False, filter=reset)
    partial.replace(out)
    return out


def resolve_source(setting: str | None, ref: str, cache_dir: Path) -> Source:
    """Turn the llama_cpp_source / llama_cpp_ref settings into a Source."""
    if not setting:
        return Source(ident=ref, local_tarball=None, url=GITHUB_TARBALL.format(ref=ref))
    path = Path(setting).expanduser()
    if path.is_dir():
        tarball = pack_tree(path, cache_dir)
    elif path.is_file() and path.name.endswith(TARBALL_SUFFIXES):
        tarball = path
    else:
        raise FileNotFoundError(f"{setting} is neither a llama.cpp tree nor a .tar.gz of one")
    return Source(ident=sha256_file(tarball), local_tarball=tarball, url=None)
