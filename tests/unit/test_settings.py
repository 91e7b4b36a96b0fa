from pathlib import Path

import pytest

from llama_rpc_deploy.settings import (
    DEFAULTS,
    SETTINGS,
    Scope,
    SettingsError,
    scopes,
    resolve,
    settings_table,
    with_table,
)


def test_defaults_pass_their_own_checks():
    for s in SETTINGS:
        if s.name != "llama_model_path":  # the placeholder is refused later, by the cluster check
            assert s.check.ok(s.default), s.name


def host_layers(role="coordinator", **kwargs):
    parts = {"overrides": {}, "host_data": {}, "groups": [], "all_data": {}} | kwargs
    return scopes("10.0.0.2", role, inventory_file="inventory.py", **parts)


def test_precedence_data_then_host_then_groups_then_all_then_default():
    """pyinfra's order, highest first; of two groups the later one in pyinfra's list wins."""

    def winner(**kwargs):
        values, origins = resolve(host_layers(**kwargs))
        return values["llama_port"], origins["llama_port"]

    every = dict(
        overrides={"llama_port": 1001},
        host_data={"llama_port": 1002},
        groups=[("gpu_boxes", {"llama_port": 1003}), ("coordinator", {"llama_port": 1004})],
        all_data={"llama_port": 1005},
    )
    assert winner(**every) == (1001, "--data on the command line")
    assert winner(**{**every, "overrides": {}}) == (1002, "inventory.py (host 10.0.0.2)")
    assert winner(**{**every, "overrides": {}, "host_data": {}}) == (1004, "group_data/coordinator.py")
    assert winner(all_data={"llama_port": 1005}) == (1005, "group_data/all.py")
    assert winner() == (DEFAULTS["llama_port"], "default")


def test_yaml_origins_name_file_line_and_column():
    data = {"llama_parallel": 0, "_origins": {"llama_parallel": "group_data/all.yml:7:17"}}
    with pytest.raises(SettingsError, match=r"^group_data/all.yml:7:17: llama_parallel = 0: expected an integer"):
        resolve(host_layers(all_data=data))


def test_pyinfra_connector_keys_are_not_ours():
    values, _ = resolve([Scope("inventory.py", {"ssh_user": "root", "ssh_port": 2222, "_sudo": True})])
    assert set(values) == set(DEFAULTS)


@pytest.mark.parametrize(
    "key,value,words",
    [
        ("llama_port", 0, "llama_port = 0: expected an integer from 1 to 65535"),
        ("llama_ctx_size", "64k", "llama_ctx_size = '64k': expected an integer from 256 to"),
        ("llama_cache_type_k", "q8", "llama_cache_type_k = 'q8': expected one of 'f32', 'f16'"),
        ("image_backend", "rocm", "image_backend = 'rocm': expected None or one of 'cuda', 'vulkan', 'cpu'"),
        ("rpc_cache", "yes", "rpc_cache = 'yes': expected True or False"),
        ("llama_tensor_split", [0, 0], "expected None, 'auto' or a list of finite numbers"),
        ("rpc_cache_dir", "cache", "rpc_cache_dir = 'cache': expected an absolute path"),
        ("llama_extra_args", "--metrics", "llama_extra_args = '--metrics': expected a list of strings"),
    ],
)
def test_bad_value_names_file_key_value_and_expectation(key, value, words):
    with pytest.raises(SettingsError) as error:
        resolve([Scope("group_data/all.py", {key: value})])
    assert str(error.value).startswith("group_data/all.py: ")
    assert words in str(error.value)


def test_unknown_key_suggests_the_nearest():
    with pytest.raises(
        SettingsError, match=r"group_data/workers.py: unknown setting 'rpc_prot' \(did you mean 'rpc_port'\?\)"
    ):
        resolve([Scope("group_data/workers.py", {"rpc_prot": 50052})])


@pytest.mark.parametrize(
    "role,where,key",
    [
        ("workers", "groups", "llama_ctx_size"),
        ("workers", "host_data", "image_build_image"),
        ("coordinator", "groups", "rpc_cache"),
        ("coordinator", "host_data", "rpc_port"),
    ],
)
def test_a_setting_where_it_has_no_effect_is_refused(role, where, key):
    data = {key: DEFAULTS[key]}
    parts = {"groups": [(role, data)]} if where == "groups" else {where: data}
    with pytest.raises(SettingsError, match=rf"{key} = .* has no effect there: only the"):
        resolve(host_layers(role, **parts))


@pytest.mark.parametrize("role", ["coordinator", "workers"])
def test_every_setting_is_fine_in_all_and_on_the_command_line(role):
    data = {s.name: s.default for s in SETTINGS}
    assert resolve(host_layers(role, all_data=data, overrides=data))[0] == DEFAULTS


@pytest.mark.parametrize("key", ["gpus", "address", "deploy_dir"])
def test_host_settings_fit_every_role(key):
    for role in ("coordinator", "workers"):
        assert resolve(host_layers(role, host_data={key: DEFAULTS[key]}))[1][key] == "inventory.py (host 10.0.0.2)"


def test_readme_shows_the_generated_table():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert with_table(readme) == readme, "README.md is stale: python3 -m llama_rpc_deploy settings --write-readme"
    assert settings_table().count("\n| `") == len(SETTINGS)
