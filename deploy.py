"""llama-rpc-deploy: one llama.cpp server from GPUs in different computers.

    pyinfra inventory.py deploy.py

The phases, in order; each lives in llama_rpc_deploy/phases/, chosen here by inventory group:
  1. checks:   every setting (config.py, before connecting), then what each host has and whether the
               model fits (before anything changes)
  2. build:    the unprivileged user the containers run as; the image built once on the coordinator
               and streamed to every worker that lacks it (docker save | zstd | ssh | docker load)
  3. services: workers: the firewall rule and rpc-server; then the coordinator: llama-server after its
               workers, and the wait for /health
  4. rollback: when that health check failed, every host goes back to its previous version
Barriers between the phases make every host finish one before any host starts the next.
"""
from pyinfra import host, inventory, state
from pyinfra.api.exceptions import DeployError

from llama_rpc_deploy.phases import barrier, build, checks, rollback, services
from llama_rpc_deploy.run import Run
from llama_rpc_deploy.settings import SettingsError

try:
    run = Run.of(state, inventory)
except (SettingsError, FileNotFoundError) as error:
    raise DeployError(str(error)) from None
role = run.deployment.cluster.role(host.name)

if role != "none":
    checks.host_is_ready(run, role)
    if role == "coordinator":
        checks.model_fits(run)

    build.service_user()
    if role == "worker":
        build.prepare_worker(run)
    if role == "coordinator":
        build.build_image(run)
    barrier(run, "image built, workers ready to receive it")
    if role == "coordinator":
        build.distribute_image(run)
    barrier(run, "the same image on every host")

    if role == "worker":
        services.install_worker(run)
    barrier(run, "rpc-server running on every worker")
    if role == "coordinator":
        services.install_coordinator(run)
    barrier(run, "llama-server checked")

    if role == "worker":
        rollback.roll_back(run, role)
    barrier(run, "workers rolled back, if the new version failed")
    if role == "coordinator":
        rollback.roll_back(run, role)
