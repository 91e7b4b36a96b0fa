"""`llama-rpc plan` answers "will it fit?" before any editing: on the checkout's own inventory.py and group_data,
unedited, with only --model; and with --gpus, with no inventory at all. The deploy still refuses both."""

import pytest

from llama_rpc_deploy.__main__ import main
from llama_rpc_deploy.plan import gpus_inventory
from llama_rpc_deploy.loading import offline_cluster
from llama_rpc_deploy.paths import PROJECT
from llama_rpc_deploy.settings import SettingsError

from .shaped import write_shaped


@pytest.fixture
def model(tmp_path):
    """A 17 GB-class header (the data a hole): 60 layers of Q4_K, as the pair's model is split."""
    return write_shaped(
        tmp_path / "gemma.gguf",
        arch="llama",
        n_layer=60,
        n_embd=5376,
        n_head=32,
        n_head_kv=4,
        head_dim=128,
        n_ff=21504,
        n_vocab=262144,
    )


@pytest.fixture
def checkout(monkeypatch):
    monkeypatch.chdir(PROJECT)  # the checkout's group_data, as a new user runs it
    return PROJECT / "inventory.py"


def test_plan_on_the_unedited_checkout_with_only_a_model(checkout, model, capsys):
    assert main(["plan", "-i", str(checkout), "--model", str(model)]) == 0
    out, err = capsys.readouterr()
    assert "RTX 5060 Ti 16GB" in out and "RTX 4080" in out and "tensor split" in out
    assert "192.0.2.10, 192.0.2.20: example addresses" in err and "a plan does not need them" in err
    assert "CHANGE_ME" not in err  # --model names the file


def test_plan_without_a_model_says_to_pass_one(checkout, capsys):
    assert main(["plan", "-i", str(checkout)]) == 2
    assert "plan needs the model: pass --model LOCAL.gguf" in capsys.readouterr().err


def test_plan_with_gpus_and_no_inventory(checkout, model, tmp_path, capsys):
    assert main(["plan", "--gpus", "RTX 4080", "RTX 5060 Ti 16GB", "--model", str(model)]) == 0
    out, err = capsys.readouterr()
    rows = [line.split()[:3] for line in out.splitlines() if line.startswith(("RPC", "CUDA"))]
    # the worker's card first, the coordinator's last
    assert rows == [["RPC0", "192.0.2.20", "RTX"], ["CUDA0", "192.0.2.10", "RTX"]]
    assert "RTX 5060 Ti 16GB" in out.splitlines()[1] and "RTX 4080" in out.splitlines()[2]
    assert err == ""
    # the same plan as that inventory written out, and a card that is not known is one line
    assert main(["plan", "--gpus", "RTX 4080", "GTX 9999", "--model", str(model)]) == 2
    assert "GTX 9999" in capsys.readouterr().err


def test_the_deploy_still_refuses_the_placeholder_and_the_example_addresses(checkout, tmp_path):
    with pytest.raises(SettingsError, match="llama_model_path = '/CHANGE_ME/"):
        offline_cluster(checkout)
    with pytest.raises(SettingsError, match="example addresses"):
        offline_cluster(gpus_inventory(["RTX 4080", "RTX 4080"], tmp_path), overrides={"llama_model_path": "/m/x.gguf"})


def test_tune_refuses_hosts_whose_cards_are_not_listed_yet(checkout, tmp_path, capsys):
    """tune renders llama-server's launch script from the inventory alone (and compares it with the deployed one):
    a host whose gpus are learned by the deploy would render another script; it says so before measuring."""
    inventory = tmp_path / "inventory.py"
    text = checkout.read_text().replace('"gpus": ["RTX 5060 Ti 16GB"]', '"image_backend": "cuda"')
    inventory.write_text(text.replace("192.0.2.", "10.9.9."))  # not the example addresses, which it refuses
    assert main(["tune", "-i", str(inventory), "--data", "llama_model_path=/models/m.gguf"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: tune: gpus is not set for 10.9.9.20: tune renders llama-server's launch script")
    assert f"llama-rpc probe -i {inventory}" in err
