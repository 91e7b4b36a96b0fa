"""Bad configurations, one table for the unit test and for the lab test.

Each case is Python appended to a working inventory (the lab's, or the unit tests' own), and the
words the error must contain. `{inv}` stands for the inventory file, `{c}` for the coordinator's
host label, `{w}` for the first worker's: that is how the error names where the value came from.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Bad:
    id: str
    code: str
    words: tuple[str, ...]


def on_coordinator(data: str) -> str:
    return f"coordinator = [(coordinator[0][0], {{**coordinator[0][1], **{data}}})]"


def on_worker(data: str) -> str:
    return f"workers = [(workers[0][0], {{**workers[0][1], **{data}}})] + workers[1:]"


def _key_file(path: str, key: str, mode: int) -> str:
    """Inventory code that writes a key file with this content and mode, then points llama_api_key_file at it."""
    return (
        f"import os as _os\n_os.makedirs({path!r}.rsplit('/', 1)[0], exist_ok=True)\n"
        f"open({path!r}, 'w').write({key!r})\n_os.chmod({path!r}, {mode:#o})\n"
        + on_coordinator(f'{{"llama_api_key_file": {path!r}}}')
    )


C, W = "{c}: ", "{w}: "
CASES = [
    Bad("port-zero", on_coordinator('{"llama_port": 0}'), (C + "llama_port = 0: expected an integer from 1 to 65535",)),
    Bad("port-string", on_coordinator('{"llama_port": "8080"}'), (C + "llama_port = '8080': expected an integer",)),
    Bad(
        "ctx-too-small",
        on_coordinator('{"llama_ctx_size": 100}'),
        (C + "llama_ctx_size = 100: expected an integer from 256 to",),
    ),
    Bad(
        "parallel-zero",
        on_coordinator('{"llama_parallel": 0}'),
        (C + "llama_parallel = 0: expected an integer from 1 to 256",),
    ),
    Bad(
        "cache-k-typo",
        on_coordinator('{"llama_cache_type_k": "q8"}'),
        (C + "llama_cache_type_k = 'q8': expected one of 'f32', 'f16'",),
    ),
    Bad(
        "cache-v-unknown",
        on_coordinator('{"llama_cache_type_v": "f8"}'),
        (C + "llama_cache_type_v = 'f8': expected one of",),
    ),
    Bad(
        "flash-attn-bool",
        on_coordinator('{"llama_flash_attn": True}'),
        (C + "llama_flash_attn = True: expected one of 'on', 'off', 'auto'",),
    ),
    Bad(
        "ngl-negative",
        on_coordinator('{"llama_n_gpu_layers": -1}'),
        (C + "llama_n_gpu_layers = -1: expected an integer from 0 to",),
    ),
    Bad(
        "split-length",
        on_coordinator('{"llama_tensor_split": [1, 2, 3]}'),
        (C + "llama_tensor_split = [1, 2, 3]: expected 2 numbers, one per device (RPC0, RPC1)",),
    ),
    Bad(
        "split-string",
        on_coordinator('{"llama_tensor_split": "1,1"}'),
        (C + "llama_tensor_split = '1,1': expected None, 'auto' or a list of finite numbers",),
    ),
    Bad(
        "sleep-zero",
        on_coordinator('{"llama_sleep_idle_seconds": 0}'),
        (C + "llama_sleep_idle_seconds = 0: expected None or an integer from 1 to",),
    ),
    Bad(
        "threads-word",
        on_coordinator('{"llama_threads": "four"}'),
        (C + "llama_threads = 'four': expected None or an integer",),
    ),
    Bad(
        "model-relative",
        on_coordinator('{"llama_model_path": "models/lab.gguf"}'),
        (C + "llama_model_path = 'models/lab.gguf': expected an absolute path",),
    ),
    Bad(
        "model-not-gguf",
        on_coordinator('{"llama_model_path": "/models/lab.bin"}'),
        (C + "llama_model_path = '/models/lab.bin': expected a .gguf file",),
    ),
    Bad(
        "model-placeholder",
        on_coordinator('{"llama_model_path": "/CHANGE_ME/model.gguf"}'),
        (C + "llama_model_path = '/CHANGE_ME/model.gguf': expected the path of your GGUF file",),
    ),
    Bad(
        "extra-args-string",
        on_coordinator('{"llama_extra_args": "--metrics"}'),
        (C + "llama_extra_args = '--metrics': expected a list of strings",),
    ),
    Bad(
        "backend-unknown",
        on_coordinator('{"image_backend": "rocm"}'),
        (C + "image_backend = 'rocm': expected None or one of 'cuda', 'vulkan', 'cpu'",),
    ),
    Bad(
        "backend-unknown-on-a-worker",
        on_worker('{"image_backend": "metal"}'),
        (W + "image_backend = 'metal': expected None or one of",),
    ),
    Bad(
        "vulkan-with-an-nvidia-card",
        on_worker('{"image_backend": "vulkan", "gpus": ["RTX 4080"]}'),
        (W + "gpus = ['RTX 4080'] on ", "RTX 4080 is a card of nvidia: expected image_backend = 'cuda' on that host"),
    ),
    Bad(
        "cuda-with-an-amd-card",
        on_worker('{"image_backend": "cuda", "gpus": ["RX 7900 XTX"]}'),
        (
            W + "gpus = ['RX 7900 XTX'] on ",
            "RX 7900 XTX is a card of amd: expected image_backend = 'vulkan' on that host",
        ),
    ),
    Bad(
        "vulkan-on-bookworm",
        on_coordinator('{"image_vulkan_build_image": "debian:bookworm"}')
        + "\n"
        + on_worker('{"image_backend": "vulkan"}'),
        (
            C
            + "image_vulkan_build_image = 'debian:bookworm': its Vulkan headers are too old for llama.cpp's ggml-vulkan",
        ),
    ),
    Bad(
        "native-string",
        on_coordinator('{"image_cpu_native": "yes"}'),
        (C + "image_cpu_native = 'yes': expected True or False",),
    ),
    Bad(
        "jobs-zero",
        on_coordinator('{"image_build_jobs": 0}'),
        (C + "image_build_jobs = 0: expected None or an integer from 1 to",),
    ),
    Bad(
        "image-name-spaces",
        on_coordinator('{"image_name": "Llama RPC"}'),
        (C + "image_name = 'Llama RPC': expected a Docker repository name",),
    ),
    Bad(
        "mixed-quantized-kv",
        on_coordinator('{"llama_cache_type_k": "q8_0", "llama_cache_type_v": "q4_0"}'),
        (
            C + "llama_cache_type_v = 'q4_0' with llama_cache_type_k = 'q8_0': expected the same quantized type",
            "#27905",
        ),
    ),
    Bad(
        "quantized-v-no-fa",
        on_coordinator('{"llama_cache_type_k": "q8_0", "llama_cache_type_v": "q8_0", "llama_flash_attn": "off"}'),
        (C + "llama_flash_attn = 'off' with llama_cache_type_v = 'q8_0': expected 'on' or 'auto'",),
    ),
    Bad(
        "unknown-key",
        on_coordinator('{"llama_ctx": 4096}'),
        (C + "unknown setting 'llama_ctx' (did you mean 'llama_ctx_size'?)",),
    ),
    Bad(
        "health-timeout-short",
        on_coordinator('{"llama_health_timeout": 5}'),
        (C + "llama_health_timeout = 5: expected an integer from 10 to",),
    ),
    Bad(
        "cuda-archs-format",
        on_coordinator('{"image_cuda_architectures": "sm_89"}'),
        (C + "image_cuda_architectures = 'sm_89': expected None or compute capabilities",),
    ),
    Bad(
        "cuda-without-gpus",  # gpus = [] on every host: unset, they are learned when the deploy connects
        on_coordinator('{"image_backend": "cuda", "gpus": []}')
        + '\nworkers = [(_n, {**_d, "gpus": []}) for _n, _d in workers]',  # (the _: not pyinfra groups)
        (C + "image_backend = 'cuda' but no host lists gpus",),
    ),
    Bad(
        "cuda-too-old",
        on_coordinator(
            '{"image_backend": "cuda", "gpus": ["RTX 5090"], "llama_tensor_split": None, '
            '"image_build_image": "nvidia/cuda:12.4.1-devel-ubuntu22.04"}'
        ),
        (
            C
            + "image_build_image = 'nvidia/cuda:12.4.1-devel-ubuntu22.04': CUDA 12.4 cannot build for sm_120: expected CUDA 12.8 or newer",
        ),
    ),
    Bad(
        "rpc-port-too-big",
        on_worker('{"rpc_port": 70000}'),
        (W + "rpc_port = 70000: expected an integer from 1 to 65535",),
    ),
    Bad("rpc-cache-string", on_worker('{"rpc_cache": "on"}'), (W + "rpc_cache = 'on': expected True or False",)),
    Bad(
        "rpc-cache-dir-relative",
        on_worker('{"rpc_cache_dir": "var/cache/llama-rpc"}'),
        (W + "rpc_cache_dir = 'var/cache/llama-rpc': expected an absolute path",),
    ),
    Bad(
        "rpc-threads-zero",
        on_worker('{"rpc_threads": 0}'),
        (W + "rpc_threads = 0: expected None or an integer from 1 to",),
    ),
    Bad(
        "gpu-unknown",
        on_worker('{"gpus": ["RTX 9999"]}'),
        (W + "gpus = ['RTX 9999']: unknown GPU 'RTX 9999': expected one of",),
    ),
    Bad(
        "rpc-key-typo", on_worker('{"rpc_prot": 50052}'), (W + "unknown setting 'rpc_prot' (did you mean 'rpc_port'?)",)
    ),
    Bad(
        "rpc-extra-args-int",
        on_worker('{"rpc_extra_args": [1]}'),
        (W + "rpc_extra_args = [1]: expected a list of strings",),
    ),
    Bad(
        "rpc-firewall-string",
        on_worker('{"rpc_firewall": "yes"}'),
        (W + "rpc_firewall = 'yes': expected True or False",),
    ),
    Bad(
        "rpc-allow-from-hostname",
        on_worker('{"rpc_allow_from": ["desktop.lan"]}'),
        (
            W + "rpc_allow_from = 'desktop.lan' (the source",
            "firewall admits to rpc_port): expected an IP address or network",
        ),
    ),
    Bad(
        "rpc-allow-from-string",
        on_worker('{"rpc_allow_from": "10.1.1.1"}'),
        (W + "rpc_allow_from = '10.1.1.1': expected None or a list of strings",),
    ),
    Bad(
        "server-setting-on-a-worker",
        on_worker('{"llama_ctx_size": 4096}'),
        (
            W + "llama_ctx_size = 4096 has no effect there: only the coordinator reads it",
            "expected it in group_data/all.yml",
        ),
    ),
    Bad(
        "rpc-setting-on-the-coordinator",
        on_coordinator('{"rpc_cache": False}'),
        (C + "rpc_cache = False has no effect there: only the workers read it",),
    ),
    Bad(
        "metrics-string",
        on_coordinator('{"llama_metrics": "on"}'),
        (C + "llama_metrics = 'on': expected True or False",),
    ),
    Bad(
        "api-key-missing",
        on_coordinator('{"llama_api_key_file": "/nonexistent/api_key"}'),
        (
            C
            + "llama_api_key_file = '/nonexistent/api_key': No such file or directory: expected a file on this machine",
        ),
    ),
    Bad(
        "api-key-world-readable",
        _key_file("/tmp/llama-rpc-deploy-test-key-644", "x" * 32, 0o644),
        (C + "llama_api_key_file = '/tmp/llama-rpc-deploy-test-key-644' has mode 644: expected 600 or 400",),
    ),
    Bad(
        "api-key-short",
        _key_file("/tmp/llama-rpc-deploy-test-key-short", "secret", 0o600),
        (
            C
            + "llama_api_key_file = '/tmp/llama-rpc-deploy-test-key-short': expected one key of at least 16 characters",
        ),
    ),
    Bad("no-workers", "workers = []", ("{inv}: group workers is empty: expected at least one worker",)),
    Bad(
        "two-coordinators",
        "coordinator = coordinator + [workers[0]]",
        ("{inv}: group coordinator has 2 hosts: expected exactly one",),
    ),
    Bad("host-in-both-groups", "workers = workers + [coordinator[0]]", ("is listed twice (coordinator and workers",)),
    # pyinfra merges a host listed twice in one group (the later line's data wins) without a word
    Bad(
        "worker-listed-twice",
        "workers = workers + [(workers[0][0], {})]",
        ("{inv}: {wn} is listed 2 times in group workers: expected each host once",),
    ),
    Bad(
        "coordinator-listed-twice",
        "coordinator = coordinator + [(coordinator[0][0], {})]",
        (
            "{inv}: ",
            " is listed 2 times in group coordinator: expected each host once",
        ),
    ),
    Bad(
        "same-rpc-endpoint",
        'workers = [(n, {**d, "rpc_host": "10.99.0.1"}) for n, d in workers]',
        ("{inv}: rpc endpoint 10.99.0.1:50053 is used by two workers",),
    ),
    Bad(
        "example-addresses",
        'coordinator = [("192.0.2.10", coordinator[0][1])]',
        ("{inv}: 192.0.2.10: example addresses (RFC 5737",),
    ),
    # --- values that would reach a shell, a unit or docker: addresses ---
    Bad(
        "address-command",
        on_worker('{"address": "10.0.0.11; reboot"}'),
        (W + "address = '10.0.0.11; reboot': expected None or an IP address or a host name",),
    ),
    Bad(
        "address-substitution",
        on_coordinator('{"address": "$(touch /tmp/pwned)"}'),
        (C + "address = '$(touch /tmp/pwned)': expected None or an IP address or a host name",),
    ),
    Bad(
        "llama-host-backticks",
        on_coordinator('{"llama_host": "`id`"}'),
        (C + "llama_host = '`id`': expected None or an IP address",),
    ),
    Bad(
        "rpc-host-trailing-space",
        on_worker('{"rpc_host": "10.0.0.11 "}'),
        (W + "rpc_host = '10.0.0.11 ': expected None or an IP address",),
    ),
    Bad(
        "address-scope-id",
        on_worker('{"address": "fe80::1%eth0"}'),
        (W + "address = 'fe80::1%eth0': expected None or an IP address",),
    ),
    Bad(
        "address-label-too-long",
        on_worker('{"address": "a" * 64 + ".lan"}'),
        (W + "address = 'aaaa", "': expected None or an IP address"),
    ),
    Bad(
        "host-name-command",
        'workers = [(workers[0][0] + ";id", workers[0][1])] + workers[1:]',
        (
            "{inv}: host '",
            ";id': expected an IP address or a host name",
        ),
    ),
    Bad(
        "worker-is-the-coordinator",
        'workers = [(workers[0][0], {**workers[0][1], "address": coordinator[0][0]})] + workers[1:]',
        (W + "address = ", "is the coordinator's: expected the worker's own address"),
    ),
    # --- paths ---
    Bad(
        "model-colon",
        on_coordinator('{"llama_model_path": "/models/a:b.gguf"}'),
        (C + "llama_model_path = '/models/a:b.gguf': expected an absolute path of letters", "no ':' or ','"),
    ),
    Bad(
        "model-comma",
        on_coordinator('{"llama_model_path": "/models/a,b.gguf"}'),
        (C + "llama_model_path = '/models/a,b.gguf': expected an absolute path",),
    ),
    Bad(
        "model-newline",
        on_coordinator('{"llama_model_path": "/models/a\\nb.gguf"}'),
        (C + "llama_model_path = '/models/a\\nb.gguf': expected an absolute path",),
    ),
    Bad(
        "model-substitution",
        on_coordinator('{"llama_model_path": "/models/$(id).gguf"}'),
        (C + "llama_model_path = '/models/$(id).gguf': expected",),
    ),
    Bad(
        "model-dot-dot",
        on_coordinator('{"llama_model_path": "/models/../etc/lab.gguf"}'),
        (C + "llama_model_path = '/models/../etc/lab.gguf': expected",),
    ),
    Bad(
        "mmproj-relative",
        on_coordinator('{"llama_mmproj_path": "mmproj.gguf"}'),
        (C + "llama_mmproj_path = 'mmproj.gguf': expected None or an absolute path",),
    ),
    Bad(
        "mmproj-quote",
        on_coordinator('{"llama_mmproj_path": "/models/mm\\"proj.gguf"}'),
        (C + "llama_mmproj_path = '/models/mm\"proj.gguf': expected",),
    ),
    Bad(
        "deploy-dir-space",
        on_coordinator('{"deploy_dir": "/opt/llama rpc"}'),
        (C + "deploy_dir = '/opt/llama rpc': expected an absolute path of letters, digits",),
    ),
    Bad(
        "deploy-dir-root",
        on_worker('{"deploy_dir": "/"}'),
        (W + "deploy_dir = '/': expected an absolute path", "a folder of its own"),
    ),
    Bad(
        "cache-dir-root-by-a-dot",
        on_worker('{"rpc_cache_dir": "/."}'),
        (W + "rpc_cache_dir = '/.': expected an absolute path",),
    ),
    Bad(
        "state-dir-a-system-folder",
        on_coordinator('{"state_dir": "/var/lib"}'),
        (C + "state_dir = '/var/lib': expected", "(not '/', /etc, /var/lib, ...)"),
    ),
    Bad(
        "rpc-host-a-name",
        on_worker('{"rpc_host": "worker1.lan"}'),
        (
            W + "rpc_host = 'worker1.lan' on worker ",
            "expected an IPv4 address (rpc-server binds to IPv4 addresses only",
        ),
    ),
    Bad(
        "kv-unified-string",
        on_coordinator('{"llama_kv_unified": "yes"}'),
        (C + "llama_kv_unified = 'yes': expected True or False",),
    ),
    Bad(
        "cache-limit-zero",
        on_worker('{"rpc_cache_max_gib": 0}'),
        (W + "rpc_cache_max_gib = 0: expected a number of GiB, more than 0",),
    ),
    Bad(
        "state-dir-command",
        on_coordinator('{"state_dir": "/var/lib/x;rm -rf /"}'),
        (C + "state_dir = '/var/lib/x;rm -rf /': expected an absolute path",),
    ),
    Bad(
        "cache-dir-specifier",
        on_worker('{"rpc_cache_dir": "/var/cache/%h"}'),
        (W + "rpc_cache_dir = '/var/cache/%h': expected an absolute path",),
    ),
    Bad(
        "cache-dir-relative-dots",
        on_worker('{"rpc_cache_dir": "/var/cache/../../etc"}'),
        (W + "rpc_cache_dir = '/var/cache/../../etc': expected",),
    ),
    Bad(
        "api-key-file-newline",
        on_coordinator('{"llama_api_key_file": "/tmp/key\\nfile"}'),
        (C + "llama_api_key_file = '/tmp/key\\nfile': expected None or a path",),
    ),
    # --- ports ---
    Bad(
        "llama-port-is-ssh",
        on_coordinator('{"llama_port": 22}'),
        (C + "llama_port = 22 on ", "is its SSH port: expected another port"),
    ),
    Bad("rpc-port-is-ssh", on_worker('{"rpc_port": 22}'), (W + "rpc_port = 22 on ", "is its SSH port")),
    Bad(
        "rpc-port-is-transfer-port",
        on_worker('{"rpc_port": 2222, "transfer_ssh_port": 2222}'),
        (W + "rpc_port = 2222 on ", "is its SSH port"),
    ),
    Bad(
        "ssh-port-string",
        on_worker('{"ssh_port": "22"}'),
        ("(host {wn}): ssh_port = '22': expected an integer from 1 to 65535",),
    ),
    # --- numbers ---
    Bad(
        "split-infinite",
        on_coordinator('{"llama_tensor_split": [float("inf"), 1]}'),
        (C + "llama_tensor_split = [inf, 1]: expected None, 'auto' or a list of finite numbers",),
    ),
    Bad(
        "split-nan",
        on_coordinator('{"llama_tensor_split": [float("nan"), 1]}'),
        (C + "llama_tensor_split = [nan, 1]: expected",),
    ),
    Bad(
        "split-negative",
        on_coordinator('{"llama_tensor_split": [-1, 2]}'),
        (C + "llama_tensor_split = [-1, 2]: expected",),
    ),
    Bad(
        "split-bool",
        on_coordinator('{"llama_tensor_split": [True, 1]}'),
        (C + "llama_tensor_split = [True, 1]: expected",),
    ),
    Bad(
        "ctx-a-billion",
        on_coordinator('{"llama_ctx_size": 10**9}'),
        (C + "llama_ctx_size = 1000000000: expected an integer from 256 to 16777216",),
    ),
    Bad(
        "ctx-float", on_coordinator('{"llama_ctx_size": 4096.0}'), (C + "llama_ctx_size = 4096.0: expected an integer",)
    ),
    Bad(
        "slots-crowd-the-context",
        on_coordinator('{"llama_ctx_size": 4096, "llama_parallel": 100}'),
        (C + "llama_parallel = 100 with llama_ctx_size = 4096 leaves 40 tokens per request: expected at least 512",),
    ),
    Bad(
        "threads-a-million",
        on_coordinator('{"llama_threads": 10**6}'),
        (C + "llama_threads = 1000000: expected None or an integer from 1 to 1024",),
    ),
    Bad(
        "sleep-bool",
        on_coordinator('{"llama_sleep_idle_seconds": True}'),
        (C + "llama_sleep_idle_seconds = True: expected None or an integer",),
    ),
    Bad(
        "health-timeout-a-year",
        on_coordinator('{"llama_health_timeout": 31536000}'),
        (C + "llama_health_timeout = 31536000: expected an integer from 10 to 86400",),
    ),
    Bad(
        "gpu-dict-unknown-key",
        on_worker('{"gpus": [{"name": "RTX 4070", "cuda_arch": "89", "vram": 12}]}'),
        (W + "gpus = ", "unknown key 'vram': expected only bandwidth_gbs, cuda_arch, name, vendor, vram_mib"),
    ),
    Bad(
        "gpu-dict-memory-nan",
        on_worker('{"gpus": [{"name": "RTX 4070", "cuda_arch": "89", "vram_mib": float("nan")}]}'),
        (W + "gpus = ", "vram_mib = nan: expected a number from 1024 to 10000000"),
    ),
    Bad(
        "gpu-dict-arch-word",
        on_worker('{"gpus": [{"name": "RTX 4070", "cuda_arch": "sm_89"}]}'),
        (W + "gpus = ", "cuda_arch = 'sm_89': expected a compute capability without the dot"),
    ),
    # --- who may reach rpc-server ---
    Bad(
        "allow-everyone",
        on_worker('{"rpc_allow_from": ["0.0.0.0/0"]}'),
        (
            W + "rpc_allow_from = '0.0.0.0/0' on ",
            "admits 4294967296 addresses to the unauthenticated RPC port",
            "rpc_allow_wide = True",
        ),
    ),
    Bad(
        "allow-everyone-ipv6",
        on_worker('{"rpc_allow_from": ["::/0"]}'),
        (W + "rpc_allow_from = '::/0' on ", "to the unauthenticated RPC port"),
    ),
    Bad(
        "allow-a-public-16",
        on_worker('{"rpc_allow_from": ["8.8.0.0/16"]}'),
        (W + "rpc_allow_from = '8.8.0.0/16' on ", "admits 65536 addresses"),
    ),
    Bad(
        "allow-a-private-8",
        on_worker('{"rpc_allow_from": ["10.0.0.0/8"]}'),
        (W + "rpc_allow_from = '10.0.0.0/8' on ", "admits 16777216 addresses"),
    ),
    Bad(
        "allow-scope-id-command",
        on_worker('{"rpc_allow_from": ["fe80::1%eth0;id"]}'),
        (W + "rpc_allow_from = 'fe80::1%eth0;id'", "expected an IP address or network"),
    ),
    Bad(
        "allow-wide-string",
        on_worker('{"rpc_allow_wide": "yes"}'),
        (W + "rpc_allow_wide = 'yes': expected True or False",),
    ),
    # --- words for llama-server, rpc-server and docker ---
    Bad(
        "extra-args-newline",
        on_coordinator('{"llama_extra_args": ["--alias", "a\\nb"]}'),
        (C + "llama_extra_args = ['--alias', 'a\\nb']: expected a list of strings without control characters",),
    ),
    Bad(
        "rpc-extra-args-escape",
        on_worker('{"rpc_extra_args": ["\\x1b[2J"]}'),
        (W + "rpc_extra_args = ['\\x1b[2J']: expected a list of strings without",),
    ),
    Bad(
        "image-name-command",
        on_coordinator('{"image_name": "llama;rm"}'),
        (C + "image_name = 'llama;rm': expected a Docker repository name",),
    ),
    Bad(
        "build-image-space",
        on_coordinator('{"image_build_image": "debian 12"}'),
        (C + "image_build_image = 'debian 12': expected a Docker image reference",),
    ),
    Bad(
        "source-url-without-ref",
        on_coordinator('{"llama_cpp_url": "https://example.org/llama.tar.gz"}'),
        (C + "llama_cpp_url = 'https://example.org/llama.tar.gz': expected a http(s):// URL with {{ref}} in it",),
    ),
    Bad(
        "source-ref-short",
        on_coordinator('{"llama_cpp_ref": "0c1e570"}'),
        (C + "llama_cpp_ref = '0c1e570': expected a full 40-character commit",),
    ),
    # speculative decoding (llama_rpc_deploy/speculation.py); what needs the files is in the lab's host cases
    Bad(
        "spec-type-unknown",
        on_coordinator('{"llama_spec_type": "mtp"}'),
        (C + "llama_spec_type = 'mtp': expected None or one of 'draft-simple', 'draft-eagle3', 'draft-mtp'",),
    ),
    Bad(
        "spec-ngram-with-a-draft-model",
        on_coordinator('{"llama_spec_type": "ngram-mod", "llama_spec_draft_path": "/models/lab.gguf"}'),
        (C + "llama_spec_draft_path = '/models/lab.gguf': expected None with llama_spec_type = 'ngram-mod'",),
    ),
    Bad(
        "spec-draft-type-without-a-draft",
        on_coordinator('{"llama_spec_type": "draft-simple"}'),
        (C + "llama_spec_type = 'draft-simple' needs a draft model: expected llama_spec_draft_path",),
    ),
    Bad(
        "spec-draft-path-relative",
        on_coordinator('{"llama_spec_draft_path": "draft.gguf"}'),
        (C + "llama_spec_draft_path = 'draft.gguf': expected None or an absolute path",),
    ),
    Bad(
        "spec-bounds-reversed",
        on_coordinator('{"llama_spec_type": "ngram-mod", "llama_spec_draft_min": 8, "llama_spec_draft_max": 4}'),
        (C + "llama_spec_draft_min = 8: expected at most llama_spec_draft_max (4)",),
    ),
    Bad(
        "spec-draft-max-zero",
        on_coordinator('{"llama_spec_type": "ngram-mod", "llama_spec_draft_max": 0}'),
        (C + "llama_spec_draft_max = 0: expected None or an integer from 1 to 1024",),
    ),
    Bad(
        "spec-draft-max-past-a-draft-model",
        on_coordinator('{"llama_spec_draft_path": "/models/lab.gguf", "llama_spec_draft_max": 100}'),
        (C + "llama_spec_draft_max = 100: expected at most 64 for a draft model",),
    ),
    Bad(
        "spec-bounds-while-off",
        on_coordinator('{"llama_spec_draft_max": 4}'),
        (C + "llama_spec_draft_max = 4: expected None, as speculative decoding is off",),
    ),
    Bad(
        "spec-bounds-on-a-type-without-them",
        on_coordinator('{"llama_spec_type": "ngram-simple", "llama_spec_draft_max": 8}'),
        (C + "llama_spec_draft_max = 8: expected None with llama_spec_type = 'ngram-simple'",),
    ),
    Bad(
        "spec-draft-device-unknown",
        on_coordinator('{"llama_spec_draft_path": "/models/lab.gguf", "llama_spec_draft_device": "CUDA0"}'),
        (C + "llama_spec_draft_device = 'CUDA0': no such device in this cluster: expected one of RPC0",),
    ),
    Bad(
        "spec-draft-device-without-a-draft",
        on_coordinator('{"llama_spec_type": "ngram-mod", "llama_spec_draft_device": "CPU"}'),
        (C + "llama_spec_draft_device = 'CPU': expected None without a draft model",),
    ),
    Bad(
        "spec-per-model-type-unknown",
        on_coordinator(
            '{"llama_models": {"other": {"llama_model_path": "/models/lab.gguf", "llama_spec_type": "eagle"}}}'
        ),
        (C + "llama_models: other.llama_spec_type = 'eagle': expected None or one of",),
    ),
    Bad(
        "sleep-too-soon",
        on_coordinator('{"sleep_idle_seconds": 5}'),
        (C + "sleep_idle_seconds = 5: expected None or an integer from 10 to 604800",),
    ),
    Bad(
        "sleep-hold-shorter-than-a-wake",
        on_coordinator('{"sleep_idle_seconds": 600, "llama_front_hold_seconds": 60, "sleep_wake_timeout": 90}'),
        (
            C
            + "llama_front_hold_seconds = 60 with sleep_wake_timeout = 90 ({c}): expected more than sleep_wake_timeout",
        ),
    ),
    Bad(
        "sleep-mode-typo",
        on_worker('{"sleep_mode": "standby"}'),
        (W + "sleep_mode = 'standby': expected one of 'suspend', 'hibernate', 'poweroff'",),
    ),
    Bad(
        "wol-mac-malformed",
        on_worker('{"wol_mac": "3c:7c:3f:12:34"}'),
        (W + "wol_mac = '3c:7c:3f:12:34': expected None or a MAC address like 3c:7c:3f:12:34:56",),
    ),
    Bad(
        "wol-interface-not-a-name",
        on_worker('{"wol_interface": "eth0; reboot"}'),
        (W + "wol_interface = 'eth0; reboot': expected None or a network interface name",),
    ),
    Bad(
        "wol-broadcast-not-ipv4",
        on_worker('{"wol_broadcast": "192.168.1.256"}'),
        (W + "wol_broadcast = '192.168.1.256': expected None or an IPv4 address",),
    ),
]


def write_case(base: Path, case: Bad, out: Path) -> Path:
    """The working inventory with the case's code appended."""
    out.write_text(base.read_text() + f"\n# bad configuration: {case.id}\n{case.code}\n")
    return out


def expected_words(case: Bad, inventory: Path, coordinator: str, worker: str) -> list[str]:
    inv = str(inventory)
    return [
        w.format(inv=inv, c=f"{inv} (host {coordinator})", w=f"{inv} (host {worker})", wn=worker) for w in case.words
    ]
