"""The split is correct, token for token (issue 14).

The lab serves the sentence model (`testmodel.write_sentence_model`, at /models/lab.gguf), split across
the coordinator and two workers. The test starts ONE llama-server with the same model and the same
image on the coordinator, alone (no RPC), and asks both the same chat completion, plain and streamed,
through the official OpenAI client at temperature 0: the token ids must be the same, their
log-probabilities the same to within f16 rounding, and the text must be SENTENCE. The model wins every
step by a logit margin of more than 12 (tests/unit/test_testmodel.py), so rounding cannot make two
correct servers differ, while every layer moves the logits: a layer skipped or garbled on a worker
changes the text or, at the least, the log-probabilities.
"""
from __future__ import annotations

import json
import time
import urllib.request

import pytest
from openai import OpenAI

from llama_rpc_deploy import client
from llama_rpc_deploy.cluster import api_key
from llama_rpc_deploy.deployment import from_cluster
from lab.testmodel import PROMPT, SENTENCE, sentence_tokens, tokenize

from . import deployed_and_serving, needs_docker, on

pytestmark = needs_docker
COORDINATOR = 0
ALONE = "llama-rpc-tokens-alone"  # the single llama-server's container on the coordinator
ALONE_PORT = 18080
TOP = 5
# llama-server's log-probabilities of the same token, split vs alone: f16 activations and KV cache
# round at 2**-11 relative, on logits of about 20; measured by hand 0.0005 (two RPC processes).
LOGPROB_TOLERANCE = 0.01


@pytest.fixture(scope="module")
def cluster():
    return deployed_and_serving()


@pytest.fixture(scope="module")
def alone(cluster):
    """URL of one llama-server with the deployed image and model, on the coordinator, no RPC devices."""
    s = cluster.settings
    image = from_cluster(cluster, with_key=False).image
    host = cluster.coordinator.address
    args = ["--model", s["llama_model_path"], "--host", host, "--port", ALONE_PORT, "--ctx-size", s["llama_ctx_size"],
            "--parallel", s["llama_parallel"], "--cache-type-k", s["llama_cache_type_k"],
            "--cache-type-v", s["llama_cache_type_v"], "--flash-attn", s["llama_flash_attn"],
            *(["--threads", s["llama_threads"]] if s["llama_threads"] else [])]
    model_dir = s["llama_model_path"].rsplit("/", 1)[0]
    on(COORDINATOR, f"docker rm -f {ALONE} >/dev/null 2>&1")
    started = on(COORDINATOR, f"docker run -d --rm --name {ALONE} --network host -v {model_dir}:{model_dir}:ro "
                              f"{image} server {' '.join(str(a) for a in args)}")
    assert started.returncode == 0, started.stderr
    url = f"http://{host}:{ALONE_PORT}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as response:
                    if json.load(response).get("status") == "ok":
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("the lone llama-server did not come up:\n" + on(COORDINATOR, f"docker logs {ALONE}").stderr[-3000:])
            time.sleep(1)
        yield url
    finally:
        on(COORDINATOR, f"docker rm -f {ALONE} >/dev/null 2>&1")


def openai_client(base_url: str, key: str | None) -> OpenAI:
    return OpenAI(base_url=base_url + "/v1", api_key=key or "no-key-needed", timeout=300, max_retries=0)


def split_api(cluster) -> OpenAI:
    """The deployed lab's llama-server, with its API key."""
    key = api_key(cluster) if cluster.settings["llama_api_key_file"] else None
    return openai_client(client.server_url(cluster), key)


def request() -> dict:
    return dict(model="lab", messages=[{"role": "user", "content": PROMPT}], temperature=0,
                max_tokens=len(sentence_tokens()), logprobs=True, top_logprobs=TOP)


def steps(items) -> list[tuple]:
    """Per generated token: (its id or text, {top id or text: logprob}). llama-server adds `id`."""
    def key(x):
        return getattr(x, "id", None) if getattr(x, "id", None) is not None else x.token
    return [(key(item), {key(t): t.logprob for t in item.top_logprobs}) for item in items]


def chat(api: OpenAI) -> tuple[str, list[tuple]]:
    reply = api.chat.completions.create(**request())
    choice = reply.choices[0]
    return choice.message.content, steps(choice.logprobs.content)


def streamed_chat(api: OpenAI) -> tuple[str, list[tuple]]:
    text, items = "", []
    for chunk in api.chat.completions.create(**request(), stream=True):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            if choice.logprobs and choice.logprobs.content:
                items += choice.logprobs.content
    return text, steps(items)


def same_tokens(split: list[tuple], alone: list[tuple], tolerance: float = LOGPROB_TOLERANCE) -> None:
    assert [token for token, _ in split] == [token for token, _ in alone]
    for n, ((token, top_split), (_, top_alone)) in enumerate(zip(split, alone)):
        common = top_split.keys() & top_alone.keys()
        assert token in common and len(common) >= TOP - 2, (n, top_split, top_alone)  # runners-up may swap
        for t in common:
            assert abs(top_split[t] - top_alone[t]) <= tolerance, (n, t, top_split[t], top_alone[t])
        runner_up = max(p for t, p in top_split.items() if t != token)
        assert runner_up < -10, (n, top_split)  # the margin reached the client: the logits are the model's


def test_the_lab_tokenizes_the_prompt_as_the_model_intends(cluster):
    reply = client.post(cluster, "/tokenize", {"content": PROMPT, "add_special": True})
    assert reply["tokens"] == tokenize(PROMPT)


@pytest.mark.parametrize("call", [chat, streamed_chat], ids=["chat", "streamed"])
def test_split_lab_and_one_server_give_the_same_tokens(cluster, alone, call):
    results = {"split": call(split_api(cluster)), "alone": call(openai_client(alone, None))}
    for name, (text, tokens) in results.items():
        assert text == SENTENCE, name
        assert len(tokens) == len(sentence_tokens()), name
        if isinstance(tokens[0][0], int):
            assert [token for token, _ in tokens] == sentence_tokens(), name
    same_tokens(results["split"][1], results["alone"][1])


def test_plain_and_streamed_chat_agree(cluster):
    api = split_api(cluster)
    plain, streamed = chat(api), streamed_chat(api)
    assert plain[0] == streamed[0] == SENTENCE
    same_tokens(plain[1], streamed[1])
