"""The deploy's shell programs (files/*.sh), run for real: the files that ship, with the settings files
programs.py writes, and stand-ins on PATH for ss, systemctl, docker, iptables, socat and sleep.

No test waits: the watchdogs take a bounded number of looks (--passes N) and their `sleep` is a stand-in
that only records how long it was asked to sleep.
"""

import json
import os
import shutil
import stat
import socket
import struct
import subprocess
import threading

import pytest

from llama_rpc_deploy import programs, render, roles
from llama_rpc_deploy.programs import (
    FILES,
    PROGRAMS,
    WATCHDOG_LIBRARY,
    cache_prune_env,
    env_file,
    firewall_env,
    front_drain_env,
    llama_server_watchdog_env,
    rpc_server_watchdog_env,
    sleep_now_env,
    wait_for_workers_env,
)

from llama_rpc_deploy.sleep import Nic

from .helpers import IMAGE, cluster

ENDPOINT = "10.0.0.20:50052"
OTHER = "10.0.0.21:50052"
SERVER_UNIT = "llama-server.service"
WORKER_UNIT = "rpc-server.service"


# --- running a program ------------------------------------------------------------------------------------


def interpreter(name):
    """The program's own interpreter, from its #! line (absolute: PATH holds only the stand-ins and /usr/bin:/bin)."""
    return (FILES / name).read_text().splitlines()[0].removeprefix("#!").split()


class Host:
    """A scratch directory with a bin/ of stand-ins; each stand-in appends its arguments to NAME.log there."""

    def __init__(self, tmp_path):
        self.dir = tmp_path
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        self.stub("sleep", "")  # record, never wait

    def stub(self, name, body):
        path = self.bin / name
        path.write_text(f'#!/bin/sh\necho "$*" >> {self.dir}/{name}.log\n{body}\n')
        path.chmod(0o755)

    def calls(self, name):
        log = self.dir / f"{name}.log"
        return log.read_text().splitlines() if log.exists() else []

    def sequence(self, name, values):
        """Values for a stand-in that runs next(name): the next one on each call, the last one once they run out."""
        (self.dir / f"{name}.seq").write_text("".join(f"{v}\n" for v in values))

    def next(self, name):
        """Shell that sets v to the next value of the sequence name (builtins only: stand-ins must be quick)."""
        seq, count = self.dir / f"{name}.seq", self.dir / f"{name}.count"
        return (
            f"n=0; [ ! -f {count} ] || read -r n < {count}; n=$((n + 1)); echo $n > {count}; "
            f"i=0; while [ $i -lt $n ] && read -r line; do i=$((i + 1)); v=$line; done < {seq}"
        )

    @staticmethod
    def cat(path):
        return f'[ ! -f "{path}" ] || while IFS= read -r line; do echo "$line"; done < "{path}"'

    def run(self, name, env, *args, path=None):
        """Run the shipped program name with the settings env; PATH: the stand-ins, then /usr/bin:/bin."""
        env_path = self.dir / name.replace(".sh", ".env")
        env_path.write_text(env)
        return subprocess.run(
            [*interpreter(name), str(FILES / name), *args],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=self.dir,
            env={"PATH": path or f"{self.bin}:/usr/bin:/bin", "LLAMA_RPC_ENV": str(env_path)},
        )


def without(env, key):
    """The env file text without the line that sets key."""
    return "".join(line + "\n" for line in env.splitlines() if not line.startswith(f"{key}="))


# --- programs.py ------------------------------------------------------------------------------------------


def test_programs_are_the_shipped_files_and_executable():
    assert set(PROGRAMS) <= {p.name for p in FILES.glob("*.sh")}
    for name in PROGRAMS:
        assert programs.text(name) == (FILES / name).read_text()
        assert (FILES / name).stat().st_mode & 0o111 == 0o111, f"{name} is not executable"
    with pytest.raises(ValueError, match="not one of the deploy's programs"):
        programs.text("llama-server.sh")


def test_env_file_quotes_every_value():
    assert env_file(A="plain", B=7, C=["x:1", "y:2"], D=(), E="") == "A=plain\nB=7\nC='x:1 y:2'\nD=''\nE=''\n"
    hostile = "img'; echo owned; echo '$(id) `id` \" \\ $HOME"
    out = subprocess.run(
        ["bash", "-uc", f'{env_file(IMAGE=hostile, LIST=["a$(id)", "b"])}\nprintf "%s|" "$IMAGE" "$LIST"'],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin"},
    ).stdout
    assert out == f"{hostile}|a$(id) b|"


@pytest.mark.parametrize(
    "values,error",
    [
        ({"lower": "x"}, ValueError),
        ({"1ABC": "x"}, ValueError),
        ({"A-B": "x"}, ValueError),
        ({"_A": "x"}, ValueError),
        ({"A": ["two words"]}, ValueError),
        ({"A": ["tab\there"]}, ValueError),
        ({"A": ["ok", ""]}, ValueError),
        ({"A": True}, TypeError),
        ({"A": 0.5}, TypeError),
        ({"A": None}, TypeError),
        ({"A": [["nested"]]}, TypeError),
    ],
)
def test_env_file_refuses(values, error):
    with pytest.raises(error):
        env_file(**values)


def test_env_functions_name_each_programs_settings():
    assert wait_for_workers_env(endpoints=[ENDPOINT, OTHER], timeout=45, image=IMAGE) == (
        f"RPC_ENDPOINTS='{ENDPOINT} {OTHER}'\nRPC_WAIT_TIMEOUT=45\nIMAGE={IMAGE}\n"
    )
    assert llama_server_watchdog_env(
        endpoints=[ENDPOINT],
        interval=5,
        retransmissions=7,
        grace=15,
        server_unit=SERVER_UNIT,
        no_drain_flag="/run/no drain",
    ) == (
        f"RPC_ENDPOINTS={ENDPOINT}\nINTERVAL=5\nRETRANSMISSIONS=7\nGRACE=15\nSERVER_UNIT={SERVER_UNIT}\n"
        "NO_DRAIN_FLAG='/run/no drain'\n"
    )
    assert front_drain_env(
        socket="/run/llama-front/admin.sock",
        backend="llama-server",
        server="llama-server",
        drain_seconds=120,
        no_drain_flag="/run/llama-rpc-no-drain",
    ) == (
        "SOCKET=/run/llama-front/admin.sock\nBACKEND=llama-server\nSERVER=llama-server\nDRAIN_SECONDS=120\n"
        "NO_DRAIN_FLAG=/run/llama-rpc-no-drain\n"
    )
    assert rpc_server_watchdog_env(port=50052, interval=5, patience=20, server_unit=WORKER_UNIT) == (
        f"RPC_PORT=50052\nINTERVAL=5\nPATIENCE=20\nSERVER_UNIT={WORKER_UNIT}\n"
    )
    assert firewall_env(ports=[50053, 50052], chain="LLAMA-RPC", ipv4=["10.0.0.10", "192.168.1.0/24"], ipv6=[]) == (
        "RPC_PORTS='50053 50052'\nCHAIN=LLAMA-RPC\nALLOW_IPV4='10.0.0.10 192.168.1.0/24'\nALLOW_IPV6=''\n"
    )
    with pytest.raises(TypeError, match="endpoints"):
        wait_for_workers_env(endpoints=ENDPOINT, timeout=45, image=IMAGE)  # a string, not a list of them
    with pytest.raises(TypeError):
        firewall_env(80, "C", [], [])  # keyword arguments only


# --- every program ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shellcheck_findings():
    """shellcheck once over every program (one process, not one a file): its findings, by the file they are in
    (shellcheck reports only on the files it is given, a sourced one included only when given too)."""
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck is not installed: apt-get install shellcheck"
    result = subprocess.run(
        [
            shellcheck,
            "--norc",
            "--external-sources",
            "--severity=style",
            "--format=json1",
            *sorted(p.name for p in FILES.glob("*.sh")),
        ],
        cwd=FILES,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode in (0, 1), result.stdout + result.stderr  # 1: findings; anything else: it could not check
    findings = {}
    for c in json.loads(result.stdout)["comments"]:
        findings.setdefault(c["file"], []).append(
            f"{c['file']}:{c['line']}:{c['column']}: {c['level']}: {c['message']} [SC{c['code']}]"
        )
    assert (result.returncode == 0) == (not findings), result.stdout + result.stderr
    return findings


@pytest.mark.xdist_group("shellcheck of the programs")  # one worker runs shellcheck, once
@pytest.mark.parametrize("name", sorted(p.name for p in FILES.glob("*.sh")))
def test_shellcheck(shellcheck_findings, name):
    assert not shellcheck_findings.get(name), "\n".join(shellcheck_findings[name])


SETTINGS = {
    "wait-for-workers.sh": wait_for_workers_env(endpoints=[ENDPOINT], timeout=1, image=IMAGE),
    "llama-server-watchdog.sh": llama_server_watchdog_env(
        endpoints=[ENDPOINT],
        interval=5,
        retransmissions=7,
        grace=15,
        server_unit=SERVER_UNIT,
        no_drain_flag="/nonexistent/no-drain",
    ),
    "rpc-server-watchdog.sh": rpc_server_watchdog_env(port=50052, interval=5, patience=20, server_unit=WORKER_UNIT),
    "rpc-firewall.sh": firewall_env(ports=[50052], chain="LLAMA-RPC", ipv4=["10.0.0.10"], ipv6=[]),
    "rpc-cache-prune.sh": cache_prune_env(cache_dir="/nonexistent/rpc", max_bytes=1 << 30, min_age=10),
    "front-drain.sh": front_drain_env(
        socket="/nonexistent/admin.sock",
        backend="llama-server",
        server="llama-server",
        drain_seconds=5,
        no_drain_flag="/nonexistent/no-drain",
    ),
    "sleep-now.sh": sleep_now_env(command="systemctl suspend"),
}


def test_every_program_has_settings_here():
    assert set(SETTINGS) == set(PROGRAMS)


@pytest.mark.parametrize(
    "name,key", [(name, line.split("=")[0]) for name, env in SETTINGS.items() for line in env.splitlines()]
)
def test_a_missing_setting_stops_the_program(tmp_path, name, key):
    """Every setting is required: without it the program fails at once and names it, and does nothing."""
    host = Host(tmp_path)
    for tool in (
        "docker",
        "systemctl",
        "ss",
        "iptables",
        "iptables-restore",
        "ip6tables",
        "ip6tables-restore",
        "socat",
        "systemd-run",
    ):
        host.stub(tool, "")
    result = host.run(name, without(SETTINGS[name], key), *ARGS.get(name, []))
    assert result.returncode != 0 and key in result.stderr
    assert not list(tmp_path.glob("*.log")), "it ran something"


ARGS = {
    "llama-server-watchdog.sh": ["--passes", "1"],
    "rpc-server-watchdog.sh": ["--passes", "1"],
    "front-drain.sh": ["drain"],
}  # what each program runs with, where it takes arguments


@pytest.mark.parametrize("name", PROGRAMS)
def test_the_settings_file_is_next_to_the_program(tmp_path, name):
    """Without LLAMA_RPC_ENV, /opt/llama-rpc/NAME.sh reads /opt/llama-rpc/NAME.env (here: through a link)."""
    (tmp_path / "opt").mkdir()
    script = tmp_path / "opt" / name
    script.symlink_to(FILES / name)
    (tmp_path / "opt" / WATCHDOG_LIBRARY).symlink_to(FILES / WATCHDOG_LIBRARY)  # shipped beside the watchdogs
    result = subprocess.run(
        [*interpreter(name), str(script), *(["--passes", "0"] if "watchdog" in name else [])],
        capture_output=True,
        text=True,
        timeout=10,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert result.returncode != 0 and str(tmp_path / "opt" / name.replace(".sh", ".env")) in result.stderr
    if "watchdog" in name:
        (tmp_path / "opt" / name.replace(".sh", ".env")).write_text(SETTINGS[name])
        assert (
            subprocess.run(
                [*interpreter(name), str(script), "--passes", "0"], timeout=10, env={"PATH": "/usr/bin:/bin"}
            ).returncode
            == 0
        )
    if name == "front-drain.sh":  # read there: its socket (none here), so nothing to do
        (tmp_path / "opt" / name.replace(".sh", ".env")).write_text(SETTINGS[name])
        result = subprocess.run(
            [*interpreter(name), str(script), "ready"],
            capture_output=True,
            text=True,
            timeout=10,
            env={"PATH": "/usr/bin:/bin"},
        )
        assert result.returncode == 0 and "no front at /nonexistent/admin.sock" in result.stdout


# --- llama-server-watchdog.sh -----------------------------------------------------------------------------

IDLE = "0 0 10.0.0.10:40000 {dst}"
KEEPALIVE = "0 0 10.0.0.10:40000 {dst} timer:(keepalive,10sec,9)"  # probes of an idle connection: not data


def retransmitting(count, timer="on"):
    return "0 1448 10.0.0.10:40000 {dst} timer:(" + f"{timer},25s,{count})"


class Coordinator(Host):
    """llama-server's host: `ss` reports the connections set per endpoint, systemctl is-active the given states;
    systemctl restart notes in flag.log whether the watchdog's no-drain file existed when it was called."""

    def __init__(self, tmp_path, active=("active",)):
        super().__init__(tmp_path)
        self.flag = tmp_path / "run" / "llama-rpc-no-drain"
        self.flag.parent.mkdir()
        self.sequence("state", active)
        self.stub(
            "ss",
            f"for dst; do :; done; "  # dst: the last argument
            f'case "$*" in *close-wait*) {self.cat(f"{tmp_path}/close-wait@$dst")} ;; '
            f"*established*) {self.cat(f'{tmp_path}/established@$dst')} ;; esac; true",
        )
        self.stub(
            "systemctl",
            f'[ "$1" = is-active ] && {{ {self.next("state")}; echo "$v"; }}; '
            f'[ "$1" = restart ] && {{ [ -e {self.flag} ] && echo present || echo absent; }} '
            f">> {tmp_path}/flag.log; true",
        )

    def connections(self, endpoint, established="", close_wait=""):
        for state, line in (("established", established), ("close-wait", close_wait)):
            (self.dir / f"{state}@{endpoint}").write_text(line.format(dst=endpoint) + "\n" if line else "")

    def watch(self, passes, endpoints=(ENDPOINT,), retransmissions=7, remotes=()):
        env = llama_server_watchdog_env(
            endpoints=list(endpoints),
            interval=5,
            retransmissions=retransmissions,
            grace=15,
            server_unit=SERVER_UNIT,
            no_drain_flag=str(self.flag),
            remotes=list(remotes),
        )
        return self.run("llama-server-watchdog.sh", env, "--passes", str(passes))

    def flag_at_restarts(self):
        """For each restart: whether the no-drain file was there when systemctl was asked."""
        return self.calls("flag")

    def restarts(self):
        return [c for c in self.calls("systemctl") if not c.startswith("is-active")]

    def looks(self):
        return self.calls("systemctl").count(f"is-active {SERVER_UNIT}")


@pytest.mark.parametrize(
    "established", [IDLE, KEEPALIVE, retransmitting(1), retransmitting(6), retransmitting(6, "persist"), ""]
)
def test_a_healthy_connection_is_left_alone(tmp_path, established):
    """Idle, kept alive, a few lost packets being retransmitted, or no connection yet: not a lost worker."""
    host = Coordinator(tmp_path)
    host.connections(ENDPOINT, established=established)
    result = host.watch(passes=2)
    assert result.returncode == 0 and result.stdout == "" and result.stderr == ""
    assert host.looks() == 2 and host.calls("sleep") == ["5"] * 2 and host.restarts() == []
    assert not host.flag.exists()  # the next planned stop of llama-server drains the front
    assert f"-Htn state close-wait dst {ENDPOINT}" in host.calls("ss")
    assert f"-Htno state established dst {ENDPOINT}" in host.calls("ss")


@pytest.mark.parametrize("case", ["close-wait", "retransmitting", "persist"])
def test_a_lost_worker_restarts_llama_server(tmp_path, case):
    host = Coordinator(tmp_path)
    host.connections(
        ENDPOINT,
        close_wait=IDLE if case == "close-wait" else "",
        established={"close-wait": IDLE, "retransmitting": retransmitting(8), "persist": retransmitting(7, "persist")}[
            case
        ],
    )
    result = host.watch(passes=1)
    assert result.returncode == 0, result.stderr
    assert host.restarts() == [f"restart --no-block {SERVER_UNIT}"]
    assert host.calls("sleep") == ["5", "15"]  # the interval, then the grace after a restart
    why = (
        "closed llama-server's connection (it restarted, or its host went down)"
        if case == "close-wait"
        else "stopped acknowledging data (the worker or the network is down)"
    )
    assert result.stdout == f"rpc-server at {ENDPOINT} {why}: restarting {SERVER_UNIT}\n"
    # its stop skips the front's drain: the requests in flight cannot finish without the worker
    assert host.flag_at_restarts() == ["present"] and host.flag.exists()


@pytest.mark.parametrize(
    "retransmissions,count,restart",
    [
        (7, 6, False),
        (7, 7, True),
        (7, 10, True),
        (12, 9, False),
        (12, 11, False),
        (12, 12, True),
        (12, 100, True),
    ],
)
def test_the_retransmission_threshold_is_a_number(tmp_path, retransmissions, count, restart):
    """Compared as numbers, so any threshold works, two digits included (12: not 1 then 2)."""
    host = Coordinator(tmp_path)
    host.connections(ENDPOINT, established=retransmitting(count))
    result = host.watch(passes=1, retransmissions=retransmissions)
    assert result.returncode == 0, result.stderr
    assert host.looks() == 1
    assert host.restarts() == ([f"restart --no-block {SERVER_UNIT}"] if restart else [])
    assert host.flag.exists() == restart


def test_each_worker_is_watched_and_one_restart_is_enough(tmp_path):
    host = Coordinator(tmp_path)
    host.connections(ENDPOINT, established=IDLE)
    host.connections(OTHER, close_wait=IDLE)
    result = host.watch(passes=1, endpoints=(ENDPOINT, OTHER))
    assert result.stdout.startswith(f"rpc-server at {OTHER} closed") and host.restarts() == [
        f"restart --no-block {SERVER_UNIT}"
    ]
    host.connections(ENDPOINT, close_wait=IDLE)  # both lost: one restart, then the grace
    (tmp_path / "systemctl.log").unlink()
    result = host.watch(passes=1, endpoints=(ENDPOINT, OTHER))
    assert result.stdout.startswith(f"rpc-server at {ENDPOINT} closed") and result.stdout.count("\n") == 1
    assert host.restarts() == [f"restart --no-block {SERVER_UNIT}"]


TUNNEL_END, REMOTE = "127.0.0.1:50100", "10.0.0.20:50053"


@pytest.mark.parametrize(
    "local,remote,why",
    [
        # a worker's rpc-server closed: its tunnel closes llama-server's connection at this host's end
        (dict(close_wait=IDLE), {}, f"rpc-server at {TUNNEL_END} closed llama-server's connection"),
        # the network dropped: data waits on the tunnel's own connection out, not on llama-server's
        (
            {},
            dict(established=retransmitting(8)),
            f"the tunnel to rpc-server at {REMOTE} stopped getting data acknowledged",
        ),
        # the tunnel's normal close (a router's child left, the worker's end answered first): nothing lost
        ({}, dict(close_wait=IDLE), None),
        ({}, dict(established=retransmitting(3)), None),
    ],
)
def test_through_a_tunnel_both_legs_are_watched(tmp_path, local, remote, why):
    host = Coordinator(tmp_path)
    host.connections(TUNNEL_END, **local)
    host.connections(REMOTE, **remote)
    result = host.watch(passes=1, endpoints=(TUNNEL_END,), remotes=(REMOTE,))
    assert result.returncode == 0, result.stderr
    if why:
        assert result.stdout.startswith(why) and host.restarts() == [f"restart --no-block {SERVER_UNIT}"]
    else:
        assert result.stdout == "" and host.restarts() == []


def test_nothing_while_llama_server_is_not_running(tmp_path):
    """While it starts (waiting for its workers) or is stopped, the watchdog does not interfere."""
    host = Coordinator(tmp_path, active=("activating", "inactive", "failed"))
    host.connections(ENDPOINT, close_wait=IDLE)
    result = host.watch(passes=3)
    assert result.returncode == 0 and host.looks() == 3 and host.restarts() == [] and host.calls("ss") == []
    assert not host.flag.exists()


@pytest.mark.parametrize("name", ["llama-server-watchdog.sh", "rpc-server-watchdog.sh"])
def test_a_watchdog_looks_for_ever_by_default(tmp_path, name):
    """Without --passes it only stops when something fails: here its sleep, on the 5th call."""
    host = Host(tmp_path)
    host.stub("sleep", f'[ "$(wc -l < {tmp_path}/sleep.log)" -lt 5 ]')
    host.stub("systemctl", "echo active")
    host.stub("ss", "")
    result = host.run(name, SETTINGS[name])
    assert result.returncode == 1 and len(host.calls("sleep")) == 5 and len(host.calls("systemctl")) == 4


@pytest.mark.parametrize("name", ["llama-server-watchdog.sh", "rpc-server-watchdog.sh"])
@pytest.mark.parametrize("args", [["--passes"], ["--passes", "-1"], ["3"]])
def test_a_watchdog_refuses_other_arguments(tmp_path, name, args):
    host = Host(tmp_path)
    host.stub("systemctl", "echo active")
    result = host.run(name, SETTINGS[name], *args)
    assert result.returncode == 2 and "usage:" in result.stderr and "[--passes N]" in result.stderr
    assert host.calls("systemctl") == []


# --- rpc-server-watchdog.sh -------------------------------------------------------------------------------


class Worker(Host):
    """rpc-server's host: `ss` reports its listening socket with the next accept-queue length (- for no socket)."""

    def __init__(self, tmp_path, queued=(0,), active=("active",)):
        super().__init__(tmp_path)
        self.sequence("queue", queued)
        self.sequence("state", active)
        self.stub("ss", f'{self.next("queue")}; [ "$v" = - ] || echo "LISTEN $v 1 10.0.0.20:50052 0.0.0.0:*"')
        self.stub("systemctl", f'[ "$1" = is-active ] && {{ {self.next("state")}; echo "$v"; }}; true')

    def watch(self, passes):
        return self.run(
            "rpc-server-watchdog.sh",
            rpc_server_watchdog_env(port=50052, interval=5, patience=20, server_unit=WORKER_UNIT),
            "--passes",
            str(passes),
        )

    def restarts(self):
        """For each restart of rpc-server: the number of the look that decided it."""
        looks, restarts = 0, []
        for call in self.calls("systemctl"):
            if call == f"is-active {WORKER_UNIT}":
                looks += 1
            else:
                assert call == f"restart {WORKER_UNIT}"
                restarts.append(looks)
        return restarts


STUCK = (
    "a new connection has waited 20 s while rpc-server still serves an old one "
    f"(llama-server restarted while the network was down?): restarting {WORKER_UNIT}\n"
)


@pytest.mark.parametrize(
    "queued,passes", [((0,), 4), (("-",), 4), ((1, 1, 1, 0, 1, 1, 1), 7), ((1, 1, 1, "-", 1, 1, 1), 7)]
)
def test_rpc_server_is_left_alone_while_nothing_waits_20_s(tmp_path, queued, passes):
    """Nothing queued, no listening socket (- : rpc-server starting), or a wait shorter than 20 s."""
    host = Worker(tmp_path, queued=queued)
    result = host.watch(passes=passes)
    assert result.returncode == 0 and result.stdout == "" and result.stderr == ""
    assert host.calls("systemctl") == [f"is-active {WORKER_UNIT}"] * passes and host.restarts() == []
    assert host.calls("sleep") == ["5"] * passes
    assert set(host.calls("ss")) == {"-Hltn sport = :50052"}


@pytest.mark.parametrize(
    "queued,passes,restarts",
    [
        ((1,), 4, [4]),
        ((0, 2), 9, [5, 9]),
        ((1, 1, 1, 0, 1, 1, 1, 1), 8, [8]),
    ],
)
def test_a_connection_waiting_20_s_restarts_rpc_server(tmp_path, queued, passes, restarts):
    """Interval 5 s, patience 20 s: the 4th look in a row that sees a waiting connection restarts rpc-server."""
    host = Worker(tmp_path, queued=queued)
    result = host.watch(passes=passes)
    assert result.returncode == 0, result.stderr
    assert host.restarts() == restarts and host.calls("sleep") == ["5"] * passes
    assert result.stdout == STUCK * len(restarts)


def test_the_wait_starts_again_while_rpc_server_is_not_running(tmp_path):
    host = Worker(tmp_path, queued=(1,), active=("active", "active", "active", "activating", "active"))
    assert host.watch(passes=7).stdout == ""
    assert f"restart {WORKER_UNIT}" not in host.calls("systemctl") and len(host.calls("ss")) == 6


# --- front-drain.sh ---------------------------------------------------------------------------------------


class Front(Host):
    """The coordinator with its front: an admin socket (a socket file: nothing listens, socat is a stand-in) and
    a `socat` that logs each command it is given on stdin to commands.log and answers `show stat` with HAProxy's
    CSV, the server's scur (5th field) the next value of the sequence "scur"."""

    def __init__(self, tmp_path, scur=(0,), socket=True):
        super().__init__(tmp_path)
        self.socket = tmp_path / "admin.sock"
        self.flag = tmp_path / "llama-rpc-no-drain"
        if socket:
            os.mknod(self.socket, stat.S_IFSOCK | 0o600)
        self.sequence("scur", scur)
        header = "# pxname,svname,qcur,qmax,scur,smax,slim,stot,bin,bout"
        self.stub(
            "socat",
            f'read -r cmd; echo "$cmd" >> {tmp_path}/commands.log; case "$cmd" in "show stat"*) '
            f'{self.next("scur")}; echo "{header}"; echo "llama-server,BACKEND,0,0,9,9,,9,0,0"; '
            f'echo "llama-server,llama-server,0,0,$v,1,,12,0,0"; echo ;; *) echo ;; esac',
        )

    def drain(self, *args, drain_seconds=5):
        env = front_drain_env(
            socket=str(self.socket),
            backend="llama-server",
            server="llama-server",
            drain_seconds=drain_seconds,
            no_drain_flag=str(self.flag),
        )
        return self.run("front-drain.sh", env, *args)

    def commands(self):
        return self.calls("commands")


DRAIN = "set server llama-server/llama-server state drain"
LOOK = "show stat llama-server 4 -1"


def test_drain_waits_until_no_request_is_in_flight(tmp_path):
    host = Front(tmp_path, scur=(2, 1, 1, 0))
    result = host.drain("drain")
    assert result.returncode == 0, result.stderr
    assert host.commands() == [DRAIN, LOOK, LOOK, LOOK, LOOK]  # drained first, then a look every 0.5 s
    assert host.calls("sleep") == ["0.5"] * 3
    assert set(host.calls("socat")) == {f"-t 5 stdio unix-connect:{host.socket}"}
    assert result.stdout == "front-drain: drained, new requests are held\n"


def test_drain_without_requests_in_flight_returns_at_once(tmp_path):
    host = Front(tmp_path, scur=(0,))
    result = host.drain("drain")
    assert result.returncode == 0 and host.commands() == [DRAIN, LOOK] and host.calls("sleep") == []


def test_drain_gives_up_after_drain_seconds(tmp_path):
    """A request that does not finish: one look past DRAIN_SECONDS (0 here), then the stop goes on anyway."""
    host = Front(tmp_path, scur=(3,))
    result = host.drain("drain", drain_seconds=0)
    assert result.returncode == 0, result.stderr
    assert host.commands() == [DRAIN, LOOK] and host.calls("sleep") == []
    assert result.stdout == "front-drain: 3 request(s) still in flight after 0s: going on\n"


def test_drain_is_bounded_by_the_clock(tmp_path):
    """DRAIN_SECONDS=1 and a sleep that takes its time: it keeps looking, and gives up within about a second."""
    import time

    host = Front(tmp_path, scur=(1,))
    host.stub("sleep", "/bin/sleep 0.1")
    start = time.monotonic()
    result = host.drain("drain", drain_seconds=1)
    took = time.monotonic() - start
    assert result.returncode == 0 and "1 request(s) still in flight after 1s: going on" in result.stdout
    assert took < 3 and host.commands()[0] == DRAIN and set(host.commands()[1:]) == {LOOK}
    assert len(host.commands()) - 1 == len(host.calls("sleep")) + 1  # a look after each sleep, and a first


def test_ready_sends_requests_to_llama_server_again(tmp_path):
    host = Front(tmp_path)
    result = host.drain("ready")
    assert result.returncode == 0, result.stderr
    assert host.commands() == ["set server llama-server/llama-server state ready"]
    assert result.stdout == "front-drain: requests go to llama-server once its health check passes\n"


@pytest.mark.parametrize("word", ["drain", "ready"])
def test_no_front_is_nothing_to_do(tmp_path, word):
    """No admin socket: the front is not installed or not running yet (a first deploy): exit 0, nothing sent."""
    host = Front(tmp_path, socket=False)
    result = host.drain(word)
    assert result.returncode == 0 and result.stdout == f"front-drain: no front at {host.socket}: nothing to do\n"
    assert host.calls("socat") == [] and host.calls("sleep") == []


@pytest.mark.parametrize("socket", [True, False])
def test_the_watchdogs_file_skips_one_drain(tmp_path, socket):
    """The watchdog restarts a llama-server that lost a worker: that stop does not drain (its requests cannot
    finish), and it removes the file, front or not, so the next stop drains again."""
    host = Front(tmp_path, scur=(1,), socket=socket)
    host.flag.touch()
    result = host.drain("drain")
    assert result.returncode == 0 and "no drain" in result.stdout
    assert not host.flag.exists() and host.calls("socat") == []
    if socket:
        result = host.drain("drain", drain_seconds=0)
        assert result.returncode == 0 and host.commands() == [DRAIN, LOOK]


def test_ready_leaves_the_watchdogs_file(tmp_path):
    """Only the stop it was meant for (a drain) takes it."""
    host = Front(tmp_path)
    host.flag.touch()
    assert host.drain("ready").returncode == 0
    assert host.flag.exists() and host.commands() == ["set server llama-server/llama-server state ready"]


@pytest.mark.parametrize("socket", [True, False])
@pytest.mark.parametrize("args", [[], ["stop"], ["Drain"], ["--drain"]])
def test_front_drain_refuses_other_arguments(tmp_path, args, socket):
    host = Front(tmp_path, socket=socket)
    host.flag.touch()
    result = host.drain(*args)
    assert result.returncode == 2 and result.stderr == "usage: front-drain.sh drain|ready\n"
    assert host.calls("socat") == [] and host.flag.exists()


# --- wait-for-workers.sh ----------------------------------------------------------------------------------


def fake_rpc_server(version, late=0.0, answer=True):
    """A socket on 127.0.0.1 that answers the RPC HELLO the way rpc-server does (uint64 size 28, major, minor,
    patch, padding, 24 bytes of capabilities); it starts listening after `late` s. Returns (port, requests)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused until it listens
    got = []

    def serve():
        if late:
            listener.listen()
        while True:
            conn, _ = listener.accept()
            with conn:
                data = b""
                conn.settimeout(5)
                try:
                    while len(data) < 33 and (chunk := conn.recv(64)):
                        data += chunk
                except OSError:
                    pass
                if len(data) == 33:
                    got.append(data)
                    if answer:
                        conn.sendall(struct.pack("<Q", 28) + bytes([*version, 0]) + bytes(24))
                        return

    if not late:
        listener.listen()
    thread = threading.Timer(late, serve)
    thread.daemon = True
    thread.start()
    return listener.getsockname()[1], got


def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once it is closed


def wait_for(tmp_path, endpoints, timeout=5, protocol="7.0.0", docker_fails=False, retry_delay="0", remotes=None):
    host = Host(tmp_path)
    host.stub("docker", "exit 1" if docker_fails else f"echo {protocol}")
    (tmp_path / "bin" / "sleep").unlink()  # the real one: RETRY_DELAY is short
    env = wait_for_workers_env(endpoints=endpoints, timeout=timeout, image=IMAGE, remotes=remotes) + env_file(
        RETRY_DELAY=retry_delay
    )
    return host, host.run("wait-for-workers.sh", env)


HELLO = bytes([14]) + (24).to_bytes(8, "little") + bytes(24)  # RPC_CMD_HELLO as llama.cpp sends it


@pytest.mark.parametrize("version,ok", [((7, 0, 0), True), ((6, 1, 0), False), ((7, 0, 1), False)])
def test_wait_for_workers_checks_the_rpc_protocol_version(tmp_path, version, ok):
    port, got = fake_rpc_server(version)
    host, result = wait_for(tmp_path, [f"127.0.0.1:{port}"])
    assert host.calls("docker") == [f"run --rm --network none {IMAGE} rpc-protocol"]
    assert got == [HELLO]
    if ok:
        assert result.returncode == 0, result.stderr
        assert result.stdout == f"rpc-server at 127.0.0.1:{port} answers, RPC protocol 7.0.0\n"
    else:
        assert result.returncode == 1 and result.stdout == ""
        assert result.stderr == (
            f"rpc-server at 127.0.0.1:{port} speaks RPC protocol {'.'.join(map(str, version))}, "
            f"this llama-server 7.0.0: every host must run this deploy's images, built from "
            f"one llama.cpp commit (this one's: {IMAGE}): deploy again\n"
        )


def test_wait_for_workers_checks_every_worker_in_order(tmp_path):
    (a, _), (b, _) = fake_rpc_server((7, 0, 0)), fake_rpc_server((7, 0, 0))
    _, result = wait_for(tmp_path, [f"127.0.0.1:{a}", f"127.0.0.1:{b}"])
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        f"rpc-server at 127.0.0.1:{a} answers, RPC protocol 7.0.0\n"
        f"rpc-server at 127.0.0.1:{b} answers, RPC protocol 7.0.0\n"
    )


def test_wait_for_workers_waits_for_a_worker_that_comes_up_late(tmp_path):
    port, got = fake_rpc_server((7, 0, 0), late=0.05)
    _, result = wait_for(tmp_path, [f"127.0.0.1:{port}"], retry_delay="0.01")
    assert result.returncode == 0, result.stderr
    assert got == [HELLO]


def test_wait_for_workers_gives_up_within_its_bound(tmp_path):
    """Nothing listens: it fails, within RPC_WAIT_TIMEOUT (0 s here), and says which worker."""
    port = closed_port()
    _, result = wait_for(tmp_path, [f"127.0.0.1:{port}", ENDPOINT], timeout=0)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == (
        f"rpc-server at 127.0.0.1:{port} did not answer within 0 s: is rpc-server.service running on that worker?\n"
    )


def test_wait_for_workers_names_a_worker_that_does_not_answer_hello(tmp_path):
    """An older rpc-server (no HELLO) closes without a reply: three tries, then no start."""
    port, got = fake_rpc_server((7, 0, 0), answer=False)
    _, result = wait_for(tmp_path, [f"127.0.0.1:{port}"])
    assert result.returncode == 1 and len(got) == 3
    assert (
        f"rpc-server at 127.0.0.1:{port} speaks RPC protocol (no answer to HELLO: an older llama.cpp?)" in result.stderr
    )


def fake_tunnel_end(closes: int):
    """A tunnel's end on the coordinator while its worker is away: it accepts every connection, and closes the
    first `closes` of them without a word (stunnel could not reach the worker); then rpc-server answers HELLO."""
    listener = socket.create_server(("127.0.0.1", 0))
    got = []

    def serve():
        for n in range(closes + 1):
            conn, _ = listener.accept()
            with conn:
                if n == closes:
                    data = b""
                    while len(data) < len(HELLO) and (chunk := conn.recv(64)):
                        data += chunk
                    got.append(data)
                    conn.sendall(struct.pack("<Q", 28) + bytes([7, 0, 0, 0]) + bytes(24))

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1], got


def test_wait_for_workers_waits_at_a_tunnel_until_its_worker_answers(tmp_path):
    """Through a tunnel, an end that accepts and closes is a worker not there yet: wait (not three tries)."""
    port, got = fake_tunnel_end(closes=5)
    _, result = wait_for(tmp_path, [f"127.0.0.1:{port}"], timeout=20, retry_delay="0.01", remotes=["10.0.0.20:50053"])
    assert result.returncode == 0, result.stderr
    assert got == [HELLO] and result.stdout == f"rpc-server at 127.0.0.1:{port} answers, RPC protocol 7.0.0\n"


def test_wait_for_workers_names_the_tunnel_when_its_worker_never_answers(tmp_path):
    port, _ = fake_tunnel_end(closes=10**6)
    _, result = wait_for(tmp_path, [f"127.0.0.1:{port}"], timeout=1, retry_delay="0.05", remotes=["10.0.0.20:50053"])
    assert result.returncode == 1
    assert result.stderr == (
        f"rpc-server at 127.0.0.1:{port} (the tunnel to 10.0.0.20:50053) did not answer within "
        "1 s: is rpc-server.service running on that worker, and llama-rpc-tunnel.service on both "
        "ends?\n"
    )


def test_wait_for_workers_stops_when_the_image_cannot_say_its_protocol(tmp_path):
    port, got = fake_rpc_server((7, 0, 0))
    host, result = wait_for(tmp_path, [f"127.0.0.1:{port}"], docker_fails=True)
    assert result.returncode == 1 and result.stdout == "" and got == [] and host.calls("docker")


# --- rpc-firewall.sh --------------------------------------------------------------------------------------


class Firewalled(Host):
    """iptables and ip6tables stand-ins: *-restore keeps its input; -C finds the jump when NAME.present exists;
    -S INPUT lists the rules in `rules`."""

    def __init__(self, tmp_path, ip6tables=True, present=(), fail=(), rules=()):
        super().__init__(tmp_path)
        for ipt in ("iptables", "ip6tables") if ip6tables else ("iptables",):
            (tmp_path / f"{ipt}.input").write_text("".join(f"{r}\n" for r in ["-P INPUT ACCEPT", *rules]))
            self.stub(
                f"{ipt}-restore", f"/bin/cat > {tmp_path}/{ipt}.rules; {'exit 1' if f'{ipt}-restore' in fail else ''}"
            )
            self.stub(
                ipt,
                f'case "$*" in *" -C "*) {"exit 0" if ipt in present else "exit 1"} ;; '
                f'*" -S "*) /bin/cat {tmp_path}/{ipt}.input ;; '
                f'*" -I "*) {"exit 1" if ipt in fail else "exit 0"} ;; esac',
            )

    def apply(self, ipv4=("10.0.0.10",), ipv6=(), ports=(50052,)):
        # PATH: the stand-ins only, so "no ip6tables" means none, wherever this runs
        return self.run(
            "rpc-firewall.sh",
            firewall_env(ports=list(ports), chain="LLAMA-RPC", ipv4=list(ipv4), ipv6=list(ipv6)),
            path=str(self.bin),
        )

    def rules(self, ipt):
        return (self.dir / f"{ipt}.rules").read_text()


def chain(*sources):
    return "".join(
        [
            "*filter\n:LLAMA-RPC - [0:0]\n",
            *(f"-A LLAMA-RPC -s {s} -j ACCEPT\n" for s in sources),
            "-A LLAMA-RPC -p tcp -j REJECT --reject-with tcp-reset\nCOMMIT\n",
        ]
    )


LIST = "--wait -S INPUT"


def jump(ipt, op, port=50052):
    return f"--wait {op} INPUT {'1 ' if op == '-I' else ''}! -i lo -p tcp --dport {port} -j LLAMA-RPC"


def test_firewall_admits_the_coordinator_only_by_default(tmp_path):
    host = Firewalled(tmp_path)
    result = host.apply()
    assert result.returncode == 0, result.stderr
    assert host.rules("iptables") == chain("10.0.0.10")
    assert host.rules("ip6tables") == chain()  # IPv6: nobody
    for ipt in ("iptables", "ip6tables"):
        assert host.calls(f"{ipt}-restore") == ["--wait --noflush"]  # our chain only, in one transaction
        assert host.calls(ipt) == [jump(ipt, "-C"), jump(ipt, "-I"), LIST]  # the jump, at the top of INPUT
    assert result.stdout == "port 50052/tcp: only from 10.0.0.10\n"


def test_firewall_sources_by_family(tmp_path):
    host = Firewalled(tmp_path)
    result = host.apply(ipv4=["192.168.1.0/24", "10.0.0.10"], ipv6=["fd00::10", "fd00:1::/64"], ports=[50100])
    assert result.returncode == 0, result.stderr
    assert host.rules("iptables") == chain("192.168.1.0/24", "10.0.0.10")
    assert host.rules("ip6tables") == chain("fd00::10", "fd00:1::/64")
    assert host.calls("ip6tables") == [jump("ip6tables", "-C", 50100), jump("ip6tables", "-I", 50100), LIST]
    assert result.stdout == "port 50100/tcp: only from 192.168.1.0/24, 10.0.0.10, fd00::10, fd00:1::/64\n"


@pytest.mark.parametrize("present", [("iptables",), ("ip6tables",), ("iptables", "ip6tables")])
def test_firewall_adds_the_jump_only_when_it_is_missing(tmp_path, present):
    host = Firewalled(tmp_path, present=present)
    assert host.apply(ipv6=["fd00::10"]).returncode == 0
    for ipt in ("iptables", "ip6tables"):
        assert host.calls(ipt) == ([jump(ipt, "-C")] if ipt in present else [jump(ipt, "-C"), jump(ipt, "-I")]) + [LIST]
        assert host.calls(f"{ipt}-restore") == ["--wait --noflush"]  # the chain is replaced every time


def test_firewall_guards_every_port_and_removes_other_jumps_after_adding_its_own(tmp_path):
    """The tunnel's port and rpc-server's, each jump in before any old one goes: a jump for a port no longer ours,
    or one of an earlier version that caught loopback too (it reset the tunnel's own connections to rpc-server),
    goes. Other rules stay."""
    rules = [
        "-A INPUT -p tcp -m tcp --dport 50052 -j LLAMA-RPC",
        "-A INPUT ! -i lo -p tcp -m tcp --dport 50053 -j LLAMA-RPC",
        "-A INPUT ! -i lo -p tcp -m tcp --dport 50060 -j LLAMA-RPC",
        "-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT",
        "-A INPUT -p tcp -m tcp --dport 50052 -j LLAMA-RPC-OTHER",
    ]
    host = Firewalled(tmp_path, present=("iptables", "ip6tables"), rules=rules)
    result = host.apply(ports=[50053, 50052])
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ports 50053, 50052/tcp: only from 10.0.0.10\n"
    for ipt in ("iptables", "ip6tables"):
        assert host.calls(ipt) == [
            jump(ipt, "-C", 50053),
            jump(ipt, "-C", 50052),
            LIST,
            "--wait -D INPUT -p tcp -m tcp --dport 50052 -j LLAMA-RPC",
            "--wait -D INPUT ! -i lo -p tcp -m tcp --dport 50060 -j LLAMA-RPC",
        ]


def test_firewall_without_ip6tables(tmp_path):
    host = Firewalled(tmp_path, ip6tables=False)
    result = host.apply(ipv6=["fd00::10"])
    assert result.returncode == 0, result.stderr
    assert host.rules("iptables") == chain("10.0.0.10")
    assert result.stdout == "port 50052/tcp: only from 10.0.0.10, fd00::10\n"


@pytest.mark.parametrize("fail", ["iptables-restore", "iptables", "ip6tables-restore", "ip6tables"])
def test_firewall_fails_when_a_rule_cannot_be_set(tmp_path, fail):
    """Its unit then fails, and rpc-server, which requires it, does not start."""
    host = Firewalled(tmp_path, fail=(fail,))
    result = host.apply()
    assert result.returncode != 0 and result.stdout == ""
    if fail == "iptables-restore":
        assert host.calls("iptables") == [] and host.calls("ip6tables-restore") == []  # no jump to a chain not set


# --- as the deploy writes them ----------------------------------------------------------------------------


NIC = Nic(interface="eno1", mac="3c:7c:3f:12:34:56", broadcast="10.0.0.255", exists=True, wake_on="pumbg", ethtool=True)


def deployed(c, image=IMAGE):
    """Every file the deploy writes for cluster c, by path (the coordinator's, then each worker's)."""
    nics = {w.name: NIC for w in c.workers}
    files = {
        **render.coordinator_files(c, image),
        **render.watchdog_files(c),
        **render.front_files(c),
        **render.sleep_files(c, nics),
    }
    for worker in c.workers:
        files.update(
            {
                f"{worker.name}:{path}": content
                for path, content in {
                    **render.worker_watchdog_files(worker),
                    **render.firewall_files(c, worker),
                    **render.cache_prune_files(worker),
                    **render.worker_sleep_files(c, worker, nics[worker.name]),
                }.items()
            }
        )
    return files


def test_the_deploy_ships_each_program_unchanged_next_to_its_settings():
    c = cluster(
        workers=[None, None],
        all_data={"rpc_wait_timeout": 45, "llama_front_drain_seconds": 30, "sleep_idle_seconds": 900},
    )
    files = deployed(c)
    assert files["/opt/llama-rpc/llama-sleep.py"] == programs.text(programs.SLEEPER)
    assert files["10.0.0.20:/opt/llama-rpc/sleep-now.env"] == sleep_now_env(command="systemctl suspend")
    endpoints, remotes = ["127.0.0.1:50100", "127.0.0.1:50101"], ["10.0.0.20:50053", "10.0.0.21:50053"]
    for name in PROGRAMS:
        paths = [p for p in files if p.endswith(f"/opt/llama-rpc/{name}")]
        assert paths and all(files[p] == programs.text(name) for p in paths), name
        assert all(p.removesuffix(".sh") + ".env" in files for p in paths), name
    assert files["/opt/llama-rpc/wait-for-workers.env"] == wait_for_workers_env(
        endpoints=endpoints, timeout=45, image=IMAGE, remotes=remotes
    )
    # the watchdog looks at llama-server's connections to the tunnels' ends and at the tunnels' own to the workers
    assert files["/opt/llama-rpc/llama-server-watchdog.env"] == llama_server_watchdog_env(
        endpoints=endpoints,
        remotes=remotes,
        interval=5,
        retransmissions=7,
        grace=15,
        server_unit=SERVER_UNIT,
        no_drain_flag=roles.NO_DRAIN_FLAG,
    )
    # the watchdog leaves its file where front-drain.sh looks for it
    assert files["/opt/llama-rpc/front-drain.env"] == front_drain_env(
        socket=roles.FRONT_SOCKET,
        backend=render.FRONT_BACKEND,
        server=render.FRONT_SERVER,
        drain_seconds=30,
        no_drain_flag=roles.NO_DRAIN_FLAG,
    )
    assert files["/opt/llama-rpc/front.lua"] == programs.text(programs.FRONT_LUA) == (FILES / "front.lua").read_text()
    assert files["10.0.0.21:/opt/llama-rpc/rpc-server-watchdog.env"] == rpc_server_watchdog_env(
        port=50052, interval=5, patience=20, server_unit=WORKER_UNIT
    )
    for unit, name in (
        (f"/etc/systemd/system/{roles.WATCHDOG_UNIT}", "llama-server-watchdog.sh"),
        (f"10.0.0.20:/etc/systemd/system/{roles.WORKER_WATCHDOG_UNIT}", "rpc-server-watchdog.sh"),
        (f"10.0.0.20:/etc/systemd/system/{roles.FIREWALL_UNIT}", "rpc-firewall.sh"),
    ):
        assert f'ExecStart="/opt/llama-rpc/{name}"\n' in files[unit] and "WantedBy=multi-user.target" in files[unit]
    assert "Restart=always" in files[f"/etc/systemd/system/{roles.WATCHDOG_UNIT}"]


@pytest.mark.parametrize(
    "allow,ipv4,ipv6",
    [
        (None, ["10.0.0.10"], []),  # the coordinator only, and nobody over IPv6
        (["192.168.1.0/24", "fd00::10"], ["192.168.1.0/24"], ["fd00::10"]),
    ],
)
def test_the_deployed_firewall_admits_the_allowed_sources_by_family(tmp_path, allow, ipv4, ipv6):
    c = cluster(workers=[{"rpc_tunnel_port": 50100, **({"rpc_allow_from": allow} if allow else {})}])
    env = render.firewall_files(c, c.workers[0])["/opt/llama-rpc/rpc-firewall.env"]
    host = Firewalled(tmp_path)
    result = host.run("rpc-firewall.sh", env, path=str(host.bin))
    assert result.returncode == 0, result.stderr
    assert host.rules("iptables") == chain(*ipv4) and host.rules("ip6tables") == chain(*ipv6)
    assert host.calls("iptables")[-4:] == [
        jump("iptables", "-I", 50100),
        jump("iptables", "-C", 50052),
        jump("iptables", "-I", 50052),
        LIST,
    ]  # the tunnel's port, then rpc-server's
    assert result.stdout == f"ports 50100, 50052/tcp: only from {', '.join(ipv4 + ipv6)}\n"


def test_the_deployed_wait_for_workers_checks_each_worker(tmp_path):
    port, got = fake_rpc_server((6, 1, 0))
    c = cluster(
        workers=[{"address": "127.0.0.1", "rpc_port": port, "rpc_transport": "plain"}], all_data={"rpc_wait_timeout": 5}
    )
    host = Host(tmp_path)
    host.stub("docker", "echo 7.0.0")
    result = host.run("wait-for-workers.sh", render.coordinator_files(c, IMAGE)["/opt/llama-rpc/wait-for-workers.env"])
    assert got == [HELLO] and host.calls("docker") == [f"run --rm --network none {IMAGE} rpc-protocol"]
    assert result.returncode == 1
    assert f"rpc-server at 127.0.0.1:{port} speaks RPC protocol 6.1.0, this llama-server 7.0.0" in result.stderr


# --- rpc-cache-prune.sh -----------------------------------------------------------------------------------

MIB = 1 << 20


def cache(tmp_path, files):
    """A cache folder: name -> (size in MiB, seconds since last use, seconds since last change)."""
    import os
    import time

    folder = tmp_path / "cache" / "rpc"
    folder.mkdir(parents=True)
    now = time.time()
    for name, (size, used, changed) in files.items():
        path = folder / name
        with open(path, "wb") as f:
            f.truncate(size * MIB)
        os.utime(path, (now - used, now - changed))
    return folder


def prune(tmp_path, folder, limit_mib, min_age=10):
    host = Host(tmp_path)
    return host.run(
        "rpc-cache-prune.sh", cache_prune_env(cache_dir=str(folder), max_bytes=limit_mib * MIB, min_age=min_age)
    )


def h(name: str) -> str:
    """A cache file's name as rpc-server writes it: the tensor's hash in 16 hex digits."""
    return name.encode().hex().rjust(16, "0")


def test_the_least_recently_used_files_go_first_until_the_cache_fits(tmp_path):
    folder = cache(
        tmp_path, {h("a"): (10, 3000, 3000), h("b"): (10, 100, 5000), h("c"): (10, 2000, 2000), h("d"): (10, 50, 50)}
    )
    result = prune(tmp_path, folder, 25)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in folder.iterdir()) == [h("b"), h("d")]  # a, then c: b was used after both
    assert (
        f"tensor cache: {20 * MIB} bytes in 2 files, limit {25 * MIB}; removed 2 files ({20 * MIB} bytes)"
        in result.stdout
    )


def test_a_cache_under_its_limit_is_left_alone(tmp_path):
    folder = cache(tmp_path, {h("a"): (10, 3000, 3000), h("b"): (10, 100, 100)})
    assert prune(tmp_path, folder, 20).returncode == 0
    assert sorted(p.name for p in folder.iterdir()) == [h("a"), h("b")]


def test_a_file_being_written_is_never_removed(tmp_path):
    """Changed in the last MIN_AGE seconds (rpc-server is writing it), or held open by a process."""
    folder = cache(tmp_path, {h("old"): (10, 3000, 3000), h("fresh"): (10, 2, 2), h("open"): (10, 4000, 4000)})
    with open(folder / h("open"), "rb"):  # this test's own process holds it open, under .../rpc/NAME
        result = prune(tmp_path, folder, 5)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in folder.iterdir()) == sorted([h("fresh"), h("open")])
    assert "removed 1 files" in result.stdout


def test_only_names_rpc_server_writes_are_removed_and_big_files_count_whole(tmp_path):
    """Sizes past 2 GiB (mawk prints those in exponent notation unless told not to); a name that is not
    a 16-digit hash is not the cache's, whatever its age."""
    folder = cache(tmp_path, {h("big"): (3 * 1024, 9000, 9000), "notes.txt": (10, 9999, 9999), h("new"): (1, 1, 100)})
    result = prune(tmp_path, folder, 2 * 1024)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in folder.iterdir()) == sorted(["notes.txt", h("new")])
    assert f"removed 1 files ({3 * 1024 * MIB} bytes)" in result.stdout


def test_no_cache_folder_yet_is_not_an_error(tmp_path):
    result = prune(tmp_path, tmp_path / "none" / "rpc", 5)
    assert result.returncode == 0 and "no " in result.stdout


def test_the_deploy_keeps_each_workers_cache_under_its_own_limit():
    c = cluster(workers=[{"rpc_cache_max_gib": 0.5, "rpc_cache_dir": "/srv/tensors"}, None])
    files = deployed(c)
    assert files["10.0.0.20:/opt/llama-rpc/rpc-cache-prune.env"] == cache_prune_env(
        cache_dir="/srv/tensors/rpc", max_bytes=1 << 29, min_age=render.CACHE_MIN_AGE
    )
    assert files["10.0.0.21:/opt/llama-rpc/rpc-cache-prune.env"] == cache_prune_env(
        cache_dir="/var/cache/llama-rpc/rpc", max_bytes=64 << 30, min_age=render.CACHE_MIN_AGE
    )
    timer = files[f"10.0.0.20:/etc/systemd/system/{roles.CACHE_PRUNE_TIMER}"]
    assert "OnUnitActiveSec=30" in timer and "WantedBy=timers.target" in timer and "0.5 GiB" in timer


def test_sleep_now_leaves_the_ssh_session_before_the_host_sleeps(tmp_path):
    """The sleep key's command: the host's sleep comes 2 s later from a transient systemd timer (the coordinator's
    SSH session has closed by then), with the configured line run by /bin/sh."""
    host = Host(tmp_path)
    host.stub("systemd-run", "")
    result = host.run("sleep-now.sh", sleep_now_env(command="systemctl hibernate"))
    assert result.returncode == 0, result.stderr
    assert "sleeps in 2 s: systemctl hibernate" in result.stdout
    assert host.calls("systemd-run") == [
        "--quiet --collect --on-active=2 --timer-property=AccuracySec=100ms /bin/sh -c systemctl hibernate"
    ]


def test_sleep_now_says_so_when_the_timer_cannot_start(tmp_path):
    host = Host(tmp_path)
    host.stub("systemd-run", "exit 1")
    result = host.run("sleep-now.sh", sleep_now_env(command="systemctl suspend"))
    assert result.returncode == 1 and "sleeps" not in result.stdout
