"""The bad configurations of tests/bad_configs.py, through pyinfra against the lab.

Each must stop the run with exit status 1 and one line naming the file, the key, the value and what
was expected, and leave every host as it was: no file changed, no service or container restarted.
"""

from __future__ import annotations

import subprocess

import pytest

from lab import lab
from llama_rpc_deploy.paths import PROJECT
from llama_rpc_deploy.loading import load_inventory

from .lab_helpers import WORKERS, needs_docker, snapshot

from ..bad_configs import CASES, Bad, expected_words, on_coordinator, on_worker, write_case

pytestmark = needs_docker


@pytest.fixture(scope="module")
def base():
    inventory = lab.up(workers=WORKERS)
    # a model file only root can read (its content does not matter: the check stops before it is read)
    subprocess.run(
        [
            "docker",
            "exec",
            f"{lab.PREFIX}-coordinator",
            "sh",
            "-c",
            "head -c 64 /models/lab.gguf > /models/private.gguf && chmod 600 /models/private.gguf",
        ],
        check=True,
    )
    # a port some other program holds, on the coordinator and on the first worker (a transient unit)
    taker = f"systemd-run --unit={PORT_TAKER} /usr/bin/systemd-socket-activate -l {TAKEN_PORT} /bin/cat"
    for host in ("coordinator", "worker1"):
        subprocess.run(
            ["docker", "exec", f"{lab.PREFIX}-{host}", "sh", "-c", f"systemctl stop {PORT_TAKER} 2>/dev/null; {taker}"],
            check=True,
            capture_output=True,
        )
    yield inventory
    for host in ("coordinator", "worker1"):
        subprocess.run(["docker", "exec", f"{lab.PREFIX}-{host}", "systemctl", "stop", PORT_TAKER], capture_output=True)


def refused_untouched(case: Bad, base, tmp_path) -> str:
    """Run the deploy with the case's inventory: it must exit 1 with the case's words and leave every
    host as it was. Returns pyinfra's output."""
    hosts = load_inventory(base)
    inventory = write_case(base, case, tmp_path / "inventory.py")
    before = snapshot()
    result = subprocess.run(
        ["pyinfra", "-y", str(inventory), "deploy.py"], cwd=PROJECT, capture_output=True, text=True, timeout=300
    )
    after = snapshot()
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    for words in expected_words(
        case, inventory, hosts.get_group("coordinator")[0].name, hosts.get_group("workers")[0].name
    ):
        assert words in output
    # the refusal is our own line alone: no "pyinfra error in /.../llama_rpc_deploy/x.py line N:" before it
    assert "pyinfra error" not in output and "Traceback" not in output, output[-3000:]
    assert after == before
    return output


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_configuration_touches_no_host(case, base, tmp_path):
    output = refused_untouched(case, base, tmp_path)
    assert "Connecting" not in output  # stopped before pyinfra connected to any host


PORT_TAKER, TAKEN_PORT = "llama-rpc-test-port-taker", 18999
HOST_CASES = [
    Bad(
        "model-missing-on-coordinator",
        on_coordinator('{"llama_model_path": "/models/missing.gguf"}'),
        ("{c}: llama_model_path = '/models/missing.gguf': no such file on the coordinator",),
    ),
    Bad(
        "llama-port-taken",
        on_coordinator(f'{{"llama_port": {TAKEN_PORT}}}'),
        (f"port {TAKEN_PORT} is taken by systemd-socket-: expected it free for the front (change llama_port)",),
    ),
    Bad(
        "llama-server-port-taken",
        on_coordinator(f'{{"llama_server_port": {TAKEN_PORT}}}'),
        (
            f"port {TAKEN_PORT} is taken by systemd-socket-: expected it free for llama-server (change llama_server_port)",
        ),
    ),
    Bad(
        "rpc-port-taken",
        on_worker(f'{{"rpc_port": {TAKEN_PORT}}}'),
        (f"port {TAKEN_PORT} is taken by systemd-socket-: expected it free for rpc-server (change rpc_port)",),
    ),
    Bad(
        "gpu-host-without-nvidia-runtime",  # a host its user prepares (host_prepare False): checked only
        on_coordinator(
            '{"image_backend": "cuda", "gpus": ["RTX 4080"], "llama_tensor_split": None, "host_prepare": False}'
        ),
        (
            "image_backend = 'cuda' ({c}) and gpus = ['RTX 4080'] ({c}) but Docker has no nvidia runtime: expected the "
            "NVIDIA Container Toolkit",
        ),
    ),
    Bad(
        "cuda-worker-without-nvidia-driver",  # the prepare phase would set up the toolkit, but needs the driver
        on_worker('{"image_backend": "cuda", "gpus": ["RTX 4080"]}'),
        (
            "image_backend = 'cuda' ({w}) with NVIDIA cards, but nvidia-smi does not answer: the NVIDIA driver is "
            "missing (the deploy does not install drivers): on Debian 12, apt-get install nvidia-driver",
        ),
    ),
    Bad(
        "vulkan-worker-without-a-vulkan-device",
        on_worker('{"image_backend": "vulkan", "gpus": ["RX 7900 XTX"]}'),
        (
            "image_backend = 'vulkan' ({w}) and gpus = ['RX 7900 XTX'] ({w}) but no Vulkan device: no /dev/dri/renderD* "
            "on the host",
            "or gpus = [] for the CPU's Vulkan device (lavapipe)",
        ),
    ),
    Bad(
        "model-unreadable-by-the-service-user",
        on_coordinator('{"llama_model_path": "/models/private.gguf"}'),
        (
            "{c}: llama_model_path = '/models/private.gguf': llama-server runs as the unprivileged user llama-rpc, "
            "which cannot read it",
            "chmod o+r FILE",
        ),
    ),
    Bad(
        "spec-draft-missing-on-coordinator",
        on_coordinator('{"llama_spec_draft_path": "/models-spec/missing.gguf"}'),
        ("{c}: llama_spec_draft_path = '/models-spec/missing.gguf': no such file on the coordinator",),
    ),
    Bad(
        "spec-draft-of-another-vocabulary",
        on_coordinator(f'{{"llama_spec_draft_path": "{lab.OTHER_VOCAB_MODEL}"}}'),
        (
            f"{{c}}: the draft {lab.OTHER_VOCAB_MODEL} has other token texts than the target's: expected the "
            "target's vocabulary (llama-server would log the mismatch and serve without drafting)",
        ),
    ),
    Bad(
        "spec-type-the-draft-cannot-serve",
        on_coordinator(f'{{"llama_spec_draft_path": "{lab.DRAFT_MODEL}", "llama_spec_type": "draft-eagle3"}}'),
        (
            f"{{c}}: llama_spec_type = 'draft-eagle3', but the draft {lab.DRAFT_MODEL} is architecture 'llama', "
            "which serves 'draft-simple': expected llama_spec_type: draft-simple",
        ),
    ),
    Bad(
        "spec-assistant-on-the-cpu",
        on_coordinator(
            f'{{"llama_model_path": "{lab.GEMMA4_MODEL}", "llama_spec_draft_path": "{lab.ASSISTANT_MODEL}", '
            '"llama_spec_draft_device": "CPU"}'
        ),
        (
            "{c}: llama_spec_draft_device = 'CPU': the draft /models-spec/gemma4-assistant.gguf is a Gemma 4 assistant, "
            "which reads the KV cache of the target's last layers where it is (RPC1), and llama.cpp aborts at "
            "load with it on another device: expected None (the assistant on RPC1) or 'RPC1'",
        ),
    ),
    Bad(
        "sleep-on-a-nic-that-cannot-wake",  # the lab's veth: ethtool lists no Wake-on at all
        on_coordinator('{"sleep_idle_seconds": 600}') + "\n" + on_worker('{"wol_check_nic": True}'),
        (
            "sleep_idle_seconds is set, but {wn}'s eth0 cannot wake on a magic packet (ethtool: Supports Wake-on: "
            "nothing, 'g' needed)",
        ),
    ),
    Bad(
        "sleep-wol-interface-missing",
        on_coordinator('{"sleep_idle_seconds": 600}') + "\n" + on_worker('{"wol_interface": "eno9"}'),
        ("wol_interface 'eno9': {wn} has no such network interface",),
    ),
    Bad(
        "worker-sshd-unreachable",
        on_worker('{"transfer_ssh_port": 2}'),
        (
            "cannot reach",
            "sshd at",
            ":2: the coordinator sends the image that way",
        ),
    ),
]


@pytest.mark.parametrize("case", HOST_CASES, ids=[c.id for c in HOST_CASES])
def test_host_check_fails_before_any_change(case, base, tmp_path):
    """Checks that need the hosts read facts only: they fail after connecting, before the first change."""
    output = refused_untouched(case, base, tmp_path)
    assert "Connecting" in output and "Starting operation" not in output
