"""`bench --mode export`: each export in a child process of its own, so its peak RSS is its alone; the
artifact's per-phase wall time and peak RSS (recorded by the exporter) next to the whole run's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_export(package: str, dtype: str, *, smoke: str, variant: str, extra: list[str]) -> dict:
    """One `vllm-sr-runtime export` in a child process; its rows: one per phase, then the whole run."""
    with tempfile.TemporaryDirectory(prefix="vsr-bench-export-") as scratch:
        out = Path(scratch) / "artifact"
        command = [
            sys.executable, "-m", "vllm_sr_runtime.cli", "export", package, "--out", str(out), "--dtype", dtype,
            "--variant", variant, "--smoke", smoke, "--quiet", *extra,
        ]  # fmt: skip
        log = Path(scratch) / "export.log"
        start = time.perf_counter()
        with open(log, "wb") as sink:
            child = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
            # wait4 reaps this child and reads its own resource usage: its peak RSS, nobody else's.
            _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.perf_counter() - start
        peak = usage.ru_maxrss * 1024  # kilobytes on Linux; the exporter resets it per phase, so see below
        if child.returncode != 0:
            raise RuntimeError(f"export --dtype {dtype} failed ({child.returncode}): {log.read_text(errors='replace').strip()[-2000:]}")
        manifest = json.loads((out / "artifact.json").read_text())
        size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    base = {"profile": f"export-{dtype}", "dtype": dtype, "smoke": manifest["smoke"]["ran"]}
    rows = [
        {**base, "phase": phase["name"], "seconds": phase["seconds"], "peak_rss_mb": _mb(phase["peak_rss_bytes"]), "peak_rss_scope": phase["peak_rss_scope"]}
        for phase in manifest["export"]["phases"]
    ]
    rows.append({**base, "phase": "startup", "seconds": round(seconds - sum(r["seconds"] for r in rows), 3), "peak_rss_mb": None, "peak_rss_scope": "imports, verification"})
    # The exporter resets the process's high-water mark at each phase (to measure phases), which the kernel's
    # own figure follows: the run's peak is the larger of it and every phase's.
    peak = max([peak, *(p["peak_rss_bytes"] or 0 for p in manifest["export"]["phases"])])
    rows.append({**base, "phase": "total", "seconds": round(seconds, 3), "peak_rss_mb": _mb(peak), "peak_rss_scope": "process", "artifact_mb": _mb(size)})
    return {"rows": rows, "manifest_smoke": manifest["smoke"]}


def _mb(value: int | None) -> float | None:
    return round(value / 2**20, 1) if value else None


def print_export_table(rows: list[dict]) -> None:
    print(f"{'export':>12}  {'phase':>18}  {'seconds':>9}  {'peak RSS MiB':>13}")
    for row in rows:
        peak = f"{row['peak_rss_mb']:,.0f}" if row["peak_rss_mb"] else "-"
        print(f"{row['profile']:>12}  {row['phase']:>18}  {row['seconds']:>9.1f}  {peak:>13}")
