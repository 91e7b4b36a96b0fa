"""llama-server's chat page (the web UI), built once on the control machine.

llama.cpp embeds the page's files into llama-server at build time. Its
`scripts/ui-assets.cmake` takes them, first of all, from a pre-built
`tools/ui/dist` in the source tree, whatever LLAMA_BUILD_UI and
LLAMA_USE_PREBUILT_UI say; only without one does it run npm (LLAMA_BUILD_UI=ON)
or download a release's assets from Hugging Face (LLAMA_USE_PREBUILT_UI=ON).
The coordinator's build has neither npm nor (in the lab) internet, so the
control machine builds `tools/ui` with npm here, once per version of its
sources, and the deploy packs the result into llama.cpp.tar.gz at
`tools/ui/dist`.

The build runs in a copy of tools/ui under the cache, never in the tree:
npm ci writes node_modules/ and the build writes icons into static/, which
would otherwise end up in the packed source.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .trees import files_below, find_tree

UI_DIR = Path("tools") / "ui"
DIST_IN_TREE = UI_DIR / "dist"  # where ui-assets.cmake looks for pre-built assets (SRC_DIST_DIR)
NPM_MISSING = "install nodejs and npm (apt-get install nodejs npm)"
KEY_FORMAT = "1"  # bump when the build below changes, so dists cached by an older version are built again
# Not sources: what npm and the build write, and editor or test leftovers.
NOT_SOURCES = {
    "node_modules",
    "dist",
    "build",
    ".svelte-kit",
    "dev-dist",
    "test-results",
    "storybook-static",
    ".vitest-attachments",
}
# Files the build writes into static/ (tools/ui/.gitignore's "PWA Artifacts").
GENERATED_STATIC = ("apple-splash-", "apple-touch-icon-", "maskable-icon-", "pwa-", "favicon")
LOCK_MARKER = "node_modules/.llama-rpc-lock.sha256"
NPM_TIMEOUT_S = 1800


class WebUIError(RuntimeError):
    """The chat page could not be built."""


def log(message: str) -> None:
    print(f"webui: {message}", file=sys.stderr, flush=True)


def ui_dir(tree: Path) -> Path:
    """tools/ui of a llama.cpp tree (or of an sdist holding one in vendor/llama.cpp)."""
    ui = find_tree(tree) / UI_DIR
    if not (ui / "package.json").is_file() or not (ui / "package-lock.json").is_file():
        raise WebUIError(
            f"{ui} has no package.json and package-lock.json: this llama.cpp tree has no web UI to build there"
        )
    return ui


def source_files(ui: Path) -> list[Path]:
    """The files of tools/ui that the build reads, sorted: everything but build outputs and node_modules."""
    static = ui / "static"
    return [
        path
        for path in files_below(ui, NOT_SOURCES)
        if not (path.parent == static and path.name.startswith(GENERATED_STATIC))
    ]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def cache_key(ui: Path, build_number: str | None = None) -> str:
    """Hash of the lock file, of every source's name, content and executable bit, and of the build number
    the page shows: the same sources, in any checkout and with any mtimes, give the same key."""
    digest = hashlib.sha256(f"webui {KEY_FORMAT}\nbuild {build_number or ''}\n".encode())
    digest.update(f"package-lock.json {_sha256(ui / 'package-lock.json')}\n".encode())
    for path in source_files(ui):
        executable = int(bool(path.stat().st_mode & 0o111))
        digest.update(f"{path.relative_to(ui).as_posix()}\0{executable}\0{_sha256(path)}\n".encode())
    return digest.hexdigest()[:16]


# The files scripts/ui-assets.cmake (ui_validate_assets) insists on; it fails the build without them.
REQUIRED = ("index.html", "manifest.webmanifest", "sw.js", "build.json", "version.json")
REQUIRED_PREFIXES = (("bundle", ".js"), ("bundle", ".css"), ("workbox", ".js"))


def missing_assets(dist: Path) -> list[str]:
    """Which of the files that ui-assets.cmake requires a dist folder lacks (empty: it is complete)."""
    names = {p.name for p in dist.rglob("*") if p.is_file()} if dist.is_dir() else set()
    missing = [name for name in REQUIRED if name not in names]
    missing += [
        f"{start}*{end}"
        for start, end in REQUIRED_PREFIXES
        if not any(n.startswith(start) and n.endswith(end) for n in names)
    ]
    return missing


def _run(command: list[str], cwd: Path, env: dict[str, str], what: str) -> None:
    started = time.monotonic()
    log(f"{what}: {' '.join(command)} (in {cwd})")
    try:
        result = subprocess.run(
            command,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=NPM_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as error:
        raise WebUIError(f"{what} took more than {NPM_TIMEOUT_S} s: {' '.join(command)} in {cwd}") from error
    if result.returncode != 0:
        tail = "\n".join(result.stdout.splitlines()[-30:])
        raise WebUIError(f"{what} failed (exit {result.returncode}): {' '.join(command)} in {cwd}\n{tail}")
    log(f"{what}: done in {time.monotonic() - started:.0f} s")


def _stage(ui: Path, work: Path) -> None:
    """Copy tools/ui's sources into work, keeping work's node_modules (npm ci is the slow part)."""
    work.mkdir(parents=True, exist_ok=True)
    for entry in work.iterdir():
        if entry.name == "node_modules":
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    for path in source_files(ui):
        target = work / path.relative_to(ui)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)


def ensure_dist(tree: Path, cache: Path, build_number: str | None = None) -> Path:
    """The built chat page for this tree's tools/ui: cache/ui-dist-KEY, built with npm the first time.

    A tree that already holds a complete tools/ui/dist (a release's pre-built page) is used as it is.
    build_number ("b1234") is what the page shows as llama-server's version (build.json).
    """
    ui = ui_dir(tree)
    if not missing_assets(ui / "dist"):
        log(f"using the pre-built page in {ui / 'dist'}")
        return ui / "dist"
    key = cache_key(ui, build_number)
    dist = cache / f"ui-dist-{key}"
    if not missing_assets(dist):
        log(f"chat page {key} already built: {dist}")
        return dist
    npm_path = shutil.which("npm")
    if not npm_path or not shutil.which("node"):
        raise WebUIError(f"building llama-server's chat page needs npm and node on this machine: {NPM_MISSING}")
    log(f"building the chat page {key} from {ui} (npm ci, then npm run build: a few minutes, once)")
    cache.mkdir(parents=True, exist_ok=True)
    work = cache / "ui-build"
    _stage(ui, work)
    env = {**os.environ, "npm_config_audit": "false", "npm_config_fund": "false", "npm_config_update_notifier": "false"}
    lock_hash = _sha256(work / "package-lock.json")
    marker = work / LOCK_MARKER
    if marker.is_file() and marker.read_text().strip() == lock_hash:
        log("npm ci: node_modules already matches package-lock.json")
    else:
        _run([npm_path, "ci"], work, env, "npm ci")
        marker.write_text(lock_hash + "\n")
    partial = cache / f"ui-dist-{key}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    build_env = {**env, "LLAMA_UI_OUT_DIR": str(partial.resolve())}
    if build_number:
        build_env["LLAMA_BUILD_NUMBER"] = build_number
    _run([npm_path, "run", "build"], work, build_env, "npm run build")
    missing = missing_assets(partial)
    if missing:
        raise WebUIError(f"npm run build finished but {partial} lacks {', '.join(missing)}")
    shutil.rmtree(dist, ignore_errors=True)
    partial.replace(dist)
    log(f"chat page {key} built: {dist}")
    return dist


def tar_members(tree: Path, dist: Path) -> list[tuple[Path, str]]:
    """(file, path inside the llama.cpp tree) for each file of dist, sorted, to pack at tools/ui/dist.

    Empty when dist already is the tree's own tools/ui/dist (packed with the rest of the tree).
    """
    tree = find_tree(tree)
    if dist.resolve() == (tree / DIST_IN_TREE).resolve():
        return []
    return [
        (path, (DIST_IN_TREE / path.relative_to(dist)).as_posix())
        for path in sorted(p for p in dist.rglob("*") if p.is_file())
    ]
