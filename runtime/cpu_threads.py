"""How many threads one process's compute may use on the CPU, and how `serve` shares the cores among its workers."""

from __future__ import annotations

import os
from collections.abc import Collection

THREADS_ENV = "OMP_NUM_THREADS"  # torch's OpenMP pool reads it when it starts; ONNX Runtime sessions get cpu_threads()
WAIT_POLICY_ENV = "OMP_WAIT_POLICY"


def cpu_affinity() -> int:
    """The CPUs this process may run on (containers, cpusets), not the host's count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def cpu_threads() -> int:
    """The process's CPU affinity, or fewer where OMP_NUM_THREADS says so."""
    value = os.environ.get(THREADS_ENV, "").strip()
    if value.isdigit() and int(value) > 0:
        return min(cpu_affinity(), int(value))
    return cpu_affinity()


def share_among_workers(workers: int, ours: Collection[str] = ()) -> dict[str, str]:
    """Before serve forks a worker: where there are several, each gets its share of the CPUs (at least one thread)
    through OMP_NUM_THREADS, and torch's OpenMP threads wait passively (OMP_WAIT_POLICY) instead of spinning on cores
    the other workers need; what the user set stays. `ours` names what an earlier call set, which is set again for
    the count now (gunicorn's TTIN and TTOU change it between forks). Returns what was set."""
    if workers <= 1 and not ours:
        return {}
    wanted = {THREADS_ENV: str(max(1, cpu_affinity() // max(1, workers))), WAIT_POLICY_ENV: "PASSIVE"}
    chosen = {key: value for key, value in wanted.items() if key in ours or not os.environ.get(key)}
    os.environ.update(chosen)
    return chosen
