"""The coordinator's watchdog, run for real with stand-ins for ss and systemctl."""
import subprocess
import time

import pytest

from llama_rpc_deploy import render
from llama_rpc_deploy.render import watchdog_files

from .helpers import cluster

ENDPOINT = "10.0.0.20:50052"
ESTABLISHED_IDLE = "0 0 10.0.0.10:40000 10.0.0.20:50052\n"
ESTABLISHED_RETRANSMITTING = "0 1448 10.0.0.10:40000 10.0.0.20:50052 timer:(on,25s,8)\n"
ESTABLISHED_ONE_RETRANSMISSION = "0 1448 10.0.0.10:40000 10.0.0.20:50052 timer:(on,400ms,1)\n"


def run_watchdog(tmp_path, close_wait="", established=ESTABLISHED_IDLE, active="active", seconds=1.5):
    """The rendered watchdog, looking every 0.2 s; returns the systemctl commands it issued and its output."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "close_wait").write_text(close_wait)
    (tmp_path / "established").write_text(established)
    (bin_dir / "ss").write_text(f'#!/bin/sh\ncase "$*" in *close-wait*) cat {tmp_path}/close_wait ;; '
                                f'*established*) cat {tmp_path}/established ;; esac\n')
    (bin_dir / "systemctl").write_text(f'#!/bin/sh\n[ "$1" = is-active ] && {{ echo {active}; exit 0; }}\n'
                                       f'echo "$*" >> {tmp_path}/systemctl.log\n')
    for tool in ("ss", "systemctl"):
        (bin_dir / tool).chmod(0o755)
    c = cluster()
    script = tmp_path / "watchdog.sh"
    script.write_text(render._render("llama-server-watchdog.sh.j2", coordinator=c.coordinator, rpc_endpoints=c.rpc_endpoints,
                                     interval=0.2, retrans=render.WATCHDOG_RETRANSMISSIONS, grace=0.2,
                                     server_unit=render.COORDINATOR_UNIT, unit=render.WATCHDOG_UNIT))
    process = subprocess.Popen(["bash", str(script)], stdout=subprocess.PIPE, text=True,
                               env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    time.sleep(seconds)
    process.terminate()
    output = process.communicate(timeout=5)[0]
    log = tmp_path / "systemctl.log"
    return (log.read_text().splitlines() if log.exists() else []), output


def test_rendered_with_every_worker():
    script = watchdog_files(cluster(workers=[None, None]))["/opt/llama-rpc/llama-server-watchdog.sh"]
    assert "endpoints=(10.0.0.20:50052 10.0.0.21:50052)" in script and "while sleep 5" in script
    unit = watchdog_files(cluster())[f"/etc/systemd/system/{render.WATCHDOG_UNIT}"]
    assert "Restart=always" in unit and "WantedBy=multi-user.target" in unit


@pytest.mark.parametrize("established", [ESTABLISHED_IDLE, ESTABLISHED_ONE_RETRANSMISSION])
def test_a_healthy_connection_is_left_alone(tmp_path, established):
    """Idle, or one lost packet being retransmitted: not a lost worker."""
    assert run_watchdog(tmp_path, established=established)[0] == []


@pytest.mark.parametrize("case", ["close-wait", "retransmitting"])
def test_a_lost_worker_restarts_llama_server(tmp_path, case):
    calls, output = run_watchdog(tmp_path, close_wait=ESTABLISHED_IDLE if case == "close-wait" else "",
                                 established=ESTABLISHED_RETRANSMITTING if case == "retransmitting" else ESTABLISHED_IDLE)
    assert calls and calls[0] == f"restart --no-block {render.COORDINATOR_UNIT}"
    assert f"rpc-server at {ENDPOINT}" in output


def test_nothing_while_llama_server_is_not_running(tmp_path):
    """While it starts (waiting for its workers) or is stopped, the watchdog does not interfere."""
    assert run_watchdog(tmp_path, close_wait=ESTABLISHED_IDLE, active="activating")[0] == []
