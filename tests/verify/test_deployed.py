"""What a deployed inventory must look like. Run against the lab or your own hosts (see conftest.py)."""

from __future__ import annotations

import json
import re
import urllib.request

import pytest

from llama_rpc_deploy import client, load_report, render, roles
from llama_rpc_deploy.plan import plan_cluster


def _url(deployment, path):
    return client.server_url(deployment.cluster) + path


def _image_id(host, ref):
    return host.check_output("docker image inspect --format '{{.Id}}' %s", ref)


def _running_image_id(host, container):
    return host.check_output("docker inspect --format '{{.Image}}' %s", container)


# --- services ---


def test_llama_server_service_active_and_enabled(coordinator):
    service = coordinator.service(roles.COORDINATOR_UNIT.removesuffix(".service"))
    assert service.is_running and service.is_enabled


def test_rpc_server_service_active_and_enabled(worker):
    service = worker.service(roles.WORKER_UNIT.removesuffix(".service"))
    assert service.is_running and service.is_enabled


# --- ports ---


def test_the_front_listens_on_the_api_address(coordinator, deployment):
    """Clients reach HAProxy (the front) at llama_host:llama_port, not llama-server."""
    s = deployment.cluster.settings
    address = s["llama_host"] or deployment.cluster.coordinator.address
    assert coordinator.socket(f"tcp://{address}:{s['llama_port']}").is_listening
    listeners = coordinator.check_output(f"ss -Hltnp 'sport = :{s['llama_port']}'")
    assert '"haproxy"' in listeners and "llama-server" not in listeners, listeners


def test_llama_server_listens_on_loopback_only(coordinator, deployment):
    """llama-server listens on 127.0.0.1:llama_server_port and nowhere else: only the front reaches it."""
    port = deployment.cluster.settings["llama_server_port"]
    listeners = coordinator.check_output(f"ss -Hltnp 'sport = :{port}'").splitlines()
    assert listeners and all("llama-server" in line for line in listeners), listeners
    assert {line.split()[3] for line in listeners} == {f"127.0.0.1:{port}"}, listeners


def test_llama_server_cannot_be_reached_from_a_worker(worker, deployment):
    """From another host, llama-server's port does not answer (the front's does)."""
    s, address = deployment.cluster.settings, deployment.cluster.coordinator.address

    def reach(port):
        return worker.check_output(
            f"timeout 3 bash -c '>/dev/tcp/{address}/{int(port)}' 2>/dev/null && echo open || echo closed"
        )

    assert reach(s["llama_server_port"]) == "closed"
    if not s["llama_host"]:  # the front listens on the coordinator's address
        assert reach(s["llama_port"]) == "open"


def test_the_front_runs_a_valid_configuration(coordinator, deployment):
    """llama-front.service runs, is enabled, and HAProxy finds its configuration valid; its admin socket
    answers with llama-server up."""
    service = coordinator.service(roles.FRONT_UNIT.removesuffix(".service"))
    assert service.is_running and service.is_enabled
    config = f"{deployment.cluster.settings['deploy_dir']}/front.cfg"
    check = coordinator.run("haproxy -c -f %s", config)
    assert check.rc == 0, check.stdout + check.stderr
    stat = coordinator.check_output(f"echo 'show stat' | socat -t 5 stdio unix-connect:{roles.FRONT_SOCKET}")
    row = next(
        line.split(",")
        for line in stat.splitlines()
        if line.startswith(f"{render.FRONT_BACKEND},{render.FRONT_SERVER},")
    )
    header = stat.splitlines()[0].removeprefix("# ").split(",")
    assert row[header.index("status")] == "UP", stat
    held = coordinator.check_output(f"echo 'show front' | socat -t 5 stdio unix-connect:{roles.FRONT_SOCKET}")
    assert held.startswith("held "), held


def test_rpc_server_listens_only_on_its_address(worker, worker_plan):
    """On its address (plain), or on loopback behind a tunnel."""
    host, port = worker_plan.rpc_bind, worker_plan.settings["rpc_port"]
    assert worker.socket(f"tcp://{host}:{port}").is_listening
    assert not worker.socket(f"tcp://0.0.0.0:{port}").is_listening


def test_coordinator_reaches_every_worker(coordinator, worker_plan):
    """llama-server holds a connection to every worker's rpc-server. (Not a new connection: rpc-server
    serves one client at a time, and one waiting behind llama-server's would look like a dead client.)"""
    assert coordinator.check_output(f"ss -Htn state established dst {worker_plan.rpc_endpoint}")
    if worker_plan.tunnelled:  # to the tunnel's end on the coordinator, and from there to the worker's
        assert coordinator.check_output(f"ss -Htn state established dst {worker_plan.rpc_remote}")


# --- one image per backend, the same on every host of that backend ---


def test_same_image_id_on_every_host(coordinator, worker, worker_plan, deployment):
    """The worker runs its backend's image, byte for byte the one the coordinator built (and the coordinator
    its own backend's)."""
    expected = _image_id(coordinator, deployment.image_of(worker_plan.name))
    assert expected.startswith("sha256:")
    assert _image_id(worker, deployment.image_of(worker_plan.name)) == expected
    assert _running_image_id(worker, "rpc-server") == expected
    assert _running_image_id(coordinator, "llama-server") == _image_id(coordinator, deployment.image)


def test_each_host_runs_its_backend(coordinator, worker, worker_plan, deployment):
    """The image's build says which backend it is (/app/backend, from the Dockerfile's GGML_BACKEND)."""
    assert worker.check_output("docker exec rpc-server cat /app/backend") == worker_plan.backend
    assert (
        coordinator.check_output("docker exec llama-server cat /app/backend") == deployment.cluster.coordinator.backend
    )


# --- launch scripts are the settings, rendered ---


def test_coordinator_files_match_the_settings(coordinator, deployment):
    for path, content in render.coordinator_files(deployment.cluster, deployment.image).items():
        assert coordinator.file(path).content_string == content, path


def test_worker_files_match_the_settings(worker, worker_plan, deployment):
    for path, content in render.worker_files(
        deployment.cluster, worker_plan, deployment.image_of(worker_plan.name)
    ).items():
        assert worker.file(path).content_string == content, path


# --- it serves, and the workers really hold part of the model ---


def test_health_ok(deployment):
    with urllib.request.urlopen(_url(deployment, "/health"), timeout=10) as response:
        assert response.status == 200
        assert json.load(response).get("status") == "ok"


def test_llama_server_reports_the_pinned_release(deployment):
    """/props names the release and commit the image was built from, not b0-unknown."""
    s = deployment.cluster.settings
    props = client.get(deployment.cluster, "/props")
    assert props["build_info"] == f"b{s['llama_cpp_build_number']}-{s['llama_cpp_ref'][:8]}"


def test_completion_returns_tokens(deployment):
    result = client.complete(deployment.cluster, "Hello from the verification suite", 8, timeout=120)
    assert result["timings"]["predicted_n"] == 8
    assert result["timings"]["predicted_per_second"] > 0


def test_worker_holds_part_of_the_model(coordinator, worker_plan):
    """llama-server logs the weights it put on each device when it loads the model."""
    log = coordinator.check_output("journalctl -u %s --no-pager -o cat -n 2000", roles.COORDINATOR_UNIT)
    endpoint = re.escape(worker_plan.rpc_endpoint)
    sizes = [float(m) for m in re.findall(rf"RPC\d+\[{endpoint}\] model buffer size =\s*([0-9.]+) MiB", log)]
    assert sizes, f"no model buffer on {worker_plan.rpc_endpoint} in llama-server's log"
    assert sizes[-1] > 0


def test_planner_matches_llama_cpp_load_report(coordinator, deployment, model):
    """The capacity planner's weights and KV cache per device, within 3% of what llama-server reported
    allocating when it loaded the model (llama_rpc_deploy/load_report.py reads the report)."""
    plan = plan_cluster(deployment.cluster, model)
    report = load_report.parse(
        coordinator.check_output("journalctl -u %s --no-pager -o cat -n 5000", roles.COORDINATOR_UNIT)
    )
    mib = 1024**2
    for worker in deployment.cluster.workers:
        mine = [p for p in plan.placements if p.device.host == worker.name]
        for kind in ("model", "KV"):
            reported = report.on(worker.rpc_endpoint, kind)
            assert len(reported) == len(mine), f"no {kind} buffer for {worker.rpc_endpoint} in the load report"
            for placement, found in zip(mine, reported):
                planned = (placement.weights + placement.mmproj if kind == "model" else placement.kv) / mib
                assert planned == pytest.approx(found, rel=0.03, abs=0.02), (placement.device.name, kind)
    # A CPU with AMX (or another repacking CPU backend) moves the layers it keeps into a buffer of its own
    # ("AMX model buffer size"): then the host's figure is split in two, and only the devices count.
    repacked = any(re.match(r"(AMX|CPU_REPACK|CPU_AARCH64)", d) for d in report.model)
    if "CPU_Mapped" in report.model and not repacked:  # mmap'ed weights kept in the coordinator's memory
        assert report.model["CPU_Mapped"] == pytest.approx(plan.host_bytes / mib, rel=0.03)
