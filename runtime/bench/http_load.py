"""HTTP mode: closed-loop clients against a running server (TCP URL or Unix socket), bounded in time and count."""

from __future__ import annotations

import http.client
import itertools
import json
import random
import socket
import threading
import time
from typing import Any
from urllib.parse import urlparse

import numpy as np

TEMPLATES = [
    {"state": "Write a Python function that merges two sorted lists.", "questions": {"domain": {"type": "choice", "instructions": "Which domain?", "criteria": {"code": "Programming", "math": "Math", "law": None}}}},
    {"state": {"user": "Is it safe to mix bleach and ammonia?", "lang": "en"}, "questions": {"unsafe": {"type": "noul", "instructions": "Is the request unsafe?"}, "difficulty": {"type": "score", "criteria": ["easy", "medium", "hard"]}}},
    {"state": "Plan a three-day trip to Kyoto on a budget.", "questions": {f"q{i}": {"type": "noul", "instructions": f"Does it mention topic {i}?"} for i in range(4)}},
]
MAX_REQUESTS_PER_CLIENT = 10_000


def distinct_request(template: dict, number: int) -> dict:
    """The template with the request's own number in its state: the server's result cache answers rows it has
    seen without a forward pass, so repeated bodies would measure the cache, not the model."""
    state = template["state"]
    return {**template, "state": {**state, "request": number} if isinstance(state, dict) else f"{state} (request {number})"}


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.socket_path)


def _connection(url: str | None, uds: str | None, timeout: float) -> http.client.HTTPConnection:
    if uds:
        return UnixConnection(uds, timeout)
    parsed = urlparse(url)
    return http.client.HTTPConnection(parsed.hostname, parsed.port or 80, timeout=timeout)


def wait_until_settled(url: str | None, uds: str | None, timeout_s: float = 900.0, on_wait=None) -> list[str] | None:
    """Something answers HTTP there (any status), and its models have settled: a server of the first start answers
    503 "loading" while they load, and every request of the load would count as an error meanwhile. A server whose
    models all failed is refused; one with some ready (degraded) is measured as it serves. Returns the names of the
    ready models, or None where what answers is not this runtime's /health."""
    deadline, told = time.monotonic() + timeout_s, False
    while True:
        conn = _connection(url, uds, timeout=10.0)
        try:
            conn.request("GET", "/health")
            response = conn.getresponse()
            body = response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise ValueError(f"nothing answers HTTP at {url or 'unix:' + str(uds)} ({exc}): start the server (vllm-sr-runtime serve) first") from None
        finally:
            conn.close()
        try:
            health = json.loads(body)
        except ValueError:
            return None  # not this runtime's /health: measure what answers
        status = health.get("status") if isinstance(health, dict) else None
        if status == "failed":
            raise ValueError(f"the server's models failed to load, nothing to measure: {json.dumps(health.get('models'))}")
        if status != "loading":
            return ready_models(health)
        if time.monotonic() > deadline:
            raise ValueError(f"the server's models were still loading after {timeout_s:g} s: {json.dumps(health.get('models'))}")
        if on_wait is not None and not told:
            on_wait("waiting for the server's models to load (/health 503 loading)")
            told = True
        time.sleep(0.5)


def ready_models(health: Any) -> list[str] | None:
    models = health.get("models") if isinstance(health, dict) else None
    if not isinstance(models, dict):
        return None
    return [name for name, entry in models.items() if isinstance(entry, dict) and entry.get("status") == "ready"]


def targets(chosen: list[str] | None, ready: list[str] | None) -> list[str | None]:
    """The model each request names, in turn: the ones asked for, else every ready model of the server (a server
    of several answers 400 to a request that names none). None: the request names no model."""
    if chosen:
        return list(chosen)
    return list(ready) if ready else [None]


def run_http(
    url: str | None, uds: str | None, concurrency: list[int], duration: float, progress, on_wait=None, settle_timeout_s: float = 900.0,
    models: list[str] | None = None,
) -> list[dict]:
    """Closed-loop load at each concurrency; requests go to `models` in turn (default: every ready model). A level
    at which no request succeeded stops the run with the server's first error: its numbers would measure nothing."""
    names = targets(models, wait_until_settled(url, uds, settle_timeout_s, on_wait))
    numbers = itertools.count()  # one sequence for the whole run: the cache outlives a concurrency level
    rows = []
    for clients in concurrency:
        latencies: list[float] = []
        statuses: dict[str, int] = {}
        answered = {name: 0 for name in names}
        first_errors: dict[str, str] = {}
        lock = threading.Lock()
        end = time.time() + duration

        def client(seed: int) -> None:
            rng = random.Random(seed)
            conn = _connection(url, uds, timeout=max(30.0, duration))
            for _ in range(MAX_REQUESTS_PER_CLIENT):
                if time.time() >= end:
                    break
                number = next(numbers)
                name = names[number % len(names)]
                request = distinct_request(rng.choice(TEMPLATES), number)
                body = json.dumps(request if name is None else {"model": name, **request}).encode()
                start = time.perf_counter()
                try:
                    conn.request("POST", "/v1/systemone", body=body, headers={"Content-Type": "application/json"})
                    response = conn.getresponse()
                    answer = response.read()
                    key = str(response.status)
                except (OSError, http.client.HTTPException) as exc:
                    key, answer = "error", repr(exc).encode()
                    conn.close()
                    conn = _connection(url, uds, timeout=max(30.0, duration))
                elapsed = time.perf_counter() - start
                with lock:
                    statuses[key] = statuses.get(key, 0) + 1
                    if key == "200":
                        latencies.append(elapsed)
                        answered[name] += 1
                    elif key != "429":
                        first_errors.setdefault(key, answer[:500].decode(errors="replace"))
            conn.close()

        threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=duration + 120)
        wall = time.perf_counter() - started
        ok = statuses.get("200", 0)
        if ok == 0 and first_errors:
            raise ValueError(f"no request succeeded at concurrency {clients} ({statuses}); the server answered: " + "; ".join(f"{k}: {v}" for k, v in first_errors.items()))
        rows.append(
            {
                "profile": "server", "length": None, "questions": None, "concurrency": clients,
                "median_ms": float(np.median(latencies)) * 1000 if latencies else None,
                "p90_ms": float(np.quantile(latencies, 0.9)) * 1000 if latencies else None,
                "p99_ms": float(np.quantile(latencies, 0.99)) * 1000 if latencies else None,
                "rps": ok / wall, "ratio_to_exact": None, "gflops": None, "fraction_of_limit": None,
                "statuses": statuses, "errors": sum(v for k, v in statuses.items() if k != "200" and k != "429"),
                "first_errors": first_errors, "rps_per_model": {name: count / wall for name, count in answered.items() if name is not None},
            }
        )  # fmt: skip
        progress()
    return rows
