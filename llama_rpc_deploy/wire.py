"""What crosses the wire between llama-server and each worker, from the kernel's own counters on the coordinator.

`ss -tin` prints, for each TCP connection, counters the kernel keeps (tcp_info): bytes_received (bytes down, the
workers' replies), bytes_acked (bytes up, what llama-server sent and the worker acknowledged) and data_segs_in (data
segments down). llama-server holds one connection to each --rpc endpoint (rpc-server's, or the tunnel's end on the
coordinator), so filtering on the endpoint gives that worker's traffic. rpc-server answers a command with one
reply, most of a few KB, which the coordinator's loopback (the tunnel's end: a 64 KB MSS) or a LAN carries as one
data segment or a few: data segments down per token estimates round trips per token, stated as an estimate.

Per generated token: the difference of the counters over a long and a short completion of the same prompt, divided
by the difference of their generated tokens, so that the prompt and a request's start fall out.
"""

from __future__ import annotations

import re

COUNTERS = ("bytes_received", "bytes_acked", "data_segs_in")
NAMES = {"bytes_received": "bytes down", "bytes_acked": "bytes up", "data_segs_in": "segments down"}


def command(endpoint: str) -> str:
    """The command that prints the coordinator's connections to endpoint (HOST:PORT)."""
    return f"ss -tinH state established dst {endpoint}"


def parse(text: str) -> dict[str, int]:
    """The counters of `ss -tin`'s output (summed over its connections: llama-server holds one per endpoint)."""
    out = dict.fromkeys(COUNTERS, 0)
    for name, value in re.findall(r"\b(" + "|".join(COUNTERS) + r"):(\d+)", text):
        out[name] += int(value)
    return out


def difference(before: dict, after: dict) -> dict:
    """after - before, per endpoint and counter."""
    return {e: {k: after[e][k] - before[e][k] for k in COUNTERS} for e in before}


def per_token(short: dict, long: dict, tokens: int) -> dict:
    """Per generated token, per endpoint: (long's counters - short's) / tokens, the generated tokens between them."""
    if tokens <= 0:
        raise ValueError(f"{tokens} tokens between the long and the short completion: expected more than 0")
    return {e: {k: (long[e][k] - short[e][k]) / tokens for k in COUNTERS} for e in long}
