"""deploy.py's wiring, without hosts: pyinfra's own prepare stage (as `pyinfra INVENTORY deploy.py` runs it)
on one coordinator and three workers whose files changed in different ways, the facts faked.

pyinfra orders every host's operations in one graph; a host that creates an operation the others do not, in
a loop, can give two hosts opposite orders of the same operations, and the whole run then stops with "Cycle
detected in operation ordering DAG" before anything changes (docs: deploy-process, loops-cycle-errors).
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import pyinfra
import pytest
from pyinfra.api import Config, State
from pyinfra.api.host import Host
from pyinfra.api.state import StateStage
from pyinfra.context import ctx_config, ctx_inventory, ctx_state
from pyinfra.facts import deb as deb_facts
from pyinfra.facts import files as file_facts
from pyinfra.facts import server as server_facts
from pyinfra.facts import systemd as systemd_facts

from llama_rpc_deploy import deployment, facts, render
from llama_rpc_deploy.paths import PROJECT

from .shaped import write_shaped

COORDINATOR, WORKERS = "10.0.0.10", ["10.0.0.11", "10.0.0.12", "10.0.0.13"]
MODEL = "/models/wiring.gguf"
IMAGE_ID = "sha256:" + "1" * 64


class Unchanged(str):
    """A remote checksum equal to whatever it is compared with: the file on the host is the one rendered."""
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    __hash__ = str.__hash__


def fake_facts(changed: dict[str, set[str]], header: bytes, header_size: int):
    """Host.get_fact for this test: every host has what the deploy needs (the image, its services running),
    and on each host exactly the files named in changed[host] differ from what the deploy renders."""
    def get_fact(host: Host, fact, *args, **kwargs):
        path = kwargs.get("path", "")
        answers = {
            facts.MissingCommands: [], facts.DockerRuntimes: ["runc"], facts.NvidiaGpus: [],
            facts.TcpListener: None, facts.TcpReachable: True, facts.GgufFiles: [],
            facts.SshHostKey: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTheWiringTest",
            facts.DockerImageId: IMAGE_ID, facts.DockerImageLayers: [],
            facts.GgufHeader: (header_size, header[:kwargs.get("limit", len(header))]),
        }
        if fact in answers:
            return answers[fact]
        if fact is deb_facts.DebPackages:
            return {"haproxy": ["2.6.12-1+deb12u4"], "socat": ["1.7.4.4-2"]}
        if fact in (file_facts.Sha1File, file_facts.Sha256File):
            return "0" * 40 if path in changed.get(host.name, ()) else Unchanged("same")
        if fact is file_facts.File:
            return {"mode": 755 if path.endswith(".sh") else 644, "user": "root", "group": "root", "size": 1}
        if fact is file_facts.Directory:
            return {"mode": 755, "user": "root", "group": "root"}
        if fact is file_facts.FindInFile:
            return ["present"]
        if fact is systemd_facts.SystemdStatus:
            return {unit: True for unit in (render.WORKER_UNIT, render.COORDINATOR_UNIT, render.FIREWALL_UNIT,
                                            render.WATCHDOG_UNIT, render.WORKER_WATCHDOG_UNIT,
                                            render.CACHE_PRUNE_TIMER, render.FRONT_UNIT)}
        if fact is systemd_facts.SystemdEnabled:
            return {unit: True for unit in (render.WORKER_UNIT, render.COORDINATOR_UNIT, render.FIREWALL_UNIT,
                                            render.WATCHDOG_UNIT, render.WORKER_WATCHDOG_UNIT,
                                            render.CACHE_PRUNE_TIMER, render.FRONT_UNIT)}
        if fact is server_facts.Users:
            return {"llama-rpc": {"home": "/nonexistent", "shell": "/usr/sbin/nologin", "group": "llama-rpc",
                                  "groups": [], "uid": 999, "gid": 999, "comment": None}}
        if fact is server_facts.Groups:
            return {"llama-rpc"}
        if fact is server_facts.Os:
            return "Linux"
        if fact is server_facts.TmpDir:
            return "/tmp"
        raise AssertionError(f"the wiring test fakes no {fact.__name__}({kwargs}): add it")
    return get_fact


def prepare(tmp_path: Path, monkeypatch, changed: dict[str, set[str]], workers_data: dict | None = None,
            extra: str = "") -> State:
    """deploy.py through pyinfra's prepare stage, as its CLI does it (pyinfra_cli/cli.py), the facts faked."""
    from pyinfra_cli.inventory import make_inventory
    from pyinfra_cli.util import load_deploy_file

    header = write_shaped(tmp_path / "model.gguf", arch="llama", n_layer=8, n_embd=512, n_head=8, n_head_kv=4,
                          head_dim=64, n_ff=1024, n_vocab=1000).read_bytes()
    key = tmp_path / "state" / "transfer_ed25519"
    key.parent.mkdir(parents=True)
    key.write_text("fake private key\n")
    key.with_suffix(".pub").write_text("ssh-ed25519 AAAA fake\n")
    monkeypatch.setattr(deployment, "transfer_key", lambda *a, **k: key)
    workers_data = workers_data or {}
    inventory_file = tmp_path / "inventory.py"
    inventory_file.write_text(
        'LAB = {"image_backend": "cpu", "llama_model_path": "%s", "llama_cpp_source": "%s"}\n'
        'coordinator = [("%s", LAB)]\nworkers = [%s]\n'
        % (MODEL, tmp_path / "llama.cpp.tar.gz", COORDINATOR,
           ", ".join(f'("{w}", {workers_data.get(w, {})!r})' for w in WORKERS)) + extra)
    (tmp_path / "llama.cpp.tar.gz").write_bytes(b"not really a tarball")
    monkeypatch.setattr(Host, "get_fact", fake_facts(changed, header, 4_000_000))
    monkeypatch.setattr(pyinfra, "is_cli", True)  # operations ordered by the lines that create them, as in the CLI
    monkeypatch.chdir(PROJECT)

    state = State(check_for_changes=True)
    config = Config()
    with ctx_state.use(state), ctx_config.use(config):
        inventory = make_inventory(str(inventory_file), cwd=str(PROJECT))
        with ctx_inventory.use(inventory):
            state.init(inventory, config)
            for host in inventory:  # as connect_all does for each host it reached
                state.activate_host(host)
            state.set_stage(StateStage.Prepare)
            state.current_op_file_number = 0
            load_deploy_file(state, str(PROJECT / "deploy.py"))
    return state


# Paths as the deploy installs them (group_data's deploy_dir is /opt/llama-rpc)
SCRIPT, UNIT = "/opt/llama-rpc/rpc-server.sh", f"{render.UNIT_DIR}/{render.WORKER_UNIT}"
WATCHDOG, LLAMA_SERVER = f"{render.UNIT_DIR}/{render.WORKER_WATCHDOG_UNIT}", "/opt/llama-rpc/llama-server.sh"


def test_workers_with_different_changes_order_and_fill_the_run_records(tmp_path, monkeypatch):
    """The case reproduced on the lab (a worker with rpc_threads: 2 of its own, so its launch script changed,
    beside a worker whose unit changed), a worker with two files changed, and the coordinator's script: pyinfra
    finds one order, and the run's records are filled."""
    changed = {WORKERS[0]: {SCRIPT}, WORKERS[1]: {UNIT}, WORKERS[2]: {WATCHDOG}, COORDINATOR: {LLAMA_SERVER}}
    state = prepare(tmp_path, monkeypatch, changed, workers_data={WORKERS[0]: {"rpc_threads": 2}})

    order = state.get_op_order()  # pyinfra's own: raises "Cycle detected in operation ordering DAG" on a tangle
    assert len(order) == len(set(order)) > 0
    run = state.llama_rpc_run
    assert run.health_check is not None
    assert sorted(run.worker_services) == sorted(WORKERS)
    for name in [COORDINATOR, *WORKERS]:
        assert set(order) >= set(state.inventory.get_host(name).op_hash_order)
        assert set(run.replaced.get(name, [])) == changed[name]  # what this run replaces, and only that
    # every worker creates the same operations in the same order, whatever changed on it
    assert len({tuple(state.inventory.get_host(w).op_hash_order) for w in WORKERS}) == 1
    # ... and only a changed launch script or unit restarts rpc-server (worker 2's watchdog changed, not rpc-server)
    restarts = {w: run.worker_services[w].restart.will_change for w in WORKERS}
    assert restarts == {WORKERS[0]: True, WORKERS[1]: True, WORKERS[2]: False}
    assert not any(run.worker_services[w].ensure.will_change for w in WORKERS)  # running and enabled already


def test_an_extra_group_reads_the_same_in_the_deploy_and_the_commands(tmp_path, monkeypatch):
    """A host in a group of its own (`big`, with group_data/big.yml beside the inventory): the deploy, and
    `plan`, `status`, the preflight and testinfra (deployment.offline_cluster) see the same settings."""
    from llama_rpc_deploy.deployment import offline_cluster

    group_data = tmp_path / "group_data"
    group_data.mkdir(parents=True)
    (group_data / "big.py").write_text((PROJECT / "group_data" / "all.py").read_text())  # the YAML loader
    (group_data / "big.yml").write_text("llama_ctx_size: 8192\nrpc_threads: 3\n")
    state = prepare(tmp_path, monkeypatch, {}, extra=f'big = ["{COORDINATOR}", "{WORKERS[1]}"]\n')
    deployed = state.llama_rpc_run.deployment.cluster
    offline = offline_cluster(tmp_path / "inventory.py")
    assert deployed.settings["llama_ctx_size"] == offline.settings["llama_ctx_size"] == 8192
    assert [h.settings["rpc_threads"] for h in offline.workers] == [h.settings["rpc_threads"] for h in deployed.workers]
    assert [h.settings["rpc_threads"] for h in offline.workers][1] == 3
    assert offline.coordinator.origins["llama_ctx_size"].startswith("group_data/big.yml:1")
    for mine, theirs in zip(offline.hosts, deployed.hosts):
        assert (mine.name, mine.settings) == (theirs.name, theirs.settings)


def test_an_extra_group_of_workers_only_refuses_a_setting_only_the_coordinator_reads(tmp_path, monkeypatch):
    """As group_data/workers.yml does: a group whose hosts are all workers applies to the workers."""
    from llama_rpc_deploy.deployment import offline_cluster
    from llama_rpc_deploy.settings import SettingsError

    monkeypatch.chdir(PROJECT)
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "small.py").write_text((PROJECT / "group_data" / "all.py").read_text())
    (tmp_path / "group_data" / "small.yml").write_text("llama_ctx_size: 8192\n")
    inventory = tmp_path / "inventory.py"
    inventory.write_text(f'coordinator = [("{COORDINATOR}", {{"llama_model_path": "{MODEL}"}})]\n'
                         f'workers = [("{WORKERS[0]}", {{}}), ("{WORKERS[1]}", {{}})]\nsmall = ["{WORKERS[1]}"]\n')
    with pytest.raises(SettingsError, match=r"group_data/small.yml:1:\d+: llama_ctx_size = 8192 has no effect there: "
                                            r"only the coordinator reads it, and this applies to the workers only"):
        offline_cluster(inventory)
