"""Models on demand (llama_models): llama-server as a router over a preset with one section per model."""

import configparser

import pytest

from llama_rpc_deploy import quoting
from llama_rpc_deploy.render import MODELS_PRESET_MOUNT, coordinator_files, models_preset
from llama_rpc_deploy.settings import SettingsError

from .helpers import MODEL, cluster, flag, server_script, words

QWEN = "/srv/models/Qwen/Qwen3-8B-Q4_K_M.gguf"
TWO = {
    "qwen3-8b": {"llama_model_path": QWEN, "llama_ctx_size": 32768, "llama_parallel": 1, "llama_tensor_split": [1, 3]}
}


def preset(c) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(comment_prefixes=(";",), inline_comment_prefixes=None)
    parser.read_string(models_preset(c))
    return parser


def test_one_model_has_no_router():
    c = cluster(all_data={"llama_tensor_split": [1, 1]})
    argv = words(server_script(c))
    assert not c.router and c.served_models() == []
    assert flag(argv, "--model") == "/models/gemma-4-31B-it-qat-UD-Q4_K_XL.gguf"
    assert "--models-preset" not in argv
    assert not any(path.endswith(".ini") for path in coordinator_files(c, "img"))


def test_router_takes_the_model_options_out_of_the_command_line():
    c = cluster(all_data={"llama_tensor_split": [1, 1], "llama_models": TWO})
    argv = words(server_script(c))
    assert flag(argv, "--models-preset") == MODELS_PRESET_MOUNT
    assert flag(argv, "--models-max") == "1"  # rpc-server serves one client: one model at a time
    for option in ("--model", "--ctx-size", "--parallel", "--tensor-split", "--n-gpu-layers"):
        assert option not in argv
    assert flag(argv, "--rpc") == "127.0.0.1:50100" and flag(argv, "--device") == "RPC0,CUDA0"
    volumes = [argv[i + 1] for i, a in enumerate(argv) if a == "--volume"]
    assert "/srv/models/lmstudio-community:/models:ro" in volumes
    assert "/srv/models/Qwen:/models-1:ro" in volumes
    assert f"/opt/llama-rpc/llama-server-models.ini:{MODELS_PRESET_MOUNT}:ro" in volumes


def test_each_model_gets_its_own_section():
    c = cluster(all_data={"llama_tensor_split": [1, 1], "llama_ctx_size": 65536, "llama_models": TWO})
    ini = preset(c)
    default = "gemma-4-31B-it-qat-UD-Q4_K_XL"
    assert c.served_models() == [default, "qwen3-8b"]
    assert ini.sections() == [default, "qwen3-8b"]
    assert dict(ini[default]) == {
        "model": "/models/gemma-4-31B-it-qat-UD-Q4_K_XL.gguf",
        "n-gpu-layers": "999",
        "tensor-split": "1,1",
        "ctx-size": "65536",
        "parallel": "4",
        "cache-type-k": "f16",
        "cache-type-v": "f16",
        "flash-attn": "auto",
        "load-on-startup": "true",
    }
    assert dict(ini["qwen3-8b"]) == {
        "model": "/models-1/Qwen3-8B-Q4_K_M.gguf",
        "n-gpu-layers": "999",
        "tensor-split": "1,3",
        "ctx-size": "32768",
        "parallel": "1",
        "cache-type-k": "f16",
        "cache-type-v": "f16",
        "flash-attn": "auto",
    }


def test_an_entry_with_llama_model_paths_file_names_the_default():
    models = {**TWO, "gemma": {"llama_model_path": MODEL, "llama_kv_unified": True}}
    c = cluster(all_data={"llama_models": models})
    assert c.default_model == "gemma" and c.served_models() == ["gemma", "qwen3-8b"]
    ini = preset(c)
    assert ini["gemma"]["kv-unified"] == "true" and ini["gemma"]["load-on-startup"] == "true"
    assert "load-on-startup" not in ini["qwen3-8b"]


def test_a_projector_per_model_is_mounted():
    models = {"vision": {"llama_model_path": "/data/vl/model.gguf", "llama_mmproj_path": "/data/vl/mmproj-model.gguf"}}
    c = cluster(all_data={"llama_models": models, "llama_mmproj_path": "/srv/proj/mmproj-gemma.gguf"})
    ini = preset(c)
    assert ini["vision"]["model"] == "/models-2/model.gguf" and ini["vision"]["mmproj"] == "/models-2/mmproj-model.gguf"
    assert ini[c.default_model]["mmproj"] == "/mmproj/mmproj-gemma.gguf"
    plain = cluster(all_data={"llama_models": TWO, "llama_mmproj_path": "/srv/proj/mmproj-gemma.gguf"})
    assert "mmproj" not in preset(plain)["qwen3-8b"]  # the shared projector is llama_model_path's model's only


@pytest.mark.parametrize(
    "models, words_",
    [
        ("qwen", "expected a mapping of model names"),
        ({"a b": {"llama_model_path": QWEN}}, "model name 'a b'"),
        ({"-x": {"llama_model_path": QWEN}}, "model name '-x'"),
        (
            {"q": {"llama_ctx_size": 4096}},
            "q = {'llama_ctx_size': 4096}: expected a mapping with at least llama_model_path",
        ),
        ({"q": {"llama_model_path": QWEN, "rpc_port": 1}}, "q.rpc_port: expected one of the settings a model may set"),
        ({"q": {"llama_model_path": QWEN, "llama_ctx_size": "big"}}, "q.llama_ctx_size = 'big': expected an integer"),
        (
            {"q": {"llama_model_path": "/srv/m;x.gguf"}},
            "q.llama_model_path = '/srv/m;x.gguf': expected an absolute path",
        ),
        ({"q": {"llama_model_path": "/srv/m/x.bin"}}, "llama_model_path = '/srv/m/x.bin': expected a .gguf file"),
        ({"q": {"llama_model_path": QWEN, "llama_parallel": 128}}, "(llama_models: q): llama_parallel = 128"),
        ({"q": {"llama_model_path": QWEN, "llama_tensor_split": [1, 1, 1]}}, "expected 2 numbers, one per device"),
        ({"q": {"llama_model_path": QWEN}, "r": {"llama_model_path": QWEN}}, "under two names"),
        (
            {"gemma-4-31B-it-qat-UD-Q4_K_XL": {"llama_model_path": QWEN}},
            "is served as 'gemma-4-31B-it-qat-UD-Q4_K_XL' too",
        ),
    ],
)
def test_bad_models_are_refused_in_one_line(models, words_):
    with pytest.raises(SettingsError) as error:
        cluster(all_data={"llama_models": models, "llama_ctx_size": 32768})
    message = str(error.value)
    assert words_ in message and "\n" not in message
    assert message.startswith("group_data/all.py")


def test_the_preset_cannot_carry_what_its_ini_cannot_quote():
    for bad in ("a;b", "a#b", " a", "a ", "a\nb"):
        with pytest.raises(ValueError):
            quoting.ini(bad)
    assert quoting.ini("/models/file (1) [q4] & more.gguf") == "/models/file (1) [q4] & more.gguf"


@pytest.mark.xdist_group("sentence models")  # tests/conftest.py: written once, on one worker
def test_plan_plans_every_model_with_its_own_settings(tmp_path, capsys, place_sentence_model):
    """`plan` with llama_models: one table per model, each model's context and split; a model that does
    not fit fails the command."""
    import json

    from llama_rpc_deploy.__main__ import main

    inventory = tmp_path / "inventory.py"
    inventory.write_text(
        'coordinator = [("10.0.0.10", {"gpus": ["RTX 4080"]})]\nworkers = [("10.0.0.20", {"gpus": ["RTX 5060 Ti"]})]\n'
    )
    first = place_sentence_model("one", tmp_path / "one.gguf")  # lab.testmodel's sentence models (tests/conftest.py)
    second = place_sentence_model("two", tmp_path / "two" / "two.gguf")
    models = {
        "two": {
            "llama_model_path": str(second),
            "llama_ctx_size": 1024,
            "llama_parallel": 1,
            "llama_tensor_split": [1, 3],
        }
    }
    data = [
        "--data",
        f"llama_model_path={first}",
        "--data",
        f"llama_models={json.dumps(models)}",
        "--data",
        "llama_ctx_size=2048",
        "--data",
        "llama_parallel=2",
        "--data",
        "llama_tensor_split=[1,1]",
    ]
    assert main(["plan", "-i", str(inventory), *data]) == 0
    out = capsys.readouterr().out
    assert "model 'one' (loaded at start):" in out and "model 'two':" in out
    one, two = out.split("model 'two':")
    assert "context: 2048 tokens, 2 slots" in one and "tensor split: 1,1 " in one
    assert "context: 1024 tokens, 1 slots" in two and "tensor split: 1,3 " in two
    huge = {"two": {**models["two"], "llama_ctx_size": 16777216}}
    assert main(["plan", "-i", str(inventory), *data[:2], "--data", f"llama_models={json.dumps(huge)}", *data[4:]]) == 2


def test_the_folder_serves_every_model_of_its_own():
    from llama_rpc_deploy.cluster import folder_models

    folder = "/srv/models/lmstudio-community"
    files = [
        f"{folder}/{n}"
        for n in (
            "gemma-4-31B-it-qat-UD-Q4_K_XL.gguf",
            "mmproj-gemma-4-31B-F16.gguf",
            "mtp-gemma-4-31B.gguf",
            "Qwen3 8B (Q4_K_M).gguf",
            "big-00001-of-00002.gguf",
            "big-00002-of-00002.gguf",
            "notes.txt",
        )
    ]
    assert [f.rsplit("/", 1)[1] for f in folder_models(files)] == [
        "Qwen3 8B (Q4_K_M).gguf",
        "big-00001-of-00002.gguf",
        "gemma-4-31B-it-qat-UD-Q4_K_XL.gguf",
    ]
    c = cluster(
        all_data={
            "llama_models_folder": True,
            "llama_tensor_split": [1, 1],
            "llama_models": {"qwen": {"llama_model_path": files[3], "llama_ctx_size": 8192}},
        }
    )
    assert c.router and c.served_models() == ["gemma-4-31B-it-qat-UD-Q4_K_XL", "qwen"]  # before the listing
    c = c.with_folder(files)
    assert c.served_models() == ["gemma-4-31B-it-qat-UD-Q4_K_XL", "qwen", "big-00001-of-00002"]
    ini = preset(c)
    assert ini["qwen"]["ctx-size"] == "8192" and ini["qwen"]["model"] == "/models/Qwen3 8B (Q4_K_M).gguf"
    assert ini["big-00001-of-00002"]["model"] == "/models/big-00001-of-00002.gguf"


def test_two_files_of_one_name_are_refused():
    c = cluster(all_data={"llama_models_folder": True})
    with pytest.raises(SettingsError, match="would be served as 'a-b', which another file is"):
        c.with_folder(["/srv/models/lmstudio-community/a b.gguf", "/srv/models/lmstudio-community/a-b.gguf"])


@pytest.mark.xdist_group("sentence models")
def test_plan_reads_the_folder_here(tmp_path, capsys, place_sentence_model):
    from llama_rpc_deploy.__main__ import main

    inventory = tmp_path / "inventory.py"
    inventory.write_text(
        'coordinator = [("10.0.0.10", {"gpus": ["RTX 4080"]})]\nworkers = [("10.0.0.20", {"gpus": ["RTX 5060 Ti"]})]\n'
    )
    first = place_sentence_model("one", tmp_path / "models" / "one.gguf")  # lab.testmodel's sentence models
    place_sentence_model("two", tmp_path / "models" / "two.gguf")
    data = [
        "--data",
        f"llama_model_path={first}",
        "--data",
        "llama_models_folder=true",
        "--data",
        "llama_ctx_size=2048",
    ]
    assert main(["plan", "-i", str(inventory), *data]) == 0
    out = capsys.readouterr().out
    assert "model 'one' (loaded at start):" in out and "model 'two':" in out
    missing = ["--data", "llama_model_path=/nowhere/one.gguf", *data[2:]]
    assert main(["plan", "-i", str(inventory), *missing]) == 2
    assert "llama_models_folder: /nowhere: not on this machine" in capsys.readouterr().err


def test_a_folder_file_no_setting_could_name_is_refused_in_one_line():
    c = cluster(all_data={"llama_models_folder": True})
    with pytest.raises(SettingsError) as error:
        c.with_folder(["/srv/models/lmstudio-community/q4;v2.gguf"])
    message = str(error.value)
    assert message.startswith(
        "group_data/all.py: llama_models_folder: the file '/srv/models/lmstudio-community/q4;v2.gguf'"
    )
    assert "expected an absolute path" in message and "\n" not in message


def test_a_request_may_name_a_model_of_the_folder():
    """The folder's models are listed on the coordinator at deploy time: the client lets the router answer."""
    from llama_rpc_deploy.client import model_field

    assert model_field(cluster(all_data={"llama_models_folder": True}), "qwen") == {"model": "qwen"}
    with pytest.raises(ValueError, match="expected one of the served models"):
        model_field(cluster(all_data={"llama_models": TWO}), "qwen")
