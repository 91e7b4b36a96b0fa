"""The deploy's phases, in the order deploy.py runs them, each a module of pyinfra operations:

checks    - before any change: what each host has, and the planner on the model's header
build     - the service user, the image built once on the coordinator and carried to every worker
services  - the firewall, rpc-server, llama-server and their watchdogs as systemd units
rollback  - every host back on its previous version when the new one failed its health check
"""
from pyinfra import host
from pyinfra.operations import files


def barrier(run, label: str):
    """The same no-op on every host: pyinfra orders each host's operations, and a shared
    operation is what makes the workers' and the coordinator's steps wait for each other."""
    files.directory(name=f"== {label} ==", path=run.deployment.cluster.host(host.name).settings["deploy_dir"], mode="755")
