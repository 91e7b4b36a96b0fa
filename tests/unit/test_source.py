import tarfile

import pytest

from llama_rpc_deploy.source import GITHUB_TARBALL, pack_tree, resolve_source, sha256_file


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


def test_pinned_ref_is_fetched_by_the_coordinator(tmp_path):
    source = resolve_source(None, "0c1e57098", tmp_path)
    assert source.url == GITHUB_TARBALL.format(ref="0c1e57098") and source.ident == "0c1e57098"


def test_not_a_tree(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a llama.cpp tree"):
        resolve_source(str(tmp_path), "ref", tmp_path / "cache")
