"""`status`: what one host's script prints, read into the table (the lab test runs it for real)."""

import re
import shlex

import pytest

from llama_rpc_deploy import speculation, render, roles, status

from .helpers import cluster

WORKER_OUTPUT = """== unit rpc-server.service
active
== unit rpc-server-watchdog.service
active
== unit llama-rpc-firewall.service
active
== unit rpc-cache-prune.timer
active
== crashes
2026-12-03T13:10:02+0000 w1 systemd[1]: rpc-server.service: Scheduled restart job, restart counter is at 1.
2026-12-03T13:40:07+0000 w1 systemd[1]: rpc-server.service: Scheduled restart job, restart counter is at 2.
== watchdog
2026-12-03T13:20:00+0000 w1 rpc-server-watchdog.sh[9]: a new connection has waited 20 s while rpc-server still serves an old one (llama-server restarted while the network was down?): restarting rpc-server.service
== image
llama-rpc:b11312-0123456789ab
== protocol
7.0.0
== gpus
NVIDIA GeForce RTX 5060 Ti, 9012, 16311
== cache
52428800
"""
COORDINATOR_OUTPUT = """== unit llama-server.service
failed
== unit llama-server-watchdog.service
active
== crashes
== watchdog
2026-12-03T13:40:09+0000 c systemd: rpc-server at 10.0.0.20:50052 closed llama-server's connection (it restarted, or its host went down): restarting llama-server.service
== image
llama-rpc:b11312-0123456789ab
== protocol
7.0.0
== gpus
== log
llama_model_loader: loaded meta data with 30 key-value pairs
load_tensors:   RPC0[10.0.0.20:50052] model buffer size =  7207.00 MiB
load_tensors:   CUDA0 model buffer size =  9374.00 MiB
llama_kv_cache: RPC0[10.0.0.20:50052] KV buffer size =  4352.00 MiB
llama_kv_cache:      CUDA0 KV buffer size =  5568.00 MiB
clip_ctx: CLIP using RPC0[10.0.0.20:50052] backend
"""


def test_a_worker_restart_and_its_cause():
    w = status.parse("10.0.0.20", "workers", WORKER_OUTPUT, cache_limit=64 << 30)
    rpc = w.services[0]
    assert [s.unit for s in w.services] == [
        "rpc-server.service",
        "rpc-server-watchdog.service",
        "llama-rpc-firewall.service",
        "rpc-cache-prune.timer",
    ]
    assert (rpc.crashes, rpc.last_crash, rpc.watchdog_restarts) == (2, "2026-12-03T13:40:07+0000", 1)
    assert rpc.last_watchdog_reason.startswith("a new connection has waited 20 s")
    assert (w.image, w.rpc_protocol, w.cache_bytes) == ("llama-rpc:b11312-0123456789ab", "7.0.0", 50 << 20)
    assert w.gpu_memory == ["NVIDIA GeForce RTX 5060 Ti, 9012, 16311"] and w.ok


def test_the_coordinators_load_report_and_a_failed_service():
    c = status.parse("10.0.0.10", "coordinator", COORDINATOR_OUTPUT)
    c.api = "no answer (connection refused)"
    assert c.devices == {
        "CUDA0": {"model": 9374.0, "kv": 5568.0},
        "RPC0[10.0.0.20:50052]": {"model": 7207.0, "kv": 4352.0},
    }
    assert c.projector_on == "RPC0[10.0.0.20:50052]" and not c.ok
    w = status.parse("10.0.0.20", "workers", WORKER_OUTPUT, cache_limit=64 << 30)
    text = status.table([c, w])
    assert "llama-server.service             failed" in text
    assert "restarts: 2 after a crash (last 2026-12-03T13:40:07+0000), 1 by its watchdog" in text
    assert "tensor cache 50.0 MiB of 64 GiB" in text and "vision projector on RPC0[10.0.0.20:50052]" in text
    assert text.endswith("NOT WELL: 10.0.0.10")
    assert '"ok": false' in status.to_json([c, w])


def test_each_host_gets_the_script_of_its_role():
    c = cluster()
    worker = status.host_script(c, c.workers[0])
    assert "rpc-cache-prune.timer" in worker and "/var/cache/llama-rpc/rpc" in worker and "== log" not in worker
    coordinator = status.host_script(c, c.coordinator)
    assert "llama-server.service" in coordinator and "buffer size|CLIP using" in coordinator


# What the deploy installs and starts per role (llama_rpc_deploy/phases/services.py): the firewall only
# with rpc_firewall; the cache prune runs from its timer, so the timer is what status asks about.
DEPLOYED_UNITS = {
    "coordinator": [roles.COORDINATOR_UNIT, roles.WATCHDOG_UNIT, roles.FRONT_UNIT, roles.TUNNEL_UNIT],
    "workers": [
        roles.WORKER_UNIT,
        roles.WORKER_WATCHDOG_UNIT,
        roles.FIREWALL_UNIT,
        roles.CACHE_PRUNE_TIMER,
        roles.TUNNEL_UNIT,
    ],
    "worker without rpc_firewall": [
        roles.WORKER_UNIT,
        roles.WORKER_WATCHDOG_UNIT,
        roles.CACHE_PRUNE_TIMER,
        roles.TUNNEL_UNIT,
    ],
    "plain coordinator": [roles.COORDINATOR_UNIT, roles.WATCHDOG_UNIT, roles.FRONT_UNIT],
    "plain worker": [roles.WORKER_UNIT, roles.WORKER_WATCHDOG_UNIT, roles.FIREWALL_UNIT, roles.CACHE_PRUNE_TIMER],
}


def _asked_units(script: str) -> list[str]:
    """The units a host script asks systemctl about, each under its own '== unit' section."""
    asked = []
    for line in script.splitlines():
        if "systemctl is-active" in line:
            section = re.search(r"echo '== unit ([^']+)'", line)
            unit = shlex.split(line.split("systemctl is-active", 1)[1])[0]
            assert section and section.group(1) == unit, f"systemctl is-active {unit} outside its own section: {line}"
            asked.append(unit)
    return asked


def _run(script: str, state: str = "active") -> str:
    """What the script prints on a host where every unit it asks about is in `state`."""
    return "".join(f"== unit {u}\n{state}\n" for u in _asked_units(script)) + "== crashes\n== watchdog\n"


@pytest.mark.parametrize(
    "role,firewall,transport,expected",
    [
        ("coordinator", True, "tunnel", DEPLOYED_UNITS["coordinator"]),
        ("workers", True, "tunnel", DEPLOYED_UNITS["workers"]),
        ("workers", False, "tunnel", DEPLOYED_UNITS["worker without rpc_firewall"]),
        ("coordinator", True, "plain", DEPLOYED_UNITS["plain coordinator"]),
        ("workers", True, "plain", DEPLOYED_UNITS["plain worker"]),
    ],
)
def test_status_asks_about_every_unit_the_deploy_installs(role, firewall, transport, expected):
    c = cluster(workers=[{"rpc_firewall": firewall, "rpc_transport": transport}])
    host = c.coordinator if role == "coordinator" else c.workers[0]
    # the units status asks this host about, from the script it sends (expected: what the deploy installs)
    script = status.host_script(c, host)
    asked = _asked_units(script)
    skipped, added = sorted(set(expected) - set(asked)), sorted(set(asked) - set(expected))
    assert not skipped and not added, f"the {role}'s status script skips {skipped}, adds {added}"
    assert len(asked) == len(set(asked)), f"a unit asked about twice: {asked}"
    reported = status.parse(host.name, role, _run(script))
    units = [s.unit for s in reported.services]
    assert sorted(units) == sorted(expected), f"parse() reports {units} of the {role}'s {expected}"
    assert reported.ok
    for unit in expected:  # any one of them down: the host is not well
        down = status.parse(host.name, role, _run(script).replace(f"== unit {unit}\nactive", f"== unit {unit}\nfailed"))
        assert not down.ok, f"{unit} failed and status still says {host.name} is well"
        assert [s.state for s in down.services if s.unit == unit] == ["failed"]


def test_the_deployed_units_are_the_ones_render_writes():
    """Every systemd unit rendered for a role is in DEPLOYED_UNITS (or is started by one of them)."""
    c = cluster(workers=[{"rpc_firewall": True}])
    w = c.workers[0]
    started_by_a_timer = {roles.CACHE_PRUNE_UNIT}

    def units(files):
        return {path.rsplit("/", 1)[1] for path in files if path.startswith(roles.UNIT_DIR + "/")}

    worker = units(
        {
            **render.worker_files(c, w, "img"),
            **render.firewall_files(c, w),
            **render.tunnel_files(c, w),
            **render.worker_watchdog_files(w),
            **render.cache_prune_files(w),
        }
    )
    coordinator = units(
        {
            **render.coordinator_files(c, "img"),
            **render.watchdog_files(c),
            **render.front_files(c),
            **render.tunnel_files(c, c.coordinator),
        }
    )
    assert worker - started_by_a_timer == set(DEPLOYED_UNITS["workers"])
    assert coordinator == set(DEPLOYED_UNITS["coordinator"])


def test_the_speculative_type_and_its_acceptance():
    """The type from the deployed launch script, the counters from llama-server's /metrics (its own words)."""
    c = status.parse("10.0.0.10", "coordinator", "== spec\n--spec-type draft-simple\n")
    metrics = (
        "# HELP llamacpp:spec_decode_num_draft_tokens_total Number of draft tokens\n"
        "llamacpp:spec_decode_num_draft_tokens_total 64\n"
        "llamacpp:spec_decode_num_accepted_tokens_total 41\n"
        "llamacpp:spec_decode_num_drafts_total 22\n"
        'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 18\n'
    )
    c.speculation.update(speculation.counters(metrics))
    assert c.speculation == {"type": "draft-simple", "drafted": 64, "accepted": 41, "drafts": 22}
    assert "speculative decoding: draft-simple: 41 of 64 drafted tokens accepted (64%), 22 drafts" in status.table([c])
    assert status.parse("10.0.0.10", "coordinator", "== spec\n").speculation == {}
