"""image_backend per host (issue 26): which image each host runs, how its GPUs reach the container, what the
planner and status call its devices. The lab test (tests/e2e/test_lab_vulkan.py) deploys a mixed cluster."""

import subprocess

import pytest

from llama_rpc_deploy import image, plan, render, status
from llama_rpc_deploy.cluster import cuda_architectures
from llama_rpc_deploy.cluster_checks import OLD_VULKAN_BASES
from llama_rpc_deploy.deployment import Deployment, backend_is_in_the_tree
from llama_rpc_deploy.plan import gpus_inventory
from llama_rpc_deploy.loading import offline_cluster
from llama_rpc_deploy.facts import RenderNodes
from llama_rpc_deploy.gpus import lookup
from llama_rpc_deploy.settings import SettingsError

from .helpers import REF, cluster, words


def mixed():
    """A CUDA coordinator, an AMD worker, a CPU worker and a vulkan worker without GPUs (lavapipe)."""
    return cluster(
        workers=[
            {"image_backend": "vulkan", "gpus": ["RX 7900 XTX"]},
            {"image_backend": "cpu", "gpus": []},
            {"image_backend": "vulkan", "gpus": []},
        ]
    )


def test_a_worker_takes_the_coordinators_backend_unless_it_sets_its_own():
    c = cluster(
        coordinator={"image_backend": "cpu", "gpus": []},
        workers=[{"gpus": []}, {"image_backend": "vulkan", "gpus": []}],
    )
    assert [h.backend for h in c.hosts] == ["cpu", "cpu", "vulkan"]
    assert (
        c.workers[0].origins["image_backend"]
        == c.coordinator.origins["image_backend"]
        == "inventory.py (host 10.0.0.10)"
    )
    assert [h.backend for h in cluster().hosts] == ["cuda", "cuda"]  # nothing set: cuda, as before per-host backends
    assert mixed().backends == ["cuda", "vulkan", "cpu"]


def test_lavapipe_only_where_a_worker_asks_for_vulkan_itself():
    """A worker without gpus that takes vulkan from the coordinator serves its CPU (ggml-vulkan finds no device);
    one that sets vulkan itself serves lavapipe. A coordinator with gpus uses its gpus, never lavapipe."""
    c = cluster(
        coordinator={"image_backend": "vulkan", "gpus": ["RX 7900 XTX"]},
        workers=[{"gpus": []}, {"image_backend": "vulkan", "gpus": []}],
    )
    assert [w.backend for w in c.workers] == ["vulkan", "vulkan"]
    assert [w.software_vulkan for w in c.hosts] == [False, False, True]
    inherited, own = (render.worker_files(c, w, "img")["/opt/llama-rpc/rpc-server.sh"] for w in c.workers)
    assert "GGML_VK_VISIBLE_DEVICES" not in inherited and "/dev/dri" not in inherited
    assert "GGML_VK_VISIBLE_DEVICES=0" in own
    assert "GGML_VK_VISIBLE_DEVICES" not in render.coordinator_files(c, "img")["/opt/llama-rpc/llama-server.sh"]


def test_a_coordinator_on_vulkan_without_gpus_has_lavapipe_as_its_own_last_device():
    """Its local device, as a card would be (how the lab stands in for the coordinator's card, benchmarks/mtp.py
    --local): Vulkan0 after the workers' devices, named to llama-server's container, holding the output; a draft and
    a Gemma 4 assistant go to it by default."""
    c = cluster(coordinator={"image_backend": "vulkan", "gpus": []}, workers=[{"image_backend": "cpu", "gpus": []}])
    assert [h.software_vulkan for h in c.hosts] == [True, False]
    assert c.devices == ["RPC0", "Vulkan0"] and c.local_devices == ["Vulkan0"]
    assert [(d.name, d.gpu, d.vram_bytes) for d in plan.devices_of(c)] == [
        ("RPC0", "CPU", 0),
        ("Vulkan0", "CPU (lavapipe)", 0),
    ]
    script = render.coordinator_files(c, "img")["/opt/llama-rpc/llama-server.sh"]
    assert "--env GGML_VK_VISIBLE_DEVICES=0 \\\n" in script and "/dev/dri" not in script
    assert "--device RPC0,Vulkan0 \\\n" in script
    inherited = cluster(coordinator={"image_backend": "cpu", "gpus": []}, workers=[{"gpus": []}])
    assert inherited.devices == ["RPC0"]  # a CPU coordinator: no device of its own, as before


@pytest.mark.parametrize(
    "base, old",
    [
        ("debian:bookworm", True),
        ("debian:12-slim", True),
        ("debian:oldstable", True),
        ("ubuntu:22.04", True),
        ("ubuntu:jammy", True),
        ("nvidia/cuda:12.4.1-devel-ubuntu22.04", True),
        ("llama-rpc-lab/debian:bookworm", True),
        ("debian:trixie", False),
        ("debian:13", False),
        ("ubuntu:24.04", False),
        ("nvidia/cuda:12.8.1-devel-ubuntu24.04", False),
        ("llama-rpc-lab/debian:trixie", False),
        ("registry.example/debian:trixie-slim", False),
    ],
)
def test_bases_too_old_for_the_vulkan_build(base, old):
    assert bool(OLD_VULKAN_BASES.search(base)) == old


def test_a_vulkan_runtime_older_than_its_build_is_refused():
    with pytest.raises(
        SettingsError, match="image_vulkan_runtime_image = 'debian:bookworm-slim': older than the build's base"
    ):
        cluster(
            workers=[{"image_backend": "vulkan", "gpus": []}],
            all_data={"image_vulkan_runtime_image": "debian:bookworm-slim"},
        )


def test_a_cuda_coordinator_by_default_is_named_where_it_is_listed():
    """The coordinator's backend unset (cuda) and no cuda host with gpus: the error points at its inventory line."""
    with pytest.raises(
        SettingsError,
        match=r"^inventory.py \(host 10.0.0.10\): image_backend = 'cuda' but no host lists "
        r"gpus \(cuda: 10.0.0.10\)",
    ):
        cluster(coordinator={"gpus": []}, workers=[{"image_backend": "vulkan", "gpus": ["RX 7900 XTX"]}])


def test_one_image_per_backend_built_from_its_own_bases():
    c = mixed()
    tags = image.tags(c, REF)
    assert list(tags) == ["cuda", "vulkan", "cpu"] and len(set(tags.values())) == 3
    assert tags["vulkan"].startswith("llama-rpc:b11312-vulkan-") and tags["cuda"].startswith("llama-rpc:b11312-")
    vulkan, cuda = image.build_args(c, REF, "vulkan"), image.build_args(c, REF, "cuda")
    assert (vulkan["GGML_BACKEND"], vulkan["BUILD_IMAGE"], vulkan["RUNTIME_IMAGE"]) == (
        "vulkan",
        "debian:trixie",
        "debian:trixie",
    )
    assert "CUDA_ARCHITECTURES" not in vulkan and cuda["CUDA_ARCHITECTURES"] == "89"  # the AMD card adds no arch
    assert cuda_architectures(c) == "89"
    # the same source and commit in every image
    assert {a["LLAMA_CPP_REF"] for a in (vulkan, cuda, image.build_args(c, REF, "cpu"))} == {REF.ident}
    d = Deployment(cluster=c, source=REF, images=tags, transfer_key=None)
    assert d.image == tags["cuda"] and [d.image_of(w.name) for w in c.workers] == [
        tags["vulkan"],
        tags["cpu"],
        tags["vulkan"],
    ]


def test_how_the_gpus_reach_each_container():
    c = mixed()
    amd, cpu, lavapipe = (render.worker_files(c, w, "img")["/opt/llama-rpc/rpc-server.sh"] for w in c.workers)
    assert "--device /dev/dri \\\n" in amd and '--group-add "$(stat -c %g /dev/dri/renderD* | head -n 1)"' in amd
    assert "--gpus" not in amd and "GGML_VK_VISIBLE_DEVICES" not in amd and "serves this host's GPUs (Vulkan)" in amd
    assert "--env GGML_VK_VISIBLE_DEVICES=0 \\\n" in lavapipe and "/dev/dri" not in lavapipe
    assert "CPU's Vulkan device (lavapipe)" in lavapipe
    assert "--gpus" not in cpu and "/dev/dri" not in cpu and "GGML_VK" not in cpu
    server = render.coordinator_files(c, "img")["/opt/llama-rpc/llama-server.sh"]
    assert "--gpus all" in server and "/dev/dri" not in server
    assert words(amd)[words(amd).index("--device") + 1] == "/dev/dri"


def test_a_vulkan_coordinator_names_its_gpus_as_llama_cpp_does():
    c = cluster(coordinator={"image_backend": "vulkan", "gpus": ["Arc B580"]}, workers=[{"image_backend": "cuda"}])
    assert c.devices == ["RPC0", "Vulkan0"]
    devices = plan.devices_of(c)
    assert [(d.name, d.gpu, d.vram_bytes >> 20) for d in devices] == [
        ("RPC0", "RTX 5060 Ti 16GB", 15849),
        ("Vulkan0", "Arc B580", 12216),
    ]
    lavapipe = cluster(workers=[{"image_backend": "vulkan", "gpus": []}])
    assert [d.gpu for d in plan.devices_of(lavapipe)] == ["CPU (lavapipe)", "RTX 4080"]


def test_amd_and_intel_cards():
    assert lookup("RX 7900 XTX").vendor == "amd" and lookup("rx 7900 xtx").backend == "vulkan"
    assert lookup("Arc A770 16GB").backend == "vulkan" and lookup("RTX 4080").backend == "cuda"
    card = lookup({"name": "Radeon 890M", "vendor": "amd", "vram_mib": 8192, "bandwidth_gbs": 120})
    assert (card.cuda_arch, card.backend, card.vram_mib) == ("", "vulkan", 8192)
    with pytest.raises(ValueError, match="vendor = 'apple': expected one of nvidia, amd, intel"):
        lookup({"name": "M4", "vendor": "apple"})
    with pytest.raises(ValueError, match="cuda_arch on a card of amd: expected cuda_arch only for NVIDIA cards"):
        lookup({"name": "x", "vendor": "amd", "cuda_arch": "89"})
    with pytest.raises(ValueError, match="expected a dict with at least name and cuda_arch"):
        lookup({"name": "RTX 9999"})


def test_a_backend_missing_from_a_local_tree_is_refused(tmp_path):
    tree = tmp_path / "llama.cpp"
    for folder in ("ggml/src/ggml-cuda", "tools"):
        (tree / folder).mkdir(parents=True)
    (tree / "ggml" / "CMakeLists.txt").write_text("")
    (tree / "ggml" / "src" / "ggml-cuda" / "CMakeLists.txt").write_text("")
    c = cluster(workers=[{"image_backend": "vulkan", "gpus": []}], all_data={"llama_cpp_source": str(tree)})
    backend_is_in_the_tree(c, "cuda")
    backend_is_in_the_tree(c, "cpu")
    with pytest.raises(
        SettingsError,
        match=rf"llama_cpp_source = '{tree}' has no ggml/src/ggml-vulkan, which "
        r"image_backend = 'vulkan' \(inventory.py \(host 10.0.0.20\), 10.0.0.20\) builds",
    ):
        backend_is_in_the_tree(c, "vulkan")


def test_render_nodes_fact():
    assert RenderNodes().process(["renderD128", "renderD129", ""]) == ["/dev/dri/renderD128", "/dev/dri/renderD129"]
    assert RenderNodes().process([]) == []


def test_plan_gpus_gives_each_card_its_backend(tmp_path):
    path = gpus_inventory(["RTX 4080", "RX 7900 XTX", "Arc B580"], tmp_path)
    c = offline_cluster(path, overrides={"llama_model_path": "/m/model.gguf"}, deploying=False)
    assert [h.backend for h in c.hosts] == ["cuda", "vulkan", "vulkan"]
    assert c.devices == ["RPC0", "RPC1", "CUDA0"]


def test_status_reads_the_backend_and_the_devices_rpc_server_serves():
    output = (
        "== unit rpc-server.service\nactive\n== image\nllama-rpc:local-vulkan-0123456789ab\n== protocol\n7.0.0\n"
        "== backend\nvulkan\n== rpc devices\nVulkan0: llvmpipe (LLVM 19.1.7, 256 bits) (23996 MiB, 23996 MiB free)\n"
    )
    w = status.parse("10.0.0.20", "workers", output)
    assert (w.backend, w.rpc_devices) == (
        "vulkan",
        ["Vulkan0: llvmpipe (LLVM 19.1.7, 256 bits) (23996 MiB, 23996 MiB free)"],
    )
    text = status.table([w])
    assert "10.0.0.20 (workers)  backend vulkan  image llama-rpc:local-vulkan-0123456789ab" in text
    assert "  serves Vulkan0: llvmpipe" in text


LOG = """Starting RPC server v7.0.0
  endpoint       : 127.0.0.1:50052
Devices:
  CPU: AMD EPYC (24105 MiB, 24105 MiB free)
  transport      : TCP
Accepted client connection
ggml_vulkan: 0 = llvmpipe (LLVM 19.1.7, 256 bits) (llvmpipe) | uma: 0 | fp16: 1
Starting RPC server v7.0.0
  endpoint       : 127.0.0.1:50052
  local cache    : /cache/rpc
Devices:
  Vulkan0: llvmpipe (LLVM 19.1.7, 256 bits) (23996 MiB, 23996 MiB free)
  transport      : TCP
"""


def test_the_devices_of_rpc_servers_last_start_are_read_from_its_log():
    """The awk program of the worker's status script, on a journal of two starts: only the last one's devices."""
    script = status.host_script(c := cluster(), c.workers[0])
    line = next(x for x in script.splitlines() if x.startswith("echo '== rpc devices'"))
    program = line.split("| awk ", 1)[1]
    result = subprocess.run(["bash", "-c", f"awk {program}"], input=LOG, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Vulkan0: llvmpipe (LLVM 19.1.7, 256 bits) (23996 MiB, 23996 MiB free)\n"
