"""Stopping a run that nobody waits for any more (its client left, its deadline passed): the model runs none of its
passes still to come, and an engine that can ends the pass in flight early (ONNX Runtime's terminate flag, a check
before each module a torch pass calls)."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Iterator


class Interrupted(Exception):
    """A run, or the pass in flight, stopped early because its Interrupt was set; it has no answers."""


class Interrupt:
    """A run's stop signal: set once, from any thread. Engines ask to be told (`calls`) where they cannot poll."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._set = False
        self._hooks: list[Callable[[], None]] = []

    def set(self) -> None:
        with self._lock:
            if self._set:
                return
            self._set = True
            hooks = list(self._hooks)
        for hook in hooks:
            hook()

    def is_set(self) -> bool:
        return self._set

    def check(self) -> None:
        """Raises Interrupted once set."""
        if self._set:
            raise Interrupted("nobody waits for this run's answers any more")

    @contextmanager
    def calls(self, hook: Callable[[], None]) -> Iterator[None]:
        """While inside, `hook` runs (on the setting thread) when this is set; at once if it is set already."""
        with self._lock:
            registered = not self._set
            if registered:
                self._hooks.append(hook)
        if not registered:
            hook()
        try:
            yield
        finally:
            if registered:
                with self._lock:
                    self._hooks.remove(hook)


class Interruptible:
    """What an engine that can stop a pass in flight shares: `interruptible(interrupt)` makes `self.interrupt` the
    interrupt its passes watch while inside (vllm_sr_runtime.engines.Engine)."""

    interrupt: Interrupt | None = None

    @contextmanager
    def interruptible(self, interrupt: Interrupt) -> Iterator[None]:
        self.interrupt = interrupt
        try:
            yield
        finally:
            self.interrupt = None
