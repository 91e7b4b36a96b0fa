"""Launch scripts and systemd units, rendered from templates/ with the cluster's settings.

The deploy uploads exactly these strings, and the unit tests read exactly these
strings: one rendering path. Rendering is strict (an unknown variable is an
error), and every value that reaches a shell is quoted.
"""
from __future__ import annotations

import hashlib
import ipaddress
import shlex
from pathlib import Path, PurePosixPath

import jinja2

from .plan import SERVICE_USER, Cluster, HostPlan, allowed_sources

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"
UNIT_DIR = "/etc/systemd/system"
WORKER_UNIT = "rpc-server.service"
COORDINATOR_UNIT = "llama-server.service"
FIREWALL_UNIT = "llama-rpc-firewall.service"
WATCHDOG_UNIT = "llama-server-watchdog.service"
WORKER_WATCHDOG_UNIT = "rpc-server-watchdog.service"
WORKER_WATCHDOG_PATIENCE = 20  # seconds a new connection may wait behind a dead one
WATCHDOG_INTERVAL = 5  # seconds between looks at llama-server's connections to its workers
WATCHDOG_RETRANSMISSIONS = 7  # retransmissions of unacknowledged data (about 25 s) that mean a worker is gone
FIREWALL_CHAIN = "LLAMA-RPC"
API_KEY_PATH = "/etc/llama-rpc/api_key"  # on the coordinator: owned by SERVICE_USER, mode 0400

_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(TEMPLATES)),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
    autoescape=False,
)
_env.filters["q"] = lambda value: shlex.quote(str(value))


def _render(template: str, **values) -> str:
    return _env.get_template(template).render(**values)


def worker_files(cluster: Cluster, worker: HostPlan, image: str) -> dict[str, str]:
    """Path on the worker -> content, for one worker."""
    s = worker.settings
    sources = allowed_sources(cluster, worker) if s["rpc_firewall"] else []
    return {
        f"{s['deploy_dir']}/rpc-server.sh": _render(
            "rpc-server.sh.j2", worker=worker, s=s, image=image, bind_host=s["rpc_host"] or worker.address,
            user=SERVICE_USER, sources=sources),
        f"{UNIT_DIR}/{WORKER_UNIT}": _render("rpc-server.service.j2", deploy_dir=s["deploy_dir"],
                                             firewall_unit=FIREWALL_UNIT if s["rpc_firewall"] else ""),
    }


def firewall_files(cluster: Cluster, worker: HostPlan) -> dict[str, str]:
    """Path on the worker -> content: the rule that admits rpc_port only from the coordinator, and its unit."""
    s = worker.settings
    if not s["rpc_firewall"]:
        return {}
    sources = allowed_sources(cluster, worker)
    by_family = {4: [], 6: []}
    for source in sources:
        by_family[ipaddress.ip_network(source, strict=False).version].append(source)
    return {
        f"{s['deploy_dir']}/rpc-firewall.sh": _render(
            "rpc-firewall.sh.j2", worker=worker, port=s["rpc_port"], sources=sources, ipv4=by_family[4],
            ipv6=by_family[6], chain=FIREWALL_CHAIN, unit=FIREWALL_UNIT),
        f"{UNIT_DIR}/{FIREWALL_UNIT}": _render("rpc-firewall.service.j2", deploy_dir=s["deploy_dir"],
                                               worker_unit=WORKER_UNIT),
    }


def cluster_fingerprint(cluster: Cluster, image: str) -> str:
    """Changes whenever the image or any worker's files change, so llama-server restarts after its workers."""
    digest = hashlib.sha256(image.encode())
    for worker in cluster.workers:
        for path, content in sorted(worker_files(cluster, worker, image).items()):
            digest.update(f"{worker.name}\0{path}\0{content}\0".encode())
    return digest.hexdigest()[:16]


def coordinator_files(cluster: Cluster, image: str) -> dict[str, str]:
    """Path on the coordinator -> content."""
    c = cluster.coordinator
    s = c.settings
    if s["llama_tensor_split"] == "auto":
        raise ValueError("llama_tensor_split = 'auto' must be resolved by the planner (deployment.with_split) first")
    model = PurePosixPath(s["llama_model_path"])
    return {
        f"{s['deploy_dir']}/llama-server.sh": _render(
            "llama-server.sh.j2", coordinator=c, s=s, image=image, devices=cluster.devices,
            rpc_endpoints=cluster.rpc_endpoints, bind_host=s["llama_host"] or c.address,
            model_dir=str(model.parent), model_file=model.name, user=SERVICE_USER,
            api_key_path=API_KEY_PATH if s["llama_api_key_file"] else "",
            cluster_fingerprint=cluster_fingerprint(cluster, image)),
        f"{s['deploy_dir']}/wait-for-workers.sh": _render(
            "wait-for-workers.sh.j2", rpc_endpoints=cluster.rpc_endpoints, timeout=s["rpc_wait_timeout"], image=image),
        f"{UNIT_DIR}/{COORDINATOR_UNIT}": _render(
            "llama-server.service.j2", deploy_dir=s["deploy_dir"], timeout=s["rpc_wait_timeout"]),
    }


def worker_watchdog_files(worker: HostPlan) -> dict[str, str]:
    """Path on the worker -> content: the watchdog that restarts rpc-server when it holds a dead client."""
    s = worker.settings
    return {
        f"{s['deploy_dir']}/rpc-server-watchdog.sh": _render(
            "rpc-server-watchdog.sh.j2", worker=worker, port=s["rpc_port"], interval=WATCHDOG_INTERVAL,
            patience=WORKER_WATCHDOG_PATIENCE, server_unit=WORKER_UNIT, unit=WORKER_WATCHDOG_UNIT),
        f"{UNIT_DIR}/{WORKER_WATCHDOG_UNIT}": _render("rpc-server-watchdog.service.j2", deploy_dir=s["deploy_dir"],
                                                      server_unit=WORKER_UNIT),
    }


def watchdog_files(cluster: Cluster) -> dict[str, str]:
    """Path on the coordinator -> content: the watchdog that restarts llama-server when it lost a worker."""
    s = cluster.settings
    return {
        f"{s['deploy_dir']}/llama-server-watchdog.sh": _render(
            "llama-server-watchdog.sh.j2", coordinator=cluster.coordinator, rpc_endpoints=cluster.rpc_endpoints,
            interval=WATCHDOG_INTERVAL, retrans=WATCHDOG_RETRANSMISSIONS, grace=3 * WATCHDOG_INTERVAL,
            server_unit=COORDINATOR_UNIT, unit=WATCHDOG_UNIT),
        f"{UNIT_DIR}/{WATCHDOG_UNIT}": _render("llama-server-watchdog.service.j2", deploy_dir=s["deploy_dir"],
                                               server_unit=COORDINATOR_UNIT),
    }
