"""Every bad configuration of tests/bad_configs.py is refused with a message naming file, key and expectation.

The same table runs against the lab in tests/e2e/test_lab_bad_configs.py, through pyinfra, where it
also checks that no host was touched.
"""

import pytest

from llama_rpc_deploy.loading import offline_cluster
from llama_rpc_deploy.settings import SettingsError

from ..bad_configs import CASES, expected_words, write_case

BASE = """SSH = {"ssh_user": "root"}
LAB = {"image_backend": "cpu", "llama_model_path": "/models/lab.gguf"}
coordinator = [("10.0.0.10", {**SSH, **LAB})]
workers = [("10.0.0.11", {**SSH}), ("10.0.0.12", {**SSH})]
"""


@pytest.fixture
def base(tmp_path):
    path = tmp_path / "base_inventory.py"
    path.write_text(BASE)
    return path


def test_the_base_inventory_is_good(base):
    assert [w.name for w in offline_cluster(base).workers] == ["10.0.0.11", "10.0.0.12"]


def test_there_are_at_least_75_distinct_cases():
    assert len({c.id for c in CASES}) == len(CASES) >= 75
    assert len({c.code for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_configuration_is_refused(case, base, tmp_path):
    inventory = write_case(base, case, tmp_path / "inventory.py")
    with pytest.raises(SettingsError) as error:
        offline_cluster(inventory)
    for words in expected_words(case, inventory, "10.0.0.10", "10.0.0.11"):
        assert words in str(error.value)


def test_python_syntax_error_names_file_and_line(base, tmp_path):
    inventory = tmp_path / "inventory.py"
    inventory.write_text(base.read_text() + "llama_port = = 8080\n")
    with pytest.raises(SettingsError, match=rf"{inventory}:5: invalid syntax: expected Python"):
        offline_cluster(inventory)


def test_an_exception_in_a_group_data_file_is_one_line_with_its_line(base, tmp_path):
    group_data = tmp_path / "group_data"
    group_data.mkdir()
    (group_data / "all.py").write_text("llama_port = 8080\nllama_ctx_size = 4096 // 0\n")
    with pytest.raises(SettingsError) as error:
        offline_cluster(base, group_data=group_data)
    assert str(error.value) == (
        f"{group_data / 'all.py'}:2: ZeroDivisionError: integer division or modulo by zero: "
        "expected Python that runs (name = value lines)"
    )


@pytest.mark.parametrize(
    "argv", [["--data", "llama_port=0"], ["--data=llama_port=0"]], ids=["--data k=v", "--data=k=v"]
)
def test_data_on_the_command_line_is_checked_before_connecting_in_either_form(base, argv, capsys):
    from llama_rpc_deploy.deployment import preflight
    from llama_rpc_deploy.refusal import Refusal

    with pytest.raises(Refusal) as stop:
        preflight(["pyinfra", "-y", *argv, str(base), "deploy.py"])
    assert stop.value.exit_code == 1
    stop.value.show()  # as pyinfra's CLI shows it: our own line alone, no pyinfra prefix with an internal path
    assert (
        capsys.readouterr().err == "--data on the command line: llama_port = 0: expected an integer from 1 to 65535\n"
    )


def test_data_without_a_value_is_refused(base, capsys):
    from llama_rpc_deploy.deployment import preflight
    from llama_rpc_deploy.refusal import Refusal

    with pytest.raises(Refusal) as stop:
        preflight(["pyinfra", "--data=llama_port", str(base), "deploy.py"])
    assert stop.value.exit_code == 1
    stop.value.show()
    assert capsys.readouterr().err == "--data 'llama_port' on the command line: expected KEY=VALUE\n"
