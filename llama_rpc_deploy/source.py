"""The llama.cpp source that the coordinator builds from.

Either a pinned commit, downloaded by the coordinator from GitHub (or a mirror) the way a package
manager fetches a source: the tarball's sha256 must match the pinned one (llama_cpp_sha256) or, if
none is pinned, the one recorded on the first download (.state/sources.lock on the control machine);
or a local tree or tarball on the control machine, uploaded by the deploy (offline use).
A local tree is packed into a reproducible tarball (sorted names, fixed owner
and times), so the same tree always gives the same bytes, the same checksum
and therefore the same image tag, and an unchanged tree uploads nothing.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from .quoting import shell
import tarfile
from dataclasses import dataclass
from pathlib import Path

from . import webui
from .settings import SettingsError
from .trees import files_below, find_tree

# Parts of a llama.cpp tree that a build of llama-server and rpc-server never reads.
EXCLUDED_TOP_LEVEL = {
    ".git",
    ".github",
    ".devops",
    "models",
    "docs",
    "media",
    "tests",
    "examples",
    "pocs",
    "benches",
    "gguf-py",
    "conversion",
    "requirements",
    "ci",
    "skills",
}
TARBALL_SUFFIXES = (".tar.gz", ".tgz")


@dataclass(frozen=True)
class Source:
    """What the deploy puts (or fetches) on the coordinator as llama.cpp.tar.gz."""

    ident: str  # goes into the image tag: the tarball's sha256, or the pinned ref
    local_tarball: Path | None  # uploaded from the control machine, or
    url: str | None  # fetched by the coordinator
    sha256: str | None = None  # what the download must hash to (pinned or recorded); None: record it
    lock: Path | None = None  # where the first download's sha256 is recorded (url -> sha256)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


PACK_FORMAT = "3"  # bump when pack_tree's output changes, so packs cached by an older version are made again


def _tree_key(tree: Path, files: list[tuple[Path, str]]) -> str:
    digest = hashlib.sha256(f"{PACK_FORMAT}\0{tree.resolve()}".encode())
    for path, rel in files:
        st = path.lstat()
        digest.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_mode}\n".encode())
    return digest.hexdigest()[:16]


def pack_tree(tree: Path, cache_dir: Path, top: str = "llama.cpp", extra: list[tuple[Path, str]] = ()) -> Path:
    """Pack a llama.cpp tree into cache_dir/llama.cpp-KEY.tar.gz, under the folder `top` (GitHub's archives
    use llama.cpp-COMMIT), with the extra (file, path in the tree) pairs (the built chat page); reuse it
    while none of that changed."""
    tree = find_tree(tree)
    files = [(path, path.relative_to(tree).as_posix()) for path in files_below(tree, EXCLUDED_TOP_LEVEL)] + list(extra)
    out = cache_dir / f"{top}-{_tree_key(tree, files)}.tar.gz"
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
            for path, rel in files:
                tar.add(path, arcname=f"{top}/{rel}", recursive=False, filter=reset)
    partial.replace(out)
    return out


def recorded(lock: Path) -> dict[str, str]:
    """url -> sha256 of the tarballs downloaded before."""
    return json.loads(lock.read_text()) if lock.is_file() else {}


def record(lock: Path, url: str, sha256: str) -> None:
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text(json.dumps({**recorded(lock), url: sha256}, indent=1, sort_keys=True) + "\n")


def resolve_source(
    setting: str | None,
    ref: str,
    cache_dir: Path,
    url_template: str = "",
    pinned: str | None = None,
    lock: Path | None = None,
    chat_page: str | None = None,
) -> Source:
    """Turn the llama_cpp_source / llama_cpp_ref / llama_cpp_url / llama_cpp_sha256 settings into a Source.
    With chat_page (the version it shows, "b11312"), a local tree is packed with llama-server's chat page,
    built here once with npm (webui.py): the coordinator's build then embeds it without network."""
    if not setting:
        url = url_template.format(ref=ref)
        known = recorded(lock).get(url) if lock else None
        if pinned and known and pinned != known:
            raise SettingsError(
                f"llama_cpp_sha256 = {pinned!r}, but {url} was recorded with sha256 {known} in "
                f"{lock}: expected one of them (remove the line from {lock} if the pin is right)"
            )
        return Source(ident=ref, local_tarball=None, url=url, sha256=pinned or known, lock=lock)
    path = Path(setting).expanduser()
    if path.is_dir():
        extra = (
            webui.tar_members(path, webui.ensure_dist(find_tree(path), cache_dir / "ui", chat_page))
            if chat_page
            else []
        )
        tarball = pack_tree(path, cache_dir, extra=extra)
    elif path.is_file() and path.name.endswith(TARBALL_SUFFIXES):
        tarball = path
    else:
        raise FileNotFoundError(f"{setting} is neither a llama.cpp tree nor a .tar.gz of one")
    return Source(ident=sha256_file(tarball), local_tarball=tarball, url=None)


def fetch_command(url: str, dest: str, sha256: str | None) -> str:
    """A bash command for the coordinator: download url into dest, but only a tarball whose sha256 is the
    expected one (any, when none is known yet) and that gzip can read; anything else is deleted and
    refused with the reason, and dest (the last good tarball) stays as it was."""
    check = (
        [
            f"want={shell(sha256 or '')}",
            'have=$(sha256sum "$tmp" | cut -d" " -f1)',
            'if [ "$have" != "$want" ]; then',
            '  refuse "the llama.cpp source from $url has sha256 $have, expected $want (llama_cpp_sha256, or the one '
            "recorded on its first download): refused, nothing was built or changed. A substituted or corrupted "
            'download? If the new tarball is right, pin its sha256 in llama_cpp_sha256."',
            "fi",
        ]
        if sha256
        else []
    )
    return "\n".join(
        [
            "set -o pipefail",
            f"url={shell(url)} tmp={shell(dest + '.partial')}",
            'refuse() { rm -f "$tmp"; printf \'%s\\n\' "$1" >&2; exit 1; }',
            'curl -fsSL --retry 3 --connect-timeout 20 -o "$tmp" "$url" || '
            'refuse "cannot download the llama.cpp source from $url: check llama_cpp_url"',
            *check,
            'gzip -t "$tmp" 2>/dev/null || refuse "the llama.cpp source from $url is not a gzip tarball: refused"',
            f'mv "$tmp" {shell(dest)}',
        ]
    )
