"""Where an export's time and memory go: wall seconds and peak RSS of each phase, shown as it runs.

Peak RSS per phase uses Linux's resettable high-water mark (writing 5 to /proc/self/clear_refs resets
VmHWM); where that is not available the figure is the process's peak so far, and says so.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from tqdm import tqdm

log = logging.getLogger("vllm_sr_runtime.export")
STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_bytes(field: str) -> int | None:
    try:
        for line in STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def reset_peak_rss() -> bool:
    """Reset the process's peak RSS to its current RSS; False where the kernel does not allow it."""
    try:
        CLEAR_REFS.write_text("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int | None:
    return _status_bytes("VmHWM")


def available_memory_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (what can be allocated without swapping), None where unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


class PhaseClock:
    """Call with a phase name to start it (closing the one before); `finish()` returns every phase's
    `{name, seconds, peak_rss_bytes, peak_rss_scope}` and prints the summary line."""

    def __init__(self, bar: tqdm, progress: bool):
        self.bar = bar
        self.progress = progress
        self.phases: list[dict] = []
        self._current: tuple[str, float, str] | None = None

    def __call__(self, name: str) -> None:
        self._close()
        scope = "phase" if reset_peak_rss() else "process"
        self._current = (name, time.perf_counter(), scope)
        self.bar.set_postfix_str(name)

    def _close(self) -> None:
        if self._current is None:
            return
        name, start, scope = self._current
        self.phases.append({"name": name, "seconds": round(time.perf_counter() - start, 3), "peak_rss_bytes": peak_rss_bytes(), "peak_rss_scope": scope})
        self._current = None

    def finish(self) -> list[dict]:
        self._close()
        total = sum(p["seconds"] for p in self.phases)
        parts = ", ".join(f"{p['name']} {p['seconds']:.1f}s" for p in sorted(self.phases, key=lambda p: -p["seconds"])[:4])
        summary = f"export took {total:.1f}s; where the time went: {parts}"
        log.info(summary)  # the first use of max_speed in `serve` exports without a progress bar
        if self.progress:
            tqdm.write(summary)
        return self.phases
