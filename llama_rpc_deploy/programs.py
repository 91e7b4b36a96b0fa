"""The deploy's own shell programs (files/*.sh) and the settings files they read.

Each program ships unchanged, byte for byte the file the unit tests run; what differs from one
cluster to the next is a small environment file next to it (NAME.env beside NAME.sh, or the path in
$LLAMA_RPC_ENV), which the program sources. This module reads the programs and writes those files:
one `KEY=value` line per setting, every value quoted for the shell, so no template logic and no
unquoted value ever reaches a host.
"""

from __future__ import annotations

from .paths import shipped

import re
from .quoting import shell
from collections.abc import Sequence

PROGRAMS = (
    "wait-for-workers.sh",
    "llama-server-watchdog.sh",
    "rpc-server-watchdog.sh",
    "rpc-firewall.sh",
    "rpc-cache-prune.sh",
    "front-drain.sh",
    "sleep-now.sh",
)
FRONT_LUA = "front.lua"  # the front's hold (HAProxy's lua-load), shipped as is like the programs
SLEEPER = "llama-sleep.py"  # the coordinator's sleep and wake of the workers (python3), shipped as is too
WATCHDOG_LIBRARY = "watchdog-loop.sh"  # what both watchdogs share (command line, settings, loop), beside them
FILES = shipped("files")

_KEY = re.compile(r"[A-Z][A-Z0-9_]*")


def text(name: str) -> str:
    """The content of the program `name` (one of PROGRAMS) as it ships."""
    if name not in (*PROGRAMS, WATCHDOG_LIBRARY, FRONT_LUA, SLEEPER):
        raise ValueError(f"{name!r} is not one of the deploy's programs: {', '.join(PROGRAMS)}")
    return (FILES / name).read_text()


def _word(key: str, value) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise TypeError(f"{key}: {value!r} is neither a string nor an integer")
    return str(value)


def _words(name: str, values: Sequence) -> list:
    if isinstance(values, (str, bytes)):  # a lone string would become one word per character
        raise TypeError(f"{name}: expected a list of words, got the string {values!r}")
    return list(values)


def env_file(**values) -> str:
    """An environment file for a program: KEY=value lines, in the order given, each value quoted with shlex.

    A string stays one word; an int is written in decimal; a list or tuple becomes its elements separated
    by spaces, which the program splits again, so each element must be one non-empty word without whitespace.
    """
    lines = []
    for key, value in values.items():
        if not _KEY.fullmatch(key):
            raise ValueError(f"{key!r}: a program's setting is named in upper case, [A-Z][A-Z0-9_]*")
        if isinstance(value, (list, tuple)):
            words = [_word(key, element) for element in value]
            for word in words:
                if not word or any(c.isspace() for c in word):
                    raise ValueError(f"{key}: {word!r} is not a single word (empty, or with whitespace)")
            value = " ".join(words)
        lines.append(f"{key}={shell(_word(key, value))}\n")
    return "".join(lines)


def wait_for_workers_env(
    *, endpoints: Sequence[str], timeout: int, image: str, remotes: Sequence[str] | None = None
) -> str:
    """wait-for-workers.sh: the workers' HOST:PORT, the seconds to wait for all of them, llama-server's image;
    with remotes, where each endpoint's tunnel leads ('-' for an rpc-server reached directly)."""
    tunnels = {} if remotes is None else {"RPC_REMOTES": _words("remotes", remotes)}
    return env_file(RPC_ENDPOINTS=_words("endpoints", endpoints), RPC_WAIT_TIMEOUT=timeout, IMAGE=image, **tunnels)


def llama_server_watchdog_env(
    *,
    endpoints: Sequence[str],
    interval: int,
    retransmissions: int,
    grace: int,
    server_unit: str,
    no_drain_flag: str,
    remotes: Sequence[str] = (),
) -> str:
    """llama-server-watchdog.sh: the workers' HOST:PORT, seconds between looks, retransmissions that mean a
    worker is gone, seconds to leave llama-server after a restart, its unit, and the file that tells its
    stop not to drain the front (front-drain.sh); remotes: the tunnels' far ends, if any."""
    tunnels = {"TUNNEL_REMOTES": _words("remotes", remotes)} if remotes else {}
    return env_file(
        RPC_ENDPOINTS=_words("endpoints", endpoints),
        INTERVAL=interval,
        RETRANSMISSIONS=retransmissions,
        GRACE=grace,
        SERVER_UNIT=server_unit,
        NO_DRAIN_FLAG=no_drain_flag,
        **tunnels,
    )


def front_drain_env(*, socket: str, backend: str, server: str, drain_seconds: int, no_drain_flag: str) -> str:
    """front-drain.sh: the front's admin socket, llama-server's backend and server in it, the longest wait
    for the requests in flight, and the watchdog's no-drain file."""
    return env_file(
        SOCKET=socket, BACKEND=backend, SERVER=server, DRAIN_SECONDS=drain_seconds, NO_DRAIN_FLAG=no_drain_flag
    )


def rpc_server_watchdog_env(*, port: int, interval: int, patience: int, server_unit: str) -> str:
    """rpc-server-watchdog.sh: rpc-server's port, seconds between looks, seconds a new connection may wait
    behind the one being served, and rpc-server's unit."""
    return env_file(RPC_PORT=port, INTERVAL=interval, PATIENCE=patience, SERVER_UNIT=server_unit)


def cache_prune_env(*, cache_dir: str, max_bytes: int, min_age: int) -> str:
    """rpc-cache-prune.sh: the folder of rpc-server's cache files, the limit in bytes, and how many seconds
    a file is left alone after its last change (it may be being written)."""
    return env_file(CACHE_DIR=cache_dir, MAX_BYTES=max_bytes, MIN_AGE=min_age)


def firewall_env(*, ports: Sequence[int], chain: str, ipv4: Sequence[str], ipv6: Sequence[str]) -> str:
    """rpc-firewall.sh: the worker's RPC ports, our iptables chain, the sources admitted per address family."""
    return env_file(
        RPC_PORTS=_words("ports", ports), CHAIN=chain, ALLOW_IPV4=_words("ipv4", ipv4), ALLOW_IPV6=_words("ipv6", ipv6)
    )


def sleep_now_env(*, command: str) -> str:
    return env_file(SLEEP_COMMAND=command)
