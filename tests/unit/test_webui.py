"""The chat page build (llama_rpc_deploy/webui.py) without npm: cache key, cache reuse, errors, packing."""

import os
import shutil
import stat

import pytest

from llama_rpc_deploy import webui
from llama_rpc_deploy.webui import NPM_MISSING, WebUIError, cache_key, ensure_dist, missing_assets, tar_members

COMPLETE_DIST = (
    "index.html",
    "manifest.webmanifest",
    "sw.js",
    "build.json",
    "_app/version.json",
    "bundle.abc.js",
    "bundle.abc.css",
    "workbox-1234.js",
)


def make_tree(root):
    """A llama.cpp tree as find_tree knows it, with a small tools/ui."""
    for rel, text in {
        "ggml/CMakeLists.txt": "",
        "tools/rpc/CMakeLists.txt": "",
        "tools/ui/package.json": '{"name": "llama-ui"}',
        "tools/ui/package-lock.json": '{"lockfileVersion": 3}',
        "tools/ui/src/app.html": "<html></html>",
        "tools/ui/static/robots.txt": "ok",
    }.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def write_dist(folder, names=COMPLETE_DIST):
    for name in names:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(name)
    return folder


def ui(tree):
    return tree / "tools" / "ui"


def test_same_sources_in_another_checkout_give_the_same_key(tmp_path):
    one, other = make_tree(tmp_path / "one"), make_tree(tmp_path / "other")
    os.utime(ui(other) / "src" / "app.html", (1, 1))
    assert cache_key(ui(one)) == cache_key(ui(other))
    assert len(cache_key(ui(one))) == 16


@pytest.mark.parametrize("rel", ["package-lock.json", "src/app.html", "static/robots.txt", "src/new.ts"])
def test_a_changed_or_added_source_changes_the_key(tmp_path, rel):
    tree = make_tree(tmp_path / "t")
    before = cache_key(ui(tree))
    (ui(tree) / rel).write_text("changed")
    assert cache_key(ui(tree)) != before


def test_the_build_number_the_page_shows_changes_the_key(tmp_path):
    tree = make_tree(tmp_path / "t")
    assert len({cache_key(ui(tree)), cache_key(ui(tree), "b1"), cache_key(ui(tree), "b2")}) == 3


def test_an_executable_bit_changes_the_key(tmp_path):
    tree = make_tree(tmp_path / "t")
    before = cache_key(ui(tree))
    path = ui(tree) / "src" / "app.html"
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    assert cache_key(ui(tree)) != before


def test_build_outputs_and_node_modules_do_not_change_the_key(tmp_path):
    tree = make_tree(tmp_path / "t")
    before = cache_key(ui(tree))
    for rel in (
        "node_modules/vite/index.js",
        "dist/index.html",
        ".svelte-kit/x.js",
        "static/pwa-64x64.png",
        "static/favicon.ico",
    ):
        path = ui(tree) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("output")
    assert cache_key(ui(tree)) == before


def test_sdist_layout_is_found(tmp_path):
    make_tree(tmp_path / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp")
    assert webui.ui_dir(tmp_path / "llama_cpp_python-0.3.36").name == "ui"


def test_a_tree_without_tools_ui_is_refused(tmp_path):
    tree = make_tree(tmp_path / "t")
    shutil.rmtree(ui(tree))
    with pytest.raises(WebUIError, match="no web UI"):
        ensure_dist(tree, tmp_path / "cache")


def test_without_npm_the_error_says_what_to_install(tmp_path, monkeypatch):
    tree = make_tree(tmp_path / "t")
    monkeypatch.setattr(webui.shutil, "which", lambda name: None)
    with pytest.raises(WebUIError) as error:
        ensure_dist(tree, tmp_path / "cache")
    assert NPM_MISSING in str(error.value) and "apt-get install nodejs npm" in str(error.value)


def test_a_built_page_is_reused_without_npm(tmp_path, monkeypatch):
    tree, cache = make_tree(tmp_path / "t"), tmp_path / "cache"
    built = write_dist(cache / f"ui-dist-{cache_key(ui(tree))}")
    monkeypatch.setattr(webui.shutil, "which", lambda name: None)
    assert ensure_dist(tree, cache) == built


def test_an_incomplete_cached_page_is_built_again(tmp_path, monkeypatch):
    tree, cache = make_tree(tmp_path / "t"), tmp_path / "cache"
    write_dist(cache / f"ui-dist-{cache_key(ui(tree))}", names=("index.html",))
    monkeypatch.setattr(webui.shutil, "which", lambda name: None)
    with pytest.raises(WebUIError, match="npm"):
        ensure_dist(tree, cache)


def test_a_pre_built_page_in_the_tree_is_used_as_it_is_and_packed_with_the_tree(tmp_path, monkeypatch):
    tree = make_tree(tmp_path / "t")
    write_dist(ui(tree) / "dist")
    monkeypatch.setattr(webui.shutil, "which", lambda name: None)
    dist = ensure_dist(tree, tmp_path / "cache")
    assert dist == ui(tree) / "dist"
    assert tar_members(tree, dist) == []


def test_missing_assets_names_what_ui_assets_cmake_requires(tmp_path):
    assert missing_assets(write_dist(tmp_path / "full")) == []
    assert missing_assets(write_dist(tmp_path / "part", names=("index.html", "bundle.x.js"))) == [
        "manifest.webmanifest",
        "sw.js",
        "build.json",
        "version.json",
        "bundle*.css",
        "workbox*.js",
    ]
    assert "index.html" in missing_assets(tmp_path / "absent")


def test_tar_members_put_the_page_at_tools_ui_dist_in_order(tmp_path):
    tree = make_tree(tmp_path / "t")
    dist = write_dist(tmp_path / "cache" / "ui-dist-k")
    members = tar_members(tree, dist)
    assert [arcname for _, arcname in members] == sorted(f"tools/ui/dist/{n}" for n in COMPLETE_DIST)
    assert all(path.read_text() == arcname.removeprefix("tools/ui/dist/") for path, arcname in members)


FAKE_NPM = """#!/bin/sh
# stands in for npm: counts its runs, writes node_modules on ci and a complete page on run build
echo "$*" >> "$NPM_LOG"
case "$1" in
  ci) mkdir -p node_modules && echo lib > node_modules/lib.js ;;
  run) test -f node_modules/lib.js || exit 3
       mkdir -p "$LLAMA_UI_OUT_DIR/_app" static && echo icon > static/pwa-64x64.png
       for f in index.html manifest.webmanifest sw.js build.json _app/version.json bundle.1.js bundle.1.css \\
                workbox-1.js; do echo "$LLAMA_BUILD_NUMBER" > "$LLAMA_UI_OUT_DIR/$f"; done ;;
esac
"""


@pytest.fixture
def fake_npm(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("npm", FAKE_NPM), ("node", "#!/bin/sh\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "npm.log"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("NPM_LOG", str(log))
    return lambda: log.read_text().splitlines() if log.exists() else []


def test_build_runs_in_a_copy_once_per_version_and_keeps_node_modules(tmp_path, fake_npm):
    tree, cache = make_tree(tmp_path / "t"), tmp_path / "cache"
    before = sorted(p.relative_to(tree) for p in tree.rglob("*"))
    dist = ensure_dist(tree, cache, build_number="b1234")
    assert dist == cache / f"ui-dist-{cache_key(ui(tree), 'b1234')}" and missing_assets(dist) == []
    assert (dist / "build.json").read_text().strip() == "b1234"
    assert fake_npm() == ["ci", "run build"]
    assert sorted(p.relative_to(tree) for p in tree.rglob("*")) == before  # nothing written into the tree
    assert ensure_dist(tree, cache, build_number="b1234") == dist and fake_npm() == ["ci", "run build"]  # cached
    (ui(tree) / "src" / "app.html").write_text("<html>changed</html>")
    second = ensure_dist(tree, cache, build_number="b1234")
    assert second != dist and fake_npm() == ["ci", "run build", "run build"]  # same lock: no second npm ci
    assert (cache / "ui-build" / "src" / "app.html").read_text() == "<html>changed</html>"
    assert not list(cache.glob("*.partial"))


def test_a_failed_build_says_so_and_caches_nothing(tmp_path, fake_npm, monkeypatch):
    tree, cache = make_tree(tmp_path / "t"), tmp_path / "cache"
    bad = tmp_path / "bin" / "npm"
    bad.write_text('#!/bin/sh\necho "$*" >> "$NPM_LOG"\necho "npm ERR! boom"\nexit 1\n')
    with pytest.raises(WebUIError, match=r"npm ci failed \(exit 1\)[\s\S]*npm ERR! boom"):
        ensure_dist(tree, cache)
    assert not list(cache.glob("ui-dist-*"))
