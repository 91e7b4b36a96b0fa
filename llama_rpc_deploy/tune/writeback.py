"""`tune --apply`: write the measured best split into the group_data YAML file it belongs in.

target_file picks the file: the one each key's current value came from (a group_data/*.yml; origins say where),
or group_data/coordinator.yml for keys still at their default. write_settings changes only the written keys' text
and the '# llama-rpc tune:' comment above them: every other line, comment and blank line stays byte for byte as the
user left it. ruamel.yaml's composer and scanner find where each top-level key and its value are written; a full
ruamel round-trip dump is not used, as it re-spaces lines it did not change ('key:   null' becomes 'key:').
The new text is read back with the project's own reader (userdata.load_yaml) before it replaces the file, so a
write that would change any other value, or leave a file the deploy cannot read, is refused, the file as it was.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Sequence

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError
from ruamel.yaml.nodes import MappingNode
from ruamel.yaml.tokens import DocumentEndToken

from ..loading import group_data_folders
from ..settings import COORDINATOR, SettingsError
from ..userdata import load_yaml

TUNE_MARK = "# llama-rpc tune:"
DEFAULT = "default"  # settings.resolve's origin of a value that no layer sets
_YAML_ORIGIN = re.compile(r"(?P<file>.+\.yml):\d+:\d+")  # userdata's "group_data/all.yml:LINE:COL"
_MERGE_TAG = "tag:yaml.org,2002:merge"


class ApplyError(SettingsError):
    """tune --apply cannot write a setting: one line naming the file, the key, the value and what was expected."""


# --- which file ---


def target_file(cluster, inventory_path: Path, keys: Sequence[str]) -> Path:
    """The group_data YAML file to write `keys` into: the file each key's current value came from
    (cluster.coordinator.origins[key] names group_data/<group>.yml:LINE:COL); for a key still at its default,
    group_data/coordinator.yml (the coordinator reads these settings) in the inventory's group_data folder.
    Raise ApplyError when a key's value comes from somewhere a group_data file cannot override (the host's own data
    in inventory.py, or --data): name that place and the key, and say to edit it there or remove it. Raise ApplyError
    when the keys come from different files, or the file is not a .yml under a group_data folder of this inventory.

    Keys at their default join the file the other keys came from (any file the coordinator reads sets them, and
    one file keeps the split's two settings together); only when every key is at its default is it coordinator.yml."""
    folders = group_data_folders(inventory_path)
    plan = cluster.coordinator
    sources = {key: _source_file(key, plan.settings[key], plan.origins[key], folders) for key in keys}
    files = sorted(set(sources.values()) - {None})
    if len(files) > 1:
        where = ", ".join(f"{key} from {path}" for key, path in sources.items() if path is not None)
        raise ApplyError(
            f"{where}: the settings tune writes come from different files: "
            "expected them in one group_data/*.yml file (move one next to the other)"
        )
    return files[0] if files else _default_file(inventory_path, folders)


def _source_file(key: str, value: object, origin: str, folders: list[Path]) -> Path | None:
    """The group_data/*.yml file that `origin` (where the coordinator's value of key was written) names;
    None for a value at its default. ApplyError for a place tune cannot write."""
    if origin == DEFAULT:
        return None
    found = _YAML_ORIGIN.fullmatch(origin)
    if found is None:
        # --data, the host's own data in the inventory (both above every group_data file), or a Python group file
        raise ApplyError(
            f"{origin}: {key} = {value!r} is set there, and tune --apply writes only group_data/*.yml "
            "files, which cannot override it: expected you to edit it there, or remove it and run "
            "tune --apply again"
        )
    shown = found.group("file")
    if shown.startswith("group_data/"):
        # pyinfra reads every folder, the later over the earlier: the last whose file writes the value there
        for folder in reversed(folders):
            path = folder / shown.removeprefix("group_data/")
            if load_yaml(path, shown)[1].get(key) == origin:
                return path
    raise ApplyError(
        f"{origin}: {key} = {value!r} is set there: expected it in a .yml file of a group_data "
        f"folder of this inventory ({', '.join(map(str, folders)) or 'none found'}) for tune --apply "
        "to write it; edit it there"
    )


def _default_file(inventory_path: Path, folders: list[Path]) -> Path:
    """group_data/coordinator.yml in the inventory's group_data folder (or the current folder's, which pyinfra
    also reads), where its one-line loader (group_data/coordinator.py) hands it to pyinfra: a .yml without a
    loader would be written and never read."""
    mine = Path(inventory_path).resolve().parent / "group_data"
    for folder in sorted(folders, key=lambda f: f != mine):
        loader = folder / f"{COORDINATOR}.py"
        if loader.is_file() and "group_vars(" in loader.read_text(encoding="utf-8"):
            return loader.with_suffix(".yml")
    raise ApplyError(
        f"{mine / (COORDINATOR + '.py')}: no loader of {COORDINATOR}.yml there: expected the one-line "
        "loader of this project's group_data/coordinator.py, so that the settings tune writes are read"
    )


# --- writing ---


def write_settings(path: Path, values: dict[str, object], comment: str) -> str:
    """Set each key of `values` at the top level of the YAML file `path`, keeping every other line, comment, blank
    line and the key order as they were (ruamel.yaml round-trip). A key already there: its value replaced in place.
    A key absent: appended at the end of the file. Lists are written in flow style ([3, 4, 2]). Above the first
    written key, one comment line starting with '# llama-rpc tune:' followed by `comment`; a previous
    '# llama-rpc tune:' line above that key is replaced, not stacked. A commented-out example line for the key
    (e.g. '# llama_tensor_split: [1, 1]') stays as it is.
    Returns the new text (also written to path, atomically: a temp file in the same folder, then os.replace).

    "The first written key" is the topmost in the file. A missing file is written as a new one. The replaced span
    runs from the key to the end of its value, so a note after the value on its line ('# my note') stays; a
    '# llama-rpc tune:' line directly above any written key is dropped, so that one stays in all."""
    path = Path(path)
    shown = ", ".join(f"{key} = {value!r}" for key, value in values.items())
    text = _read(path)
    try:
        before = load_yaml(path, str(path))[0]
    except SettingsError as error:
        raise ApplyError(f"{error}; so {shown} was not written") from None
    new = _splice(text, _edits(path, text, values, f"{TUNE_MARK} {' '.join(comment.split())}".rstrip()))
    _replace(path, new, {**before, **values}, shown)
    return new


def _read(path: Path) -> str:
    """The file's text exactly as stored ('\\r\\n' kept), or '' for a file not there yet."""
    if not path.is_file():
        return ""
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()


def _edits(path: Path, text: str, values: dict[str, object], tune_line: str) -> list[tuple[int, int, str]]:
    """(start, end, new text) of each change to `text`: each present key's 'key: value' span, the tune comment
    above the topmost of them (old ones above the others dropped), and the lines appended for absent keys."""
    newline = "\r\n" if "\r\n" in text else "\n"
    spans = _top_level_spans(path, text)
    edits = [(start, end, _entry(key, values[key])) for key, (start, end, _) in spans.items() if key in values]
    present = sorted(span for key, span in spans.items() if key in values)
    for start, _, column in present:
        new = " " * column + tune_line + newline if start == present[0][0] else ""
        edits += _comment_edit(text, start, column, new)
    absent = [key for key in values if key not in spans]
    if absent:
        column = min((span[2] for span in spans.values()), default=0)  # the top-level mapping's indentation
        lines = ([tune_line] if not present else []) + [_entry(key, values[key]) for key in absent]
        lead = newline if text and not text.endswith("\n") else ""
        edits.append((len(text), len(text), lead + "".join(" " * column + line + newline for line in lines)))
    return edits


def _comment_edit(text: str, start: int, column: int, new: str) -> list[tuple[int, int, str]]:
    """The change above the key written at `start`: the line just above it, when it is a '# llama-rpc tune:'
    comment, replaced by `new` (or `new` inserted there); '' drops an old one, so that comments never stack."""
    line_start = start - column
    above = text.rfind("\n", 0, line_start - 1) + 1 if line_start else line_start
    old = above if text[above:line_start].lstrip().startswith(TUNE_MARK) else line_start
    return [(old, line_start, new)] if old != line_start or new else []


def _top_level_spans(path: Path, text: str) -> dict[str, tuple[int, int, int]]:
    """{key: (where the key starts, where its value's text ends, the key's column)} of the top-level mapping
    (character offsets into text). ruamel.yaml's composer finds the keys; its scanner the end of each value: the
    last token before the next top-level key (comments and blank lines in between are not tokens). Node marks
    alone would not do: an empty value's mark lies past the comments after it, an alias's at its anchor."""
    try:
        root = YAML().compose(text)
        tokens = [
            t
            for t in YAML().scan(text)
            if t.end_mark.index > t.start_mark.index and not isinstance(t, DocumentEndToken)
        ]
    except YAMLError as error:  # the project's reader accepted it: a construct only ruamel refuses
        raise ApplyError(f"{path}: {' '.join(str(error).split())}: expected YAML that ruamel.yaml reads") from None
    if not isinstance(root, MappingNode):
        return {}  # empty, or only comments (load_yaml has refused any other top level)
    if root.flow_style:
        raise ApplyError(
            f"{path}:{root.start_mark.line + 1}: the top level is a mapping in braces ({{...}}): "
            "expected 'name: value' lines, to change one in place"
        )
    starts = sorted(k.start_mark.index for k, _ in root.value) + [len(text)]
    spans = {}
    for key_node, _ in root.value:
        if key_node.tag == _MERGE_TAG:
            continue
        start = key_node.start_mark.index
        following = starts[starts.index(start) + 1]
        end = max(t.end_mark.index for t in tokens if start <= t.start_mark.index < following)
        spans[key_node.value] = (start, start + len(text[start:end].rstrip()), key_node.start_mark.column)
    return spans


def _entry(key: str, value: object) -> str:
    """'key: value' on one line, lists and mappings in flow style ([3, 4, 2]): the one-key mapping as ruamel.yaml
    writes it in flow style ({key: value}), less its braces (what is valid in flow context is in block context)."""
    writer = YAML(typ="safe", pure=True)
    writer.default_flow_style = True
    writer.width = 1 << 16  # one line, however long
    out = io.StringIO()
    try:
        writer.dump({key: value}, out)
    except YAMLError as error:
        raise ApplyError(
            f"{key} = {value!r}: {' '.join(str(error).split())}: expected numbers, strings, lists or mappings"
        ) from None
    return out.getvalue().strip()[1:-1]


def _splice(text: str, edits: list[tuple[int, int, str]]) -> str:
    """text with each (start, end, new) applied; edits do not overlap (an insertion sorts before a replacement
    that starts at the same place)."""
    pieces, at = [], 0
    for start, end, new in sorted(edits):
        pieces += [text[at:start], new]
        at = end
    return "".join(pieces) + text[at:]


def _replace(path: Path, text: str, expected: dict, shown: str) -> None:
    """Write text to a temp file next to path, check that it reads back as `expected` (_check_reads_back), then
    os.replace it over path (keeping the file's mode); on any failure path is untouched and the temp file gone."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        _check_reads_back(Path(tmp), path, expected, shown)
        if path.exists():
            shutil.copymode(path, tmp)
        else:
            os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _check_reads_back(written: Path, path: Path, expected: dict, shown: str) -> None:
    """ApplyError unless the project's reader (userdata.load_yaml, as the deploy reads group_data) gets exactly
    `expected` from the written text: the new values, and every other value as it was."""
    try:
        got = load_yaml(written, str(path))[0]
    except SettingsError as error:  # e.g. keys appended after a '...' (end of document)
        raise ApplyError(f"{error} (once {shown} is written; nothing was written)") from None
    if got != expected:  # e.g. the string 'yes', which ruamel writes plain (YAML 1.2) and PyYAML reads as true
        changed = ", ".join(f"{k} = {got.get(k)!r}" for k in sorted({*got, *expected}) if got.get(k) != expected.get(k))
        raise ApplyError(
            f"{path}: {shown} would read back as {changed}: expected the values as written and every "
            "other unchanged; nothing was written"
        )
