"""GPUs learned from the hosts (issue 38, part 3): what nvidia-smi and vulkaninfo print, read into cards; a learned
card as a Gpu (the table's bandwidth where the table has it); the checks that wait for the cards (before connecting
they cannot know them); what the inventory lists wins, with a warning; and the deploy's step that learns them,
through pyinfra's prepare stage with the facts faked."""

from __future__ import annotations

import logging
from pathlib import Path

import gevent
import pytest

from llama_rpc_deploy import gpus, image, probe, render
from llama_rpc_deploy.cluster import cuda_architectures
from llama_rpc_deploy.cluster_checks import with_learned
from llama_rpc_deploy.gpus import Found
from llama_rpc_deploy.paths import PROJECT
from llama_rpc_deploy.plan import plan_cluster
from llama_rpc_deploy.settings import SettingsError

from .. import wiring
from .helpers import LOCAL, cluster, seed_model

# nvidia-smi --query-gpu=name,memory.total,compute_cap --format=csv,noheader,nounits, as two hosts print it
RTX_4080 = "NVIDIA GeForce RTX 4080, 16376, 8.9"
RTX_5060_TI = "NVIDIA GeForce RTX 5060 Ti, 15848, 12.0"
# `vulkaninfo --summary` (Vulkan Instance 1.3.280, Mesa 24.0) on a host with an RX 7900 XTX, cut to its devices
VULKANINFO = """==========
VULKANINFO
==========

Vulkan Instance Version: 1.3.280


Instance Extensions: count = 23
-------------------------------
VK_EXT_debug_report                    : extension revision 10
VK_KHR_surface                         : extension revision 25

Instance Layers: count = 1
--------------------------
VK_LAYER_MESA_device_select Linux device selection layer 1.3.211  version 1

Devices:
========
GPU0:
	apiVersion         = 1.3.274
	driverVersion      = 24.0.5
	vendorID           = 0x1002
	deviceID           = 0x744c
	deviceType         = PHYSICAL_DEVICE_TYPE_DISCRETE_GPU
	deviceName         = AMD Radeon RX 7900 XTX (RADV NAVI31)
	driverID           = DRIVER_ID_MESA_RADV
	driverName         = radv
	driverInfo         = Mesa 24.0.5-1ubuntu1
	conformanceVersion = 1.3.0.0
	deviceUUID         = 00000000-0300-0000-0000-000000000000
	driverUUID         = 414d442d-4d45-5341-2d44-525600000000
GPU1:
	apiVersion         = 1.3.274
	driverVersion      = 0.0.1
	vendorID           = 0x10005
	deviceID           = 0x0000
	deviceType         = PHYSICAL_DEVICE_TYPE_CPU
	deviceName         = llvmpipe (LLVM 17.0.6, 256 bits)
	driverID           = DRIVER_ID_MESA_LLVMPIPE
	driverName         = llvmpipe
	driverInfo         = Mesa 24.0.5-1ubuntu1 (LLVM 17.0.6)
	conformanceVersion = 1.3.1.1
	deviceUUID         = 6d657361-3234-2e30-2e35-2d3175627500
	driverUUID         = 6c6c766d-7069-7065-5555-494400000000
""".splitlines()


# --- the parsers ---


def test_nvidia_smi_lines_are_cards_and_anything_else_is_not():
    assert gpus.parse_nvidia_smi([RTX_4080, RTX_5060_TI]) == [
        Found("NVIDIA GeForce RTX 4080", 16376, "8.9"),
        Found("NVIDIA GeForce RTX 5060 Ti", 15848, "12.0"),
    ]
    # a name with a comma; an error line; a card whose memory nvidia-smi cannot read
    lines = ["Some, Card, 8192, 8.6", "NVIDIA-SMI has failed because it couldn't communicate", "X, [N/A], 8.9"]
    assert gpus.parse_nvidia_smi(lines) == [Found("Some, Card", 8192, "8.6")]
    assert [f.cuda_arch for f in gpus.parse_nvidia_smi([RTX_4080, RTX_5060_TI])] == ["89", "120"]


def test_vulkaninfo_summary_gives_the_discrete_card_and_leaves_lavapipe_out():
    assert gpus.parse_vulkaninfo(VULKANINFO) == [Found("AMD Radeon RX 7900 XTX (RADV NAVI31)", 0, "", "amd")]
    lavapipe_only = VULKANINFO[: VULKANINFO.index("GPU0:")] + VULKANINFO[VULKANINFO.index("GPU1:") :]
    assert gpus.parse_vulkaninfo(lavapipe_only) == [] and gpus.parse_vulkaninfo([]) == []


def test_vulkaninfo_takes_an_integrated_gpu_only_without_a_discrete_one():
    igpu = [
        "GPU0:",
        "\tvendorID           = 0x8086",
        "\tdeviceType         = PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU",
        "\tdeviceName         = Intel(R) Graphics (RPL-S)",
    ]
    arc = [
        "GPU1:",
        "\tvendorID           = 0x8086",
        "\tdeviceType         = PHYSICAL_DEVICE_TYPE_DISCRETE_GPU",
        "\tdeviceName         = Intel(R) Arc(tm) A770 Graphics (DG2)",
    ]
    assert gpus.parse_vulkaninfo(igpu) == [Found("Intel(R) Graphics (RPL-S)", 0, "", "intel")]
    assert gpus.parse_vulkaninfo(igpu + arc) == [Found("Intel(R) Arc(tm) A770 Graphics (DG2)", 0, "", "intel")]


# --- a learned card as a Gpu ---


def test_a_card_of_the_table_takes_its_bandwidth_and_the_hosts_memory():
    rtx4080, rtx5060 = gpus.parse_nvidia_smi([RTX_4080, RTX_5060_TI])
    assert gpus.learned(rtx4080) == gpus.Gpu("RTX 4080", "89", 16376, 717)  # the table says 16375 MiB
    assert gpus.learned(rtx5060) == gpus.Gpu("RTX 5060 Ti 16GB", "120", 15848, 448)  # through ALIASES
    assert gpus.inventory_entry(gpus.learned(rtx4080)) == "RTX 4080"
    amd = gpus.parse_vulkaninfo(VULKANINFO)[0]
    assert gpus.learned(amd) == gpus.Gpu("RX 7900 XTX", "", 24560, 960, "amd")  # memory: the table's
    arc = Found("Intel(R) Arc(tm) A770 Graphics (DG2)", 0, "", "intel")
    assert gpus.learned(arc).name == "Arc A770 16GB"


def test_a_card_not_in_the_table_keeps_what_the_host_said_with_an_assumed_bandwidth():
    pro = Found("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", 97887, "12.0")
    gpu = gpus.learned(pro)
    assert (gpu.name, gpu.cuda_arch, gpu.vram_mib, gpu.vendor) == (pro.name, "120", 97887, "nvidia")
    assert gpu.bandwidth_assumed and gpu.bandwidth_gbs == gpus.ASSUMED_BANDWIDTH_GBS["nvidia"] == 288
    entry = gpus.inventory_entry(gpu)
    assert entry == {"name": pro.name, "cuda_arch": "120", "vram_mib": 97887}
    assert gpus.lookup(entry) == gpu  # the pasted dict is the same card
    # the 8 GB RTX 3060 has the 12 GB one's name, not its bandwidth: not the table's card
    small = gpus.learned(Found("NVIDIA GeForce RTX 3060", 8192, "8.6"))
    assert small.bandwidth_assumed and small.vram_mib == 8192
    # an AMD card the table lacks: no memory from the summary, so none
    other = gpus.learned(Found("AMD Radeon PRO W7800 (RADV NAVI31)", 0, "", "amd"))
    assert (other.vram_mib, other.bandwidth_gbs, other.cuda_arch) == (0, 288, "")
    assert gpus.inventory_entry(other) == {"name": "AMD Radeon PRO W7800 (RADV NAVI31)", "vendor": "amd"}


def test_a_dict_without_bandwidth_plans_with_the_assumed_one():
    """A gpus dict without bandwidth_gbs had bandwidth 0, and the planner divided by it."""
    c = cluster(workers=[{"gpus": [{"name": "RTX PRO 6000", "cuda_arch": "120", "vram_mib": 97887}]}])
    assert c.workers[0].gpus[0].bandwidth_gbs == 288
    capacity = plan_cluster(c, seed_model())
    assert capacity.tokens_per_s > 0


# --- what the inventory says wins; a difference warns ---


def test_the_listed_cards_against_the_hosts():
    listed = (gpus.lookup("RTX 4080"),)
    assert gpus.mismatch(listed, gpus.parse_nvidia_smi([RTX_4080]), "nvidia-smi") == ""
    assert gpus.mismatch(listed, gpus.parse_nvidia_smi([RTX_4080, RTX_5060_TI]), "nvidia-smi") == (
        "gpus lists 1 (RTX 4080), nvidia-smi reports 2 (RTX 4080, RTX 5060 Ti 16GB)"
    )
    assert gpus.mismatch(listed, gpus.parse_nvidia_smi([RTX_5060_TI]), "nvidia-smi") == (
        "gpus lists 1 (RTX 4080), nvidia-smi reports 1 (RTX 5060 Ti 16GB)"
    )
    assert gpus.mismatch(listed, [], "nvidia-smi") == "gpus lists 1 (RTX 4080), nvidia-smi reports 0 (none)"
    assert gpus.mismatch((), [], "vulkaninfo") == ""


def test_listed_cards_are_kept_whatever_the_host_has():
    c = cluster()  # both hosts list their cards
    assert with_learned(c, {c.workers[0].name: gpus.parse_nvidia_smi([RTX_4080, RTX_4080])}) == c


# --- the checks that wait for the cards ---


def test_unset_gpus_on_cuda_hosts_wait_to_be_learned():
    c = cluster(coordinator={"gpus": None}, workers=[{"gpus": None}])  # cuda: would be refused with gpus = []
    assert [h.name for h in c.unlearned] == ["10.0.0.10", "10.0.0.20"]
    assert c.devices == ["RPC0"] and cuda_architectures(c) == ""  # until then: a CPU device, as an empty list
    learned = with_learned(c, {"10.0.0.10": gpus.parse_nvidia_smi([RTX_4080]), "10.0.0.20": []})
    assert not learned.unlearned and learned.coordinator.gpus_from == "host"
    assert learned.devices == ["RPC0", "CUDA0"] and cuda_architectures(learned) == "89"
    assert render.device_options(learned.coordinator) == ["--gpus all"]
    assert render.device_options(learned.workers[0]) == []
    assert image.build_args(learned, LOCAL)["CUDA_ARCHITECTURES"] == "89"


def test_no_card_anywhere_on_cuda_is_refused_once_learned():
    c = cluster(coordinator={"gpus": None}, workers=[{"gpus": None}])
    with pytest.raises(SettingsError) as error:
        with_learned(c, {})
    assert str(error.value) == (
        "inventory.py (host 10.0.0.10): image_backend = 'cuda' but no host lists gpus (cuda: 10.0.0.10, 10.0.0.20; "
        "nvidia-smi lists no card on 10.0.0.10, 10.0.0.20): expected gpus on at least one of them "
        "(e.g. gpus = ['RTX 4080']), or image_backend = 'cpu'"
    )


def test_a_split_per_device_is_checked_once_the_devices_are_known():
    split = {"llama_tensor_split": [1, 1, 1]}
    c = cluster(coordinator={"gpus": None, **split}, workers=[{"gpus": None}])  # 2 devices before learning
    with pytest.raises(SettingsError, match=r"llama_tensor_split = \[1, 1, 1\]: expected 2 numbers, one per device"):
        with_learned(c, {"10.0.0.20": gpus.parse_nvidia_smi([RTX_4080, RTX_5060_TI])})
    ok = with_learned(
        c, {"10.0.0.10": gpus.parse_nvidia_smi([RTX_4080]), "10.0.0.20": gpus.parse_nvidia_smi([RTX_4080, RTX_5060_TI])}
    )
    assert ok.devices == ["RPC0", "RPC1", "CUDA0"]
    with pytest.raises(SettingsError, match="expected 2 numbers"):  # as before, where gpus are listed
        cluster(coordinator={"gpus": [], **split}, workers=[{"gpus": ["RTX 4080", "RTX 4080"]}])


def test_a_card_of_another_vendor_learned_on_a_host_is_refused_naming_the_tool():
    c = cluster(workers=[{"gpus": None, "image_backend": "vulkan"}])
    with pytest.raises(SettingsError) as error:
        with_learned(c, {"10.0.0.20": [Found("NVIDIA GeForce RTX 4080", 0, "", "nvidia")]})
    assert str(error.value).startswith(
        "10.0.0.20: gpus (not set; vulkaninfo on the host lists) = ['RTX 4080'] on 10.0.0.20, whose image_backend is "
        "'vulkan'"
    )
    assert str(error.value).endswith("expected image_backend = 'cuda' on that host")


def test_a_vulkan_host_keeps_lavapipe_unless_it_has_a_card():
    c = cluster(workers=[{"gpus": None, "image_backend": "vulkan"}])
    assert c.workers[0].software_vulkan  # before learning, as with gpus = []
    assert with_learned(c, {}).workers[0].software_vulkan
    card = with_learned(c, {"10.0.0.20": gpus.parse_vulkaninfo(VULKANINFO)}).workers[0]
    assert not card.software_vulkan and [g.name for g in card.gpus] == ["RX 7900 XTX"]
    assert render.device_options(card)[0].startswith("--device")


def test_cpu_hosts_have_nothing_to_learn():
    c = cluster(coordinator={"gpus": None, "image_backend": "cpu"}, workers=[{"gpus": None}, {"gpus": None}])
    assert not c.unlearned and {h.gpus_from for h in c.hosts} == {"backend"}


def test_the_drafts_device_is_checked_once_the_devices_are_known():
    spec = {"llama_spec_draft_path": "/srv/models/draft.gguf", "llama_spec_draft_device": "CUDA0"}
    c = cluster(coordinator={"gpus": None, **spec})  # CUDA0: not a device before its card is known
    with pytest.raises(SettingsError, match="llama_spec_draft_device = 'CUDA0': no such device in this cluster"):
        with_learned(c, {})
    assert with_learned(c, {"10.0.0.10": gpus.parse_nvidia_smi([RTX_4080])}).devices == ["RPC0", "CUDA0"]
    with pytest.raises(SettingsError, match="no such device"):  # listed: refused before connecting, as before
        cluster(coordinator={"gpus": [], **spec})


# --- probe's inventory lines ---


def test_probe_reads_a_hosts_answer_and_writes_its_line():
    output = "\n".join(
        ["== nvidia", RTX_4080, "== vulkan", *VULKANINFO, "== system", "Debian GNU/Linux 13 (trixie)"]
        + ["== nic", "name enp5s0", "speed 2500", "link up"]
    )
    p = probe.parse("10.0.0.20", "workers", output)
    assert (p.system, p.nic, p.speed, p.link) == ("Debian GNU/Linux 13 (trixie)", "enp5s0", "2500", "up")
    assert [f.name for f in p.cards] == ["NVIDIA GeForce RTX 4080", "AMD Radeon RX 7900 XTX (RADV NAVI31)"]
    c = cluster(workers=[{"gpus": None}])
    assert probe.inventory_line(p, c.workers[0]) == '("10.0.0.20", {"gpus": ["RTX 4080"]}),'
    assert probe.parse("h", "workers", "== nic\nname eth0\nspeed -1\nlink down\n").speed == ""
    unknown = probe.parse("h", "workers", "== nvidia\nNVIDIA RTX PRO 6000 Blackwell, 97887, 12.0\n")
    line = probe.inventory_line(unknown, c.workers[0])
    assert line.startswith(
        '("10.0.0.20", {"gpus": [{"name": "NVIDIA RTX PRO 6000 Blackwell", "cuda_arch": "120", "vram_mib": 97887}]}),'
    )
    assert "add bandwidth_gbs" in line


# --- the deploy learns them, through pyinfra's prepare stage ---

COORDINATOR, WORKERS = "10.0.0.10", ["10.0.0.11", "10.0.0.12"]


def prepare(tmp_path: Path, monkeypatch, nvidia: dict[str, list[str]]):
    """deploy.py through pyinfra's prepare stage (tests/wiring.py), a cuda coordinator with an RTX 4080 listed and two
    workers that list none; nvidia[host]: the lines its nvidia-smi prints. Each fact read yields, as over SSH."""
    header = wiring.model_header(tmp_path / "model.gguf")
    inventory_file = tmp_path / "inventory.py"
    inventory_file.write_text(
        f'coordinator = [("{COORDINATOR}", {{"gpus": ["RTX 4080"], "llama_model_path": "/models/wiring.gguf", '
        f'"llama_cpp_source": "{tmp_path / "llama.cpp.tar.gz"}", "llama_tensor_split": None}})]\n'
        f"workers = [{', '.join(f'({w!r}, {{}})' for w in WORKERS)}]\n"
    )
    (tmp_path / "llama.cpp.tar.gz").write_bytes(b"not really a tarball")
    monkeypatch.chdir(PROJECT)
    fake = wiring.fake_facts(wiring.EVERY_FILE, header, 4_000_000, ("runc", "nvidia"))

    def read(host, fact, *args, **kwargs):
        gevent.sleep(0.001)
        if fact.__name__ == "NvidiaGpus":
            return gpus.parse_nvidia_smi(nvidia.get(host.name, []))
        return fake(host, fact, *args, **kwargs)

    return wiring.prepare(inventory_file, read, wiring.fake_transfer_key(tmp_path))


def test_the_deploy_learns_a_workers_card_before_anything_reads_it(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    state = prepare(tmp_path, monkeypatch, {COORDINATOR: [RTX_4080, RTX_4080], WORKERS[0]: [RTX_5060_TI]})
    run = state.llama_rpc_run
    c = run.deployment.cluster
    assert [g.name for g in c.host(WORKERS[0]).gpus] == ["RTX 5060 Ti 16GB"] and c.host(WORKERS[1]).gpus == ()
    assert c.devices == ["RPC0", "RPC1", "CUDA0"]  # the coordinator's second card: the inventory lists one
    assert run.deployment.images == image.tags(c, run.deployment.source)  # CUDA_ARCHITECTURES 89;120
    assert image.build_args(c, run.deployment.source)["CUDA_ARCHITECTURES"] == "89;120"
    # every worker's operations were made from the learned cluster: the same operations, in one order
    assert len({tuple(state.inventory.get_host(w).op_hash_order) for w in WORKERS}) == 1
    log = caplog.text
    assert f"{WORKERS[0]}: gpus not set: nvidia-smi lists RTX 5060 Ti 16GB (15848 MiB)" in log
    assert f"{WORKERS[1]}: gpus not set: nvidia-smi lists no card: a CPU device" in log
    assert (
        f"{COORDINATOR}: gpus lists 1 (RTX 4080), nvidia-smi reports 2 (RTX 4080, RTX 4080) (" in log
        and "the plan and the device order follow gpus" in log
    )
