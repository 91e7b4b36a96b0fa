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

import pytest

from llama_rpc_deploy import client
from lab.testmodel import PROMPT, SENTENCE, sentence_tokens, tokenize

from .lab_helpers import api, chat, needs_docker, openai_client, same_tokens, streamed_chat

pytestmark = needs_docker


def test_the_lab_tokenizes_the_prompt_as_the_model_intends(cluster):
    reply = client.post(cluster, "/tokenize", {"content": PROMPT, "add_special": True})
    assert reply["tokens"] == tokenize(PROMPT)


@pytest.mark.parametrize("call", [chat, streamed_chat], ids=["chat", "streamed"])
def test_split_lab_and_one_server_give_the_same_tokens(cluster, alone, call):
    results = {"split": call(api(cluster)), "alone": call(openai_client(alone, None))}
    for name, (text, tokens) in results.items():
        assert text == SENTENCE, name
        assert len(tokens) == len(sentence_tokens()), name
        if isinstance(tokens[0][0], int):
            assert [token for token, _ in tokens] == sentence_tokens(), name
    same_tokens(results["split"][1], results["alone"][1])


def test_plain_and_streamed_chat_agree(cluster):
    split = api(cluster)
    plain, streamed = chat(split), streamed_chat(split)
    assert plain[0] == streamed[0] == SENTENCE
    same_tokens(plain[1], streamed[1])
