"""A memory budget for the weights the models of one process hold (`load(..., memory_budget_bytes=)`, serve
--memory-budget): a model is refused before its weights load when the engine plugin's estimate for it passes what
is left, and again, released, when what its built engine holds does."""

from __future__ import annotations

import threading
from typing import Any

from vllm_sr_runtime.errors import MemoryBudgetExceeded
from vllm_sr_runtime.plugins import plugin
from vllm_sr_runtime.profiles import engine_plugin_for, profile_named

GIB = 1024**3


def estimate_weight_bytes(profile_name: str, family: Any, device: Any, artifact: Any = None, cache_dir: Any = None) -> int | None:
    """The weights the profile's engine plugin expects to hold for `family` on `device`, before it is built (its
    builder's optional `expected_weight_bytes`); None where the plugin does not say."""
    estimate = getattr(plugin("engine", engine_plugin_for(profile_name, family, artifact)), "expected_weight_bytes", None)
    if estimate is None:
        return None
    return estimate(family, device, profile_named(profile_name), artifact=artifact, cache_dir=cache_dir)


def check_weight_budget(needed: int | None, budget: int | None, subject: str, measured: bool) -> None:
    """Raise MemoryBudgetExceeded when `needed` bytes of weights pass `budget` (None: unknown or no budget)."""
    if needed is None or budget is None or needed <= budget:
        return
    how = "hold" if measured else "need (estimated before loading)"
    raise MemoryBudgetExceeded(
        f"{subject}: its weights {how} {size(needed)} and the memory budget has {size(max(budget, 0))} left: "
        "raise --memory-budget, serve fewer models or workers, or a smaller dtype (an int8 or fp16 artifact)",
        needed,
        budget,
    )


def size(count: int) -> str:
    return f"{count / GIB:.2f} GiB ({count:,} bytes)"


class WeightBudget:
    """What one worker's models may still take of its budget: its share of serve's --memory-budget."""

    def __init__(self, total: int):
        self.total = total
        self.held = 0
        self.lock = threading.Lock()

    def remaining(self) -> int:
        with self.lock:
            return self.total - self.held

    def hold(self, weight_bytes: int | None) -> None:
        with self.lock:
            self.held += weight_bytes or 0
