"""User settings in YAML: group_data/<group>.yml, read by a one-line group_data/<group>.py.

pyinfra reads only group_data/*.py, so each group keeps a loader like

    from llama_rpc_deploy.userdata import group_vars; globals().update(group_vars(__file__))

pyinfra drops the imported name (group_vars) and keeps every value, plus `_origins`:
{key: "group_data/all.yml:LINE:COL"}, the place of each top-level value (1-based), so an
error about a bad value can name it. Keys starting with "_" are not settings.

A YAML mistake (a tab for indentation, a duplicate key, an unclosed bracket or quote, a top
level that is not a mapping, a key that is not a string) raises SettingsError with one line:
"group_data/all.yml:LINE:COL: what is wrong: expected what".
"""

from __future__ import annotations

import copy
import functools
import re
from pathlib import Path
from typing import Any

import yaml
from pyinfra.api.exceptions import PyinfraError
from yaml.nodes import MappingNode, Node, ScalarNode

from .settings import SettingsError

ORIGINS = "_origins"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_NULL_TAG = "tag:yaml.org,2002:null"


class YamlError(SettingsError, PyinfraError):
    """A mistake in a group_data/*.yml file. A SettingsError; also a PyinfraError, so that pyinfra,
    which reads the loaders itself, prints its one line instead of a traceback."""


def _at(mark: yaml.Mark) -> str:
    return f"{mark.line + 1}:{mark.column + 1}"


class _Problem(Exception):
    """A mistake found while reading the nodes: (the mark where it is, what is wrong, what was expected)."""

    def __init__(self, mark: yaml.Mark, wrong: str, expected: str):
        super().__init__(wrong)
        self.mark, self.wrong, self.expected = mark, wrong, expected


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict:
        if isinstance(node, MappingNode):
            seen: dict[Any, yaml.Mark] = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:
                    continue  # "<<: *anchor" merges; explicit keys may override merged ones
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:
                    continue  # an unhashable key: SafeLoader's own error says so
                if first is not None:
                    raise _Problem(
                        key_node.start_mark,
                        f"duplicate key {key!r} (first at {_at(first)})",
                        "each key once in a mapping",
                    )
                seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def _kind(node: Node) -> str:
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, ScalarNode):
        return f"a single value ({node.value!r})"
    return "a list"


def _explain(error: yaml.MarkedYAMLError, text: str) -> tuple[yaml.Mark, str, str]:
    """PyYAML's error as (mark, what is wrong, what was expected), in words a user can act on."""
    problem, context = error.problem or "", error.context or ""
    mark = error.problem_mark or error.context_mark
    assert mark is not None
    if "'\\t'" in problem:
        line = text.splitlines()[mark.line] if mark.line < len(text.splitlines()) else ""
        if line[: mark.column].strip(" \t") == "":
            return mark, "a tab used for indentation (YAML forbids tabs there)", "spaces"
        return mark, "a tab character where YAML reads no tabs", "a space"
    if context.startswith("while scanning a quoted scalar") and error.context_mark is not None:
        opener = error.context_mark
        line = text.splitlines()[opener.line]
        quote = line[opener.column] if opener.column < len(line) else '"'
        return opener, f"a {quote}-quoted string that is never closed", f"a closing {quote}"
    flow = re.fullmatch(r"expected (.+), but (?:got|found) (.+)", problem)
    if context.startswith("while parsing a flow") and error.context_mark is not None and flow:
        opener = error.context_mark
        bracket = "[" if "sequence" in context else "{"
        closer = "]" if bracket == "[" else "}"
        found = "the end of the file" if flow.group(2) == "'<stream end>'" else f"{flow.group(2)} at {_at(mark)}"
        return opener, f"{bracket!r} not closed before {found}", f"',' or {closer!r}"
    if problem == "mapping values are not allowed here":
        return (
            mark,
            "':' where no mapping can start (a value holding ': ' needs quotes, or the line is indented too far)",
            "one 'key: value' per line, keys lined up",
        )
    if context.startswith("expected a single document"):
        return mark, "a second document ('---')", "one document per file"
    if flow:
        wrong = f"found {flow.group(2)}"
        if context and error.context_mark is not None:
            wrong += f" {context} at {_at(error.context_mark)}"
        return mark, wrong, flow.group(1)
    wrong = problem or context or "not valid YAML"
    if context and problem and error.context_mark is not None:
        wrong += f" ({context} at {_at(error.context_mark)})"
    elif context and problem:
        wrong += f" ({context})"
    return mark, wrong, "valid YAML"


def load_yaml(path: str | Path, display_name: str | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """(values, origins) from a YAML file whose top level maps setting names to values.

    origins maps each top-level key to "DISPLAY_NAME:LINE:COL" (1-based) of its value. A missing
    file, an empty one or one of comments only gives ({}, {}). Any mistake raises SettingsError
    with one line "DISPLAY_NAME:LINE:COL: what is wrong: expected what".
    """
    path = Path(path)
    name = display_name or str(path)
    if not path.is_file():
        return {}, {}
    values, origins = _parse(path.read_text(encoding="utf-8"), name)
    return copy.deepcopy(values), dict(origins)


@functools.lru_cache(maxsize=64)
def _parse(text: str, name: str) -> tuple[dict[str, Any], dict[str, str]]:
    """load_yaml's work on one file's text (the same group_data is read again by every inventory load:
    PyYAML's pure-Python scanner, once per text; callers get copies)."""

    def fail(mark: yaml.Mark | None, wrong: str, expected: str) -> SettingsError:
        where = f"{name}:{_at(mark)}" if mark is not None else name
        return YamlError(f"{where}: {' '.join(wrong.split())}: expected {' '.join(expected.split())}")

    try:
        loader = _Loader(text)
    except yaml.reader.ReaderError as error:  # a control character, before any parsing
        before = text[: error.position]
        mark = yaml.Mark(name, error.position, before.count("\n"), len(before) - before.rfind("\n") - 1, None, None)
        code = error.character if isinstance(error.character, int) else ord(error.character)
        raise fail(
            mark,
            f"the character U+{code:04X}, which YAML does not allow",
            'printable text (quote it as an escape, e.g. "\\t")',
        ) from None
    try:
        root = loader.get_single_node()
        if root is None or (isinstance(root, ScalarNode) and root.tag == _NULL_TAG):
            return {}, {}
        if not isinstance(root, MappingNode):
            raise fail(
                root.start_mark,
                f"the top level is {_kind(root)}",
                "a mapping of setting names to values ('name: value' lines)",
            )
        origins: dict[str, str] = {}
        for key_node, value_node in root.value:
            if key_node.tag == _MERGE_TAG:
                continue
            if not (isinstance(key_node, ScalarNode) and key_node.tag == "tag:yaml.org,2002:str"):
                shown = key_node.value if isinstance(key_node, ScalarNode) else _kind(key_node)
                raise fail(
                    key_node.start_mark,
                    f"the key {shown!s} is not a string",
                    "a setting name (letters, digits and '_')",
                )
            origins.setdefault(key_node.value, f"{name}:{_at(value_node.start_mark)}")
        values = loader.construct_document(root)
    except _Problem as problem:
        raise fail(problem.mark, problem.wrong, problem.expected) from None
    except yaml.MarkedYAMLError as error:
        raise fail(*_explain(error, text)) from None
    except yaml.YAMLError as error:  # e.g. a character YAML does not allow (no position known)
        raise fail(None, str(error).splitlines()[0] if str(error) else "not valid YAML", "valid YAML") from None
    finally:
        loader.dispose()
    # Keys brought in by "<<: *anchor" have no origin of their own: the merge key's value stands for them.
    merge = next((v for k, v in root.value if k.tag == _MERGE_TAG), None)
    for key in values:
        if key not in origins and merge is not None:
            origins[key] = f"{name}:{_at(merge.start_mark)}"
    for key in values:
        if not isinstance(key, str):
            raise fail(root.start_mark, f"the key {key!r} is not a string", "a setting name")
    return values, origins


def _display_name(yml: Path) -> str:
    """'group_data/all.yml' when the file sits in a folder called group_data, else the path as given."""
    if yml.parent.name == "group_data":
        return f"group_data/{yml.name}"
    return str(yml)


def group_vars(loader_path: str | Path) -> dict[str, Any]:
    """The settings in the .yml next to a group_data/<group>.py loader, plus `_origins`.

    Missing or empty file: {}. Else {**values, "_origins": {key: "group_data/<group>.yml:LINE:COL"}}.
    """
    yml = Path(loader_path).with_suffix(".yml")
    values, origins = load_yaml(yml, _display_name(yml))
    if not values:
        return {}
    return {**values, ORIGINS: origins}
