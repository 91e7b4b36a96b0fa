"""Launch scripts and systemd units, rendered from templates/ with the cluster's settings.

The deploy uploads exactly these strings, and the unit tests read exactly these
strings: one rendering path. Rendering is strict (an unknown variable is an
error), and every value that reaches a shell is quoted.
"""
from __future__ import annotations

import hashlib
import shlex
from pathlib import Path, PurePosixPath

import jinja2

from .plan import Cluster, HostPlan

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"
UNIT_DIR = "/etc/systemd/system"
WORKER_UNIT = "rpc-server.service"
COORDINATOR_UNIT = "llama-server.service"

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
    return {
        f"{s['deploy_dir']}/rpc-server.sh": _render(
            "rpc-server.sh.j2", worker=worker, s=s, image=image, bind_host=s["rpc_host"] or worker.address),
        f"{UNIT_DIR}/{WORKER_UNIT}": _render("rpc-server.service.j2", deploy_dir=s["deploy_dir"]),
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
            model_dir=str(model.parent), model_file=model.name,
            cluster_fingerprint=cluster_fingerprint(cluster, image)),
        f"{s['deploy_dir']}/wait-for-workers.sh": _render(
            "wait-for-workers.sh.j2", rpc_endpoints=cluster.rpc_endpoints, timeout=s["rpc_wait_timeout"]),
        f"{UNIT_DIR}/{COORDINATOR_UNIT}": _render(
            "llama-server.service.j2", deploy_dir=s["deploy_dir"], timeout=s["rpc_wait_timeout"]),
    }
