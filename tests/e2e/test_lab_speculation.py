"""Speculative decoding on the lab, through the split (llama_rpc_deploy/speculation.py).

The oracle is llama-server itself: the lab's split without speculation gives the greedy tokens, and each mode must
give the same ones. The draft (lab.DRAFT_MODEL, testmodel.write_draft_model) skips every third word of the
sentence, so some drafts are rejected and some accepted; it runs on the coordinator's CPU (no GPU there), never on a
worker. ngram-mod needs no model: the sentence repeats. Speed is measured by benchmarks/speculation.py, not here.
"""

import pytest

from lab import lab
from lab.testmodel import PROMPT
from llama_rpc_deploy import client, status
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
