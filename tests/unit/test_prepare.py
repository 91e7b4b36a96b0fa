"""The prepare phase (phases/prepare.py, systems.py) against pyinfra facts, through deploy.py's own prepare stage
(tests/wiring.py): which systems pass, what a host is given from what it has, the NVIDIA steps (driver present or
not, toolkit present or not, Docker's daemon.json with or without the runtime), and the commands shellchecked."""

from __future__ import annotations

import subprocess

import pytest

from llama_rpc_deploy import gpus, systems
from llama_rpc_deploy.refusal import Refusal

from .test_wiring import COORDINATOR, WORKERS, over_ssh, prepare

pytestmark = pytest.mark.xdist_group("wiring")  # one worker imports the deploy's phases and operations, once

GPU_WORKER = WORKERS[0]
CUDA = {GPU_WORKER: {"image_backend": "cuda", "gpus": ["RTX 4080"]}}
TRIXIE = {"ID": "debian", "VERSION_ID": "13", "PRETTY_NAME": "Debian GNU/Linux 13 (trixie)"}


def with_facts(**on_gpu_worker):
    """The wiring's facts, and for GPU_WORKER the given ones instead: {fact class name: answer, or a function of
    the fact's keyword arguments}."""

    def wrap(get_fact):
        def read(host, fact, *args, **kwargs):
            if host.name == GPU_WORKER and fact.__name__ in on_gpu_worker:
                answer = on_gpu_worker[fact.__name__]
                return answer(**kwargs) if callable(answer) else answer
            return over_ssh(get_fact)(host, fact, *args, **kwargs)

        return read

    return wrap


def names_of(state, name: str) -> list[str]:
    host = state.inventory.get_host(name)
    return [
        n.split(" | ", 1)[-1]
        for h in state.get_op_order()
        if h in host.op_hash_order
        for n in sorted(state.op_meta[h].names)
    ]


# --- the system ---


@pytest.mark.parametrize(
    "release, packages",
    [
        ({"ID": "debian", "VERSION_ID": "12"}, ("docker.io",)),
        (TRIXIE, ("docker.io", "docker-cli", "docker-buildx")),
        ({"ID": "ubuntu", "VERSION_ID": "22.04"}, ("docker.io", "docker-buildx")),
        ({"ID": "ubuntu", "VERSION_ID": "24.04"}, ("docker.io", "docker-buildx")),
    ],
)
def test_supported_systems_and_their_docker(release, packages):
    assert systems.system_of(release, "h").docker == packages


@pytest.mark.parametrize(
    "release",
    [
        {"ID": "fedora", "VERSION_ID": "40", "PRETTY_NAME": "Fedora Linux 40 (Workstation Edition)"},
        {"ID": "debian", "VERSION_ID": "11", "PRETTY_NAME": "Debian GNU/Linux 11 (bullseye)"},
        {"ID": "ubuntu", "VERSION_ID": "20.04", "PRETTY_NAME": "Ubuntu 20.04.6 LTS"},
        {},
    ],
)
def test_another_system_is_refused_in_one_line_that_says_what_is_supported(tmp_path, monkeypatch, release):
    with pytest.raises(Refusal) as refusal:
        prepare(tmp_path, monkeypatch, {}, facts=with_facts(OsRelease=release))
    line = refusal.value.format_message()
    assert "\n" not in line
    assert line.startswith(f"{GPU_WORKER}: {release.get('PRETTY_NAME', 'an unknown system')} (/etc/os-release: ")
    assert "expected Debian 12 or 13, Ubuntu 22.04 or 24.04, or host_prepare: False" in line


def test_host_prepare_false_checks_only_any_system(tmp_path, monkeypatch):
    """A host its user prepares: not read, not refused, nothing installed there; the others are prepared."""
    state = prepare(
        tmp_path,
        monkeypatch,
        {},
        workers_data={GPU_WORKER: {"host_prepare": False}},
        facts=with_facts(OsRelease={"ID": "arch", "PRETTY_NAME": "Arch Linux"}),
    )
    assert not [n for n in names_of(state, GPU_WORKER) if "packages the deploy needs" in n]
    assert [n for n in names_of(state, WORKERS[1]) if "packages the deploy needs" in n]


def test_os_release_is_read_as_the_file_says():
    lines = ['PRETTY_NAME="Ubuntu 24.04.1 LTS"', 'NAME="Ubuntu"', 'VERSION_ID="24.04"', "ID=ubuntu", "", "# x=y"]
    release = systems.OsRelease().process(lines)
    assert release == {"PRETTY_NAME": "Ubuntu 24.04.1 LTS", "NAME": "Ubuntu", "VERSION_ID": "24.04", "ID": "ubuntu"}
    assert systems.system_of(release, "h").name == "Ubuntu 24.04"


def test_display_controllers_by_vendor():
    assert systems.DisplayVendors().process(["0x10de", "0x10de", "0x1002", "0x1a03"]) == ["0x1a03", "amd", "nvidia"]
    # no output at all (no display controller, the lab): pyinfra answers default(), not process([])
    assert systems.DisplayVendors.default() == [] and systems.OsRelease.default() == {}


def test_daemon_json_runtimes():
    runtimes = systems.DockerDaemonRuntimes()
    configured = '{"runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}}'
    assert runtimes.process(configured.splitlines()) == ["nvidia"]
    assert runtimes.process(['{"cgroup-parent": "x"}']) == []
    assert runtimes.process([]) is None  # no file
    assert runtimes.process(["{not json"]) is None


# --- NVIDIA ---


def test_an_nvidia_host_without_a_driver_is_refused_with_its_systems_command(tmp_path, monkeypatch):
    with pytest.raises(Refusal) as refusal:
        prepare(tmp_path, monkeypatch, {}, workers_data=CUDA, facts=with_facts(NvidiaDriver=False, OsRelease=TRIXIE))
    line = refusal.value.format_message()
    assert line.startswith(f"{GPU_WORKER}: image_backend = 'cuda' (")
    assert "nvidia-smi does not answer: the NVIDIA driver is missing" in line
    assert "on Debian 13, apt-get install nvidia-driver firmware-misc-nonfree" in line


def test_gpus_unset_and_an_nvidia_card_on_the_bus_is_an_nvidia_host(tmp_path, monkeypatch):
    """gpus learned (unset): the PCI bus's NVIDIA display controller makes it an NVIDIA host, whose driver is
    checked; with no such card it is not one, and the cards' own check refuses a cuda host without any."""
    unset = {GPU_WORKER: {"image_backend": "cuda"}}
    with pytest.raises(Refusal, match="the NVIDIA driver is missing"):
        prepare(
            tmp_path,
            monkeypatch,
            {},
            workers_data=unset,
            facts=with_facts(NvidiaDriver=False, DisplayVendors=["nvidia"]),
        )
    with pytest.raises(Refusal, match="image_backend = 'cuda' but no host lists gpus"):  # not the driver's line
        prepare(
            tmp_path,
            monkeypatch,
            {},
            workers_data=unset,
            facts=with_facts(NvidiaDriver=False, DisplayVendors=[], NvidiaGpus=[]),
        )


def without_toolkit(**kwargs):
    return {p: ["1"] for p in (*systems.BASE_PACKAGES, "docker.io", "haproxy", "socat")}


def no_keyring(path="", **kwargs):
    return None if path == systems.NVIDIA_KEYRING else {"mode": 644, "user": "root", "group": "root", "size": 1}


KEY, SOURCE = "NVIDIA's repository key", "NVIDIA's repository (signed by that key)"
TOOLKIT, RUNTIME, RESTART = "The NVIDIA Container Toolkit", "Docker's nvidia runtime", "Docker restarted onto"


def nvidia_steps(state) -> list[str]:
    steps = (KEY, SOURCE, TOOLKIT, RUNTIME, RESTART)
    return [s for n in names_of(state, GPU_WORKER) for s in steps if n.startswith(s)]


@pytest.mark.parametrize(
    "facts, steps",
    [
        ({}, []),  # toolkit installed, the runtime in daemon.json: nothing
        ({"DockerDaemonRuntimes": None}, [RUNTIME, RESTART]),  # no daemon.json
        ({"DockerDaemonRuntimes": ["runc"]}, [RUNTIME, RESTART]),  # a daemon.json without it
        ({"DockerRuntimes": ["runc"]}, [RESTART]),  # in daemon.json, not in the running Docker: a run cut short
        ({"DebPackages": without_toolkit, "File": no_keyring}, [KEY, SOURCE, TOOLKIT]),
        (
            {"DebPackages": without_toolkit, "File": no_keyring, "DockerDaemonRuntimes": None},
            [KEY, SOURCE, TOOLKIT, RUNTIME, RESTART],
        ),
        ({"DebPackages": without_toolkit}, [SOURCE, TOOLKIT]),  # the key is there already: kept
    ],
    ids=["prepared", "no-daemon-json", "daemon-json-without", "not-running", "no-toolkit", "bare", "keyring-kept"],
)
def test_nvidia_steps_follow_the_facts(tmp_path, monkeypatch, facts, steps):
    answers = {"DockerDaemonRuntimes": ["nvidia"], "DockerRuntimes": ["runc", "nvidia"], **facts}
    state = prepare(tmp_path, monkeypatch, {}, workers_data=CUDA, facts=with_facts(**answers))
    assert nvidia_steps(state) == steps
    assert not [n for h in (COORDINATOR, WORKERS[1]) for n in names_of(state, h) if "NVIDIA" in n or "nvidia" in n]
    ops = names_of(state, GPU_WORKER)
    # the toolkit's steps (gpg for the key) after the distribution's packages, all before the image or a service
    assert ops.index(next(n for n in ops if "Docker enabled and running" in n)) < min(
        [ops.index(n) for n in ops if n.startswith(tuple(steps))] or [len(ops)]
    )
    assert not steps or max(ops.index(n) for n in ops if n.startswith(tuple(steps))) < ops.index(
        next(n for n in ops if "rpc-server" in n)
    )


def test_the_toolkit_brings_gpg_for_its_key(tmp_path, monkeypatch):
    state = prepare(
        tmp_path,
        monkeypatch,
        {},
        workers_data=CUDA,
        facts=with_facts(DebPackages=without_toolkit, DockerDaemonRuntimes=["nvidia"], DockerRuntimes=["nvidia"]),
    )
    assert any(n.endswith("iproute2, ethtool, docker.io, gpg") for n in names_of(state, GPU_WORKER))


def test_the_repository_line_is_signed_by_the_pinned_keyring():
    assert systems.NVIDIA_SOURCE == (
        "deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg] "
        "https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /\n"
    )
    assert len(systems.NVIDIA_KEY_FINGERPRINT) == 40 and int(systems.NVIDIA_KEY_FINGERPRINT, 16)


@pytest.mark.parametrize("command", [systems.key_command(), systems.CONFIGURE_RUNTIME], ids=["key", "runtime"])
def test_the_commands_pass_shellcheck(command):
    found = subprocess.run(["shellcheck", "-s", "bash", "-"], input=command, capture_output=True, text=True)
    assert found.returncode == 0, found.stdout


def test_the_key_check_installs_the_pinned_key_alone(tmp_path):
    """The key command on this machine, curl replaced by a copy of a file of two keys made here. Pinned to neither:
    nothing installed, the line names the pinned fingerprint and the file's. Pinned to the first: the keyring holds
    that key alone (binary, as apt's signed-by takes it), not the other key that came with it."""
    home = tmp_path / "gnupg"
    home.mkdir(mode=0o700)
    env = {"GNUPGHOME": str(home), "PATH": "/usr/bin:/bin"}
    for who in ("first", "second"):
        subprocess.run(
            ["gpg", "--batch", "--passphrase", "", "--quick-gen-key", f"{who} <{who}@example.invalid>", "ed25519"],
            env=env,
            check=True,
            capture_output=True,
        )
    listed = subprocess.run(
        ["gpg", "--with-colons", "--list-keys"], env=env, check=True, capture_output=True, text=True
    )
    lines = listed.stdout.splitlines()
    primaries = [lines[i + 1].split(":")[9] for i, line in enumerate(lines) if line.startswith("pub")]
    (tmp_path / "key.asc").write_bytes(
        subprocess.run(["gpg", "--armor", "--export"], env=env, check=True, capture_output=True).stdout
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "curl").write_text(f'#!/bin/sh\nwhile [ "$1" != -o ]; do shift; done\ncp {tmp_path}/key.asc "$2"\n')
    (bin_dir / "curl").chmod(0o755)
    keyring = tmp_path / "keyring.gpg"
    command = systems.key_command().replace(systems.NVIDIA_KEYRING, str(keyring))

    def run(pinned: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", "-c", command.replace(systems.NVIDIA_KEY_FINGERPRINT, pinned)],
            env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
            capture_output=True,
            text=True,
        )

    refused = run(systems.NVIDIA_KEY_FINGERPRINT)
    assert refused.returncode == 1 and not keyring.exists()
    assert f"no key {systems.NVIDIA_KEY_FINGERPRINT} (the file holds: " in refused.stderr
    assert all(p in refused.stderr for p in primaries) and "): not installed" in refused.stderr
    installed = run(primaries[0])
    assert installed.returncode == 0, installed.stderr
    assert not keyring.read_bytes().startswith(b"-----BEGIN")
    shown = subprocess.run(
        ["gpg", "--with-colons", "--show-keys", str(keyring)], env=env, check=True, capture_output=True, text=True
    ).stdout
    assert [line.split(":")[9] for line in shown.splitlines() if line.startswith("fpr")][:1] == primaries[:1]
    assert primaries[1] not in shown and shown.count("\npub:") + shown.startswith("pub:") == 1


def test_the_lab_host_image_has_every_base_package():
    """The lab's prepared hosts (lab/host.Dockerfile) have what the prepare phase installs, so a redeploy there
    changes nothing; the bare hosts' image (lab/bare.Dockerfile) has none of it."""
    from llama_rpc_deploy.paths import PROJECT

    prepared = (PROJECT / "lab" / "host.Dockerfile").read_text()
    bare = (PROJECT / "lab" / "bare.Dockerfile").read_text()
    for package in (*systems.BASE_PACKAGES, "docker.io"):
        assert (
            f" {package} " in prepared.replace("\n", " ")
            and f" {package} " not in bare.split("apt-get install")[1].split("&&")[0] + " "
        )


# --- what the deploy reads before the phase installs it ---


def test_a_vulkan_card_to_learn_without_vulkaninfo_yet_is_refused(tmp_path, monkeypatch):
    """gpus unset on a vulkan host whose PCI bus shows an AMD card: the cards are learned while the deploy loads,
    before vulkan-tools is installed, so the deploy says so instead of serving a CPU device."""
    with pytest.raises(Refusal) as refusal:
        prepare(
            tmp_path,
            monkeypatch,
            {},
            workers_data={GPU_WORKER: {"image_backend": "vulkan"}},
            facts=with_facts(
                DisplayVendors=["amd"], MissingCommands=lambda names=(): [n for n in names if n == "vulkaninfo"]
            ),
        )
    line = refusal.value.format_message()
    assert line.startswith(f"{GPU_WORKER}: gpus is not set and an AMD or Intel card is on its PCI bus, but vulkaninfo")
    assert "expected gpus listed" in line


def test_sleep_on_a_worker_without_ip_yet_is_refused_with_what_to_do(tmp_path, monkeypatch):
    """sleep_idle_seconds on a bare worker: its NIC is read before the phase installs iproute2 and ethtool."""
    from .test_wiring import SLEEPY

    with pytest.raises(Refusal) as refusal:
        prepare(
            tmp_path,
            monkeypatch,
            {},
            extra=SLEEPY,
            facts=with_facts(MissingCommands=lambda names=(): [n for n in names if n in ("ip", "ethtool", "docker")]),
        )
    assert refusal.value.format_message() == (
        f"{GPU_WORKER}: sleep_idle_seconds is set, and the worker's NIC is read before the deploy changes anything, "
        "but ip and ethtool are not installed yet: expected one deploy without sleep_idle_seconds first (its "
        "prepare phase installs them), or apt-get install iproute2 ethtool"
    )


def test_a_cuda_host_the_phase_does_not_set_up_still_needs_dockers_runtime(tmp_path, monkeypatch):
    """Cards listed on a cuda host whose PCI bus shows none (a VM, WSL): the phase sets up nothing NVIDIA there, so
    the check of Docker's nvidia runtime still stands. gpus listed makes it an NVIDIA host: not this case; gpus unset
    and nvidia-smi answering (learned) is."""
    with pytest.raises(Refusal, match="but Docker has no nvidia runtime"):
        prepare(
            tmp_path,
            monkeypatch,
            {},
            workers_data={GPU_WORKER: {"image_backend": "cuda"}},
            facts=with_facts(
                DisplayVendors=[],
                DockerRuntimes=["runc"],
                NvidiaGpus=gpus.parse_nvidia_smi(["NVIDIA GeForce RTX 4080, 16376, 8.9"]),
            ),
        )


def test_facts_with_no_output_are_empty_not_none():
    """pyinfra answers a fact's default() when its command prints nothing (no tool, no card): the lists the deploy
    iterates must be empty then (a cuda host without nvidia-smi learned None, and the deploy crashed)."""
    from llama_rpc_deploy import facts

    for fact in (facts.NvidiaGpus, facts.VulkanGpus, systems.DisplayVendors):
        assert fact.default() == [], fact.__name__
