import pytest

from llama_rpc_deploy.settings import DEFAULTS, SETTINGS, Layer, SettingsError, resolve, settings_table


def test_defaults_pass_their_own_checks():
    for s in SETTINGS:
        if s.name != "llama_model_path":  # the placeholder is refused later, by the cluster check
            assert s.check.ok(s.default), s.name


def test_higher_layer_wins_and_source_is_recorded():
    values, sources = resolve([Layer("inventory.py (host a)", {"llama_port": 9000}),
                               Layer("group_data/all.py", {"llama_port": 8081, "llama_parallel": 2})])
    assert values["llama_port"] == 9000 and sources["llama_port"] == "inventory.py (host a)"
    assert values["llama_parallel"] == 2 and sources["llama_parallel"] == "group_data/all.py"
    assert values["rpc_port"] == DEFAULTS["rpc_port"] and sources["rpc_port"] == "default"


def test_pyinfra_connector_keys_are_not_ours():
    values, _ = resolve([Layer("inventory.py", {"ssh_user": "root", "ssh_port": 2222, "_sudo": True})])
    assert "ssh_user" not in values


@pytest.mark.parametrize("key,value,words", [
    ("llama_port", 0, "llama_port = 0: expected an integer from 1 to 65535"),
    ("llama_ctx_size", "64k", "llama_ctx_size = '64k': expected an integer >= 256"),
    ("llama_cache_type_k", "q8", "llama_cache_type_k = 'q8': expected one of 'f32', 'f16'"),
    ("image_backend", "rocm", "image_backend = 'rocm': expected one of 'cuda', 'cpu'"),
    ("rpc_cache", "yes", "rpc_cache = 'yes': expected True or False"),
    ("llama_tensor_split", [0, 0], "expected None, 'auto' or a list of numbers >= 0"),
    ("rpc_cache_dir", "cache", "rpc_cache_dir = 'cache': expected an absolute path"),
    ("llama_extra_args", "--metrics", "llama_extra_args = '--metrics': expected a list of strings"),
])
def test_bad_value_names_file_key_value_and_expectation(key, value, words):
    with pytest.raises(SettingsError) as error:
        resolve([Layer("group_data/all.py", {key: value})])
    assert str(error.value).startswith("group_data/all.py: ")
    assert words in str(error.value)


def test_unknown_key_suggests_the_nearest():
    with pytest.raises(SettingsError, match=r"group_data/workers.py: unknown setting 'rpc_prot' \(did you mean 'rpc_port'\?\)"):
        resolve([Layer("group_data/workers.py", {"rpc_prot": 50052})])


def test_settings_table_lists_every_setting_once():
    table = settings_table()
    for s in SETTINGS:
        assert table.count(f"| `{s.name}` |") == 1


def test_readme_shows_the_generated_table():
    from pathlib import Path

    from llama_rpc_deploy.settings import with_table

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert with_table(readme) == readme, "README.md is stale: python3 -m llama_rpc_deploy settings --write-readme"
