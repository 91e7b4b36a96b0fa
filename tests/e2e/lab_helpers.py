"""What the end-to-end tests share (no test module imports another; the fixtures are in conftest.py): running the
deploy on the lab and commands on its hosts, reading pyinfra's JSON, the hosts' state, and asking the deployed
llama-server through OpenAI's client."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from openai import OpenAI

from lab import lab
from lab.testmodel import PROMPT, sentence_tokens
from llama_rpc_deploy import client, roles, transfer
from llama_rpc_deploy.cluster import api_key
from llama_rpc_deploy.paths import PROJECT
from llama_rpc_deploy.quoting import shell

needs_docker = pytest.mark.skipif(
    shutil.which("docker") is None or subprocess.run(["docker", "info"], capture_output=True).returncode != 0,
    reason="needs a running Docker engine (scripts/setup-machine.sh starts one)",
)
WORKERS = 2  # one coordinator and two workers: the deploy must handle more than one worker
INVENTORY = lab.LAB_DIR / "inventory.py"


def pyinfra(*args: str, timeout: int = 3000, inventory=INVENTORY) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["pyinfra", "-y", *args, str(inventory), "deploy.py"],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def on(host_index: int, command: str) -> subprocess.CompletedProcess:
    name = lab.host_names(WORKERS)[host_index]
    return subprocess.run(
        ["docker", "exec", f"{lab.PREFIX}-{name}", "sh", "-c", command], capture_output=True, text=True
    )


def operations(result: subprocess.CompletedProcess) -> list[dict]:
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout)["results"]["operations"]


def changed(ops: list[dict], prefix: str) -> list[str]:
    """Hosts on which an operation whose name contains `prefix` made a change."""
    return [h for op in ops if prefix in op["name"] for h in op["success"]]


# what a failed deploy must leave as it was on every host: files, services, containers, images, firewall
STATE = (
    "sha256sum /opt/llama-rpc/* /etc/systemd/system/rpc-server.service /etc/systemd/system/llama-server.service "
    "/etc/systemd/system/llama-rpc-tunnel.service /etc/llama-rpc/* /etc/llama-rpc-tunnel/* "
    "/root/.ssh/authorized_keys 2>/dev/null; "
    "find /models /var/cache/llama-rpc -exec stat -c '%n %s %Y' {} + 2>/dev/null | sort; "
    "systemctl show -p ActiveEnterTimestampMonotonic -p NRestarts rpc-server llama-server llama-rpc-tunnel; "
    "for c in $(docker ps -q); do docker inspect --format '{{.Name}} {{.State.StartedAt}}' $c; done | sort; "
    "docker images -q | sort; iptables -S"
)


def deployed_and_serving():
    """The lab up, deployed as its inventory says, and serving: the cluster as the tests see it."""
    from llama_rpc_deploy.loading import offline_cluster
    from llama_rpc_deploy.loadtest import until_serving

    lab.up(workers=WORKERS)
    operations(pyinfra("--json"))
    cluster = offline_cluster(INVENTORY)
    assert until_serving(cluster, 120, expect_down=False).seconds is not None
    return cluster


def snapshot() -> dict[str, str]:
    """STATE on every lab host."""
    return {
        name: subprocess.run(
            ["docker", "exec", f"{lab.PREFIX}-{name}", "sh", "-c", STATE], capture_output=True, text=True
        ).stdout
        for name in lab.host_names(WORKERS)
    }


# --- the image transfer (test_lab_layers.py, test_lab_vulkan.py) ---

SKIP_LAYERS_FILTER = f"/opt/llama-rpc/{roles.SKIP_LAYERS}"
WORKER_LAYERS = "/var/tmp/layers-of-the-worker"  # on the coordinator: the layers `send` says the worker has
NEW_BYTES = 3_000_000  # a probe image's one new layer of random bytes


def send(cluster, image: str, have, worker: int = 0) -> subprocess.CompletedProcess:
    """The deploy's transfer command to the worker of that index, run on the coordinator under bash as the deploy
    runs it, with `have` as the worker's images."""
    lab.put_file("coordinator", WORKER_LAYERS, transfer.layers_text(have))
    command = transfer.send_command(
        image, cluster.workers[worker].address, layers_file=WORKER_LAYERS, skip_layers=SKIP_LAYERS_FILTER
    )
    return on(0, f"bash -c {shell(command)}")


def rx_bytes(host: int) -> int:
    return int(on(host, "cat /sys/class/net/eth0/statistics/rx_bytes").stdout)


# --- the deployed llama-server through OpenAI's client (token for token: test_lab_tokens.py) ---

TOP = 5
# llama-server's log-probabilities of the same token, split vs alone: f16 activations and KV cache
# round at 2**-11 relative, on logits of about 20; measured by hand 0.0005 (two RPC processes).
LOGPROB_TOLERANCE = 0.01


def openai_client(base_url: str, key: str | None) -> OpenAI:
    return OpenAI(base_url=base_url + "/v1", api_key=key or "no-key-needed", timeout=300, max_retries=0)


def api(cluster) -> OpenAI:
    """The deployed lab's llama-server, with its API key."""
    key = api_key(cluster) if cluster.settings["llama_api_key_file"] else None
    return openai_client(client.server_url(cluster), key)


def request() -> dict:
    return dict(
        model="lab",
        messages=[{"role": "user", "content": PROMPT}],
        temperature=0,
        max_tokens=len(sentence_tokens()),
        logprobs=True,
        top_logprobs=TOP,
    )


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
