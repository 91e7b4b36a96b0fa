"""`status`: what one host's script prints, read into the table (the lab test runs it for real)."""
from llama_rpc_deploy import status

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
    w = status.parse("10.0.0.20", "worker", WORKER_OUTPUT, cache_limit=64 << 30)
    rpc = w.services[0]
    assert [s.unit for s in w.services] == ["rpc-server.service", "rpc-server-watchdog.service",
                                            "llama-rpc-firewall.service", "rpc-cache-prune.timer"]
    assert (rpc.crashes, rpc.last_crash, rpc.watchdog_restarts) == (2, "2026-12-03T13:40:07+0000", 1)
    assert rpc.last_watchdog_reason.startswith("a new connection has waited 20 s")
    assert (w.image, w.rpc_protocol, w.cache_bytes) == ("llama-rpc:b11312-0123456789ab", "7.0.0", 50 << 20)
    assert w.gpu_memory == ["NVIDIA GeForce RTX 5060 Ti, 9012, 16311"] and w.ok


def test_the_coordinators_load_report_and_a_failed_service():
    c = status.parse("10.0.0.10", "coordinator", COORDINATOR_OUTPUT)
    c.api = "no answer (connection refused)"
    assert c.devices == {"CUDA0": {"model": 9374.0, "kv": 5568.0},
                         "RPC0[10.0.0.20:50052]": {"model": 7207.0, "kv": 4352.0}}
    assert c.projector_on == "RPC0[10.0.0.20:50052]" and not c.ok
    w = status.parse("10.0.0.20", "worker", WORKER_OUTPUT, cache_limit=64 << 30)
    text = status.table([c, w])
    assert "llama-server.service             failed" in text
    assert "restarts: 2 after a crash (last 2026-12-03T13:40:07+0000), 1 by its watchdog" in text
    assert "tensor cache 50.0 MiB of 64 GiB" in text and "vision projector on RPC0[10.0.0.20:50052]" in text
    assert text.endswith("NOT WELL: 10.0.0.10")
    assert '"ok": false' in status.to_json([c, w])


def test_each_host_gets_the_script_of_its_role():
    c = cluster()
    worker = status.host_script(c.workers[0], "worker")
    assert "rpc-cache-prune.timer" in worker and "/var/cache/llama-rpc/rpc" in worker and "== log" not in worker
    coordinator = status.host_script(c.coordinator, "coordinator")
    assert "llama-server.service" in coordinator and "buffer size|CLIP using" in coordinator
