import shlex

from llama_rpc_deploy.render import COORDINATOR_UNIT, WORKER_UNIT, coordinator_files, worker_files

from .helpers import MODEL, cluster

IMAGE = "llama-rpc:0c1e57098-abcdef012345"


def server_script(c, image=IMAGE):
    return coordinator_files(c, image)["/opt/llama-rpc/llama-server.sh"]


def words(script):
    """The command line the script runs, as the shell would split it."""
    body = script.split("exec ", 1)[1].replace("\\\n", " ")
    return shlex.split(body.split('"$@"')[0])


def flag(argv, name):
    return argv[argv.index(name) + 1]


def test_llama_server_carries_the_settings():
    c = cluster(all_data={"llama_ctx_size": 32768, "llama_parallel": 2, "llama_cache_type_k": "q8_0",
                          "llama_cache_type_v": "q8_0", "llama_flash_attn": "on", "llama_tensor_split": [1, 1],
                          "llama_sleep_idle_seconds": 900, "llama_threads": 8, "llama_port": 8081})
    argv = words(server_script(c))
    assert argv[:3] == ["/usr/bin/docker", "run", "--rm"]
    assert flag(argv, "--volume") == "/srv/models/lmstudio-community:/models:ro"
    assert flag(argv, "--model") == "/models/" + MODEL.rsplit("/", 1)[1]
    assert flag(argv, "--rpc") == "10.0.0.20:50052"
    assert flag(argv, "--device") == "RPC0,CUDA0"
    assert flag(argv, "--ctx-size") == "32768" and flag(argv, "--parallel") == "2"
    assert flag(argv, "--cache-type-k") == "q8_0" and flag(argv, "--cache-type-v") == "q8_0"
    assert flag(argv, "--flash-attn") == "on" and flag(argv, "--tensor-split") == "1,1"
    assert flag(argv, "--sleep-idle-seconds") == "900" and flag(argv, "--threads") == "8"
    assert flag(argv, "--host") == "10.0.0.10" and flag(argv, "--port") == "8081"
    assert "--gpus" in argv and argv[argv.index(IMAGE) + 1] == "server"


def test_optional_flags_only_when_set_and_no_speculative_decoding():
    argv = words(server_script(cluster()))
    for absent in ("--tensor-split", "--sleep-idle-seconds", "--threads", "--spec-type", "--model-draft", "-md",
                   "--kv-unified", "--mmproj"):
        assert absent not in argv


def test_unified_kv_and_the_projector_reach_llama_server():
    """llama_mmproj_path: its folder mounted read-only of its own, --mmproj the file in it."""
    c = cluster(all_data={"llama_kv_unified": True, "llama_mmproj_path": "/srv/vision/mmproj-gemma-4-31B-F16.gguf"})
    argv = words(server_script(c))
    assert "--kv-unified" in argv
    assert flag(argv, "--mmproj") == "/mmproj/mmproj-gemma-4-31B-F16.gguf"
    volumes = [argv[i + 1] for i, word in enumerate(argv) if word == "--volume"]
    assert "/srv/vision:/mmproj:ro" in volumes and "/srv/models/lmstudio-community:/models:ro" in volumes


def test_extra_args_are_quoted_one_word_each():
    c = cluster(all_data={"llama_extra_args": ["--alias", "my model; rm -rf /", "--metrics"]})
    argv = words(server_script(c))
    assert argv[-3:] == ["--alias", "my model; rm -rf /", "--metrics"]


def test_cpu_coordinator_has_no_gpu_flag_and_only_rpc_devices():
    c = cluster(coordinator={"gpus": []}, workers=[{"gpus": []}, {"gpus": []}],
                all_data={"image_backend": "cpu", "llama_n_gpu_layers": 6})
    argv = words(server_script(c))
    assert "--gpus" not in argv
    assert flag(argv, "--device") == "RPC0,RPC1" and flag(argv, "--n-gpu-layers") == "6"
    assert flag(argv, "--rpc") == "10.0.0.20:50052,10.0.0.21:50052"


def test_rpc_server_binds_to_the_worker_address_with_cache():
    c = cluster(workers=[{"rpc_threads": 2}])
    files = worker_files(c, c.workers[0], IMAGE)
    argv = words(files["/opt/llama-rpc/rpc-server.sh"])
    assert flag(argv, "--host") == "10.0.0.20" and flag(argv, "--port") == "50052"
    assert "--cache" in argv and flag(argv, "--threads") == "2"
    assert flag(argv, "--volume") == "/var/cache/llama-rpc:/cache"
    assert argv[argv.index(IMAGE) + 1] == "rpc"
    assert "0.0.0.0" not in files["/opt/llama-rpc/rpc-server.sh"]
    no_cache = cluster(workers=[{"rpc_cache": False}])
    assert "--cache" not in words(worker_files(no_cache, no_cache.workers[0], IMAGE)["/opt/llama-rpc/rpc-server.sh"])


def test_units_restart_and_wait_for_workers():
    c = cluster(all_data={"rpc_wait_timeout": 45})
    unit = coordinator_files(c, IMAGE)[f"/etc/systemd/system/{COORDINATOR_UNIT}"]
    assert 'ExecStartPre="/opt/llama-rpc/wait-for-workers.sh"' in unit
    assert "Restart=always" in unit and "TimeoutStartSec=75" in unit
    assert "[Install]\nWantedBy=multi-user.target" in unit
    assert "Restart=always" in worker_files(c, c.workers[0], IMAGE)[f"/etc/systemd/system/{WORKER_UNIT}"]


def test_the_coordinator_script_names_the_image_and_not_its_workers_files():
    """llama-server restarts after its workers by one mechanism (Run.coordinator_restart_needed), so a
    change of a worker's files alone leaves the coordinator's files as they are; a new image changes them."""
    base = cluster()
    assert server_script(base) == server_script(cluster(workers=[{"rpc_threads": 3}]))
    assert server_script(base) != server_script(base, IMAGE + "x")
