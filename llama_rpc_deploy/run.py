"""One pyinfra run's shared state: what every host's operations work from and tell each other.

pyinfra runs deploy.py once per host and creates every host's operations before the first one runs,
so whatever one host's operation must learn from another's (did a worker restart? did the health
check fail?) is decided when the operation runs, from the operations recorded here. There is one Run
per pyinfra State (`Run.of`), with named fields; nothing is kept in module globals.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .deployment import Deployment, from_pyinfra
from .loading import inventory_file


@dataclass
class Run:
    deployment: Deployment  # the checked cluster, the llama.cpp source, the image tag; settled once (settle)
    settled: bool = False  # phases/checks.settle has resolved the Cluster from the coordinator's files
    run_id: str = field(default_factory=lambda: time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
    # host name -> the paths this run replaces there (each old file kept as path.previous)
    replaced: dict[str, list[str]] = field(default_factory=dict)
    # worker name -> its rpc-server's restart-or-ensure operations (phases/services.Started)
    worker_services: dict[str, object] = field(default_factory=dict)
    # host name -> its RPC tunnel's restart-or-ensure operations: a restart cuts llama-server's connections
    tunnel_services: dict[str, object] = field(default_factory=dict)
    health_check: object | None = None  # the coordinator's wait for /health; failed: every host rolls back
    coordinator_service: object | None = None  # llama-server's Started (phases/services)
    front_drain: object | None = None  # the front's drain before servers restart (phases/services)

    @classmethod
    def of(cls, state, inventory) -> Run:
        """The Run of this pyinfra run: made (settings checked, source hashed) by the first host's deploy.py."""
        run = getattr(state, "llama_rpc_run", None)
        if run is None:
            run = cls(from_pyinfra(inventory, inventory_file=inventory_file()))
            state.llama_rpc_run = run
        return run

    def settle(self, deployment: Deployment) -> None:
        """The deployment every later phase reads, with the Cluster settled from the coordinator's files
        (phases/checks.settle: llama_models_folder's models, the planner's split); once per run."""
        if self.settled:
            raise RuntimeError("the cluster of this run is settled already")
        self.deployment, self.settled = deployment, True

    def keep_replaced(self, host: str, path: str) -> None:
        self.replaced.setdefault(host, []).append(path)

    def workers_restarted(self) -> bool:
        """Whether this run (re)started any worker's rpc-server, or an RPC tunnel (asked when an operation runs)."""
        return any(op.did_change() for op in [*self.worker_services.values(), *self.tunnel_services.values()])

    def restart_planned(self) -> bool:
        """Whether new files restart any rpc-server or llama-server in this run (asked when an operation
        runs: every host's operations exist by then)."""
        services = [*self.worker_services.values(), *self.tunnel_services.values(), self.coordinator_service]
        return any(started is not None and started.planned for started in services)

    def health_failed(self) -> bool:
        check = self.health_check
        return check is not None and check.is_complete() and check.did_error()

    def coordinator_restart_needed(self, started: object) -> bool:
        """llama-server cannot reconnect to an rpc-server that restarted (it aborts on the next request),
        so it restarts whenever this run (re)started a worker, unless `started` (its own start or restart
        in this run, after the workers) already did."""
        return not started.did_change() and self.workers_restarted()
