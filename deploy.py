"""llama-rpc-deploy: one llama.cpp server from GPUs in different computers.

    pyinfra inventory.py deploy.py

The lines at the end are the whole deploy, in order: each step runs on the hosts of the roles it names
(the inventory's groups coordinator and workers); a barrier makes every host finish what comes before
it before any host goes on. The steps live in llama_rpc_deploy/phases/:
  prepare   each host gets what it lacks (host_prepare): the system checked, the distribution's packages, Docker
            running; for NVIDIA cards the driver checked, the NVIDIA Container Toolkit and Docker's nvidia runtime
  checks    every setting (config.py, before connecting), then what each host has; then the Cluster is
            settled from the coordinator's model files (settle: the planner's split, the folder's models,
            a model that does not fit refused), before anything changes; no step below changes it
  build     the unprivileged user the containers run as; the image built once on the coordinator
            and streamed to every worker that lacks it (docker save | zstd | ssh | docker load)
  services  the front (HAProxy, reloaded on new files), drained when a server will restart; workers:
            the firewall rule and rpc-server; then the coordinator: llama-server after its workers, and
            the wait for /health through the front
  sleep     with sleep_idle_seconds: the workers' NICs checked, their sleep command and Wake-on-LAN, then
            llama-sleep.service on the coordinator, which suspends them when idle and wakes them (docs/sleep.md)
  rollback  when that health check failed, every host goes back to its previous version
"""

from pyinfra import host, inventory, state

from llama_rpc_deploy.phases import build, checks, prepare, rollback, services, sleep
from llama_rpc_deploy.phases.shared import barrier
from llama_rpc_deploy.run import Run
from llama_rpc_deploy import settings
from llama_rpc_deploy.refusal import refuse
from llama_rpc_deploy.settings import ROLES, SettingsError

try:
    run = Run.of(state, inventory)  # every setting checked (as config.py did before connecting)
except (SettingsError, FileNotFoundError) as error:
    refuse(str(error))
role = run.deployment.cluster.role(host.name)  # None for a host in neither group: nothing to do
EVERY, COORDINATOR, WORKERS = set(ROLES), {settings.COORDINATOR}, {settings.WORKERS}


def on(roles, step):
    """step(run) on this host when its role is one of roles. (One call a line, not a loop: pyinfra
    orders the hosts' operations by the line numbers they were called from.)"""
    if role in roles:
        step(run)


if role is not None:
    on(EVERY, prepare.prepare_host)  # first: what the host lacks (host_prepare; facts are read before it installs)
    on(EVERY, checks.host_is_ready)
    on(EVERY, sleep.can_sleep)  # sleep_idle_seconds: each worker's NIC can wake it
    on(COORDINATOR, checks.settle)  # the Cluster from the coordinator's model files, once; workers read none of it
    on(EVERY, build.service_user)
    on(WORKERS, build.prepare_worker)
    on(WORKERS, sleep.sleep_worker)  # its sleep command and Wake-on-LAN (or none, sleep off)
    on(COORDINATOR, build.build_image)
    barrier(run, "image built, workers ready to receive it")
    on(COORDINATOR, build.distribute_image)
    barrier(run, "the same image on every host")
    on(COORDINATOR, services.install_front)
    barrier(run, "the front drained, if a server restarts")
    on(WORKERS, services.install_worker)
    barrier(run, "rpc-server running on every worker")
    on(COORDINATOR, services.install_coordinator)
    on(COORDINATOR, sleep.install_sleep)  # llama-sleep.service (or none, sleep off)
    barrier(run, "llama-server checked")
    on(WORKERS, rollback.roll_back)
    barrier(run, "workers rolled back, if the new version failed")
    on(COORDINATOR, rollback.roll_back)
