"""group_data/*.yml: read through the one-line group_data/*.py loaders, as pyinfra reads them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from pyinfra.api import State
from pyinfra.context import ctx_state
from pyinfra_cli.inventory import _get_group_data  # imported before any test starts a thread (gevent)

from llama_rpc_deploy import settings
from llama_rpc_deploy.settings import BY_NAME, COORDINATOR, WORKERS, SettingsError
from llama_rpc_deploy.userdata import group_vars, load_yaml

PROJECT = Path(__file__).resolve().parents[2]
GROUP_DATA = PROJECT / "group_data"
SHIPPED = sorted(GROUP_DATA.glob("*.yml"))
EXAMPLE = re.compile(r"^#\s?([a-z_][a-z0-9_]*):(\s.*)?$")  # "# key: value  # why" (a commented example)


def pyinfra_group_data(folder: Path) -> dict:
    with ctx_state.use(State()):
        return _get_group_data(str(folder))


def test_shipped_files_are_the_three_groups_with_a_loader_each():
    assert [p.name for p in SHIPPED] == ["all.yml", "coordinator.yml", "workers.yml"]
    for yml in SHIPPED:
        code = [
            line
            for line in yml.with_suffix(".py").read_text().splitlines()
            if line.strip() and not line.startswith("#")
        ]
        assert code == ["from llama_rpc_deploy.userdata import group_vars; globals().update(group_vars(__file__))"]


def test_pyinfra_reads_the_shipped_group_data_with_origins():
    data = pyinfra_group_data(GROUP_DATA)
    assert set(data) == {"all", "coordinator", "workers"}
    all_data = data["all"]
    assert "group_vars" not in all_data and not any(k.startswith("__") for k in all_data)
    assert all_data["llama_model_path"] == "/CHANGE_ME/models/gemma-4-31B-it-qat-UD-Q4_K_XL.gguf"
    lines = (GROUP_DATA / "all.yml").read_text().splitlines()
    line_no = next(i for i, line in enumerate(lines, 1) if line.startswith("llama_model_path:"))
    column = lines[line_no - 1].index("/CHANGE_ME") + 1
    assert all_data["_origins"] == {"llama_model_path": f"group_data/all.yml:{line_no}:{column}"}
    # Nothing set for the roles: only comments there, so no data and no _origins.
    assert data["coordinator"] == {} and data["workers"] == {}


def test_the_settings_schema_skips_origins_and_names_them():
    data = group_vars(GROUP_DATA / "all.py")
    values, sources = settings.resolve([settings.Scope("group_data/all.py", data)])
    assert values["llama_model_path"].endswith("gemma-4-31B-it-qat-UD-Q4_K_XL.gguf")
    assert sources["llama_model_path"] == data["_origins"]["llama_model_path"] == "group_data/all.yml:9:19"


def test_origins_point_at_each_value(tmp_path):
    folder = tmp_path / "group_data"
    folder.mkdir()
    (folder / "coordinator.yml").write_text(
        "# a comment\n"
        "llama_port: 8081\n"
        "llama_extra_args:\n"
        "  - --metrics\n"
        "gpus: [RTX 4080, {name: RTX 5060 Ti, cuda_arch: '120'}]\n"
        "llama_tensor_split:   null\n"
    )
    data = group_vars(folder / "coordinator.py")
    assert data["llama_port"] == 8081 and data["llama_extra_args"] == ["--metrics"]
    assert data["gpus"] == ["RTX 4080", {"name": "RTX 5060 Ti", "cuda_arch": "120"}]
    assert data["llama_tensor_split"] is None
    assert data["_origins"] == {
        "llama_port": "group_data/coordinator.yml:2:13",
        "llama_extra_args": "group_data/coordinator.yml:4:3",
        "gpus": "group_data/coordinator.yml:5:7",
        "llama_tensor_split": "group_data/coordinator.yml:6:23",
    }


def test_a_folder_not_called_group_data_keeps_the_path_as_given(tmp_path):
    (tmp_path / "all.yml").write_text("llama_port: 8081\n")
    assert group_vars(tmp_path / "all.py")["_origins"] == {"llama_port": f"{tmp_path}/all.yml:1:13"}


@pytest.mark.parametrize("text", [None, "", "\n\n", "# only comments\n# llama_port: 1\n", "---\n", "{}\n"])
def test_missing_or_empty_gives_nothing(tmp_path, text):
    if text is not None:
        (tmp_path / "workers.yml").write_text(text)
    assert group_vars(tmp_path / "workers.py") == {}
    assert load_yaml(tmp_path / "workers.yml", "group_data/workers.yml") == ({}, {})


MISTAKES = {
    "tab for indentation": (
        "llama_port: 8080\nllama_extra_args:\n\t- --metrics\n",
        "3:1: a tab used for indentation (YAML forbids tabs there): expected spaces",
    ),
    "tab after a key": ("llama_port:\t8080\n", "1:12: a tab character where YAML reads no tabs: expected a space"),
    "duplicate top-level key": (
        "llama_port: 8080\nllama_parallel: 2\nllama_port: 8081\n",
        "3:1: duplicate key 'llama_port' (first at 1:1): expected each key once in a mapping",
    ),
    "duplicate nested key": (
        "gpus:\n  - {name: RTX 4080, name: RTX 3090}\n",
        "2:22: duplicate key 'name' (first at 2:6): expected each key once in a mapping",
    ),
    "unclosed bracket": (
        "llama_extra_args: [--metrics\nllama_port: 8080\n",
        "1:19: '[' not closed before ':' at 2:11: expected ',' or ']'",
    ),
    "unclosed bracket at the end": (
        "llama_port: 8080\nllama_extra_args: [--metrics, --no-mmap\n",
        "2:19: '[' not closed before the end of the file: expected ',' or ']'",
    ),
    "unclosed brace": ("gpus: [{name: RTX 4080]\n", "1:8: '{' not closed before ']' at 1:23: expected ',' or '}'"),
    "unclosed double quote": (
        'llama_model_path: "/models/m.gguf\nllama_port: 8080\n',
        '1:19: a "-quoted string that is never closed: expected a closing "',
    ),
    "unclosed single quote": (
        "llama_port: 8080\nimage_cuda_architectures: '89;120\n",
        "2:27: a '-quoted string that is never closed: expected a closing '",
    ),
    "value holding ': '": (
        "llama_model_path: /models/a: b.gguf\n",
        "1:28: ':' where no mapping can start (a value holding ': ' needs quotes, or the line is "
        "indented too far): expected one 'key: value' per line, keys lined up",
    ),
    "indented too far": (
        "llama_port: 8080\n  llama_parallel: 2\n",
        "2:17: ':' where no mapping can start (a value holding ': ' needs quotes, or the line is "
        "indented too far): expected one 'key: value' per line, keys lined up",
    ),
    "top level is a list": (
        "# settings\n- llama_port: 8080\n",
        "2:1: the top level is a list: expected a mapping of setting names to values ('name: value' lines)",
    ),
    "top level is a value": (
        "llama_port 8080\n",
        "1:1: the top level is a single value ('llama_port 8080'): expected a mapping of setting names "
        "to values ('name: value' lines)",
    ),
    "key that is a number": (
        "llama_port: 8080\n50052: rpc_port\n",
        "2:1: the key 50052 is not a string: expected a setting name (letters, digits and '_')",
    ),
    "key that is true": (
        "true: 1\n",
        "1:1: the key true is not a string: expected a setting name (letters, digits and '_')",
    ),
    "two documents": (
        "llama_port: 8080\n---\nrpc_port: 50053\n",
        "2:1: a second document ('---'): expected one document per file",
    ),
    "control character": (
        "llama_port: 8080\nimage_name: ab\x07c\n",
        "2:15: the character U+0007, which YAML does not allow: expected printable text (quote it as an escape, "
        'e.g. "\\t")',
    ),
    "undefined alias": ("llama_port: *port\n", "1:13: found undefined alias 'port': expected valid YAML"),
}


@pytest.mark.parametrize("text, message", MISTAKES.values(), ids=MISTAKES.keys())
def test_a_yaml_mistake_is_one_line_with_its_place(tmp_path, text, message):
    folder = tmp_path / "group_data"
    folder.mkdir()
    (folder / "all.yml").write_text(text)
    with pytest.raises(SettingsError) as error:
        group_vars(folder / "all.py")
    assert str(error.value) == f"group_data/all.yml:{message}"
    assert "\n" not in str(error.value) and "Traceback" not in str(error.value)
    assert error.value.__cause__ is None and (error.value.__context__ is None or error.value.__suppress_context__)


def test_pyinfra_shows_a_yaml_mistake_as_its_own_error(tmp_path):
    from pyinfra.api.exceptions import PyinfraError

    folder = tmp_path / "group_data"
    folder.mkdir()
    (folder / "all.py").write_text((GROUP_DATA / "all.py").read_text())
    (folder / "all.yml").write_text("llama_port: 8080\nllama_port: 8081\n")
    with pytest.raises(PyinfraError, match=r"^group_data/all.yml:2:1: duplicate key 'llama_port'"):
        pyinfra_group_data(folder)


def _examples(yml: Path) -> dict[str, object]:
    """The commented examples ("# key: value  # why") of a shipped file, parsed as YAML."""
    found = {}
    for line in yml.read_text().splitlines():
        match = EXAMPLE.match(line)
        if match:
            found.update(yaml.safe_load(line.lstrip("#").strip()))
    return found


@pytest.mark.parametrize("yml", SHIPPED, ids=lambda p: p.name)
def test_shipped_values_are_not_defaults(yml):
    values, _ = load_yaml(yml, f"group_data/{yml.name}")
    for key, value in values.items():
        default = settings.DEFAULTS[key]
        assert not (value == default and type(value) is type(default)), (
            f"{yml.name}: {key} = {value!r} only repeats the default (settings.py holds defaults)"
        )


@pytest.mark.parametrize("yml", SHIPPED, ids=lambda p: p.name)
def test_every_key_and_example_is_a_known_setting_with_a_good_value(yml):
    values, _ = load_yaml(yml, f"group_data/{yml.name}")
    examples = _examples(yml)
    assert examples, f"{yml.name} shows no commented examples"
    for key, value in [*values.items(), *examples.items()]:
        assert key in settings.BY_NAME, f"{yml.name}: {key} is not a setting"
        setting = settings.BY_NAME[key]
        assert setting.check.ok(value), f"{yml.name}: {key}: {value!r}: expected {setting.check.expected}"
    for key, value in examples.items():  # an example shows a change, not the default
        assert value != settings.DEFAULTS[key], f"{yml.name}: the example {key} = {value!r} is the default"


def test_role_files_hold_their_role_settings_only():
    # the role that reads each example's value (settings.Setting.read_from): llama_*, image_* and rpc_*, sleep_mode, wol_*
    assert all(BY_NAME[k].read_from == COORDINATOR for k in _examples(GROUP_DATA / "coordinator.yml"))
    assert all(BY_NAME[k].read_from == WORKERS for k in _examples(GROUP_DATA / "workers.yml"))
