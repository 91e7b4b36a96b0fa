"""Concurrent clients against a deployed llama-server, and how long it takes to serve again.

Used by the fault tests (tests/e2e/test_lab_faults.py), the load benchmark and `bench`.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from dataclasses import dataclass, field

from . import client
from .cluster import Cluster


@dataclass
class Request:
    client: int
    start: float  # seconds since the load started
    seconds: float
    ok: bool
    error: str = ""
    tokens: int = 0
    tokens_per_second: float = 0.0


@dataclass
class LoadResult:
    clients: int
    requests: list[Request] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failed(self) -> list[Request]:
        return [r for r in self.requests if not r.ok]

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens per second of wall time, all clients together."""
        return sum(r.tokens for r in self.requests if r.ok) / self.seconds if self.seconds else 0.0

    def summary(self) -> dict:
        return {
            "clients": self.clients,
            "requests": len(self.requests),
            "failed": len(self.failed),
            "seconds": round(self.seconds, 2),
            "tokens_per_second": round(self.tokens_per_second, 2),
            "errors": sorted({r.error for r in self.failed}),
        }


def run_load(
    cluster: Cluster,
    clients: int,
    requests_each: int,
    n_predict: int = 16,
    timeout: float = 120,
    prompt: str = "Tell me about computers",
    during=None,
) -> LoadResult:
    """`clients` threads, each sending `requests_each` completions one after another. `during`, if
    given, is called (in the caller's thread) once every client has started: a fault to inject."""
    result = LoadResult(clients=clients)
    lock = threading.Lock()
    started = threading.Barrier(clients + 1)
    t0 = time.monotonic()

    def one_client(index: int) -> None:
        started.wait()
        for i in range(requests_each):
            begin = time.monotonic()
            try:
                reply = client.complete(cluster, f"{prompt} ({index}.{i})", n_predict, timeout=timeout)
                t = reply.get("timings", {})
                request = Request(
                    index,
                    begin - t0,
                    time.monotonic() - begin,
                    True,
                    tokens=t.get("predicted_n", 0),
                    tokens_per_second=t.get("predicted_per_second", 0.0),
                )
            except Exception as error:  # a failed request is data here, not a crash
                request = Request(
                    index, begin - t0, time.monotonic() - begin, False, error=f"{type(error).__name__}: {error}"[:160]
                )
                time.sleep(0.5)
            with lock:
                result.requests.append(request)

    threads = [threading.Thread(target=one_client, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    started.wait()
    if during:
        during()
    for thread in threads:
        thread.join()
    result.seconds = time.monotonic() - t0
    return result


def health_ok(cluster: Cluster, timeout: float = 3) -> bool:
    try:
        with urllib.request.urlopen(client.server_url(cluster) + "/health", timeout=timeout) as response:
            return response.status == 200
    except Exception:
        return False


@dataclass
class Recovery:
    seconds: float | None  # until a completion succeeded again; None: not within the bound
    health_down_at: float | None  # when /health first stopped saying ok; None: it never did meanwhile


def until_serving(cluster: Cluster, bound: float, expect_down: bool = True, poll: float = 0.5) -> Recovery:
    """Seconds until llama-server completes a request again, at most `bound`. With expect_down, a
    completion counts only after /health has gone down (the fault was noticed), or after 15 s."""
    start = time.monotonic()
    down = None
    while (elapsed := time.monotonic() - start) < bound:
        healthy = health_ok(cluster)
        if not healthy and down is None:
            down = elapsed
        if healthy and (not expect_down or down is not None or elapsed > 15):
            try:
                client.complete(cluster, "are you back?", 2, timeout=20)
                return Recovery(time.monotonic() - start, down)
            except Exception:
                pass
        time.sleep(poll)
    return Recovery(None, down)
