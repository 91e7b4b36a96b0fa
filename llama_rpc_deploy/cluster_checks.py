"""The checks that span settings or hosts, each a named function, and checked_cluster(): the checked Cluster.

A single value is checked by its schema entry (settings.py); what needs two settings, two hosts or
a file on the control machine is checked here. Each check raises SettingsError with the file, the
key, the value and what was expected.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import replace

from .cluster import Cluster, ClusterHost, allowed_clients, api_key, cuda_architectures, is_wide
from . import gpus, paths, speculation, tunnel
from .settings import PLACEHOLDER, PORT, QUANTIZED_CACHE_TYPES, SettingsError, is_host_name

# The first CUDA release that can build for a compute capability (newer cards need newer CUDA).
MIN_CUDA_FOR_ARCH = {"100": (12, 8), "101": (12, 8), "120": (12, 8), "121": (12, 9), "90": (11, 8), "89": (11, 8)}
DOCUMENTATION_NETS = [ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24")]


def check_inventory_shape(coordinators: list[str], workers: list[str], inventory_file: str) -> None:
    """One coordinator, at least one worker, each host once (by inventory name)."""
    if len(coordinators) != 1:
        raise SettingsError(f"{inventory_file}: group coordinator has {len(coordinators)} hosts: expected exactly one")
    if not workers:
        raise SettingsError(f"{inventory_file}: group workers is empty: expected at least one worker")
    names = coordinators + workers
    both = sorted({n for n in names if names.count(n) > 1})
    if both:
        raise SettingsError(
            f"{inventory_file}: {', '.join(both)} is listed twice (coordinator and workers, "
            "or twice in workers): expected each host once"
        )


MIN_CTX_PER_SLOT = 512  # tokens: a chat's system prompt alone takes a few hundred


def _where(host: ClusterHost, key: str, inventory_file: str) -> str:
    """Where a host's value of key came from; unset, its host line in the inventory (address, rpc_host:
    the inventory name stands in for them)."""
    return host.origins[key] if host.settings[key] else f"{inventory_file} (host {host.name})"


def hosts_are_addresses(cluster: Cluster, inventory_file: str) -> None:
    """Every inventory name and address is an IP address or an RFC 1123 host name: they go into commands."""
    for h in cluster.hosts:
        if not is_host_name(h.name):
            raise SettingsError(
                f"{inventory_file}: host {h.name!r}: expected an IP address or a host name "
                "(RFC 1123: letters, digits, '-' and '.')"
            )
        if not PORT.ok(h.ssh_port):
            raise SettingsError(
                f"{inventory_file} (host {h.name}): ssh_port = {h.ssh_port!r}: expected {PORT.expected}"
            )


def rpc_servers_bind_ipv4(cluster: Cluster, inventory_file: str) -> None:
    """rpc-server binds an IPv4 address literal only (inet_addr in ggml-rpc.cpp), and llama-server splits
    --rpc endpoints at the first ':': a host name or an IPv6 address there would never serve."""
    for w in cluster.workers:
        bind = w.settings["rpc_host"] or w.address
        try:
            ok = ipaddress.ip_address(bind).version == 4
        except ValueError:
            ok = False
        if not ok:
            key = "rpc_host" if w.settings["rpc_host"] else "address"
            raise SettingsError(
                f"{_where(w, key, inventory_file)}: {key} = {bind!r} on worker {w.name}: expected an IPv4 address (rpc-server "
                "binds to IPv4 addresses only; set address, or rpc_host, to the worker's IPv4 address)"
            )


def workers_apart_from_the_coordinator(cluster: Cluster, inventory_file: str) -> None:
    for w in cluster.workers:
        if w.address == cluster.coordinator.address:
            raise SettingsError(
                f"{_where(w, 'address', inventory_file)}: address = {w.address!r} on worker {w.name} is the coordinator's: expected "
                "the worker's own address (a worker on the coordinator's host adds nothing over RPC)"
            )


def ports_apart_from_ssh(cluster: Cluster, inventory_file: str) -> None:
    """llama_port on the coordinator and rpc_port on a worker must not be its sshd's port: the firewall
    would guard sshd's port, and the service could not bind."""
    checks = [(cluster.coordinator, "llama_port")] + [(w, "rpc_port") for w in cluster.workers]
    for h, key in checks:
        ports = {h.ssh_port} | (
            {h.settings["transfer_ssh_port"]} if key == "rpc_port" and h.settings["transfer_ssh_port"] else set()
        )
        if h.settings[key] in ports:
            raise SettingsError(
                f"{h.origins[key]}: {key} = {h.settings[key]} on {h.name} is its SSH port: expected another port"
            )


def context_per_slot(cluster: Cluster, inventory_file: str) -> None:
    s, origins = cluster.settings, cluster.coordinator.origins
    if not s["llama_kv_unified"] and s["llama_ctx_size"] // s["llama_parallel"] < MIN_CTX_PER_SLOT:
        raise SettingsError(
            f"{origins['llama_parallel']}: llama_parallel = {s['llama_parallel']} with llama_ctx_size = "
            f"{s['llama_ctx_size']} leaves {s['llama_ctx_size'] // s['llama_parallel']} tokens per request: expected "
            f"at least {MIN_CTX_PER_SLOT} (fewer slots, or a larger llama_ctx_size)"
        )


def hold_outlasts_a_wake(cluster: Cluster, inventory_file: str) -> None:
    """With sleep, the front holds the request that wakes the workers: it must hold it longer than a wake may take,
    or the client gets the hold's 503 where the wake would have answered it (docs/sleep.md)."""
    s, origins = cluster.settings, cluster.coordinator.origins
    if s["sleep_idle_seconds"] and s["llama_front_hold_seconds"] <= s["sleep_wake_timeout"]:
        raise SettingsError(
            f"{origins['llama_front_hold_seconds']}: llama_front_hold_seconds = {s['llama_front_hold_seconds']} with "
            f"sleep_wake_timeout = {s['sleep_wake_timeout']} ({origins['sleep_wake_timeout']}): expected more than "
            "sleep_wake_timeout, and time for the model's load on top (the front holds the request that wakes the "
            "workers)"
        )


def distinct_rpc_endpoints(cluster: Cluster, inventory_file: str) -> None:
    endpoints = [w.rpc_remote for w in cluster.workers]
    dup = sorted({e for e in endpoints if endpoints.count(e) > 1})
    if dup:
        raise SettingsError(
            f"{inventory_file}: rpc endpoint {', '.join(dup)} is used by two workers: "
            "expected one address:port per worker"
        )


def model_path_is_set(cluster: Cluster, inventory_file: str) -> None:
    path, where = cluster.settings["llama_model_path"], cluster.coordinator.origins["llama_model_path"]
    if PLACEHOLDER in path:
        raise SettingsError(
            f"{where}: llama_model_path = {path!r}: expected the path of your GGUF file on the coordinator"
        )


def model_path_is_gguf(cluster: Cluster, inventory_file: str) -> None:
    path, where = cluster.settings["llama_model_path"], cluster.coordinator.origins["llama_model_path"]
    if not path.endswith(".gguf"):
        raise SettingsError(f"{where}: llama_model_path = {path!r}: expected a .gguf file")


def _is_documentation_address(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in net for net in DOCUMENTATION_NETS)


def no_example_addresses(cluster: Cluster, inventory_file: str) -> None:
    examples = [h.name for h in cluster.hosts if _is_documentation_address(h.address)]
    if examples:
        raise SettingsError(
            f"{inventory_file}: {', '.join(examples)}: example addresses (RFC 5737, they reach "
            "nothing): expected your hosts' addresses"
        )


def same_quantized_kv_types(cluster: Cluster, inventory_file: str) -> None:
    k, v = cluster.settings["llama_cache_type_k"], cluster.settings["llama_cache_type_v"]
    if k in QUANTIZED_CACHE_TYPES and v in QUANTIZED_CACHE_TYPES and k != v:
        raise SettingsError(
            f"{cluster.coordinator.origins['llama_cache_type_v']}: llama_cache_type_v = {v!r} with "
            f"llama_cache_type_k = {k!r}: expected the same quantized type for K and V "
            "(RPC workers crash on mixed quantized K/V, llama.cpp issue #27905)"
        )


def quantized_v_has_flash_attention(cluster: Cluster, inventory_file: str) -> None:
    v = cluster.settings["llama_cache_type_v"]
    if v in QUANTIZED_CACHE_TYPES and cluster.settings["llama_flash_attn"] == "off":
        raise SettingsError(
            f"{cluster.coordinator.origins['llama_flash_attn']}: llama_flash_attn = 'off' with "
            f"llama_cache_type_v = {v!r}: expected 'on' or 'auto' (a quantized V cache needs flash attention)"
        )


def rpc_port_apart_from_llama_port(cluster: Cluster, inventory_file: str) -> None:
    for h in cluster.workers:
        if h.settings["rpc_port"] == cluster.settings["llama_port"] and h.address == cluster.coordinator.address:
            raise SettingsError(
                f"{h.origins['rpc_port']}: rpc_port = {h.settings['rpc_port']} on {h.name}: "
                "expected a port other than llama_port on the same address"
            )


def server_port_apart_from_the_api(cluster: Cluster, inventory_file: str) -> None:
    """llama-server listens on the coordinator's loopback at llama_server_port, the front at llama_port."""
    s, origins = cluster.settings, cluster.coordinator.origins
    if s["llama_server_port"] == s["llama_port"]:
        raise SettingsError(
            f"{origins['llama_server_port']}: llama_server_port = {s['llama_server_port']}: expected "
            f"a port other than llama_port ({s['llama_port']}, where the front listens)"
        )


def one_share_per_device(cluster: Cluster, inventory_file: str) -> None:
    """A share of llama_tensor_split per device (with a host's GPUs still to learn: once they are, LEARNED_CHECKS)."""
    split = cluster.settings["llama_tensor_split"]
    if cluster.unlearned:
        return
    if isinstance(split, (list, tuple)) and len(split) != len(cluster.devices):
        raise SettingsError(
            f"{cluster.coordinator.origins['llama_tensor_split']}: llama_tensor_split = {list(split)!r}: expected "
            f"{len(cluster.devices)} numbers, one per device ({', '.join(cluster.devices)})"
        )


def speculation_is_consistent(cluster: Cluster, inventory_file: str) -> None:
    """The speculative settings, read alone (speculation.settings_problem); the files are checked on the coordinator.
    With a host's GPUs still to learn, the cluster's devices are not known: llama_spec_draft_device is checked once
    they are (LEARNED_CHECKS), the rest now."""
    if cluster.unlearned and cluster.settings[speculation.DEVICE_KEY] is not None:
        cluster = cluster.with_setting(speculation.DEVICE_KEY, None)
    problem = speculation.settings_problem(cluster)
    if problem:
        raise SettingsError(problem)


def _cuda_version(image: str) -> tuple[int, int] | None:
    match = re.search(r"cuda:(\d+)\.(\d+)", image)
    return (int(match.group(1)), int(match.group(2))) if match else None


def gpus_where(h: ClusterHost) -> str:
    """Where a host's gpus came from, for a message: 'FILE: gpus = [...]', or, learned, the tool that listed them."""
    if h.gpus_from == "host":
        return f"{h.name}: gpus (not set; {LEARN_FROM[h.backend]} on the host lists) = {[g.name for g in h.gpus]!r}"
    return f"{h.origins['gpus']}: gpus = {h.settings['gpus']!r}"


def gpus_match_backend(cluster: Cluster, inventory_file: str) -> None:
    """Each host's GPUs are of its backend: NVIDIA cards on cuda, AMD and Intel cards on vulkan, none on cpu."""
    for h in cluster.hosts:
        for gpu in h.gpus:
            if gpu.backend != h.backend:
                raise SettingsError(
                    f"{gpus_where(h)} on {h.name}, whose image_backend is "
                    f"{h.backend!r} (from {h.origins['image_backend']}): {gpu.name} is a card of "
                    f"{gpu.vendor}: expected image_backend = {gpu.backend!r} on that host"
                )


# Base images whose Vulkan headers are older than this llama.cpp needs: ggml-vulkan.cpp uses vk::LayerSettingEXT
# (VK_EXT_layer_settings), which Debian 12's 1.3.239 lacks (its build fails there; Debian 13's 1.4.309 builds),
# and Ubuntu 22.04's 1.3.204 is older still.
OLD_VULKAN_BASES = re.compile(
    r"(^|/)(debian:(bookworm|bullseye|buster|oldstable|oldoldstable|1[0-2])"
    r"|ubuntu:(2[0-3]\.(04|10)|18\.04|jammy|focal|bionic|kinetic|lunar|mantic))([-.@].*)?$"
    r"|-ubuntu(1[0-9]|2[0-3])\.(04|10)$"
)  # nvidia/cuda:12.4.1-devel-ubuntu22.04


def vulkan_can_build(cluster: Cluster, inventory_file: str) -> None:
    """A vulkan host's image is built on a base whose Vulkan headers this llama.cpp can use."""
    if "vulkan" not in cluster.backends:
        return
    for key, what in (
        (
            "image_vulkan_build_image",
            "its Vulkan headers are too old for llama.cpp's ggml-vulkan (vk::LayerSettingEXT)",
        ),
        (
            "image_vulkan_runtime_image",
            "older than the build's base: the binaries need its newer C library and Vulkan loader",
        ),
    ):
        base = cluster.settings[key]
        if OLD_VULKAN_BASES.search(base):
            raise SettingsError(
                f"{cluster.coordinator.origins[key]}: {key} = {base!r}: {what}: "
                "expected debian:trixie, ubuntu:24.04 or newer"
            )


def cuda_can_build_every_gpu(cluster: Cluster, inventory_file: str) -> None:
    s, origins = cluster.settings, cluster.coordinator.origins
    cuda_hosts = [h for h in cluster.hosts if h.backend == "cuda"]
    if not cuda_hosts:
        return
    archs = cuda_architectures(cluster)
    if not archs and any(not h.gpus_known for h in cuda_hosts):
        return  # the cards are learned from the hosts when the deploy connects: checked then (LEARNED_CHECKS)
    if not archs:
        first = cuda_hosts[0]
        learned = [h.name for h in cuda_hosts if h.gpus_from == "host"]
        raise SettingsError(
            f"{first.origins['image_backend']}: image_backend = 'cuda' but no host lists gpus "
            f"(cuda: {', '.join(h.name for h in cuda_hosts)}"
            + (f"; nvidia-smi lists no card on {', '.join(learned)}" if learned else "")
            + "): expected gpus on at least one of them (e.g. gpus = ['RTX 4080']), or image_backend = 'cpu'"
        )
    version = _cuda_version(s["image_build_image"])
    for arch in archs.split(";"):
        need = MIN_CUDA_FOR_ARCH.get(re.sub(r"\D", "", arch))
        if version and need and version < need:
            raise SettingsError(
                f"{origins['image_build_image']}: image_build_image = {s['image_build_image']!r}: CUDA "
                f"{version[0]}.{version[1]} cannot build for sm_{arch}: expected CUDA {need[0]}.{need[1]} or newer"
            )


def firewall_admits_addresses(cluster: Cluster, inventory_file: str) -> None:
    for worker in cluster.workers:
        if not worker.settings["rpc_firewall"]:
            continue
        for client in allowed_clients(cluster, worker):
            try:
                if not isinstance(client, str) or "%" in client:
                    raise ValueError("an IPv6 scope id")
                network = ipaddress.ip_network(client, strict=False)
            except ValueError:
                host, key = (
                    (worker, "rpc_allow_from")
                    if worker.settings["rpc_allow_from"]
                    else (cluster.coordinator, "address")
                )
                where = _where(host, key, inventory_file)
                raise SettingsError(
                    f"{where}: {key} = {client!r} (the source {worker.name}'s firewall admits to rpc_port): expected an "
                    "IP address or network (set address to the coordinator's IP, or rpc_allow_from, or rpc_firewall = False)"
                ) from None
            if is_wide(network) and not worker.settings["rpc_allow_wide"]:
                raise SettingsError(
                    f"{worker.origins['rpc_allow_from']}: rpc_allow_from = {client!r} on {worker.name} admits "
                    f"{network.num_addresses} addresses to the unauthenticated RPC port: expected addresses or "
                    "private networks no wider than a /16 (rpc_allow_wide = True to open it anyway)"
                )


def api_key_file_is_usable(cluster: Cluster, inventory_file: str) -> None:
    if cluster.settings["llama_api_key_file"]:
        api_key(cluster)


def served_models_apart(cluster: Cluster, inventory_file: str) -> None:
    """Models on demand: the name llama_model_path is served under is no other file's."""
    models, name = cluster.settings["llama_models"], cluster.default_model
    if name in models and models[name]["llama_model_path"] != cluster.settings["llama_model_path"]:
        raise SettingsError(
            f"{cluster.coordinator.origins['llama_models']}: llama_models: {name} = "
            f"{models[name]['llama_model_path']!r}, but llama_model_path "
            f"{cluster.settings['llama_model_path']!r} is served as {name!r} too: expected "
            "another name, or an entry with llama_model_path's path"
        )
    paths = [e["llama_model_path"] for e in models.values()]
    twice = sorted({p for p in paths if paths.count(p) > 1})
    if twice:
        raise SettingsError(
            f"{cluster.coordinator.origins['llama_models']}: llama_models: {', '.join(twice)} "
            "under two names: expected each file once"
        )


def one_transport(cluster: Cluster, inventory_file: str) -> None:
    """Every worker reached the same way: the deploy's operations are the same on every worker."""
    kinds = {w.settings["rpc_transport"] for w in cluster.workers}
    if len(kinds) > 1:
        w = next(
            w for w in cluster.workers if w.settings["rpc_transport"] != cluster.workers[0].settings["rpc_transport"]
        )
        raise SettingsError(
            f"{w.origins['rpc_transport']}: rpc_transport = {w.settings['rpc_transport']!r} on {w.name}, "
            f"{cluster.workers[0].settings['rpc_transport']!r} on {cluster.workers[0].name}: expected one "
            "rpc_transport for every worker (set it in group_data/workers.yml)"
        )


def tunnel_ports_apart(cluster: Cluster, inventory_file: str) -> None:
    """A tunnelled worker's TLS port is neither rpc-server's nor sshd's; the tunnels' ends on the coordinator
    are none of the coordinator's own ports."""
    for w in cluster.tunnelled:
        port = w.settings["rpc_tunnel_port"]
        if port in (w.settings["rpc_port"], w.ssh_port, w.settings["transfer_ssh_port"]):
            raise SettingsError(
                f"{w.origins['rpc_tunnel_port']}: rpc_tunnel_port = {port} on {w.name} is its "
                f"{'rpc_port' if port == w.settings['rpc_port'] else 'SSH port'}: expected another port"
            )
    c = cluster.coordinator
    own = {
        c.settings["llama_port"]: "llama_port",
        c.settings["llama_server_port"]: "llama_server_port",
        c.ssh_port: "ssh_port",
    }
    for w in cluster.tunnelled:
        if w.tunnel_end > 65535 or w.tunnel_end in own:
            clash = own.get(w.tunnel_end, "above 65535")
            raise SettingsError(
                f"{c.origins['rpc_tunnel_local_port']}: rpc_tunnel_local_port = "
                f"{c.settings['rpc_tunnel_local_port']} puts {w.name}'s tunnel end on the coordinator at "
                f"port {w.tunnel_end} ({clash}): expected ports free of the coordinator's own"
            )


def tunnel_keys_private(cluster: Cluster, inventory_file: str) -> None:
    """The tunnel's keys and certificates on this machine are readable by their owner alone."""
    if cluster.tunnelled:
        generation, origin = tunnel.generation(cluster)
        tunnel.check_modes(tunnel.folder(paths.STATE, generation), origin)


# the checks of the settings a model of llama_models may set for itself, run once per model
MODEL_CHECKS = (
    context_per_slot,
    model_path_is_set,
    model_path_is_gguf,
    same_quantized_kv_types,
    quantized_v_has_flash_attention,
    one_share_per_device,
    speculation_is_consistent,
)

CHECKS = (
    hosts_are_addresses,
    rpc_servers_bind_ipv4,
    workers_apart_from_the_coordinator,
    ports_apart_from_ssh,
    context_per_slot,
    hold_outlasts_a_wake,
    distinct_rpc_endpoints,
    model_path_is_set,
    model_path_is_gguf,
    no_example_addresses,
    same_quantized_kv_types,
    quantized_v_has_flash_attention,
    rpc_port_apart_from_llama_port,
    server_port_apart_from_the_api,
    one_share_per_device,
    speculation_is_consistent,
    gpus_match_backend,
    cuda_can_build_every_gpu,
    vulkan_can_build,
    firewall_admits_addresses,
    api_key_file_is_usable,
    served_models_apart,
    one_transport,
    tunnel_ports_apart,
    tunnel_keys_private,
)


# What only a deploy needs: plan is arithmetic, and plans an unedited checkout (--model names the file).
DEPLOY_ONLY = (model_path_is_set, no_example_addresses)

# The checks that read the hosts' GPUs (the devices, the CUDA architectures, each card's vendor): before connecting
# they check what is known and leave a host whose gpus are to be learned for later; with_learned runs them again
# once the cards are known (on the cluster, and the first two on each model of llama_models).
LEARNED_CHECKS = (one_share_per_device, speculation_is_consistent, gpus_match_backend, cuda_can_build_every_gpu)
LEARNED_MODEL_CHECKS = (one_share_per_device, speculation_is_consistent)
# what a host's cards are learned from, by image_backend (a cpu host has none to learn)
LEARN_FROM = {"cuda": "nvidia-smi", "vulkan": "vulkaninfo"}


def _backend_from(host: ClusterHost, backend: str, origin: str) -> ClusterHost:
    """host with image_backend set: its own, or else backend (the coordinator's, which was set at origin)."""
    if host.settings["image_backend"]:
        return host
    return replace(
        host, settings={**host.settings, "image_backend": backend}, origins={**host.origins, "image_backend": origin}
    )


def nothing_to_learn(h: ClusterHost) -> ClusterHost:
    """A cpu host whose gpus are not set has none: nothing to learn."""
    return h if h.gpus_known or h.backend in LEARN_FROM else replace(h, gpus_from="backend")


def with_learned(cluster: Cluster, found: dict, inventory_file: str = "inventory.py") -> Cluster:
    """The cluster with the cards each host still to learn reported (found: host name -> [gpus.Found], from
    LEARN_FROM[its backend]), then LEARNED_CHECKS. A host that reported none has none (its CPU device; on a host that
    set image_backend 'vulkan' itself, lavapipe, as with gpus = []). Hosts whose gpus are set are left as they are:
    what the inventory says wins."""
    learned = {
        h.name: replace(
            h,
            gpus=tuple(gpus.learned(f) for f in found.get(h.name) or []),
            gpus_from="host",
            software_vulkan=h.software_vulkan and not found.get(h.name),
        )
        for h in cluster.unlearned
    }
    cluster = replace(
        cluster,
        coordinator=learned.get(cluster.coordinator.name, cluster.coordinator),
        workers=tuple(learned.get(w.name, w) for w in cluster.workers),
    )
    for check in LEARNED_CHECKS:
        check(cluster, inventory_file)
    for name in cluster.served_models():
        for check in LEARNED_MODEL_CHECKS:
            check(cluster.for_model(name), inventory_file)
    return cluster


def checked_cluster(
    coordinators: list[ClusterHost],
    workers: list[ClusterHost],
    inventory_file: str = "inventory.py",
    deploying: bool = True,
) -> Cluster:
    """The Cluster, after every check in CHECKS (each raises SettingsError); for a plan (deploying=False),
    less DEPLOY_ONLY's."""
    check_inventory_shape([h.name for h in coordinators], [h.name for h in workers], inventory_file)

    def lavapipe(h: ClusterHost) -> ClusterHost:  # vulkan set on the host itself, and no gpus
        return replace(h, software_vulkan=h.settings["image_backend"] == "vulkan" and not h.gpus)

    coordinators = [_backend_from(lavapipe(coordinators[0]), "cuda", f"{inventory_file} (host {coordinators[0].name})")]
    first = coordinators[0].settings["rpc_tunnel_local_port"]  # each tunnelled worker's end on the coordinator
    workers = [lavapipe(w) for w in workers]
    workers = [_backend_from(w, coordinators[0].backend, coordinators[0].origins["image_backend"]) for w in workers]
    coordinators, workers = [nothing_to_learn(h) for h in coordinators], [nothing_to_learn(w) for w in workers]
    workers = [replace(w, tunnel_end=first + i) if w.tunnelled else w for i, w in enumerate(workers)]
    cluster = Cluster(coordinator=coordinators[0], workers=tuple(workers))
    skip = () if deploying else DEPLOY_ONLY
    for check in CHECKS:
        if check not in skip:
            check(cluster, inventory_file)
    for name in cluster.served_models():  # each model of llama_models with its own settings
        for check in MODEL_CHECKS:
            if check not in skip:
                check(cluster.for_model(name), inventory_file)
    return cluster
