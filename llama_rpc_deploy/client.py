"""Talk to a deployed llama-server from the control machine: its URL, the API key, a completion.

Used by `complete`, `bench`, the benchmarks and the verification suite, so all of them send
the key the same way (Authorization: Bearer, read from llama_api_key_file; never printed).
"""

from __future__ import annotations

import json
import urllib.request

from . import render
from .cluster import Cluster, api_key


def server_url(cluster: Cluster) -> str:
    """The API's URL: where the front listens (render.front_address: an IPv6 address in brackets)."""
    return f"http://{render.front_address(cluster)}"


def headers(cluster: Cluster, with_key: bool = True) -> dict[str, str]:
    h = {"Content-Type": "application/json"}
    if with_key and cluster.settings["llama_api_key_file"]:
        h["Authorization"] = f"Bearer {api_key(cluster)}"
    return h


def post(
    cluster: Cluster, path: str, body: dict, timeout: float = 300, with_key: bool = True, server: str | None = None
) -> dict:
    """POST JSON, return the JSON reply; urllib.error.HTTPError on a 4xx/5xx answer. server: another llama-server's
    URL than the cluster's (a benchmark's own, asked with the cluster's key)."""
    request = urllib.request.Request(
        (server or server_url(cluster)) + path, data=json.dumps(body).encode(), headers=headers(cluster, with_key)
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.load(response)


def get(cluster: Cluster, path: str, timeout: float = 10) -> dict:
    """GET, return the JSON reply (with the API key, when one is set)."""
    return json.loads(get_text(cluster, path, timeout))


def get_text(cluster: Cluster, path: str, timeout: float = 10) -> str:
    """GET, return the reply's text (with the API key, when one is set): /metrics."""
    request = urllib.request.Request(server_url(cluster) + path, headers=headers(cluster))
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read().decode()


def model_field(cluster: Cluster, model: str | None = None) -> dict:
    """The request's model field: with models on demand, the model to answer (llama_model_path's unless
    named); one model needs none."""
    if model and model not in cluster.served_models() and not cluster.settings["llama_models_folder"]:
        # (the folder's models are listed on the coordinator at deploy time: the router answers for those)
        raise ValueError(
            f"model {model!r}: expected one of the served models ({', '.join(cluster.served_models()) or 'none: llama_models is empty'})"
        )
    return {"model": model or cluster.default_model} if cluster.router else {}


def complete(
    cluster: Cluster,
    prompt: str,
    n_predict: int,
    timeout: float = 300,
    model: str | None = None,
    server: str | None = None,
    **options,
) -> dict:
    return post(
        cluster,
        "/completion",
        {**model_field(cluster, model), "prompt": prompt, "n_predict": n_predict, "cache_prompt": False, **options},
        timeout=timeout,
        server=server,
    )


def complete_command(args) -> int:
    """`llama-rpc complete`: one completion from the deployed cluster, and its tokens/s."""
    from .loading import offline_cluster

    result = complete(offline_cluster(args.inventory), args.prompt, args.n_predict, model=args.model)
    t = result.get("timings", {})
    print(f"prompt: {args.prompt!r}")
    print(f"completion: {result.get('content', '')!r}")
    print(
        f"{t.get('predicted_n', 0)} tokens at {t.get('predicted_per_second', 0):.1f} tokens/s "
        f"(prompt {t.get('prompt_n', 0)} tokens at {t.get('prompt_per_second', 0):.1f} tokens/s)"
    )
    return 0
