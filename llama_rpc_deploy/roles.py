"""What each role puts on a host, by name: its systemd units, the paths of its files, its Debian packages.

render fills these files, the phases install them, and rollback, status, tune, the tests and the benchmarks
find them here: nothing else spells a unit's name or a path on a host. `coordinator(cluster)` and
`worker(cluster, host)` say what one host of that role runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from .settings import COORDINATOR, WORKERS

UNIT_DIR = "/etc/systemd/system"
COORDINATOR_UNIT = "llama-server.service"
WORKER_UNIT = "rpc-server.service"
FRONT_UNIT = "llama-front.service"  # HAProxy, the front (coordinator)
WATCHDOG_UNIT = "llama-server-watchdog.service"  # restarts llama-server when it lost a worker (coordinator)
WORKER_WATCHDOG_UNIT = "rpc-server-watchdog.service"  # restarts rpc-server when it holds a dead client (workers)
FIREWALL_UNIT = "llama-rpc-firewall.service"  # the RPC port's rule (workers, with rpc_firewall)
TUNNEL_UNIT = "llama-rpc-tunnel.service"  # stunnel: the worker's TLS end, or the coordinator's ends (one per worker)
SLEEP_UNIT = "llama-sleep.service"  # the workers' sleep when idle and their wake (coordinator, with sleep_idle_seconds)
CACHE_PRUNE_UNIT, CACHE_PRUNE_TIMER = "rpc-cache-prune.service", "rpc-cache-prune.timer"  # the tensor cache (workers)
SERVER_UNIT = {COORDINATOR: COORDINATOR_UNIT, WORKERS: WORKER_UNIT}  # the unit that serves, by role

# files in deploy_dir
LLAMA_SERVER_SCRIPT = "llama-server.sh"
RPC_SERVER_SCRIPT = "rpc-server.sh"
MODELS_PRESET = "llama-server-models.ini"  # models on demand: next to the launch script on the coordinator
FRONT_CONFIG = "front.cfg"
FRONT_DRAIN = "front-drain.sh"
TUNNEL_CONFIG = "rpc-tunnel.conf"
IMAGE_RECEIVER = "receive-image.sh"  # on the workers: the transfer key's one command
SLEEP_NOW = "sleep-now.sh"  # on the workers: the sleep key's one command
SKIP_LAYERS = "skip-layers.py"  # on the coordinator: the layers a worker lacks (files/skip-layers.py)

CONFIG_DIR = "/etc/llama-rpc"  # on the coordinator: mode 700 (the API key, the image-transfer key)
API_KEY_PATH = f"{CONFIG_DIR}/api_key"  # owned by the service user, mode 0400
TRANSFER_KEY = f"{CONFIG_DIR}/transfer_key"  # the key the coordinator sends the images with
KNOWN_HOSTS = f"{CONFIG_DIR}/known_hosts"  # ... and the workers' host keys
SLEEP_KEY = f"{CONFIG_DIR}/sleep_key"  # the key llama-sleep.py tells the workers to sleep with (sleep-now.sh only)
SLEEP_STATE_DIR = "/var/lib/llama-sleep"  # llama-sleep.service's StateDirectory
SLEEP_STATE = f"{SLEEP_STATE_DIR}/state.json"  # llama-sleep.py's state: what `status` shows
WOL_LINK = "/etc/systemd/network/50-llama-rpc-wol.link"  # on the workers: Wake-on-LAN on at every boot
TUNNEL_DIR = "/etc/llama-rpc-tunnel"  # on every tunnelled host: the service user's, mode 700 (stunnel runs as it)
FRONT_SOCKET = "/run/llama-front/admin.sock"  # HAProxy's runtime API (RuntimeDirectory of FRONT_UNIT)
NO_DRAIN_FLAG = "/run/llama-rpc-no-drain"  # the watchdog's word to front-drain.sh: this stop, no drain
STUNNEL = "/usr/bin/stunnel4"  # Debian's stunnel4 package
FIREWALL_CHAIN = "LLAMA-RPC"  # iptables chain of the RPC port's rule

FRONT_PACKAGES = ("haproxy", "socat")  # the front, and the client of its admin socket (front-drain.sh, status)
TUNNEL_PACKAGES = ("stunnel4",)


@dataclass(frozen=True)
class Role:
    """What one host of a role runs."""

    role: str  # settings.COORDINATOR or settings.WORKERS
    deploy_dir: str
    server: str  # the unit that serves: llama-server or rpc-server
    watchdog: str  # the server's watchdog
    container: str  # the server's container
    units: tuple[str, ...]  # every unit of ours on the host: the server's, the watchdog's, then the others

    def path(self, name: str) -> str:
        """A file of deploy_dir on the host."""
        return f"{self.deploy_dir}/{name}"

    @property
    def launch_script(self) -> str:
        return self.path(LLAMA_SERVER_SCRIPT if self.role == COORDINATOR else RPC_SERVER_SCRIPT)


def coordinator(cluster) -> Role:
    tunnels = bool(cluster.tunnels_at(cluster.coordinator))
    return Role(
        COORDINATOR,
        cluster.settings["deploy_dir"],
        COORDINATOR_UNIT,
        WATCHDOG_UNIT,
        "llama-server",
        units=(COORDINATOR_UNIT, WATCHDOG_UNIT, FRONT_UNIT)
        + ((TUNNEL_UNIT,) if tunnels else ())
        + ((SLEEP_UNIT,) if cluster.settings["sleep_idle_seconds"] else ()),
    )


def worker(cluster, host) -> Role:
    s = host.settings
    tunnels = bool(cluster.tunnels_at(host))
    return Role(
        WORKERS,
        s["deploy_dir"],
        WORKER_UNIT,
        WORKER_WATCHDOG_UNIT,
        "rpc-server",
        units=(WORKER_UNIT, WORKER_WATCHDOG_UNIT)
        + ((FIREWALL_UNIT,) if s["rpc_firewall"] else ())
        + (CACHE_PRUNE_TIMER,)
        + ((TUNNEL_UNIT,) if tunnels else ()),
    )


def of(cluster, host) -> Role:
    """The Role of one of cluster's hosts."""
    return coordinator(cluster) if host.name == cluster.coordinator.name else worker(cluster, host)
