"""Speculative decoding on the lab, through the split (llama_rpc_deploy/speculation.py).

The oracle is llama-server itself: the lab's split without speculation gives the greedy tokens, and each mode must
give the same ones. The draft (lab.DRAFT_MODEL, testmodel.write_draft_model) skips every third word of the
sentence, so some drafts are rejected and some accepted; it runs on the coordinator's CPU (no GPU there), never on a
worker. ngram-mod needs no model: the sentence repeats. The Gemma 4 assistant (MTP drafting, lab.ASSISTANT_MODEL)
drafts for lab.GEMMA4_MODEL, the same sentence in Gemma 4's architecture, and runs where the target's last layers
are. Speed is measured by benchmarks/speculation.py and benchmarks/mtp.py, not here.
"""

import pytest

from lab import lab
from lab.testmodel import PROMPT
from llama_rpc_deploy import client, status, tune
from llama_rpc_deploy.loading import offline_cluster

from .lab_helpers import INVENTORY, deployed_and_serving, needs_docker, on, operations, pyinfra

pytestmark = needs_docker
N = 64  # tokens: two and a half turns of the sentence


def greedy(cluster) -> dict:
    """llama-server's greedy answer to PROMPT, with its token ids and timings (draft_n, draft_n_accepted)."""
    return client.complete(cluster, PROMPT, N, temperature=0, return_tokens=True)


@pytest.fixture(scope="module")
def plain():
    cluster = deployed_and_serving()
    reply = greedy(cluster)
    assert len(reply["tokens"]) == N and "draft_n" not in reply["timings"]
    return reply


def deployed_with(data: dict):
    args = [a for key, value in data.items() for a in ("--data", f"{key}={value}")]
    operations(pyinfra(*args, "--json"))
    return offline_cluster(INVENTORY, overrides=data)


@pytest.fixture(scope="module")
def restore(plain):
    yield
    operations(pyinfra("--json"))


def test_a_draft_model_gives_the_same_tokens_and_some_drafts_fail(plain, restore):
    cluster = deployed_with({"llama_spec_draft_path": lab.DRAFT_MODEL})
    script = on(0, "cat /opt/llama-rpc/llama-server.sh").stdout
    assert "--spec-type draft-simple" in script  # the draft's own type, read from its header on the coordinator
    assert "--spec-draft-device none" in script  # the coordinator's CPU: no drafted token crosses the network
    reply = greedy(cluster)
    assert reply["tokens"] == plain["tokens"] and reply["content"] == plain["content"]
    drafted, accepted = reply["timings"]["draft_n"], reply["timings"]["draft_n_accepted"]
    assert 0 < accepted < drafted, reply["timings"]
    hosts = status.collect(cluster, INVENTORY)
    spec = hosts[0].speculation
    assert spec["type"] == "draft-simple" and spec["drafted"] >= drafted and spec["accepted"] >= accepted, spec
    log = on(0, "journalctl -u llama-server --no-pager -o cat -n 3000").stdout
    assert "failed to initialize speculative decoding" not in log


def test_ngram_drafting_gives_the_same_tokens(plain, restore):
    cluster = deployed_with({"llama_spec_type": "ngram-mod"})
    assert "--spec-draft" not in on(0, "cat /opt/llama-rpc/llama-server.sh").stdout
    reply = greedy(cluster)
    assert reply["tokens"] == plain["tokens"]
    assert reply["timings"].get("draft_n_accepted", 0) > 0, reply["timings"]  # the sentence repeats


def test_a_gemma4_assistant_runs_by_the_targets_last_layers_and_gives_the_same_tokens(restore):
    """Its oracle is the same target split without it; it reads the KV of the target's last layers, on RPC1 here
    (the coordinator has no GPU), so that is where the deploy puts it."""
    target = deployed_with({"llama_model_path": lab.GEMMA4_MODEL})
    plain = greedy(target)
    assert len(plain["tokens"]) == N and "draft_n" not in plain["timings"]
    cluster = deployed_with({"llama_model_path": lab.GEMMA4_MODEL, "llama_spec_draft_path": lab.ASSISTANT_MODEL})
    script = on(0, "cat /opt/llama-rpc/llama-server.sh").stdout
    assert "--spec-type draft-mtp" in script  # the assistant's type, read from its header
    assert (
        "--spec-draft-device RPC1" in script
    )  # the device of layers 6 and 7 and the output (-ngl 6, split 1,1), as the plan places them
    reply = greedy(cluster)
    assert reply["tokens"] == plain["tokens"] and reply["content"] == plain["content"]
    drafted, accepted = reply["timings"]["draft_n"], reply["timings"]["draft_n_accepted"]
    assert 0 < accepted < drafted, reply["timings"]


def test_tune_turns_off_a_draft_that_never_pays_and_puts_the_deployed_script_back(restore):
    """The random target, whose text the draft never predicts: each drafted token costs a draft pass and a wider
    verify pass for nothing (benchmarks/speculation.py: 0.53x plain). tune's speculation stage must find "off"
    faster, beyond the noise (its interval's low end above 1), and leave the deployed launch script as it was."""
    data = {"llama_model_path": lab.RANDOM_MODEL, "llama_spec_draft_path": lab.DRAFT_MODEL}
    deployed_with(data)
    script = on(0, "cat /opt/llama-rpc/llama-server.sh").stdout
    lines = []
    report = tune.run(INVENTORY, only="speculation", repeats=2, confirm=3, overrides=data, log=lines.append)
    chosen = report.speculation
    assert report.spec_names[chosen.best] == "off", (chosen, lines)
    assert chosen.significant and chosen.interval[0] > 1.0, (chosen, lines)
    assert {s["max"] for s in report.spec_samples} >= {0, 3}  # off and the deployed maximum, both measured
    assert on(0, "cat /opt/llama-rpc/llama-server.sh").stdout == script
    assert on(0, "systemctl is-active llama-server").stdout.strip() == "active"
