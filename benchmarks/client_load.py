"""The clients of benchmarks.no_request_lost: PLAIN_CLIENTS + STREAM_CLIENTS threads that keep asking the lab's
front, each in a loop until stopped, every request recorded (Req); the same as an application asks it (OpenAILoad:
OpenAI's Python client, its retries off, each thread's connection kept alive); and what one run of them gives
(figures).
"""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
import urllib.error
import urllib.parse
from collections import Counter
from dataclasses import asdict, dataclass

import openai

try:  # pyinfra_cli (the inventory loader) would turn this process's threads into greenlets: the clients are threads
    from gevent import monkey
except ImportError:
    pass
else:
    monkey.patch_all = lambda *args, **kwargs: None

from llama_rpc_deploy import client  # noqa: E402
from llama_rpc_deploy.cluster import api_key  # noqa: E402

CLIENT_TIMEOUT = 300
PLAIN_CLIENTS, STREAM_CLIENTS = 3, 1
PLAIN_TOKENS, STREAM_TOKENS = 16, 32
OPENAI_CLIENTS, OPENAI_TOKENS = 4, 16  # OpenAILoad: threads (half of them stream), max_tokens of each request
SERVED_BOUND = 240  # seconds a case waits, after its fault, for every client to be served again


# --- the clients ----------------------------------------------------------------------------------------


@dataclass
class Req:
    client: int
    kind: str  # "plain" (non-streamed /completion) or "stream" (streamed /v1/chat/completions)
    start: float  # seconds since the load started
    end: float
    ok: bool
    error: str = ""
    tokens: int = 0
    ttft: float | None = None  # streamed: seconds to the first token
    model: str | None = None


class Load:
    """PLAIN_CLIENTS + STREAM_CLIENTS threads, started together, each in a loop until stop()."""

    def __init__(self, cluster, models: list[str] | None = None, n: int = PLAIN_CLIENTS + STREAM_CLIENTS):
        self.cluster, self.models = cluster, models
        self.requests: list[Req] = []
        self.lock, self.stopping = threading.Lock(), threading.Event()
        self.n = n
        self.barrier = threading.Barrier(self.n + 1)
        self.threads = [threading.Thread(target=self.loop, args=(i,), daemon=True) for i in range(self.n)]
        url = urllib.parse.urlsplit(client.server_url(cluster))
        self.host, self.port = url.hostname, url.port
        self.t0 = self.wall0 = 0.0

    def start(self) -> "Load":
        for thread in self.threads:
            thread.start()
        self.barrier.wait()
        self.t0, self.wall0 = time.monotonic(), time.time()
        return self

    def now(self) -> float:
        return time.monotonic() - self.t0

    def wall(self, t: float) -> float:
        return self.wall0 + t

    def kind(self, index: int) -> str:
        return "stream" if index >= PLAIN_CLIENTS else "plain"

    def ask(self, index: int, i: int, model: str | None, begin: float, kind: str) -> Req:
        return self.stream(index, i, model, begin) if kind == "stream" else self.plain(index, i, model, begin)

    def loop(self, index: int) -> None:
        self.barrier.wait()
        kind = self.kind(index)
        i = 0
        while not self.stopping.is_set():
            model = self.models[(index + i) % len(self.models)] if self.models else None
            begin = time.monotonic() - self.t0
            request = self.ask(index, i, model, begin, kind)
            with self.lock:
                self.requests.append(request)
            if not request.ok:
                time.sleep(0.5)
            i += 1

    def plain(self, index: int, i: int, model: str | None, begin: float) -> Req:
        try:
            reply = client.complete(
                self.cluster,
                f"Tell me about computers ({index}.{i})",
                PLAIN_TOKENS,
                timeout=CLIENT_TIMEOUT,
                model=model,
            )
            tokens = reply.get("timings", {}).get("predicted_n", 0)
            ok = isinstance(reply.get("content"), str) and tokens > 0
            return Req(
                index,
                "plain",
                begin,
                self.now(),
                ok,
                "" if ok else f"odd reply {str(reply)[:120]}",
                tokens=tokens,
                model=model,
            )
        except urllib.error.HTTPError as error:
            body = error.read()[:160].decode(errors="replace")
            return Req(index, "plain", begin, self.now(), False, f"HTTP {error.code}: {body}", model=model)
        except Exception as error:  # a failed request is data here
            return Req(index, "plain", begin, self.now(), False, f"{type(error).__name__}: {error}"[:200], model=model)

    def stream(self, index: int, i: int, model: str | None, begin: float) -> Req:
        body = {
            **client.model_field(self.cluster, model),
            "temperature": 0,
            "max_tokens": STREAM_TOKENS,
            "stream": True,
            "messages": [{"role": "user", "content": f"Tell me about computers ({index}.{i})"}],
        }
        tokens, ttft, finished, done = 0, None, False, False
        connection = http.client.HTTPConnection(self.host, self.port, timeout=CLIENT_TIMEOUT)
        try:
            connection.request("POST", "/v1/chat/completions", json.dumps(body), client.headers(self.cluster))
            response = connection.getresponse()
            if response.status != 200:
                text = response.read()[:160].decode(errors="replace")
                return Req(index, "stream", begin, self.now(), False, f"HTTP {response.status}: {text}", model=model)
            buffer = b""
            while True:  # to the end of the answer (its last chunk), [DONE] or not
                chunk = response.read1(65536)  # a stream cut before its last chunk raises IncompleteRead here
                if not chunk:
                    break
                buffer += chunk
                while b"\n" in buffer and not done:
                    line, buffer = buffer.split(b"\n", 1)
                    line = line.strip()
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        done = True
                        break
                    event = json.loads(data)
                    if "error" in event:
                        return Req(
                            index,
                            "stream",
                            begin,
                            self.now(),
                            False,
                            f"error event after {tokens} tokens: {json.dumps(event['error'])[:140]}",
                            tokens,
                            ttft,
                            model,
                        )
                    choice = (event.get("choices") or [{}])[0]
                    if choice.get("delta", {}).get("content"):
                        tokens += 1
                        ttft = ttft if ttft is not None else self.now() - begin
                    finished = finished or bool(choice.get("finish_reason"))
            ok = done and finished
            error = (
                ""
                if ok
                else f"stream ended without {'[DONE]' if not done else 'a finish_reason'} after {tokens} tokens"
            )
            return Req(index, "stream", begin, self.now(), ok, error, tokens, ttft, model)
        except Exception as error:
            return Req(
                index,
                "stream",
                begin,
                self.now(),
                False,
                f"{type(error).__name__} after {tokens} tokens: {error}"[:200],
                tokens,
                ttft,
                model,
            )
        finally:
            connection.close()

    def served_since(self, t: float) -> set[int]:
        """Clients with a request sent at or after t and answered."""
        with self.lock:
            return {r.client for r in self.requests if r.ok and r.start >= t}

    def until_every_client_served(self, t: float, bound: float = SERVED_BOUND, settle: float = 2.0) -> bool:
        """Keep the load until every client was answered a request sent at or after t (bounded), then settle s."""
        deadline = time.monotonic() + bound
        while len(self.served_since(t)) < self.n:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        time.sleep(settle)
        return True

    def stop(self) -> list[Req]:
        self.stopping.set()
        for thread in self.threads:
            thread.join(CLIENT_TIMEOUT + 30)
        with self.lock:
            return sorted(self.requests, key=lambda r: r.start)


class OpenAILoad(Load):
    """As an application asks: `threads` threads, each with one `openai.OpenAI(max_retries=0)` of its own (its pool
    keeps the connection to the front alive between requests), the first half sending non-streamed chat
    completions, the other half streamed ones, OPENAI_TOKENS each. A streamed request counts as answered only when
    a chunk had a finish_reason and the stream ended (the client reads up to `data: [DONE]`) without an error."""

    def __init__(self, cluster, models: list[str] | None = None, threads: int = OPENAI_CLIENTS):
        super().__init__(cluster, models, threads)
        key = api_key(cluster) if cluster.settings["llama_api_key_file"] else "none"
        self.clients = [
            openai.OpenAI(
                base_url=client.server_url(cluster) + "/v1", api_key=key, max_retries=0, timeout=CLIENT_TIMEOUT
            )
            for _ in range(self.n)
        ]

    def kind(self, index: int) -> str:
        return "stream" if index >= self.n // 2 else "plain"

    def ask(self, index: int, i: int, model: str | None, begin: float, kind: str) -> Req:
        stream = kind == "stream"
        tokens, ttft, finished = 0, None, False
        try:
            answer = self.clients[index].chat.completions.create(
                model=client.model_field(self.cluster, model).get("model", "default"),
                messages=[{"role": "user", "content": f"Tell me about computers ({index}.{i})"}],
                max_tokens=OPENAI_TOKENS,
                temperature=0,
                stream=stream,
            )
            if not stream:
                content = answer.choices[0].message.content if answer.choices else None
                tokens = answer.usage.completion_tokens if answer.usage else 0
                ok = isinstance(content, str) and tokens > 0
                error = "" if ok else f"odd reply {str(answer)[:120]}"
                return Req(index, kind, begin, self.now(), ok, error, tokens=tokens, model=model)
            with answer:
                for chunk in answer:
                    choice = chunk.choices[0] if chunk.choices else None
                    if choice is None:
                        continue
                    if choice.delta and choice.delta.content:
                        tokens += 1
                        ttft = ttft if ttft is not None else self.now() - begin
                    finished = finished or bool(choice.finish_reason)
            error = "" if finished else f"stream ended without a finish_reason after {tokens} tokens"
            return Req(index, kind, begin, self.now(), finished, error, tokens, ttft, model)
        except Exception as error:  # openai.APIStatusError (an HTTP error), APIConnectionError (no answer, a cut)
            status = getattr(error, "status_code", None)
            what = f"HTTP {status}" if status else type(error).__name__
            return Req(
                index,
                kind,
                begin,
                self.now(),
                False,
                f"{what} after {tokens} tokens: {error}"[:200],
                tokens,
                ttft,
                model,
            )


# --- what one run of a case gives ----------------------------------------------------------------------


def figures(reqs: list[Req], fault: float, heal: float | None = None) -> dict:
    """sent/failed per kind; the longest time without an answer from the fault on, and the first answer once
    the fault took effect (the end of that stretch), from the fault (or, for a cut, the first after the heal)."""
    plain = [r for r in reqs if r.kind == "plain"]
    stream = [r for r in reqs if r.kind == "stream"]
    ends = sorted(r.end for r in reqs if r.ok and r.end > fault)
    points = [fault] + ends
    gaps = [(points[i], points[i + 1] - points[i]) for i in range(len(points) - 1)]
    longest = max(gaps, key=lambda g: g[1], default=(fault, None))
    f = {
        "sent": len(reqs),
        "sent_plain": len(plain),
        "sent_stream": len(stream),
        "failed": sum(not r.ok for r in reqs),
        "failed_plain": sum(not r.ok for r in plain),
        "failed_stream": sum(not r.ok for r in stream),
        "streams_cut": sum(not r.ok and r.tokens > 0 for r in stream),  # failed after some tokens: cut mid-way
        "errors": dict(Counter(re.sub(r"\d+(\.\d+)?", "N", r.error)[:120] for r in reqs if not r.ok)),
        "failed_requests": [asdict(r) for r in reqs if not r.ok][:20],
        "longest_request_s": round(max((r.end - r.start for r in reqs), default=0), 2),
        "longest_plain_s": round(max((r.end - r.start for r in plain), default=0), 2),
        "longest_stream_s": round(max((r.end - r.start for r in stream), default=0), 2),
        "streams_in_flight_at_fault": sum(r.start <= fault < r.end for r in stream),
        "longest_no_answer_s": round(longest[1], 2) if longest[1] is not None else None,
        "no_answer_from_s": round(longest[0], 2),
        "first_answer_s": round(longest[0] + longest[1] - fault, 2) if longest[1] is not None else None,
        "stretches_over_1s": [[round(a, 2), round(b, 2)] for a, b in gaps if b > 1.0][:20],
        "tokens_per_s_all": round(
            sum(r.tokens for r in reqs if r.ok) / max(1e-9, max((r.end for r in reqs), default=1)), 1
        ),
    }
    if heal is not None:
        after = [e for e in ends if e > heal]
        f["first_answer_after_heal_s"] = round(after[0] - heal, 2) if after else None
    return f
