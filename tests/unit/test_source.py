import tarfile

import subprocess

import pytest

from llama_rpc_deploy.settings import DEFAULTS, SettingsError
from llama_rpc_deploy.source import fetch_command, pack_tree, record, recorded, resolve_source, sha256_file


def make_tree(root):
    for rel in ("ggml/CMakeLists.txt", "tools/rpc/CMakeLists.txt", "CMakeLists.txt", "models/big.gguf", ".git/HEAD"):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(rel)
    return root


def test_pack_is_reproducible_and_leaves_out_what_no_build_reads(tmp_path):
    tree = make_tree(tmp_path / "llama.cpp")
    first = pack_tree(tree, tmp_path / "a")
    second = pack_tree(tree, tmp_path / "b")
    assert sha256_file(first) == sha256_file(second)
    with tarfile.open(first) as tar:
        names = tar.getnames()
        assert "llama.cpp/ggml/CMakeLists.txt" in names
        assert not any(n.startswith(("llama.cpp/models", "llama.cpp/.git")) for n in names)
        assert {m.uid for m in tar.getmembers()} == {0} and {m.mtime for m in tar.getmembers()} == {0}


def test_same_content_in_another_checkout_gives_the_same_bytes(tmp_path):
    """Another clone (other path, other mtimes) packs the same tree: the same tarball, so the same image tag
    (the gzip header once carried the cache file's name, and every fresh clone rebuilt the image)."""
    import os

    one, other = make_tree(tmp_path / "one" / "llama.cpp"), make_tree(tmp_path / "other" / "llama.cpp")
    os.utime(other / "CMakeLists.txt", (1, 1))
    a, b = pack_tree(one, tmp_path / "a"), pack_tree(other, tmp_path / "b")
    assert a.name != b.name and sha256_file(a) == sha256_file(b)


def test_changed_tree_gives_a_new_tarball(tmp_path):
    tree = make_tree(tmp_path / "t")
    first = sha256_file(pack_tree(tree, tmp_path / "c"))
    (tree / "ggml" / "CMakeLists.txt").write_text("changed")
    assert sha256_file(pack_tree(tree, tmp_path / "c")) != first


def test_sdist_layout_is_found(tmp_path):
    make_tree(tmp_path / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp")
    source = resolve_source(str(tmp_path / "llama_cpp_python-0.3.36"), "ref", tmp_path / "cache")
    assert source.local_tarball and source.url is None and len(source.ident) == 64


REF = DEFAULTS["llama_cpp_ref"]
URL = DEFAULTS["llama_cpp_url"]


def test_pinned_commit_is_fetched_by_the_coordinator_from_github_or_a_mirror(tmp_path):
    source = resolve_source(None, REF, tmp_path, URL)
    assert source.url == f"https://github.com/ggml-org/llama.cpp/archive/{REF}.tar.gz" and source.ident == REF
    assert source.sha256 is None  # nothing pinned or recorded: the first download is recorded
    mirror = resolve_source(None, REF, tmp_path, "http://mirror.lan/llama.cpp/{ref}.tgz")
    assert mirror.url == f"http://mirror.lan/llama.cpp/{REF}.tgz"


def test_the_first_download_is_recorded_and_a_pin_must_agree(tmp_path):
    lock = tmp_path / "sources.lock"
    record(lock, "http://m/a.tar.gz", "a" * 64)
    record(lock, "http://m/b.tar.gz", "b" * 64)
    assert recorded(lock) == {"http://m/a.tar.gz": "a" * 64, "http://m/b.tar.gz": "b" * 64}
    assert resolve_source(None, "r", tmp_path, "http://m/a.tar.gz", lock=lock).sha256 == "a" * 64
    assert resolve_source(None, "r", tmp_path, "http://m/a.tar.gz", pinned="a" * 64, lock=lock).sha256 == "a" * 64
    with pytest.raises(SettingsError, match="llama_cpp_sha256 = 'cccc.*was recorded with sha256 aaaa"):
        resolve_source(None, "r", tmp_path, "http://m/a.tar.gz", pinned="c" * 64, lock=lock)


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    """A local HTTP server with a good tarball, a corrupted copy and a different one, like a mirror gone bad."""
    import functools
    import http.server
    import threading

    root = tmp_path_factory.mktemp("mirror")
    tree = root / "tree"
    make_tree(tree)
    good = pack_tree(tree, root / "packs")
    (root / "good.tar.gz").write_bytes(good.read_bytes())
    (root / "corrupted.tar.gz").write_bytes(good.read_bytes()[:-100] + bytes(100))
    (tree / "ggml" / "CMakeLists.txt").write_text("something else")
    (root / "substituted.tar.gz").write_bytes(pack_tree(tree, root / "packs").read_bytes())
    (root / "not-gzip.tar.gz").write_text("<html>rate limited</html>")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.RequestHandlerClass.log_message = lambda *a: None
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", sha256_file(root / "good.tar.gz")
    server.shutdown()


def fetch(tmp_path, url, sha256):
    dest = tmp_path / "build" / "llama.cpp.tar.gz"
    dest.parent.mkdir(exist_ok=True)
    return subprocess.run(["bash", "-c", fetch_command(url, str(dest), sha256)], capture_output=True, text=True), dest


def test_the_download_is_kept_only_with_the_expected_sha256(tmp_path, mirror):
    base, good = mirror
    result, dest = fetch(tmp_path, f"{base}/good.tar.gz", good)
    assert result.returncode == 0 and sha256_file(dest) == good
    result, dest = fetch(tmp_path, f"{base}/good.tar.gz", None)  # nothing known yet: any gzip tarball
    assert result.returncode == 0 and sha256_file(dest) == good


@pytest.mark.parametrize(
    "name,words",
    [
        ("corrupted.tar.gz", "has sha256 {other}, expected {good} (llama_cpp_sha256, or the one recorded"),
        ("substituted.tar.gz", "has sha256 {other}, expected {good} (llama_cpp_sha256, or the one recorded"),
        ("missing.tar.gz", "cannot download the llama.cpp source from {url}: check llama_cpp_url"),
    ],
)
def test_a_corrupted_or_substituted_download_is_refused_and_the_last_good_one_stays(tmp_path, mirror, name, words):
    base, good = mirror
    fetch(tmp_path, f"{base}/good.tar.gz", good)
    result, dest = fetch(tmp_path, f"{base}/{name}", good)
    other = subprocess.run(
        ["bash", "-c", f"curl -fsS {base}/{name} | sha256sum | cut -d' ' -f1"], capture_output=True, text=True
    ).stdout.strip()
    assert result.returncode == 1
    assert words.format(other=other, good=good, url=f"{base}/{name}") in result.stderr
    assert sha256_file(dest) == good and not list(dest.parent.glob("*.partial"))


def test_a_download_that_is_not_a_tarball_is_refused_even_on_first_use(tmp_path, mirror):
    base, _ = mirror
    result, dest = fetch(tmp_path, f"{base}/not-gzip.tar.gz", None)
    assert result.returncode == 1 and "is not a gzip tarball: refused" in result.stderr and not dest.exists()


def test_not_a_tree(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a llama.cpp tree"):
        resolve_source(str(tmp_path), "ref", tmp_path / "cache")
