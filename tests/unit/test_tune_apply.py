"""`tune --apply` writes the best split into group_data: into the file each setting came from (writeback.target_file),
changing only those settings' lines and the '# llama-rpc tune:' comment above them (writeback.write_settings); the
file then reads back, with the project's own reader and through pyinfra's, as the new values."""

import os
import shutil
from pathlib import Path

import pytest

from llama_rpc_deploy.loading import offline_cluster
from llama_rpc_deploy.paths import PROJECT
from llama_rpc_deploy.settings import SettingsError
from llama_rpc_deploy.tune.writeback import ApplyError, target_file, write_settings
from llama_rpc_deploy.userdata import group_vars

from llama_rpc_deploy.tune import KEYS  # what tune writes

SPLIT = {"llama_tensor_split": [3, 4, 2], "llama_n_gpu_layers": 7}
COMMENT = "2025-06-01, generation tokens/s 1.080x the split [3, 3, 3]"
INVENTORY = """coordinator = [("10.0.0.10", {"image_backend": "cpu", "llama_model_path": "/models/lab.gguf"%s})]
workers = [("10.0.0.11", {}), ("10.0.0.12", {})]
"""


def others(text: str) -> list[str]:
    """The lines of text that are neither a written key's line nor a tune comment, line ends kept (a commented-out
    example, '# llama_tensor_split: auto', is one of them)."""
    return [
        line
        for line in text.splitlines(keepends=True)
        if not line.lstrip().startswith((*(f"{k}:" for k in SPLIT), "# llama-rpc tune:"))
    ]


def tune_lines(text: str) -> list[str]:
    """The '# llama-rpc tune:' comment lines of text."""
    return [line for line in text.splitlines() if line.lstrip().startswith("# llama-rpc tune:")]


# --- write_settings ---


@pytest.mark.parametrize("name", ["coordinator.yml", "all.yml"])
def test_the_shipped_files_keep_every_other_line_and_read_back(tmp_path, name):
    path = tmp_path / "group_data" / name
    path.parent.mkdir()
    shutil.copy(PROJECT / "group_data" / name, path)
    original = path.read_text()
    assert others(original) == original.splitlines(keepends=True)  # neither key is set in the shipped files
    text = write_settings(path, SPLIT, COMMENT)
    assert path.read_text() == text
    assert others(text) == original.splitlines(keepends=True)
    assert tune_lines(text) == [f"# llama-rpc tune: {COMMENT}"]
    assert text.endswith(f"# llama-rpc tune: {COMMENT}\nllama_tensor_split: [3, 4, 2]\nllama_n_gpu_layers: 7\n")
    data = group_vars(path.with_suffix(".py"))  # what the one-line loader hands pyinfra
    assert {k: data[k] for k in SPLIT} == SPLIT
    assert set(data) - {"_origins"} == {*SPLIT, *(["llama_model_path"] if name == "all.yml" else [])}
    lines = text.splitlines()
    assert data["_origins"]["llama_tensor_split"] == f"group_data/{name}:{len(lines) - 1}:21"


EDITED = """# My cluster's coordinator.
llama_port: 8081   # the front listens here

# the split I found by hand:
# llama_tensor_split: [1, 1]
llama_tensor_split: [1, 1]  # my note
# between
llama_n_gpu_layers: 999   # all of them

llama_extra_args:
  - --metrics   # keep
# the end
"""


def test_a_key_already_set_is_replaced_in_place_and_a_second_write_does_not_stack(tmp_path):
    path = tmp_path / "coordinator.yml"
    path.write_text(EDITED)
    first = write_settings(path, SPLIT, COMMENT)
    assert others(first) == others(EDITED)
    new = first.splitlines()
    at = new.index("llama_tensor_split: [3, 4, 2]  # my note")  # its note after the value stays
    assert new[at - 1] == f"# llama-rpc tune: {COMMENT}"
    assert new[at - 2] == "# llama_tensor_split: [1, 1]"  # the commented example stays as it is
    assert new[at + 1 : at + 3] == ["# between", "llama_n_gpu_layers: 7   # all of them"]
    second = write_settings(path, {"llama_tensor_split": [2, 5, 2], "llama_n_gpu_layers": 7}, "the second run")
    assert tune_lines(second) == ["# llama-rpc tune: the second run"]
    assert others(second) == others(EDITED)
    assert second.splitlines()[at : at + 1] == ["llama_tensor_split: [2, 5, 2]  # my note"]
    data = group_vars(tmp_path / "coordinator.py")
    assert (data["llama_tensor_split"], data["llama_n_gpu_layers"]) == ([2, 5, 2], 7)
    assert (data["llama_port"], data["llama_extra_args"]) == (8081, ["--metrics"])


def test_the_comment_goes_above_the_topmost_key_and_an_old_one_elsewhere_goes(tmp_path):
    """Written in the other order than the file has them; an old tune comment above the lower key is dropped."""
    path = tmp_path / "all.yml"
    path.write_text("llama_n_gpu_layers: 20\nllama_port: 8081\n# llama-rpc tune: old\nllama_tensor_split: [1, 1]\n")
    text = write_settings(path, SPLIT, "new")
    assert text == "# llama-rpc tune: new\nllama_n_gpu_layers: 7\nllama_port: 8081\nllama_tensor_split: [3, 4, 2]\n"


@pytest.mark.parametrize(
    "before, after",
    [
        ("llama_tensor_split:\n# after\nllama_port: 1\n", "llama_tensor_split: [3, 4, 2]\n# after\nllama_port: 1\n"),
        (
            "llama_tensor_split:\n  - 1\n  - 1   # n\n\n# after\nllama_port: 1\n",
            "llama_tensor_split: [3, 4, 2]   # n\n\n# after\nllama_port: 1\n",
        ),
        ("llama_tensor_split: |\n  1, 1\n\n# after\n", "llama_tensor_split: [3, 4, 2]\n\n# after\n"),
        ("split: &s [1, 1]\nllama_tensor_split: *s\n", "split: &s [1, 1]\nllama_tensor_split: [3, 4, 2]\n"),
        (
            "llama_port: 1\r\n# c\r\nllama_tensor_split: auto\r\n",
            "llama_port: 1\r\n# c\r\nllama_tensor_split: [3, 4, 2]\r\n",
        ),
        ("llama_port: 1", "llama_port: 1\nllama_tensor_split: [3, 4, 2]\n"),
        ("", "llama_tensor_split: [3, 4, 2]\n"),
    ],
    ids=["empty value", "block list", "block text", "alias", "CRLF", "no final newline", "empty file"],
)
def test_each_way_of_writing_the_old_value_becomes_the_new_line(tmp_path, before, after):
    path = tmp_path / "coordinator.yml"
    path.write_bytes(before.encode())
    write_settings(path, {"llama_tensor_split": [3, 4, 2]}, "c")
    newline = "\r\n" if "\r\n" in before else "\n"
    comment = "# llama-rpc tune: c" + newline
    expected = after.replace("llama_tensor_split:", comment + "llama_tensor_split:")
    assert path.read_bytes() == expected.encode()


def test_a_missing_file_is_written_and_a_files_mode_is_kept(tmp_path):
    new, old = tmp_path / "new.yml", tmp_path / "old.yml"
    old.write_text("llama_port: 1\n")
    old.chmod(0o640)
    text = write_settings(new, SPLIT, "c")
    assert text == "# llama-rpc tune: c\nllama_tensor_split: [3, 4, 2]\nllama_n_gpu_layers: 7\n"
    write_settings(old, SPLIT, "c")
    assert (new.stat().st_mode & 0o777, old.stat().st_mode & 0o777) == (0o644, 0o640)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.yml", "old.yml"]


@pytest.mark.parametrize(
    "text, values, words",
    [
        ("- llama_port\n- 8081\n", SPLIT, ["1:1: the top level is a list", "llama_tensor_split = [3, 4, 2]"]),
        ("{llama_port: 8081}\n", SPLIT, [":1: the top level is a mapping in braces", "expected 'name: value' lines"]),
        (
            "llama_port: 8081\n...\n",
            SPLIT,
            [":4:1: found", "once llama_tensor_split = [3, 4, 2]", "nothing was written"],
        ),
        (
            "llama_port: 8081\n",
            {"image_backend": "yes"},
            ["image_backend = 'yes' would read back as image_backend = True"],
        ),
        ("llama_port: 8081\n", {"llama_tensor_split": object()}, ["llama_tensor_split = <object", "cannot represent"]),
    ],
    ids=["a list", "a mapping in braces", "an end of document", "a string YAML 1.1 reads as true", "not YAML"],
)
def test_a_file_that_cannot_take_the_values_is_refused_and_left_untouched(tmp_path, text, values, words):
    path = tmp_path / "coordinator.yml"
    path.write_text(text)
    with pytest.raises(ApplyError) as error:
        write_settings(path, values, "c")
    assert isinstance(error.value, SettingsError) and "\n" not in str(error.value)
    for word in words:
        assert word in str(error.value)
    assert str(path) in str(error.value) or "cannot represent" in str(error.value)
    assert path.read_text() == text
    assert [p.name for p in tmp_path.iterdir()] == ["coordinator.yml"]  # no temp file left


# --- target_file, on inventories loaded as the deploy loads them ---


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """A folder with an inventory and group_data's three loaders and YAML files (comments only), run from there."""
    folder = tmp_path / "checkout"
    (folder / "group_data").mkdir(parents=True)
    for group in ("all", "coordinator", "workers"):
        shutil.copy(PROJECT / "group_data" / f"{group}.py", folder / "group_data")
        (folder / "group_data" / f"{group}.yml").write_text(f"# {group}\n")
    monkeypatch.chdir(folder)
    return folder


def inventory(folder: Path, coordinator_data: str = "") -> Path:
    path = folder / "inventory.py"
    path.write_text(INVENTORY % coordinator_data)
    return path


def test_a_value_from_all_yml_is_written_there_and_the_deploy_reads_it_back(checkout):
    all_yml = checkout / "group_data" / "all.yml"
    all_yml.write_text("# every host\nllama_tensor_split: [1, 1]   # mine\n")
    inv = inventory(checkout)
    path = target_file(offline_cluster(inv), inv, KEYS)
    assert path == all_yml  # llama_n_gpu_layers, at its default, goes with it
    write_settings(path, {"llama_n_gpu_layers": 999, "llama_tensor_split": [1, 2]}, "c")
    after = offline_cluster(inv).coordinator
    assert (after.settings["llama_tensor_split"], after.settings["llama_n_gpu_layers"]) == ([1, 2], 999)
    assert after.origins["llama_tensor_split"] == "group_data/all.yml:3:21"
    assert after.origins["llama_n_gpu_layers"] == "group_data/all.yml:4:21"


def test_values_at_their_default_go_to_coordinator_yml(checkout):
    inv = inventory(checkout)
    assert target_file(offline_cluster(inv), inv, KEYS) == checkout / "group_data" / "coordinator.yml"


def test_the_inventorys_own_group_data_folder_and_the_current_folders_are_both_looked_in(checkout, tmp_path):
    """Run from the checkout with an inventory elsewhere: pyinfra reads both group_data folders."""
    (checkout / "group_data" / "all.yml").write_text("llama_tensor_split: [1, 1]\n")
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "group_data").mkdir(parents=True)
    for group in ("all", "coordinator"):  # its all.yml sets nothing
        shutil.copy(PROJECT / "group_data" / f"{group}.py", elsewhere / "group_data")
    (elsewhere / "group_data" / "all.yml").write_text("# nothing set here\n")
    inv = inventory(elsewhere)
    assert target_file(offline_cluster(inv), inv, KEYS) == checkout / "group_data" / "all.yml"
    (checkout / "group_data" / "all.yml").write_text("# nothing set\n")
    assert target_file(offline_cluster(inv), inv, KEYS) == elsewhere / "group_data" / "coordinator.yml"


@pytest.mark.parametrize(
    "data, overrides, words",
    [
        (
            ', "llama_n_gpu_layers": 7',
            None,
            ["inventory.py (host 10.0.0.10)", "llama_n_gpu_layers = 7", "edit it there, or remove it"],
        ),
        (
            "",
            {"llama_tensor_split": [1, 1]},
            ["--data on the command line", "llama_tensor_split = [1, 1]", "edit it there, or remove it"],
        ),
    ],
    ids=["the host's own data", "--data"],
)
def test_a_value_a_group_data_file_cannot_override_is_refused(checkout, data, overrides, words):
    inv = inventory(checkout, data)
    with pytest.raises(ApplyError) as error:
        target_file(offline_cluster(inv, overrides=overrides), inv, KEYS)
    for word in words:
        assert word in str(error.value)


def test_keys_from_two_files_are_refused(checkout):
    (checkout / "group_data" / "all.yml").write_text("llama_tensor_split: [1, 1]\n")
    (checkout / "group_data" / "coordinator.yml").write_text("llama_n_gpu_layers: 999\n")
    inv = inventory(checkout)
    with pytest.raises(
        ApplyError,
        match=r"llama_n_gpu_layers from .*coordinator.yml, llama_tensor_split from "
        r".*all.yml: the settings tune writes come from different files",
    ):
        target_file(offline_cluster(inv), inv, KEYS)


def test_a_python_group_data_file_or_a_missing_loader_is_refused(checkout):
    inv = inventory(checkout)
    loader = checkout / "group_data" / "coordinator.py"
    loader.write_text("llama_n_gpu_layers = 999\n")  # Python group data, no YAML loader
    with pytest.raises(ApplyError, match=r"^group_data/coordinator.py: llama_n_gpu_layers = 999 is set there"):
        target_file(offline_cluster(inv), inv, KEYS)
    os.remove(loader)
    with pytest.raises(ApplyError, match=r"coordinator.py: no loader of coordinator.yml there"):
        target_file(offline_cluster(inv), inv, KEYS)


def test_a_yml_outside_the_inventorys_group_data_folders_is_refused(checkout, tmp_path):
    """--group-data FOLDER (not called group_data): its values are named by path; tune does not write there."""
    extra = tmp_path / "extra"
    extra.mkdir()
    shutil.copy(PROJECT / "group_data" / "all.py", extra)
    (extra / "all.yml").write_text("llama_tensor_split: [1, 1]\n")
    inv = inventory(checkout)
    with pytest.raises(
        ApplyError,
        match=rf"^{extra}/all.yml:1:21: llama_tensor_split = \[1, 1\] is set there: "
        r"expected it in a .yml file of a group_data folder of this inventory",
    ):
        target_file(offline_cluster(inv, group_data=extra), inv, KEYS)


# --- the speculation stage's result ---


@pytest.mark.parametrize(
    "best, written",
    [
        ((0,), {"llama_spec_type": None, "llama_spec_draft_path": None, "llama_spec_draft_min": None}),
        ((32,), {"llama_spec_type": "ngram-mod", "llama_spec_draft_min": 32, "llama_spec_draft_max": 32}),
    ],
)
def test_apply_writes_the_speculation_stages_best(checkout, best, written):
    """ngram-mod set in all.yml, tune found `best` (off, or at most 32 tokens) faster beyond the noise: apply writes
    it into all.yml (the minimum, 48 by default, lowered to 32), and the deploy reads it back; no split is written, as
    none won."""
    from llama_rpc_deploy import tune
    from llama_rpc_deploy.tune.search import TuneResult

    all_yml = checkout / "group_data" / "all.yml"
    all_yml.write_text("llama_spec_type: ngram-mod\n")
    inv = inventory(checkout)
    report = tune.Report(layout=None, start=(1, 1), objective="generation")
    report.result = TuneResult((1, 1), (1, 1), 1.0, (1.0, 1.0), False, [], "")
    report.speculation = TuneResult((64,), best, 1.2, (1.1, 1.3), True, [], "")
    report.spec_names = tune.spec_names(offline_cluster(inv).settings)
    assert tune.apply(inv, report) == [all_yml]
    settings = offline_cluster(inv).settings
    assert {k: settings[k] for k in written} == written
    assert settings["llama_tensor_split"] is None
    assert "# llama-rpc tune:" in all_yml.read_text()


def test_apply_writes_nothing_within_the_noise(checkout):
    from llama_rpc_deploy import tune
    from llama_rpc_deploy.tune.search import TuneResult

    (checkout / "group_data" / "all.yml").write_text("llama_spec_type: ngram-mod\n")
    inv = inventory(checkout)
    before = (checkout / "group_data" / "all.yml").read_text()
    report = tune.Report(layout=None, start=(1, 1), objective="generation")
    report.speculation = TuneResult((64,), (64,), 1.0, (0.9, 1.1), False, [], "")
    assert tune.apply(inv, report) == []
    assert (checkout / "group_data" / "all.yml").read_text() == before
