"""Every setting a user may put in group_data/ or in inventory.py, with its default and its check.

This table is the one place where a setting is defined and the only place a default lives.
group_data/*.yml set what a user must set; everything they leave out takes the default here.
`python -m llama_rpc_deploy settings` prints the table that README.md shows.

Values are looked up the way pyinfra layers them, scope by scope (highest first, `scopes()`): --data on the
command line, the host's data in the inventory, group_data/<group>, then group_data/all.
Errors name the place a bad value came from (file:line:column for YAML).
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
QUANTIZED_CACHE_TYPES = frozenset(CACHE_TYPES) - {"f32", "f16", "bf16"}
PLACEHOLDER = "CHANGE_ME"
MAX_CTX = 1 << 24  # 16M tokens: more than any model is trained for; llama.cpp's n_ctx is 32-bit


# The roles, named as the inventory's groups (one set of names everywhere: settings, cluster, deploy, status),
# and what a setting or a scope that is neither role's alone applies to.
COORDINATOR, WORKERS = "coordinator", "workers"
ROLES = (COORDINATOR, WORKERS)
EVERY_HOST = "every host"


class SettingsError(ValueError):
    """A bad setting: the message names the file, the key, the value and what was expected."""


@dataclass(frozen=True)
class Check:
    expected: str  # what a good value looks like, in words
    ok: Callable[[Any], bool]
    why: Callable[[Any], str] | None = None  # for a nested value: which part is wrong, and what it should be


def _int(lo: int | None = None, hi: int | None = None) -> Check:
    words = (
        "an integer"
        + (f" >= {lo}" if lo is not None and hi is None else "")
        + (f" from {lo} to {hi}" if lo is not None and hi is not None else "")
    )
    return Check(
        words,
        lambda v: (
            isinstance(v, int) and not isinstance(v, bool) and (lo is None or v >= lo) and (hi is None or v <= hi)
        ),
    )


def _optional(check: Check) -> Check:
    return Check(f"None or {check.expected}", lambda v: v is None or check.ok(v))


def _one_of(*choices: Any) -> Check:
    return Check("one of " + ", ".join(repr(c) for c in choices), lambda v: v in choices)


def _printable(v) -> bool:
    """A string without control characters (a newline ends a line of a script, a unit, an env file)."""
    return isinstance(v, str) and v.isprintable()


def _str(pattern: str = r".+", words: str = "a non-empty string") -> Check:
    return Check(words, lambda v: _printable(v) and re.fullmatch(pattern, v) is not None)


def _str_list() -> Check:
    return Check(
        "a list of strings without control characters",
        lambda v: isinstance(v, (list, tuple)) and all(_printable(x) for x in v),
    )


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _positive_numbers() -> Check:
    return Check(
        "None, 'auto' or a list of finite numbers from 0 to 1000000, one per device, not all 0",
        lambda v: (
            v is None
            or v == "auto"
            or (
                isinstance(v, (list, tuple))
                and len(v) > 0
                and all(_number(x) and 0 <= x <= 1e6 for x in v)
                and sum(v) > 0
            )
        ),
    )


def _ipv4(value) -> bool:
    try:
        return isinstance(value, str) and isinstance(ipaddress.ip_address(value), ipaddress.IPv4Address)
    except ValueError:
        return False


def is_host_name(value) -> bool:
    """An IP address (IPv6 without a %scope) or an RFC 1123 host name: what may go into a command."""
    if not isinstance(value, str) or not value:
        return False
    try:
        ipaddress.ip_address(value)
        return "%" not in value
    except ValueError:
        pass
    labels = value.rstrip(".").split(".")
    return len(value) <= 253 and all(
        re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?", label) for label in labels
    )


# folders a deploy must never take over (it chowns its own folders to the service user)
SYSTEM_DIRS = frozenset(
    {
        "/",
        "/bin",
        "/boot",
        "/dev",
        "/etc",
        "/home",
        "/lib",
        "/lib32",
        "/lib64",
        "/media",
        "/mnt",
        "/opt",
        "/proc",
        "/root",
        "/run",
        "/sbin",
        "/srv",
        "/sys",
        "/tmp",
        "/usr",
        "/usr/bin",
        "/usr/lib",
        "/usr/local",
        "/usr/sbin",
        "/usr/share",
        "/var",
        "/var/cache",
        "/var/lib",
        "/var/log",
        "/var/tmp",
    }
)


def _path(allowed: str, words: str) -> Check:
    """An absolute path of these characters, without '.' or '..' components, not a system folder."""

    def ok(v) -> bool:
        if not (_printable(v) and re.fullmatch(f"/{allowed}*", v)):
            return False
        parts = v.split("/")
        return "." not in parts and ".." not in parts and "/" + "/".join(p for p in parts if p) not in SYSTEM_DIRS

    return Check(words, ok)


BOOL = Check("True or False", lambda v: isinstance(v, bool))
PORT = _int(1, 65535)
ADDRESS = Check("an IP address or a host name (RFC 1123: letters, digits, '-' and '.')", is_host_name)
# a folder of the deploy's own on a host: it goes into commands, units and docker's --volume
HOST_DIR = _path(
    r"[A-Za-z0-9._/-]",
    "an absolute path of letters, digits, '.', '_', '-' and '/', a folder of its own (not '/', /etc, /var/lib, ...)",
)
# a file the user has (in LM Studio's folder...): spaces and letters of any script, but not ':' or ','
# (docker's --volume cannot carry them) nor shell or unit syntax
MODEL_FILE = _path(
    r"[\w .+@=~'()\[\]&/-]",
    "an absolute path of letters, digits, spaces and . _ - + @ = ~ ' ( ) [ ] & "
    "(no ':' or ',': docker --volume and --mount cannot carry them)",
)
CONTROL_PATH = _str(r"\S(.*\S)?", "a path on this machine")
# models on demand: the settings each model in llama_models may set for itself (the rest are shared)
PER_MODEL = (
    "llama_model_path",
    "llama_mmproj_path",
    "llama_ctx_size",
    "llama_parallel",
    "llama_kv_unified",
    "llama_tensor_split",
    "llama_cache_type_k",
    "llama_cache_type_v",
    "llama_flash_attn",
    "llama_n_gpu_layers",
    "llama_spec_type",
    "llama_spec_draft_path",
    "llama_spec_draft_min",
    "llama_spec_draft_max",
    "llama_spec_draft_device",
)
MODEL_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"  # the request's "model" field; an INI section name


def _models_problem(value) -> str:
    """What is wrong with a llama_models value ('' when nothing is)."""
    if not isinstance(value, dict):
        return f"llama_models = {value!r}: expected a mapping of model names to their settings"
    for name, entry in value.items():
        if not (isinstance(name, str) and re.fullmatch(MODEL_NAME, name)):
            return (
                f"llama_models: model name {name!r}: expected letters, digits, '.', '_' and '-' "
                "(at most 64, a letter or digit first): clients send it as the request's model field"
            )
        if not isinstance(entry, dict) or "llama_model_path" not in entry:
            return f"llama_models: {name} = {entry!r}: expected a mapping with at least llama_model_path"
        for key, v in entry.items():
            if key not in PER_MODEL:
                return (
                    f"llama_models: {name}.{key}: expected one of the settings a model may set for itself: "
                    + ", ".join(PER_MODEL)
                )
            check = BY_NAME[key].check
            if not check.ok(v):
                return f"llama_models: {name}.{key} = {v!r}: expected {check.expected}"
    return ""


MODELS = Check("a mapping of model names to settings", lambda v: not _models_problem(v), _models_problem)
IMAGE_REF = _str(r"[a-z0-9][a-z0-9._/:@-]*", "a Docker image reference")
BACKENDS = ("cuda", "vulkan", "cpu")
# llama.cpp's speculative types (common/speculative.cpp); speculation.py says which reads a draft model
SPEC_TYPES = (
    "draft-simple",
    "draft-eagle3",
    "draft-mtp",
    "draft-dflash",
    "draft-dspark",
    "ngram-mod",
    "ngram-simple",
    "ngram-map-k",
    "ngram-map-k4v",
    "ngram-cache",
)  # image_backend: a llama.cpp build each (files/Dockerfile's GGML_BACKEND)


@dataclass(frozen=True)
class Setting:
    name: str
    default: Any
    check: Check
    doc: str
    section: str

    @property
    def read_from(self) -> str:
        """Whose value counts: 'coordinator' for the cluster-wide settings (image, model, llama-server),
        'workers' for rpc-server's, 'every host' for the rest."""
        return {"image": COORDINATOR, "server": COORDINATOR, "rpc": WORKERS}.get(self.section, EVERY_HOST)


S = Setting
SETTINGS: tuple[Setting, ...] = (
    # --- llama.cpp source and image ---
    S(
        "llama_cpp_ref",
        "0c1e57098bba43ac29e6e3b677cdceebdd22334f",
        _str(r"[0-9a-f]{40}", "a full 40-character commit"),
        "llama.cpp commit the image is built from: release b11312, 2026-10-01 (also what the llama-cpp-python "
        "0.3.36 sdist vendors). A full commit, so that it names one tree.",
        "image",
    ),
    S(
        "llama_cpp_build_number",
        11312,
        _int(0),
        "The release number of llama_cpp_ref (bNNNN), so that llama-server reports its version (/props, "
        "system_fingerprint); a tarball has no git history to count it from.",
        "image",
    ),
    S(
        "llama_cpp_url",
        "https://github.com/ggml-org/llama.cpp/archive/{ref}.tar.gz",
        _str(r"https?://[^\s{}]*\{ref\}[^\s{}]*", "a http(s):// URL with {ref} in it (and no other braces)"),
        "Where the coordinator downloads llama_cpp_ref from ({ref} stands for the commit): GitHub, or your "
        "mirror or proxy.",
        "image",
    ),
    S(
        "llama_cpp_sha256",
        None,
        _optional(_str(r"[0-9a-f]{64}", "a sha256 (64 hex digits)")),
        "The downloaded tarball's sha256; a tarball with another is refused before it is built. None: the first "
        "download's sha256 is recorded on the control machine (.state/sources.lock) and every later download "
        "must match it; pin it here to check the first one too.",
        "image",
    ),
    S(
        "llama_cpp_source",
        None,
        _optional(CONTROL_PATH),
        "None: the coordinator downloads llama_cpp_ref from llama_cpp_url. A path on the control machine to a "
        "llama.cpp tree (or an sdist that vendors one) or a .tar.gz of one: uploaded instead, for offline use.",
        "image",
    ),
    S(
        "image_name",
        "llama-rpc",
        _str(r"[a-z0-9][a-z0-9._/-]*", "a Docker repository name"),
        "Image repository; the tag is derived from the source, the Dockerfile and the build arguments.",
        "image",
    ),
    S(
        "image_build_image",
        "nvidia/cuda:12.8.1-devel-ubuntu24.04",
        IMAGE_REF,
        "Base image of the build stage of the cuda and cpu images (CUDA 12.8 or newer for RTX 50xx / sm_120).",
        "image",
    ),
    S(
        "image_runtime_image",
        "nvidia/cuda:12.8.1-runtime-ubuntu24.04",
        IMAGE_REF,
        "Base image of the runtime stage of the cuda and cpu images.",
        "image",
    ),
    S(
        "image_vulkan_build_image",
        "debian:trixie",
        IMAGE_REF,
        "Base image of the vulkan image's build stage: Debian 13 or newer (Debian 12's Vulkan headers, 1.3.239, "
        "lack what this llama.cpp uses; Debian 13's 1.4.309 build it).",
        "image",
    ),
    S(
        "image_vulkan_runtime_image",
        "debian:trixie",
        IMAGE_REF,
        "Base image of the vulkan image's runtime stage (it installs Mesa's Vulkan drivers).",
        "image",
    ),
    S(
        "image_cuda_architectures",
        None,
        _optional(_str(r"[0-9]+[a-z]?(;[0-9]+[a-z]?)*", "compute capabilities like '89;120'")),
        "None: the union of the inventory's GPUs (see gpus). Set to override, e.g. '86;89;120'.",
        "image",
    ),
    S(
        "image_cpu_native",
        False,
        BOOL,
        "True builds for the coordinator's own CPU (only if every host has the same CPU, like the lab); "
        "False builds every x86 variant and picks one at run time.",
        "image",
    ),
    S(
        "image_build_jobs",
        None,
        _optional(_int(1, 1024)),
        "Parallel compile jobs; None: all cores of the coordinator.",
        "image",
    ),
    # --- hardware ---
    S(
        "image_backend",
        None,
        _optional(_one_of(*BACKENDS)),
        "This host's llama.cpp build: 'cuda' (NVIDIA GPUs, with the NVIDIA Container Toolkit), 'vulkan' (AMD or "
        "Intel GPUs, through /dev/dri; with no gpus, the CPU's Vulkan device, Mesa's lavapipe) or 'cpu'. The "
        "coordinator builds one image per backend the hosts use, each from the same llama.cpp commit. None: the "
        "coordinator's, and 'cuda' on the coordinator.",
        "hardware",
    ),
    S(
        "gpus",
        None,
        Check(
            "None, or a list of GPU names from llama_rpc_deploy/gpus.py, or dicts with name and cuda_arch",
            lambda v: v is None or isinstance(v, (list, tuple)),
        ),
        "This host's GPUs, e.g. ['RTX 4080'] (NVIDIA: image_backend cuda) or ['RX 7900 XTX'] (AMD, Intel: "
        "image_backend vulkan). None: learned from the host when the deploy connects (nvidia-smi on a cuda host, "
        "vulkaninfo on a vulkan one; none on a cpu one); `llama-rpc probe` prints what it finds, as lines to paste. "
        "Set, it wins over what the host has (a difference is a warning). Empty: a CPU-only host (exposes one CPU "
        "device).",
        "hardware",
    ),
    S(
        "address",
        None,
        _optional(ADDRESS),
        "Address the other hosts use to reach this one. None: the inventory name.",
        "hardware",
    ),
    S(
        "host_prepare",
        True,
        BOOL,
        "True: the deploy's first phase installs what this host lacks (Docker Engine, zstd, iptables, python3; "
        "for NVIDIA cards the NVIDIA Container Toolkit and Docker's nvidia runtime; for Vulkan cards Mesa's "
        "drivers) on Debian 12/13 or Ubuntu 22.04/24.04 (docs/prepare.md). False: you prepare the host yourself; "
        "the deploy only checks it.",
        "hardware",
    ),
    # --- the model and llama-server (coordinator) ---
    S(
        "llama_model_path",
        f"/{PLACEHOLDER}/model.gguf",
        MODEL_FILE,
        "GGUF file on the coordinator (e.g. inside LM Studio's models folder); its folder is mounted read-only.",
        "server",
    ),
    S(
        "llama_mmproj_path",
        None,
        _optional(MODEL_FILE),
        "A vision projector (mmproj-*.gguf, next to the model in LM Studio's folder) on the coordinator: "
        "llama-server gets --mmproj and answers image requests; its folder is mounted read-only. "
        "llama.cpp puts it on the first device (RPC0) and the planner counts it there.",
        "server",
    ),
    S(
        "llama_models",
        {},
        MODELS,
        "Models on demand: more GGUF files on the coordinator, by name, each with its own settings, e.g. "
        "{'qwen3-8b': {'llama_model_path': '/models/qwen3-8b.gguf', 'llama_ctx_size': 32768}} (a model may set "
        + ", ".join(PER_MODEL[1:])
        + "; the rest are shared). llama-server then runs as a router: a request's "
        "model field picks the model, one is loaded at a time across the workers, and llama_model_path's model "
        "(named after its file, or after the entry with its path) is loaded at start. Each is planned before "
        "the deploy. Empty: llama_model_path only.",
        "server",
    ),
    S(
        "llama_models_folder",
        False,
        BOOL,
        "True: every GGUF model in llama_model_path's folder is served on demand too, each named after its file "
        "and planned with the shared settings (a llama_models entry with its path sets its own). Projectors "
        "(mmproj*), draft models (mtp-*, ...) and the later shards of a split model are not models of their own.",
        "server",
    ),
    S(
        "llama_ctx_size",
        65536,
        _int(256, MAX_CTX),
        "Context size in tokens. Each of the llama_parallel slots gets ctx/parallel of it (`plan` shows "
        "the figure), unless llama_kv_unified.",
        "server",
    ),
    S("llama_parallel", 4, _int(1, 256), "Parallel request slots.", "server"),
    S(
        "llama_kv_unified",
        False,
        BOOL,
        "True: one KV cache that all slots share (--kv-unified), so one request may use the whole context "
        "while the others are idle. False: each slot has its own ctx/parallel tokens.",
        "server",
    ),
    S(
        "llama_cache_type_k",
        "f16",
        _one_of(*CACHE_TYPES),
        "KV cache type for K. f16 measured faster than q8_0 over RPC.",
        "server",
    ),
    S("llama_cache_type_v", "f16", _one_of(*CACHE_TYPES), "KV cache type for V.", "server"),
    S("llama_flash_attn", "auto", _one_of("on", "off", "auto"), "Flash attention.", "server"),
    S(
        "llama_n_gpu_layers",
        999,
        _int(0, 10000),
        "Layers to offload to the devices (999: all). With a CPU-only "
        "coordinator the last N layers go to the RPC devices and the rest stay on its CPU.",
        "server",
    ),
    S(
        "llama_tensor_split",
        None,
        _positive_numbers(),
        "Share of the layers per device, in device order (every worker's devices, then the coordinator's GPUs). "
        "None: llama.cpp splits by free memory. 'auto': the planner's split (fastest memory first, see `plan`).",
        "server",
    ),
    S(
        "llama_sleep_idle_seconds",
        None,
        _optional(_int(1, 31536000)),
        "Unload the model from every device after this many idle seconds; reloads on the next request. None: never.",
        "server",
    ),
    S(
        "llama_threads",
        None,
        _optional(_int(1, 1024)),
        "CPU threads of llama-server. None: llama.cpp's default.",
        "server",
    ),
    S(
        "llama_host",
        None,
        _optional(ADDRESS),
        "Address clients reach the API at: the front (HAProxy) listens there. None: the coordinator's address.",
        "server",
    ),
    S("llama_port", 8080, PORT, "The API's port, where the front listens for clients.", "server"),
    S(
        "llama_server_port",
        18080,
        PORT,
        "llama-server's own port, on the coordinator's loopback only: nothing but the front reaches it.",
        "server",
    ),
    S(
        "llama_front_hold_seconds",
        180,
        _int(1, 86400),
        "How long the front holds a request while llama-server is down, restarting or loading (a worker lost, "
        "a deploy, a model switch, the wake from sleep). Past it the client gets 503 with Retry-After.",
        "server",
    ),
    S(
        "llama_front_drain_seconds",
        120,
        _int(0, 86400),
        "Before a planned restart (a deploy, a rollback) the front stops sending new requests to llama-server "
        "and waits at most this long for those in flight to finish.",
        "server",
    ),
    S(
        "llama_front_replay_kib",
        256,
        _int(16, 65536),
        "The largest request (KiB, headers and body) the front keeps to replay when llama-server dies while "
        "answering it; a larger one is served but not replayed. Each connection may buffer this much.",
        "server",
    ),
    S(
        "llama_api_key_file",
        None,
        _optional(CONTROL_PATH),
        "A file on the control machine holding the API key clients must send (Authorization: Bearer KEY); "
        "chmod 600, outside the repository. It goes to the coordinator readable only by the service user and "
        "reaches llama-server as a file, never on a command line. None: no key (anyone who reaches the port "
        "can use it).",
        "server",
    ),
    S(
        "llama_metrics",
        False,
        BOOL,
        "Serve Prometheus metrics at /metrics (on whenever a model speculates: `status` reads its acceptance there).",
        "server",
    ),
    S(
        "llama_log_verbosity",
        4,
        _int(0, 5),
        "llama-server's log threshold; 4 keeps llama.cpp's load report (weights per device) in the journal.",
        "server",
    ),
    S(
        "llama_spec_type",
        None,
        _optional(_one_of(*SPEC_TYPES)),
        "Speculative decoding: a model-free n-gram type (ngram-mod, ...) or a draft model's (draft-simple, "
        "draft-eagle3, draft-mtp, draft-dflash, draft-dspark). None: the draft model's own (from its architecture), "
        "or off without one. docs/speculative.md says which pays over RPC.",
        "server",
    ),
    S(
        "llama_spec_draft_path",
        None,
        _optional(MODEL_FILE),
        "A draft model, a GGUF file on the coordinator (its folder is mounted read-only): a small model of the "
        "target's vocabulary (draft-simple), an EAGLE-3 head or an MTP assistant. Checked against the target's "
        "header before the deploy, and counted by the planner on the device it runs on.",
        "server",
    ),
    S(
        "llama_spec_draft_min",
        None,
        _optional(_int(0, 1024)),
        "The fewest tokens a draft may propose (--spec-draft-n-min, ngram-mod's --spec-ngram-mod-n-min). None: "
        "llama.cpp's default.",
        "server",
    ),
    S(
        "llama_spec_draft_max",
        None,
        _optional(_int(1, 1024)),
        "The most tokens a draft proposes at once (--spec-draft-n-max, at most 64 for a draft model; ngram-mod's "
        "--spec-ngram-mod-n-max). None: llama.cpp's default (3 for a draft model, 64 for ngram-mod).",
        "server",
    ),
    S(
        "llama_spec_draft_device",
        None,
        _optional(_str(r"[A-Za-z0-9_]+", "a device name like CUDA0, Vulkan0, RPC0 or CPU")),
        "Where the draft model runs. None: the coordinator's own device (its last GPU, or its CPU), so that no "
        "drafted token crosses the network; an MTP draft (a Gemma 4 assistant), which reads the target's last "
        "layers' KV, on their device. 'CPU', or a device of the cluster (RPC0 ... is a worker's).",
        "server",
    ),
    S(
        "llama_extra_args",
        [],
        _str_list(),
        "Extra llama-server arguments, one list item per word (speculative decoding has settings of its own: "
        "llama_spec_*).",
        "server",
    ),
    S(
        "llama_health_timeout",
        900,
        _int(10, 86400),
        "Seconds the deploy waits for llama-server's /health after a (re)start.",
        "server",
    ),
    S(
        "rpc_tunnel_local_port",
        50100,
        _int(1024, 65000),
        "The coordinator's end of the first tunnelled worker's tunnel, on 127.0.0.1 (llama-server's --rpc); "
        "the next workers get the next ports, in inventory order.",
        "server",
    ),
    S(
        "rpc_tunnel_key_generation",
        1,
        _int(1, 1000000),
        "Raise it by one to rotate the tunnel's keys: a new CA, key and certificate for every host "
        "(.state/tunnel/GENERATION on this machine), installed by the next deploy.",
        "server",
    ),
    S(
        "rpc_wait_timeout",
        120,
        _int(1, 86400),
        "Seconds llama-server's unit waits for every worker's RPC port before it starts.",
        "server",
    ),
    # --- rpc-server (workers) ---
    S(
        "rpc_host",
        None,
        _optional(ADDRESS),
        "Address the worker's RPC port binds to: the tunnel's TLS end, or rpc-server itself when rpc_transport is "
        "'plain'. None: the worker's address.",
        "rpc",
    ),
    S(
        "rpc_port",
        50052,
        PORT,
        "rpc-server's TCP port (on the worker's loopback when rpc_transport is 'tunnel').",
        "rpc",
    ),
    S(
        "rpc_transport",
        "tunnel",
        _one_of("tunnel", "plain"),
        "'tunnel': rpc-server listens on the worker's loopback only, and the coordinator reaches it through "
        "stunnel, mutual TLS 1.3 with certificates of the deploy's own CA: only the coordinator can speak RPC. "
        "'plain': rpc-server on rpc_host, guarded by the firewall rule alone (any device that takes the "
        "coordinator's address gets in); the deploy warns each run.",
        "rpc",
    ),
    S(
        "rpc_tunnel_port",
        50053,
        _int(1024, 65535),
        "The tunnel's TLS port on the worker (rpc_transport 'tunnel'), on rpc_host; stunnel runs as the service user, "
        "so not a privileged port.",
        "rpc",
    ),
    S(
        "rpc_firewall",
        True,
        BOOL,
        "A host firewall rule (iptables, its own chain) that admits the worker's RPC port (rpc_tunnel_port, or "
        "rpc_port when plain) only from rpc_allow_from; kept "
        "across reboots by a systemd unit. False only if you firewall the port yourself.",
        "rpc",
    ),
    S(
        "rpc_allow_from",
        None,
        _optional(_str_list()),
        "IP addresses or networks that may reach the worker's RPC port. None: the coordinator's address only.",
        "rpc",
    ),
    S(
        "rpc_allow_wide",
        False,
        BOOL,
        "True admits rpc_allow_from networks wider than a private /16 (0.0.0.0/0, a public range): anyone there "
        "can read and write the worker's GPU memory, rpc-server has no authentication. The deploy says so each run.",
        "rpc",
    ),
    S("rpc_cache", True, BOOL, "rpc-server's local tensor cache (-c): faster reloads of the same model.", "rpc"),
    S(
        "rpc_cache_max_gib",
        64,
        Check("a number of GiB, more than 0 and at most 1000000", lambda v: _number(v) and 0 < v <= 1e6),
        "The most disk the tensor cache may take on a worker: least recently used files go first, checked every "
        "30 s (rpc-cache-prune.timer). A model's share of a worker takes about its weights on that worker.",
        "rpc",
    ),
    S(
        "rpc_cache_dir",
        "/var/cache/llama-rpc",
        HOST_DIR,
        "Where the tensor cache lives on each worker; kept across deploys.",
        "rpc",
    ),
    S(
        "rpc_threads",
        None,
        _optional(_int(1, 1024)),
        "CPU threads of rpc-server (for its CPU device). None: llama.cpp's default.",
        "rpc",
    ),
    S("rpc_extra_args", [], _str_list(), "Extra rpc-server arguments, one list item per word.", "rpc"),
    # --- sleep when idle, wake on the first request (docs/sleep.md) ---
    S(
        "sleep_idle_seconds",
        None,
        _optional(_int(10, 604800)),
        "Suspend every worker after this many seconds without a request (health checks, status polls and "
        "/metrics do not count), and wake them by Wake-on-LAN on the next one, which the front holds meanwhile. "
        "The coordinator stays up. None: the workers never sleep.",
        "server",
    ),
    S(
        "sleep_wake_timeout",
        90,
        _int(5, 3600),
        "Seconds a wake may take, from the first magic packet to every worker's rpc-server answering; past it the "
        "held requests get 503 with Retry-After and `status` names the worker that did not wake.",
        "server",
    ),
    S(
        "sleep_mode",
        "suspend",
        _one_of("suspend", "hibernate", "poweroff"),
        "How a worker sleeps: systemctl suspend (to RAM), hibernate (to disk) or poweroff. Each needs a NIC "
        "that wakes on a magic packet from that state (the BIOS's 'Wake on LAN' for poweroff).",
        "rpc",
    ),
    S(
        "sleep_command",
        None,
        _optional(_str_list()),
        "Instead of sleep_mode's systemctl command: the command (one item per word) that puts this worker to "
        "sleep. The lab's stand-in freezes its container with it.",
        "rpc",
    ),
    S(
        "wol_interface",
        None,
        _optional(_str(r"[A-Za-z0-9_.:@-]{1,15}", "a network interface name (at most 15 letters, digits, _.:@-)")),
        "The worker's NIC that wakes it: its MAC goes into the magic packet. None: the interface that holds the "
        "worker's address.",
        "rpc",
    ),
    S(
        "wol_mac",
        None,
        _optional(_str(r"[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}", "a MAC address like 3c:7c:3f:12:34:56")),
        "The MAC the magic packet wakes. None: wol_interface's MAC, read on the worker at deploy time.",
        "rpc",
    ),
    S(
        "wol_broadcast",
        None,
        _optional(Check("an IPv4 address (a broadcast address, like 192.168.1.255)", _ipv4)),
        "Where the coordinator sends the magic packets (UDP port 9). None: the broadcast address of the "
        "worker's network, read on the worker at deploy time.",
        "rpc",
    ),
    S(
        "wol_check_nic",
        True,
        BOOL,
        "Check with ethtool that wol_interface can wake on a magic packet ('Supports Wake-on: ...g') and turn "
        "that on, persistently (a systemd .link file). False: you set up Wake-on-LAN yourself (the lab: a veth).",
        "rpc",
    ),
    # --- where things go on the hosts ---
    S("deploy_dir", "/opt/llama-rpc", HOST_DIR, "Launch scripts on every host.", "paths"),
    S("state_dir", "/var/lib/llama-rpc", HOST_DIR, "Build context and source tarball on the coordinator.", "paths"),
    S(
        "transfer_ssh_port",
        None,
        _optional(PORT),
        "Port the coordinator uses to SSH into a worker to send the image. None: the inventory's ssh_port, or 22.",
        "rpc",
    ),
)
BY_NAME = {s.name: s for s in SETTINGS}
DEFAULTS = {s.name: s.default for s in SETTINGS}

# Keys that belong to pyinfra itself (connectors, global arguments), not to this schema.
FOREIGN_PREFIXES = ("ssh_", "_", "docker_", "local_")


@dataclass(frozen=True)
class Scope:
    source: str  # e.g. "group_data/all.yml", "inventory.py (host 10.0.0.2)"
    data: dict
    applies_to: str = EVERY_HOST  # or COORDINATOR / WORKERS: a scope only that role reads

    def origin(self, key: str) -> str:
        """Where this scope's value of key was written: file:line:column for YAML group_data."""
        return self.data.get("_origins", {}).get(key, self.source)


def scopes(
    name: str,
    role: str,
    *,
    overrides: dict,
    host_data: dict,
    groups: list[tuple[str, dict]],
    all_data: dict,
    inventory_file: str,
    group_roles: dict[str, str] | None = None,
) -> list[Scope]:
    """pyinfra's scopes of data for one host, highest first: --data, the host's own data in the inventory,
    its groups (the later a group in pyinfra's order, the higher), group_data/all. The one place where
    precedence is written: the deploy, the offline commands and the tests all build their scopes here."""
    mine = role if role in ROLES else EVERY_HOST
    out = [
        Scope("--data on the command line", dict(overrides)),
        Scope(f"{inventory_file} (host {name})", dict(host_data), mine),
    ]
    # group coordinator or workers applies to that role; another group of the inventory to the one role of all
    # its hosts (group_roles), or to every host when it holds hosts of both
    out += [
        Scope(
            f"group_data/{group}.py",
            dict(data),
            group if group in ROLES else (group_roles or {}).get(group, EVERY_HOST),
        )
        for group, data in reversed(groups)
        if group != "all"
    ]
    return out + [Scope("group_data/all.py", dict(all_data))]


def resolve(scopes: list[Scope]) -> tuple[dict[str, Any], dict[str, str]]:
    """Merge scopes (highest first) over the defaults and check every value.

    Returns (values, origins). Raises SettingsError for an unknown key, a bad value, or a setting in a
    scope that only a role which never reads it sees (llama_ctx_size on a worker does nothing).
    """
    values = dict(DEFAULTS)
    origins = {name: "default" for name in DEFAULTS}
    for scope in reversed(scopes):
        for key, value in scope.data.items():
            if key.startswith(FOREIGN_PREFIXES):
                continue
            if key not in BY_NAME:
                near = difflib.get_close_matches(key, BY_NAME, n=1)
                hint = f" (did you mean {near[0]!r}?)" if near else ""
                raise SettingsError(f"{scope.origin(key)}: unknown setting {key!r}{hint}")
            read_from = BY_NAME[key].read_from
            if EVERY_HOST not in (scope.applies_to, read_from) and read_from != scope.applies_to:
                raise SettingsError(
                    f"{scope.origin(key)}: {key} = {value!r} has no effect there: "
                    f"only {'the coordinator reads' if read_from == COORDINATOR else 'the workers read'} it, "
                    f"and this applies to the {scope.applies_to} only: expected it in group_data/all.yml, "
                    f"group_data/{read_from}.yml or next to a host of the {read_from}"
                )
            values[key] = value
            origins[key] = scope.origin(key)
    for setting in SETTINGS:
        value = values[setting.name]
        if not setting.check.ok(value):
            if setting.check.why:
                raise SettingsError(f"{origins[setting.name]}: {setting.check.why(value)}")
            raise SettingsError(
                f"{origins[setting.name]}: {setting.name} = {value!r}: expected {setting.check.expected}"
            )
    return values, origins


def settings_table() -> str:
    """The Markdown table README.md shows (generated, so it cannot drift from the schema)."""
    lines = ["| setting | default | meaning |", "| --- | --- | --- |"]
    for s in SETTINGS:
        lines.append(f"| `{s.name}` | `{s.default!r}` | {s.doc} |")
    return "\n".join(lines)


README_BEGIN, README_END = "<!-- settings:begin -->", "<!-- settings:end -->"


def with_table(readme: str) -> str:
    """README text with the generated table between its markers."""
    head, rest = readme.split(README_BEGIN, 1)
    _, tail = rest.split(README_END, 1)
    return f"{head}{README_BEGIN}\n{settings_table()}\n{README_END}{tail}"


def command(args) -> int:
    """`llama-rpc settings`: the table; --write-readme puts it into README.md."""
    if args.write_readme:
        readme = Path(__file__).resolve().parent.parent / "README.md"
        readme.write_text(with_table(readme.read_text()))
    else:
        print(settings_table())
    return 0
