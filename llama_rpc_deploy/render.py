"""Every file the deploy puts on a host: launch scripts and systemd units rendered from templates/,
the bash programs of files/ (wait-for-workers, the watchdogs, the firewall) with their small
environment files.

The deploy uploads exactly these strings, and the unit tests read exactly these strings: one
rendering path. Python decides every argument here; a template only substitutes the values it is
given by name (rendering is strict: an unknown variable is an error). Every value is quoted for
where it lands by llama_rpc_deploy/quoting.py: `line` for the launch scripts' shell, the `unit` filter
for the units' Exec lines, `quoting.volume` for docker's --volume.
"""

from __future__ import annotations

from .paths import shipped

import ipaddress
import json
from pathlib import PurePosixPath

import jinja2

from . import programs, quoting, sleep, speculation, tunnel
from .roles import (
    API_KEY_PATH,
    CACHE_PRUNE_TIMER,
    CACHE_PRUNE_UNIT,
    COORDINATOR_UNIT,
    FIREWALL_CHAIN,
    FIREWALL_UNIT,
    FRONT_CONFIG,
    FRONT_DRAIN,
    FRONT_SOCKET,
    FRONT_UNIT,
    KNOWN_HOSTS,
    LLAMA_SERVER_SCRIPT,
    MODELS_PRESET,
    NO_DRAIN_FLAG,
    RPC_SERVER_SCRIPT,
    SLEEP_KEY,
    SLEEP_NOW,
    SLEEP_STATE,
    SLEEP_UNIT,
    STUNNEL,
    TUNNEL_CONFIG,
    TUNNEL_DIR,
    TUNNEL_UNIT,
    UNIT_DIR,
    WATCHDOG_UNIT,
    WORKER_UNIT,
    WORKER_WATCHDOG_UNIT,
    WOL_LINK,
)
from .cluster import SERVICE_USER, Cluster, ClusterHost, allowed_clients
from .settings import COORDINATOR, WORKERS

TEMPLATES = shipped("templates")
FRONT_BACKEND = FRONT_SERVER = "llama-server"  # llama-server's backend and server line in front.cfg
FRONT_HELD = "held"  # the backend the hold releases requests to
FRONT_RETRIES = 3  # replays of one request (each held while llama-server is down): few, as a request that
# crashes llama-server itself would crash it once a replay
FRONT_IO_TIMEOUT = 600  # seconds of silence from either side of a request (llama-server's own --timeout)
# stunnel's TIMEOUTidle: its default, 12 h, would cut an idle llama-server's connections (and the watchdog would
# restart it); the most stunnel can wait, as it polls with an int of milliseconds, is 2147483 s (24.8 days)
TUNNEL_IDLE_SECONDS = 2147483
CACHE_PRUNE_EVERY = 30  # seconds between two looks at a worker's tensor cache
CACHE_MIN_AGE = 10  # seconds a cache file is left alone after its last change (rpc-server may be writing it)
WORKER_WATCHDOG_PATIENCE = 20  # seconds a new connection may wait behind a dead one
WATCHDOG_INTERVAL = 5  # seconds between looks at llama-server's connections to its workers
WATCHDOG_RETRANSMISSIONS = 7  # retransmissions of unacknowledged data (about 25 s) that mean a worker is gone
API_KEY_MOUNT = "/run/secrets/llama-api-key"
MMPROJ_MOUNT = "/mmproj"
MODELS_PRESET_MOUNT = "/etc/llama-rpc/models.ini"

_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(TEMPLATES)),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
    autoescape=False,
)
_env.filters["unit"] = quoting.unit  # a word of a systemd Exec line


def _render(template: str, **values) -> str:
    return _env.get_template(template).render(**values)


line = quoting.shell_line  # one line of a command: each word quoted for the shell


def container_options(name: str, me: ClusterHost, volumes: list[tuple[str, str, bool]], role: str) -> list[str]:
    """docker run options shared by both roles: host networking, the service user, no capabilities,
    read-only root; the host's GPUs (device_options) and the given volumes."""
    return [
        line("--name", name),
        line("--network", "host"),
        "--init",
        f'--user "$(id -u {SERVICE_USER}):$(id -g {SERVICE_USER})"',
        line("--cap-drop", "ALL"),
        line("--security-opt", "no-new-privileges"),
        "--read-only",
        line("--tmpfs", "/tmp"),
        *device_options(me),
        *[line("--volume", quoting.volume(source, target, ro)) for source, target, ro in volumes],
        line("--label", f"io.llama-rpc-deploy.role={role}"),
    ]


def device_options(me: ClusterHost) -> list[str]:
    """How a host's GPUs reach its container, by image_backend. cuda: NVIDIA's runtime (--gpus all). vulkan: the
    render nodes (/dev/dri) and, for the service user, the group that owns them (Mesa's drivers are in the image);
    a worker that sets vulkan itself without GPUs: the CPU's Vulkan device (lavapipe), which llama.cpp uses only when
    named: it is the only device the container sees, so device 0."""
    if me.backend == "cuda" and me.gpus:
        return [line("--gpus", "all")]
    if me.software_vulkan:
        return [line("--env", "GGML_VK_VISIBLE_DEVICES=0")]
    if me.backend == "vulkan" and me.gpus:
        return [line("--device", "/dev/dri"), '--group-add "$(stat -c %g /dev/dri/renderD* | head -n 1)"']
    return []  # a vulkan host without gpus that did not ask for lavapipe: ggml-vulkan finds no device, the CPU serves


def model_folders(cluster: Cluster) -> list[tuple[str, str]]:
    """(folder on the coordinator, where llama-server's container sees it), for every model and projector
    file: llama_model_path's folder at /models, llama_mmproj_path's at /mmproj, any other folder of a
    model of llama_models or of a draft model at /models-2, /models-3, ..."""
    s = cluster.settings
    folders = [(str(PurePosixPath(s["llama_model_path"]).parent), "/models")]
    if s["llama_mmproj_path"]:
        folders.append((str(PurePosixPath(s["llama_mmproj_path"]).parent), MMPROJ_MOUNT))
    for name in cluster.served_models() or [None]:
        for key in ("llama_model_path", "llama_mmproj_path", "llama_spec_draft_path"):
            path = (cluster.for_model(name) if name else cluster).settings[key]
            if path and str(PurePosixPath(path).parent) not in [f for f, _ in folders]:
                folders.append((str(PurePosixPath(path).parent), f"/models-{len(folders)}"))
    return folders


def _inside(folders: list[tuple[str, str]], path: str, prefer: str) -> str:
    """Where llama-server's container sees the file at path (through the mount `prefer` if it can)."""
    parent, name = str(PurePosixPath(path).parent), PurePosixPath(path).name
    mounts = [m for f, m in folders if f == parent]
    return f"{prefer if prefer in mounts else mounts[0]}/{name}"


def model_options(cluster: Cluster, folders: list[tuple[str, str]]) -> tuple[list[tuple], list[tuple]]:
    """The options that belong to one model, as (option, value) with value None for a flag: its files,
    and how it is fitted (layers, split, context, KV). For one model they go on the command line; for
    models on demand, into the model's section of the preset."""
    s = cluster.settings
    split = s["llama_tensor_split"]
    files = [
        ("--model", _inside(folders, s["llama_model_path"], "/models")),
        *([("--mmproj", _inside(folders, s["llama_mmproj_path"], MMPROJ_MOUNT))] if s["llama_mmproj_path"] else []),
    ]
    fit = [
        ("--n-gpu-layers", s["llama_n_gpu_layers"]),
        *([("--tensor-split", ",".join(str(x) for x in split))] if split else []),
        ("--ctx-size", s["llama_ctx_size"]),
        ("--parallel", s["llama_parallel"]),
        *([("--kv-unified", None)] if s["llama_kv_unified"] else []),
        ("--cache-type-k", s["llama_cache_type_k"]),
        ("--cache-type-v", s["llama_cache_type_v"]),
        ("--flash-attn", s["llama_flash_attn"]),
    ]
    draft_files, speculative = speculation.options(cluster, lambda path: _inside(folders, path, "/models"))
    return files + draft_files, fit + speculative


def models_preset(cluster: Cluster) -> str:
    """llama-server's --models-preset for models on demand: one section per model of llama_models
    (llama_model_path's first, loaded at start), each with its own files, split, context and KV."""
    folders = model_folders(cluster)
    out = [
        "; Models on demand, rendered by llama-rpc-deploy from llama_models: change the settings and deploy",
        "; again, not this file. llama-server (router mode) loads the model a request names, one at a time.",
    ]
    for name in cluster.served_models():
        files, fit = model_options(cluster.for_model(name), folders)
        out += ["", f"[{name}]"]
        out += [
            f"{option.removeprefix('--')} = {quoting.ini('true' if value is None else value)}"
            for option, value in files + fit
        ]
        if name == cluster.default_model:
            out.append("load-on-startup = true")
    return "\n".join(out) + "\n"


def llama_server_args(cluster: Cluster, api_key: bool) -> list[str]:
    """llama-server's arguments, one per line, in the order the launch script shows them. With
    llama_models, the model options go to the preset instead (models_preset), one model at a time."""
    s = cluster.settings
    sleep, threads = s["llama_sleep_idle_seconds"], s["llama_threads"]
    if cluster.router:
        files, fit = [("--models-preset", MODELS_PRESET_MOUNT), ("--models-max", 1)], []
    else:
        files, fit = model_options(cluster, model_folders(cluster))
    return [
        *[line(o, v) if v is not None else line(o) for o, v in files],
        line("--host", "127.0.0.1"),  # behind the front: front_files
        line("--port", s["llama_server_port"]),
        *([line("--api-key-file", API_KEY_MOUNT)] if api_key else []),
        *([line("--metrics")] if s["llama_metrics"] or speculation.anywhere(cluster) else []),
        line("--rpc", ",".join(cluster.rpc_endpoints)),
        line("--device", ",".join(cluster.devices)),
        *[line(o, v) if v is not None else line(o) for o, v in fit],
        line("--log-verbosity", s["llama_log_verbosity"]),
        *([line("--sleep-idle-seconds", sleep)] if sleep else []),
        *([line("--threads", threads)] if threads else []),
        *[line(arg) for arg in s["llama_extra_args"]],
    ]


def rpc_server_args(worker: ClusterHost) -> list[str]:
    s = worker.settings
    return [
        line("--host", worker.rpc_bind),
        line("--port", s["rpc_port"]),
        *([line("--cache")] if s["rpc_cache"] else []),
        *([line("--threads", s["rpc_threads"])] if s["rpc_threads"] else []),
        *[line(arg) for arg in s["rpc_extra_args"]],
    ]


def _program(deploy_dir: str, name: str, env: str) -> dict[str, str]:
    """A program of files/ and its environment file, side by side (the program reads NAME.env);
    a watchdog with the loop it sources."""
    library = [programs.WATCHDOG_LIBRARY] if name.endswith("-watchdog.sh") else []
    return {
        **{f"{deploy_dir}/{n}": programs.text(n) for n in (*library, name)},
        f"{deploy_dir}/{name.removesuffix('.sh')}.env": env,
    }


def served_device(worker: ClusterHost) -> str:
    """What rpc-server serves, in words, for the launch script's first line (as device_options passes it)."""
    if worker.software_vulkan:
        return "CPU's Vulkan device (lavapipe)"
    return {"cuda": "GPUs (CUDA)", "vulkan": "GPUs (Vulkan)"}.get(worker.backend, "CPU") if worker.gpus else "CPU"


def worker_files(cluster: Cluster, worker: ClusterHost, image: str) -> dict[str, str]:
    """Path on the worker -> content, for one worker."""
    s = worker.settings
    firewall = s["rpc_firewall"]
    if worker.tunnelled:
        guard = f"only the tunnel ({TUNNEL_UNIT}, mutual TLS on port {s['rpc_tunnel_port']}) reaches it"
    else:
        guard = (
            f"rpc-firewall.sh admits only {', '.join(allowed_clients(cluster, worker))}"
            if firewall
            else "rpc_firewall is off: firewall the port yourself"
        )
    return {
        f"{s['deploy_dir']}/{RPC_SERVER_SCRIPT}": _render(
            "rpc-server.sh.j2",
            host_name=worker.name,
            device=served_device(worker),
            bind_host=worker.rpc_bind,
            guard=guard,
            image=quoting.shell(image),
            docker_options=container_options("rpc-server", worker, [(s["rpc_cache_dir"], "/cache", False)], WORKERS),
            rpc_server_args=rpc_server_args(worker),
        ),
        f"{UNIT_DIR}/{WORKER_UNIT}": _render(
            "rpc-server.service.j2",
            deploy_dir=s["deploy_dir"],
            requires=" ".join(["docker.service"] + ([FIREWALL_UNIT] if firewall else [])),
            after=" ".join(["docker.service", "network-online.target"] + ([FIREWALL_UNIT] if firewall else [])),
        ),
    }


def firewall_files(cluster: Cluster, worker: ClusterHost) -> dict[str, str]:
    """Path on the worker -> content: the rule that admits its RPC ports (the tunnel's and rpc_port) only from
    the coordinator, and its unit."""
    s = worker.settings
    if not s["rpc_firewall"]:
        return {}
    clients = allowed_clients(cluster, worker)
    ipv4 = [c for c in clients if ipaddress.ip_network(c, strict=False).version == 4]
    ipv6 = [c for c in clients if ipaddress.ip_network(c, strict=False).version == 6]
    return {
        **_program(
            s["deploy_dir"],
            "rpc-firewall.sh",
            programs.firewall_env(ports=worker.firewalled_ports, chain=FIREWALL_CHAIN, ipv4=ipv4, ipv6=ipv6),
        ),
        f"{UNIT_DIR}/{FIREWALL_UNIT}": _render(
            "rpc-firewall.service.j2", deploy_dir=s["deploy_dir"], worker_unit=WORKER_UNIT
        ),
    }


def tunnel_files(cluster: Cluster, me: ClusterHost) -> dict[str, str]:
    """Path on the host -> content: stunnel's configuration and unit. On a tunnelled worker, the TLS end on
    rpc_tunnel_port that admits the coordinator's certificate alone and leads to rpc-server on loopback; on the
    coordinator, one end per tunnelled worker on 127.0.0.1 (llama-server's --rpc). {} where nothing is tunnelled."""
    s, tunnels = me.settings, cluster.tunnels_at(me)
    if not tunnels:
        return {}
    if me.name == cluster.coordinator.name:
        services = [
            dict(name=w.name, client=True, accept=w.rpc_endpoint, connect=w.rpc_remote, peer=tunnel.tunnel_name(w.name))
            for w in tunnels
        ]
        what = f"llama-server's ends of the tunnels to {', '.join(w.name for w in tunnels)}"
        before = COORDINATOR_UNIT
    else:
        services = [
            dict(
                name="rpc-server",
                client=False,
                accept=me.rpc_remote,
                connect=f"127.0.0.1:{s['rpc_port']}",
                peer=tunnel.tunnel_name(cluster.coordinator.name),
            )
        ]
        what = f"the coordinator's way in to rpc-server (port {s['rpc_tunnel_port']} to 127.0.0.1:{s['rpc_port']})"
        before = ""
    config = f"{s['deploy_dir']}/{TUNNEL_CONFIG}"
    return {
        config: _render(
            "rpc-tunnel.conf.j2",
            host_name=me.name,
            what=what,
            tunnel_dir=TUNNEL_DIR,
            idle_seconds=TUNNEL_IDLE_SECONDS,
            services=services,
        ),
        f"{UNIT_DIR}/{TUNNEL_UNIT}": _render(
            "llama-rpc-tunnel.service.j2", what=what, before=before, user=SERVICE_USER, stunnel=STUNNEL, config=config
        ),
    }


def coordinator_files(cluster: Cluster, image: str) -> dict[str, str]:
    """Path on the coordinator -> content."""
    c = cluster.coordinator
    s = c.settings
    if any(cluster.for_model(n).settings["llama_tensor_split"] == "auto" for n in cluster.model_names()):
        raise ValueError("llama_tensor_split = 'auto' must be resolved by the planner (Deployment.with_split) first")
    volumes = [(folder, mount, True) for folder, mount in model_folders(cluster)]
    preset = {f"{s['deploy_dir']}/{MODELS_PRESET}": models_preset(cluster)} if cluster.router else {}
    if preset:
        volumes.append((f"{s['deploy_dir']}/{MODELS_PRESET}", MODELS_PRESET_MOUNT, True))
    if s["llama_api_key_file"]:
        volumes.append((API_KEY_PATH, API_KEY_MOUNT, True))
    return {
        **preset,
        f"{s['deploy_dir']}/{LLAMA_SERVER_SCRIPT}": _render(
            "llama-server.sh.j2",
            host_name=c.name,
            devices=", ".join(cluster.devices),
            device_count=len(cluster.devices),
            image=quoting.shell(image),
            docker_options=container_options("llama-server", c, volumes, COORDINATOR),
            llama_server_args=llama_server_args(cluster, bool(s["llama_api_key_file"])),
        ),
        **_program(
            s["deploy_dir"],
            "wait-for-workers.sh",
            programs.wait_for_workers_env(
                endpoints=cluster.rpc_endpoints,
                timeout=s["rpc_wait_timeout"],
                image=image,
                remotes=[w.rpc_remote if w.tunnelled else "-" for w in cluster.workers] if cluster.tunnelled else None,
            ),
        ),
        f"{UNIT_DIR}/{COORDINATOR_UNIT}": _render(
            "llama-server.service.j2",
            deploy_dir=s["deploy_dir"],
            start_timeout=s["rpc_wait_timeout"] + 30,
            stop_timeout=s["llama_front_drain_seconds"] + 60,
            tunnel=TUNNEL_UNIT if cluster.tunnelled else "",
        ),
    }


def front_address(cluster: Cluster) -> str:
    """Where the front listens, as HAProxy's bind line takes it (an IPv6 address in brackets)."""
    s = cluster.settings
    host = s["llama_host"] or cluster.coordinator.address
    return f"[{host}]:{s['llama_port']}" if ":" in host else f"{host}:{s['llama_port']}"


def front_files(cluster: Cluster) -> dict[str, str]:
    """Path on the coordinator -> content: the front (HAProxy's configuration, its hold in Lua, its unit) and
    front-drain.sh, which llama-server.service runs around a planned restart."""
    s = cluster.settings
    deploy_dir = s["deploy_dir"]
    config, lua = f"{deploy_dir}/{FRONT_CONFIG}", f"{deploy_dir}/{programs.FRONT_LUA}"
    maxrewrite = 1024  # HAProxy's default reserve for the headers it adds
    return {
        config: _render(
            "front.cfg.j2",
            host_name=cluster.coordinator.name,
            listen=front_address(cluster),
            server_port=s["llama_server_port"],
            socket=FRONT_SOCKET,
            lua=lua,
            bufsize=s["llama_front_replay_kib"] * 1024 + maxrewrite,
            maxrewrite=maxrewrite,
            replay_kib=s["llama_front_replay_kib"],
            hold_seconds=s["llama_front_hold_seconds"],
            retry_after=min(30, s["llama_front_hold_seconds"]),
            retries=FRONT_RETRIES,
            io_timeout=FRONT_IO_TIMEOUT,
        ),
        lua: programs.text(programs.FRONT_LUA),
        **_program(
            deploy_dir,
            FRONT_DRAIN,
            programs.front_drain_env(
                socket=FRONT_SOCKET,
                backend=FRONT_BACKEND,
                server=FRONT_SERVER,
                drain_seconds=s["llama_front_drain_seconds"],
                no_drain_flag=NO_DRAIN_FLAG,
            ),
        ),
        f"{UNIT_DIR}/{FRONT_UNIT}": _render("llama-front.service.j2", config=config),
    }


def worker_watchdog_files(worker: ClusterHost) -> dict[str, str]:
    """Path on the worker -> content: the watchdog that restarts rpc-server when it holds a dead client."""
    s = worker.settings
    return {
        **_program(
            s["deploy_dir"],
            "rpc-server-watchdog.sh",
            programs.rpc_server_watchdog_env(
                port=s["rpc_port"],
                interval=WATCHDOG_INTERVAL,
                patience=WORKER_WATCHDOG_PATIENCE,
                server_unit=WORKER_UNIT,
            ),
        ),
        f"{UNIT_DIR}/{WORKER_WATCHDOG_UNIT}": _render(
            "rpc-server-watchdog.service.j2", deploy_dir=s["deploy_dir"], server_unit=WORKER_UNIT
        ),
    }


def cache_dir(worker: ClusterHost) -> str:
    """Where rpc-server's cache files are on the worker: rpc-server --cache writes to $LLAMA_CACHE/rpc."""
    return f"{worker.settings['rpc_cache_dir']}/rpc"


def cache_prune_files(worker: ClusterHost) -> dict[str, str]:
    """Path on the worker -> content: the tensor cache kept under rpc_cache_max_gib by a timer."""
    s = worker.settings
    limit = f"{s['rpc_cache_max_gib']:g} GiB"
    return {
        **_program(
            s["deploy_dir"],
            "rpc-cache-prune.sh",
            programs.cache_prune_env(
                cache_dir=cache_dir(worker), max_bytes=int(s["rpc_cache_max_gib"] * 2**30), min_age=CACHE_MIN_AGE
            ),
        ),
        f"{UNIT_DIR}/{CACHE_PRUNE_UNIT}": _render(
            "rpc-cache-prune.service.j2", deploy_dir=s["deploy_dir"], limit=limit, user=SERVICE_USER
        ),
        f"{UNIT_DIR}/{CACHE_PRUNE_TIMER}": _render("rpc-cache-prune.timer.j2", limit=limit, every=CACHE_PRUNE_EVERY),
    }


def watchdog_files(cluster: Cluster) -> dict[str, str]:
    """Path on the coordinator -> content: the watchdog that restarts llama-server when it lost a worker."""
    s = cluster.settings
    return {
        **_program(
            s["deploy_dir"],
            "llama-server-watchdog.sh",
            # through a tunnel, llama-server's connection ends on the coordinator: a worker that closed
            # shows there (the tunnel closes it too), a network that dropped on stunnel's connection out
            programs.llama_server_watchdog_env(
                endpoints=cluster.rpc_endpoints,
                interval=WATCHDOG_INTERVAL,
                remotes=[w.rpc_remote for w in cluster.tunnelled],
                retransmissions=WATCHDOG_RETRANSMISSIONS,
                grace=3 * WATCHDOG_INTERVAL,
                server_unit=COORDINATOR_UNIT,
                no_drain_flag=NO_DRAIN_FLAG,
            ),
        ),
        f"{UNIT_DIR}/{WATCHDOG_UNIT}": _render(
            "llama-server-watchdog.service.j2", deploy_dir=s["deploy_dir"], server_unit=COORDINATOR_UNIT
        ),
    }


def sleep_files(cluster: Cluster, nics: dict[str, sleep.Nic]) -> dict[str, str]:
    """Path on the coordinator -> content: llama-sleep.py, its settings (llama-sleep.json: every command it runs,
    and per worker its MAC, broadcast address and RPC endpoint, nics[name] as the deploy read them) and its unit.
    Empty when sleep_idle_seconds is None."""
    s = cluster.settings
    if not s["sleep_idle_seconds"]:
        return {}
    deploy_dir = s["deploy_dir"]
    sleeper = f"{deploy_dir}/{programs.SLEEPER}"

    def told_to_sleep(w: ClusterHost) -> list[str]:  # its authorized_keys runs sleep-now.sh whatever we send
        return [
            "ssh", "-i", SLEEP_KEY, "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={KNOWN_HOSTS}", "-o", "ConnectTimeout=10", "-p", str(w.transfer_port),
            f"root@{w.address}", "sleep",
        ]  # fmt: skip

    config = {
        "idle_seconds": s["sleep_idle_seconds"],
        "wake_timeout": s["sleep_wake_timeout"],
        "retry_after": sleep.WAKE_RETRY_AFTER,
        "keep_awake": sleep.KEEP_AWAKE,
        "ready_timeout": s["llama_health_timeout"],
        "socket": FRONT_SOCKET,
        "backends": [FRONT_BACKEND, FRONT_HELD],  # where requests that count reach llama-server (front.cfg.j2)
        "server": FRONT_SERVER,
        "state": SLEEP_STATE,
        "stop_server": ["systemctl", "stop", COORDINATOR_UNIT],
        "start_server": ["systemctl", "start", COORDINATOR_UNIT],
        "server_running": ["systemctl", "is-active", "--quiet", COORDINATOR_UNIT],
        "workers": [
            {
                "name": w.name,
                "mac": nics[w.name].mac,
                "broadcast": nics[w.name].broadcast,
                "endpoint": w.rpc_endpoint,
                "sleep": told_to_sleep(w),
            }
            for w in cluster.workers
        ],
    }
    return {
        sleeper: programs.text(programs.SLEEPER),
        f"{deploy_dir}/{programs.SLEEPER.removesuffix('.py')}.json": json.dumps(config, indent=1) + "\n",
        f"{UNIT_DIR}/{SLEEP_UNIT}": _render(
            "llama-sleep.service.j2",
            idle=s["sleep_idle_seconds"],
            sleeper=sleeper,
            front_unit=FRONT_UNIT,
            server_unit=COORDINATOR_UNIT,
        ),
    }


def worker_sleep_files(cluster: Cluster, worker: ClusterHost, nic: sleep.Nic | None) -> dict[str, str]:
    """Path on the worker -> content: sleep-now.sh (the sleep key's one command) with its settings, and with
    wol_check_nic the .link file that turns Wake-on-LAN on at every boot. Empty when sleep_idle_seconds is None."""
    if not cluster.settings["sleep_idle_seconds"]:
        return {}
    out = _program(worker.settings["deploy_dir"], SLEEP_NOW, programs.sleep_now_env(command=sleep.sleep_line(worker)))
    if worker.settings["wol_check_nic"] and nic is not None:
        out[WOL_LINK] = _render("wol.link.j2", interface=nic.interface, mac=nic.mac)
    return out
