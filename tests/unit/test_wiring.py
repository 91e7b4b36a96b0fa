"""deploy.py's wiring, without hosts: pyinfra's own prepare stage (as `pyinfra INVENTORY deploy.py` runs it)
on one coordinator and three workers whose files changed in different ways, the facts faked.

pyinfra orders every host's operations in one graph; a host that creates an operation the others do not, in
a loop, can give two hosts opposite orders of the same operations, and the whole run then stops with "Cycle
detected in operation ordering DAG" before anything changes (docs: deploy-process, loops-cycle-errors).
"""

from __future__ import annotations

from pathlib import Path

import gevent
import pytest
from pyinfra.api import State

from llama_rpc_deploy import roles
from llama_rpc_deploy.paths import PROJECT

from .. import wiring

COORDINATOR, WORKERS = "10.0.0.10", ["10.0.0.11", "10.0.0.12", "10.0.0.13"]
MODEL = "/models/wiring.gguf"
pytestmark = pytest.mark.xdist_group("wiring")  # one worker imports the deploy's phases and operations, once


def prepare(
    tmp_path: Path,
    monkeypatch,
    changed: dict[str, set[str]],
    workers_data: dict | None = None,
    extra: str = "",
    facts=lambda get_fact: get_fact,
) -> State:
    """deploy.py through pyinfra's prepare stage (tests/wiring.py) for one coordinator and three workers, on each
    host exactly the files in changed[host] differing from what the deploy renders (facts: around those facts)."""
    header = wiring.model_header(tmp_path / "model.gguf")
    workers_data = workers_data or {}
    inventory_file = tmp_path / "inventory.py"
    inventory_file.write_text(
        'LAB = {"image_backend": "cpu", "llama_model_path": "%s", "llama_cpp_source": "%s"}\n'
        'coordinator = [("%s", LAB)]\nworkers = [%s]\n'
        % (
            MODEL,
            tmp_path / "llama.cpp.tar.gz",
            COORDINATOR,
            ", ".join(f'("{w}", {workers_data.get(w, {})!r})' for w in WORKERS),
        )
        + extra
    )
    (tmp_path / "llama.cpp.tar.gz").write_bytes(b"not really a tarball")
    monkeypatch.chdir(PROJECT)
    return wiring.prepare(
        inventory_file, facts(wiring.fake_facts(changed, header, 4_000_000)), wiring.fake_transfer_key(tmp_path)
    )


def over_ssh(get_fact, refused: tuple[str, str] | None = None):
    """The facts as a real run reads them: each read a round trip, so pyinfra's greenlet for that host yields and
    another host's deploy.py goes on (pyinfra loads every host's at once). refused = (host, command): that host
    lacks that command."""

    def read(host, fact, *args, **kwargs):
        gevent.sleep(0.001)
        if refused and host.name == refused[0] and fact.__name__ == "MissingCommands":
            return [refused[1]]
        return get_fact(host, fact, *args, **kwargs)

    return read


# Paths as the deploy installs them (group_data's deploy_dir is /opt/llama-rpc)
SCRIPT, UNIT = "/opt/llama-rpc/rpc-server.sh", f"{roles.UNIT_DIR}/{roles.WORKER_UNIT}"
WATCHDOG, LLAMA_SERVER = f"{roles.UNIT_DIR}/{roles.WORKER_WATCHDOG_UNIT}", "/opt/llama-rpc/llama-server.sh"


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


def test_every_host_loads_at_once_and_the_coordinator_alone_settles_the_cluster(tmp_path, monkeypatch):
    """Hosts whose fact reads yield, as over SSH: the coordinator settles the Cluster once (the planner's split
    for llama_tensor_split = 'auto', in its launch script), whichever host's deploy.py runs first."""
    auto = (
        'coordinator[0][1]["llama_tensor_split"] = "auto"\n'
        'for _, data in workers:\n    data.update(image_backend="vulkan", gpus=["RX 7900 XTX"])\n'
    )
    state = prepare(tmp_path, monkeypatch, {}, extra=auto, facts=over_ssh)
    run = state.llama_rpc_run
    assert run.settled and sorted(run.worker_services) == sorted(WORKERS)
    split = run.deployment.cluster.settings["llama_tensor_split"]
    assert isinstance(split, list) and len(split) == len(WORKERS)  # a share per device (the CPU coordinator has none)
    assert len({tuple(state.inventory.get_host(w).op_hash_order) for w in WORKERS}) == 1


@pytest.mark.parametrize("who", [COORDINATOR, WORKERS[1]], ids=["the coordinator", "a worker"])
def test_a_host_that_lacks_a_command_is_refused_once_with_our_line(tmp_path, monkeypatch, who):
    """A refusal in one host's load, while the others load too: one Refusal (our line, shown alone by pyinfra's
    CLI, exit 1, llama_rpc_deploy/refusal.py), no traceback from gevent's hub."""
    from llama_rpc_deploy.refusal import Refusal

    unprepared = 'for _, data in coordinator + workers:\n    data["host_prepare"] = False\n'  # checks only
    with pytest.raises(Refusal) as refusal:
        prepare(
            tmp_path,
            monkeypatch,
            {},
            extra=unprepared,
            facts=lambda get_fact: over_ssh(get_fact, refused=(who, "zstd")),
        )
    assert refusal.value.format_message() == (
        f"{who}: zstd not found: install them first (Docker Engine, zstd, iptables)"
    )


def test_a_command_the_prepare_phase_installs_is_not_refused(tmp_path, monkeypatch):
    """host_prepare (the default): the checks read their facts before the prepare phase installs anything, so a host
    without docker is not refused: its first operation installs Debian 12's docker.io. The others have a Docker not
    from Debian (docker-ce: no docker.io package), which is left alone."""
    from pyinfra.facts.deb import DebPackages

    def docker_ce_but_one(get_fact):
        def read(host, fact, *args, **kwargs):
            found = over_ssh(get_fact, refused=(WORKERS[1], "docker"))(host, fact, *args, **kwargs)
            return {p: v for p, v in found.items() if p != "docker.io"} if fact is DebPackages else found

        return read

    state = prepare(tmp_path, monkeypatch, {}, facts=docker_ce_but_one)
    first = {state.inventory.get_host(h).op_hash_order[0] for h in (COORDINATOR, *WORKERS)}
    assert len(first) == 1  # the same operation first on every host: the packages (each host's own list)
    assert {n.rsplit(": ", 1)[1] for n in state.op_meta[first.pop()].names} == {
        "zstd, iptables, python3, ca-certificates, curl, iproute2, ethtool, docker.io",  # the host without Docker
        "zstd, iptables, python3, ca-certificates, curl, iproute2, ethtool",  # docker-ce's hosts
    }


def test_an_extra_group_reads_the_same_in_the_deploy_and_the_commands(tmp_path, monkeypatch):
    """A host in a group of its own (`big`, with group_data/big.yml beside the inventory): the deploy, and
    `plan`, `status`, the preflight and testinfra (loading.offline_cluster) see the same settings."""
    from llama_rpc_deploy.loading import offline_cluster

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
    from llama_rpc_deploy.loading import offline_cluster
    from llama_rpc_deploy.settings import SettingsError

    monkeypatch.chdir(PROJECT)
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "small.py").write_text((PROJECT / "group_data" / "all.py").read_text())
    (tmp_path / "group_data" / "small.yml").write_text("llama_ctx_size: 8192\n")
    inventory = tmp_path / "inventory.py"
    inventory.write_text(
        f'coordinator = [("{COORDINATOR}", {{"llama_model_path": "{MODEL}"}})]\n'
        f'workers = [("{WORKERS[0]}", {{}}), ("{WORKERS[1]}", {{}})]\nsmall = ["{WORKERS[1]}"]\n'
    )
    with pytest.raises(
        SettingsError,
        match=r"group_data/small.yml:1:\d+: llama_ctx_size = 8192 has no effect there: "
        r"only the coordinator reads it, and this applies to the workers only",
    ):
        offline_cluster(inventory)


DRAFT = "/models/draft.gguf"
SMALL = dict(n_layer=1, n_embd=64, n_head=2, n_head_kv=1, n_ff=128)


def with_headers(folder: Path, draft: str):
    """The facts, with the model and the draft (facts.GgufHeader at MODEL and DRAFT) of the lab's kinds: the
    sentence model, and a draft of its vocabulary ('same') or of another ('other', write_model's)."""
    from lab.testmodel import Shape, write_model, write_sentence_model

    headers = {
        MODEL: write_sentence_model(folder / "model.gguf", Shape(**SMALL)).read_bytes(),
        DRAFT: (write_sentence_model if draft == "same" else write_model)(
            folder / "draft.gguf", Shape(**SMALL, seed=7)
        ).read_bytes(),
    }

    def around(get_fact):
        def read(host, fact, *args, **kwargs):
            header = headers.get(kwargs.get("path")) if fact.__name__ == "GgufHeader" else None
            if header is not None:
                return len(header), header[: kwargs.get("limit", len(header))]
            return get_fact(host, fact, *args, **kwargs)

        return over_ssh(read)

    return around


def test_the_coordinator_settles_the_drafts_type_from_its_header(tmp_path, monkeypatch):
    """llama_spec_draft_path alone: the type is the draft file's (a llama model: draft-simple), read on the
    coordinator before any change, and it reaches the launch script."""
    from llama_rpc_deploy.render import llama_server_args

    extra = f'coordinator[0][1].update(llama_spec_draft_path="{DRAFT}", llama_ctx_size=4096)\n'
    state = prepare(tmp_path, monkeypatch, {}, extra=extra, facts=with_headers(tmp_path, "same"))
    cluster = state.llama_rpc_run.deployment.cluster
    assert cluster.settings["llama_spec_type"] == "draft-simple"
    assert "--spec-type draft-simple" in llama_server_args(cluster, api_key=False)


def test_a_draft_of_another_vocabulary_is_refused_on_the_coordinator_before_any_change(tmp_path, monkeypatch):
    from llama_rpc_deploy.refusal import Refusal

    extra = f'coordinator[0][1].update(llama_spec_draft_path="{DRAFT}", llama_ctx_size=4096)\n'
    with pytest.raises(Refusal) as refusal:
        prepare(tmp_path, monkeypatch, {}, extra=extra, facts=with_headers(tmp_path, "other"))
    message = refusal.value.format_message()
    assert f"(host {COORDINATOR}): the draft {DRAFT} has other token texts than the target's: expected " in message


INTEL_NIC = ["interface eno1", "exists yes", "mac 3c:7c:3f:12:34:56", "broadcast 10.0.0.255", "ethtool yes",
             "\tSupports Wake-on: pumbg", "\tWake-on: d"]  # fmt: skip
SLEEPY = 'coordinator = [(coordinator[0][0], {**coordinator[0][1], "sleep_idle_seconds": 600})]\n'


def nics(lines_of):
    """facts with facts.WakeNic answered per worker by lines_of(host name)."""

    def wrap(get_fact):
        def read(host, fact, *args, **kwargs):
            if fact.__name__ == "WakeNic":
                return lines_of(host.name)
            return get_fact(host, fact, *args, **kwargs)

        return over_ssh(read)

    return wrap


def test_sleep_on_workers_checked_differently_still_order(tmp_path, monkeypatch):
    """With sleep_idle_seconds, a worker whose NIC is checked (a .link file too) beside one that is not: one order,
    and the coordinator's llama-sleep.service comes after llama-server's health check."""
    state = prepare(
        tmp_path,
        monkeypatch,
        {},
        workers_data={WORKERS[2]: {"wol_check_nic": False}},
        extra=SLEEPY,
        facts=nics(lambda name: INTEL_NIC),
    )
    order = state.get_op_order()
    names = [state.op_meta[h].names for h in order]
    flat = [next(iter(n)) for n in names]
    health = next(i for i, n in enumerate(flat) if "| Wait for" in n)
    sleeper = next(i for i, n in enumerate(flat) if "(llama-sleep)" in n)
    assert health < sleeper
    assert any("Accept the coordinator's sleep key" in n for n in flat)


def test_a_worker_whose_nic_cannot_wake_is_refused_before_any_change(tmp_path, monkeypatch):
    from llama_rpc_deploy.refusal import Refusal

    veth = ["interface eth0", "exists yes", "mac 02:42:ac:1e:39:0b", "broadcast 10.0.0.255", "ethtool yes"]
    with pytest.raises(Refusal) as refusal:
        prepare(
            tmp_path,
            monkeypatch,
            {},
            extra=SLEEPY,
            facts=nics(lambda name: veth if name == WORKERS[1] else INTEL_NIC),
        )
    assert f"{WORKERS[1]}'s eth0 cannot wake on a magic packet" in refusal.value.format_message()
