import os
import re
import subprocess
from pathlib import Path

import pytest

from llama_rpc_deploy import programs, render, roles
from llama_rpc_deploy.render import coordinator_files, worker_files
from llama_rpc_deploy.roles import COORDINATOR_UNIT, WORKER_UNIT

from .helpers import IMAGE, MODEL, cluster, flag, server_script, words


def test_llama_server_carries_the_settings():
    c = cluster(
        all_data={
            "llama_ctx_size": 32768,
            "llama_parallel": 2,
            "llama_cache_type_k": "q8_0",
            "llama_cache_type_v": "q8_0",
            "llama_flash_attn": "on",
            "llama_tensor_split": [1, 1],
            "llama_sleep_idle_seconds": 900,
            "llama_threads": 8,
            "llama_port": 8081,
            "llama_server_port": 18081,
        }
    )
    argv = words(server_script(c))
    assert argv[:3] == ["/usr/bin/docker", "run", "--rm"]
    assert flag(argv, "--volume") == "/srv/models/lmstudio-community:/models:ro"
    assert flag(argv, "--model") == "/models/" + MODEL.rsplit("/", 1)[1]
    assert flag(argv, "--rpc") == "127.0.0.1:50100"  # the worker's tunnel, its end on the coordinator
    assert flag(argv, "--device") == "RPC0,CUDA0"
    assert flag(argv, "--ctx-size") == "32768" and flag(argv, "--parallel") == "2"
    assert flag(argv, "--cache-type-k") == "q8_0" and flag(argv, "--cache-type-v") == "q8_0"
    assert flag(argv, "--flash-attn") == "on" and flag(argv, "--tensor-split") == "1,1"
    assert flag(argv, "--sleep-idle-seconds") == "900" and flag(argv, "--threads") == "8"
    # behind the front: on the coordinator's loopback, at its own port (clients reach the front at llama_port)
    assert flag(argv, "--host") == "127.0.0.1" and flag(argv, "--port") == "18081"
    assert "--gpus" in argv and argv[argv.index(IMAGE) + 1] == "server"


def test_optional_flags_only_when_set_and_no_speculative_decoding():
    argv = words(server_script(cluster()))
    for absent in (
        "--tensor-split",
        "--sleep-idle-seconds",
        "--threads",
        "--spec-type",
        "--model-draft",
        "-md",
        "--kv-unified",
        "--mmproj",
    ):
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
    c = cluster(
        coordinator={"gpus": []},
        workers=[{"gpus": []}, {"gpus": []}],
        all_data={"image_backend": "cpu", "llama_n_gpu_layers": 6},
    )
    argv = words(server_script(c))
    assert "--gpus" not in argv
    assert flag(argv, "--device") == "RPC0,RPC1" and flag(argv, "--n-gpu-layers") == "6"
    assert flag(argv, "--rpc") == "127.0.0.1:50100,127.0.0.1:50101"
    plain = cluster(
        coordinator={"gpus": []},
        workers=[{"gpus": [], "rpc_transport": "plain"}] * 2,
        all_data={"image_backend": "cpu", "llama_n_gpu_layers": 6},
    )
    assert flag(words(server_script(plain)), "--rpc") == "10.0.0.20:50052,10.0.0.21:50052"


@pytest.mark.parametrize("transport,bind", [("tunnel", "127.0.0.1"), ("plain", "10.0.0.20")])
def test_rpc_server_binds_to_loopback_behind_a_tunnel_else_to_the_worker_address(transport, bind):
    c = cluster(workers=[{"rpc_threads": 2, "rpc_transport": transport}])
    files = worker_files(c, c.workers[0], IMAGE)
    argv = words(files["/opt/llama-rpc/rpc-server.sh"])
    assert flag(argv, "--host") == bind and flag(argv, "--port") == "50052"
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
    assert "TimeoutStopSec=180" in unit  # the front's drain (120 s by default), then docker stop
    assert "[Install]\nWantedBy=multi-user.target" in unit
    assert "Restart=always" in worker_files(c, c.workers[0], IMAGE)[f"/etc/systemd/system/{WORKER_UNIT}"]


def test_the_coordinator_script_names_the_image_and_not_its_workers_files():
    """llama-server restarts after its workers by one mechanism (Run.coordinator_restart_needed), so a
    change of a worker's files alone leaves the coordinator's files as they are; a new image changes them."""
    base = cluster()
    assert server_script(base) == server_script(cluster(workers=[{"rpc_threads": 3}]))
    assert server_script(base) != server_script(base, IMAGE + "x")


# --- the front (HAProxy) ----------------------------------------------------------------------------------

HAPROXY = "/usr/sbin/haproxy"
FRONT_CFG, FRONT_LUA = "/opt/llama-rpc/front.cfg", "/opt/llama-rpc/front.lua"


def front(c):
    return render.front_files(c)


def lines(text, start):
    """The configuration's lines (stripped) that start with `start`."""
    return [line.strip() for line in text.splitlines() if line.strip().startswith(start)]


def section(cfg, name):
    """One section of front.cfg (from its header to the next one), its lines stripped, comments dropped."""
    out, inside = [], False
    for line in cfg.splitlines():
        if line and not line[0].isspace() and not line.startswith("#"):
            inside = line.strip() == name
        elif inside and line.strip() and not line.strip().startswith("#"):
            out.append(line.strip())
    return out


def haproxy_check(tmp_path, files):
    """haproxy -c on the rendered front.cfg, its lua-load and stats socket pointed into tmp_path; the user and
    group lines dropped only when this does not run as root (haproxy -c refuses them then)."""
    assert os.path.exists(HAPROXY), f"{HAPROXY} is missing: apt-get install haproxy (scripts/setup-machine.sh does)"
    (tmp_path / "front.lua").write_text(files[FRONT_LUA])
    cfg = files[FRONT_CFG].replace(f"lua-load {FRONT_LUA}\n", f"lua-load {tmp_path / 'front.lua'}\n")
    cfg = cfg.replace(f"stats socket {roles.FRONT_SOCKET} ", f"stats socket {tmp_path / 'admin.sock'} ")
    assert str(tmp_path) in cfg.split("lua-load", 1)[1] and "admin.sock" in cfg
    if os.geteuid() != 0:
        cfg = re.sub(r"(?m)^\s*(user|group) haproxy\n", "", cfg)
    (tmp_path / "front.cfg").write_text(cfg)
    return subprocess.run(
        [HAPROXY, "-c", "-f", str(tmp_path / "front.cfg")], capture_output=True, text=True, timeout=30
    )


# haproxy -c's warnings of the config as rendered now: harmless, to be gone when the template changes
# ('option httplog' in defaults reaches the hold's frontend, which has 'no log'; in 'frontend api' only, no warning)
KNOWN_WARNINGS = {"config : log format ignored for frontend 'hold' since it has no log address."}


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"llama_host": "fd00::10", "llama_port": 8443, "llama_server_port": 9000},
        {"llama_front_hold_seconds": 1, "llama_front_drain_seconds": 0, "llama_front_replay_kib": 16},
        {"llama_front_hold_seconds": 86400, "llama_front_replay_kib": 65536},
    ],
    ids=["defaults", "ipv6", "smallest", "largest"],
)
def test_the_front_passes_haproxys_own_check(tmp_path, data):
    files = front(cluster(all_data=data))
    result = haproxy_check(tmp_path, files)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Configuration file is valid" in result.stdout + result.stderr
    warnings = [line.split(" : ", 1)[1] for line in result.stderr.splitlines() if line.startswith("[WARNING]")]
    assert set(warnings) <= KNOWN_WARNINGS, result.stdout + result.stderr


def test_the_front_listens_for_clients_and_sends_to_llama_server_on_loopback():
    c = cluster(all_data={"llama_port": 8081, "llama_server_port": 18081})
    cfg = front(c)[FRONT_CFG]
    assert section(cfg, "frontend api")[0] == "bind 10.0.0.10:8081"
    llama = section(cfg, "backend llama-server")
    # one hop to llama-server while it is up; the hold (backup) only while it is not
    assert [line for line in llama if line.startswith("server ")] == [
        f"server {render.FRONT_SERVER} 127.0.0.1:18081 check inter 500 fall 1 rise 1",
        "server hold abns@llama-front-hold send-proxy-v2 backup",
    ]
    assert "option redispatch 1" in llama
    # the hold sends to the same llama-server, whose up, down or drained state it follows
    assert [line for line in section(cfg, "backend held") if line.startswith("server ")] == [
        f"server llama-server 127.0.0.1:18081 track {render.FRONT_BACKEND}/{render.FRONT_SERVER}"
    ]
    assert lines(cfg, "bind ") == ["bind 10.0.0.10:8081", "bind abns@llama-front-hold accept-proxy"]
    assert section(cfg, "frontend api")[-1] == f"default_backend {render.FRONT_BACKEND}"
    assert section(cfg, "frontend hold")[-1] == "default_backend held"
    assert f"backend {render.FRONT_BACKEND}" in cfg
    assert lines(cfg, "stats socket") == [f"stats socket {roles.FRONT_SOCKET} mode 600 level admin"]
    assert lines(cfg, "lua-load") == [f"lua-load {FRONT_LUA}"]
    # the API address: llama_host when set, an IPv6 one in brackets
    assert (
        section(front(cluster(all_data={"llama_host": "fd00::10"}))[FRONT_CFG], "frontend api")[0]
        == "bind [fd00::10]:8080"
    )
    assert (
        section(front(cluster(all_data={"llama_host": "0.0.0.0"}))[FRONT_CFG], "frontend api")[0] == "bind 0.0.0.0:8080"
    )


def test_the_front_replays_what_fits_in_its_buffer():
    """tune.bufsize: llama_front_replay_kib of request, plus HAProxy's reserve for the headers it adds."""
    for kib in (16, 256, 1000):
        cfg = front(cluster(all_data={"llama_front_replay_kib": kib}))[FRONT_CFG]
        assert lines(cfg, "tune.bufsize") == [f"tune.bufsize {kib * 1024 + 1024}"]
        assert lines(cfg, "tune.maxrewrite") == ["tune.maxrewrite 1024"]
        assert f"up to {kib} KiB" in cfg
    replay = section(front(cluster())[FRONT_CFG], f"backend {render.FRONT_BACKEND}")
    assert f"retries {render.FRONT_RETRIES}" in replay
    assert "retry-on conn-failure empty-response 502 503 504" in replay
    assert "option http-buffer-request" in section(front(cluster())[FRONT_CFG], "frontend api")


def test_the_front_settings_show_up_where_they_act():
    base = cluster()
    c = cluster(all_data={"llama_front_hold_seconds": 42, "llama_front_drain_seconds": 77})
    files, base_files = front(c), front(base)
    hold = section(files[FRONT_CFG], "frontend hold")
    assert "http-request lua.llama_hold llama-server llama-server 42" in hold
    assert "http-request lua.llama_hold llama-server llama-server 180" in section(
        base_files[FRONT_CFG], "frontend hold"
    )
    assert "within 42 s (llama_front_hold_seconds)" in files[FRONT_CFG]
    # Retry-After: the hold, at most 30 s
    answers = lines(base_files[FRONT_CFG], "http-error") + lines(base_files[FRONT_CFG], "http-request return")
    assert len(answers) == 3 and all("hdr Retry-After 30" in line for line in answers)
    short = front(cluster(all_data={"llama_front_hold_seconds": 5}))[FRONT_CFG]
    assert [line.rsplit("Retry-After", 1)[1].split()[0] for line in short.splitlines() if "Retry-After" in line] == [
        "5",
        "5",
        "5",
    ]
    assert files["/opt/llama-rpc/front-drain.env"] == programs.front_drain_env(
        socket=roles.FRONT_SOCKET,
        backend=render.FRONT_BACKEND,
        server=render.FRONT_SERVER,
        drain_seconds=77,
        no_drain_flag=roles.NO_DRAIN_FLAG,
    )
    assert "DRAIN_SECONDS=120\n" in base_files["/opt/llama-rpc/front-drain.env"]
    # llama-server's stop: the drain, then docker's own 20 s, inside TimeoutStopSec
    unit = coordinator_files(c, IMAGE)[f"/etc/systemd/system/{COORDINATOR_UNIT}"]
    assert "TimeoutStopSec=137" in unit
    # only these changed: the drain and the hold are not in each other's files
    assert files["/opt/llama-rpc/front-drain.env"] != base_files["/opt/llama-rpc/front-drain.env"]
    drain_only = front(cluster(all_data={"llama_front_drain_seconds": 77}))
    assert drain_only[FRONT_CFG] == base_files[FRONT_CFG]
    hold_only = cluster(all_data={"llama_front_hold_seconds": 42})
    assert coordinator_files(hold_only, IMAGE) == coordinator_files(base, IMAGE)


def test_llama_server_unit_drains_the_front_around_its_stop_and_start():
    unit = coordinator_files(cluster(), IMAGE)[f"/etc/systemd/system/{COORDINATOR_UNIT}"]
    pre = lines(unit, "ExecStartPre=")
    assert pre[0] == 'ExecStartPre=+"/opt/llama-rpc/front-drain.sh" ready'
    assert lines(unit, "ExecStop=") == [
        'ExecStop=+"/opt/llama-rpc/front-drain.sh" drain',
        "ExecStop=/usr/bin/docker stop --time 20 llama-server",
    ]


def test_the_front_ships_its_files_and_unit():
    files = front(cluster())
    assert set(files) == {
        FRONT_CFG,
        FRONT_LUA,
        "/opt/llama-rpc/front-drain.sh",
        "/opt/llama-rpc/front-drain.env",
        f"/etc/systemd/system/{roles.FRONT_UNIT}",
    }
    assert files[FRONT_LUA] == (programs.FILES / "front.lua").read_text()
    assert files["/opt/llama-rpc/front-drain.sh"] == (programs.FILES / "front-drain.sh").read_text()
    unit = files[f"/etc/systemd/system/{roles.FRONT_UNIT}"]
    assert f'ExecStart=/usr/sbin/haproxy -Ws -f "{FRONT_CFG}"' in unit
    assert f'ExecStartPre=/usr/sbin/haproxy -q -c -f "{FRONT_CFG}"' in unit
    assert f"RuntimeDirectory={Path(roles.FRONT_SOCKET).parent.name}" in unit
    assert "Restart=always" in unit and "WantedBy=multi-user.target" in unit
