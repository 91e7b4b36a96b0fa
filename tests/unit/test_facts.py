"""The facts' parsing of what the hosts print (the commands themselves run in the lab tests)."""

import base64
import gzip

from llama_rpc_deploy.gpus import Found
from llama_rpc_deploy.facts import DockerImageId, GgufHeader, MissingCommands, NvidiaGpus, SshHostKey, TcpListener


def test_nvidia_smi_csv():
    out = ["NVIDIA GeForce RTX 4080, 16376, 8.9", "NVIDIA GeForce RTX 5060 Ti, 15848, 12.0"]
    assert NvidiaGpus().process(out) == [
        Found("NVIDIA GeForce RTX 4080", 16376, "8.9"),
        Found("NVIDIA GeForce RTX 5060 Ti", 15848, "12.0"),
    ]
    assert NvidiaGpus().process([]) == []
    assert "--query-gpu=name,memory.total,compute_cap --format=csv,noheader,nounits" in NvidiaGpus().command()


def test_image_id_and_host_key():
    assert DockerImageId().process(["sha256:" + "a" * 64]) == "sha256:" + "a" * 64
    assert DockerImageId().process([]) is None
    assert SshHostKey().process(["ssh-ed25519 AAAAC3Nz root@worker"]) == "ssh-ed25519 AAAAC3Nz"


def test_listener_names_the_process():
    line = 'LISTEN 0 128 172.30.57.11:50052 0.0.0.0:* users:(("rpc-server",pid=412,fd=3))'
    assert TcpListener().process([line]) == "rpc-server"
    assert TcpListener().process(["LISTEN 0 128 0.0.0.0:22 0.0.0.0:*"]) == ""
    assert TcpListener().process([]) is None


def test_missing_commands_and_gguf_header():
    assert MissingCommands().process(["zstd", ""]) == ["zstd"]
    payload = b"GGUF" + bytes(100)
    assert GgufHeader().process(["4096", base64.b64encode(gzip.compress(payload)).decode()]) == (4096, payload)
    assert GgufHeader().process(["stat: cannot stat"]) is None
