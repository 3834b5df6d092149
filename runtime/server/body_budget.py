"""The bytes of request bodies a worker's in-flight requests hold, bounded: a request thread waits for its forward
holding its body, and a worker has a thread for every request its queues take, so without a bound a burst of large
bodies (base64 images, up to --max-request-bytes each) would hold hundreds of them."""

from __future__ import annotations

import threading
from collections.abc import Callable

from vllm_sr_runtime.errors import Overloaded


class BodyBudget:
    def __init__(self, limit: int, on_held: Callable[[int], None] = lambda held: None):
        """`on_held` is told the bytes held after every change (a gauge)."""
        self.limit, self.held, self.lock, self.on_held = limit, 0, threading.Lock(), on_held

    def reserve(self, size: int) -> "Holding":
        """Holds `size` bytes until the holding is released, or refuses the request (429) where the bodies in flight
        already hold the rest; a request alone is never refused, whatever its size (the per-request limit judges it)."""
        with self.lock:
            if self.held and self.held + size > self.limit:
                raise Overloaded(
                    f"this worker's requests in flight hold {self.held} bytes of bodies and this one may take {size} "
                    f"(--max-inflight-request-bytes {self.limit}); retry later",
                    "inflight_bytes",
                )
            self.held += size
            self.on_held(self.held)
        return Holding(self, size)


class Holding:
    """One request's share of the budget: what was reserved before its body was read, then what it read."""

    def __init__(self, budget: BodyBudget, size: int):
        self.budget, self.size = budget, size

    def settle(self, size: int) -> None:
        """The body is read: hold what it is (a body of unknown length, or compressed, reserved the limit)."""
        with self.budget.lock:
            self.budget.held += size - self.size
            self.size = size
            self.budget.on_held(self.budget.held)

    def release(self) -> None:
        with self.budget.lock:
            self.budget.held -= self.size
            self.size = 0
            self.budget.on_held(self.budget.held)
