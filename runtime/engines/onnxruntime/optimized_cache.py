"""ONNX Runtime's optimized graph, saved on a session's first open and loaded as is on later opens.

ORT re-runs every graph transformer (fusions, constant folding, layout) each time a session opens. The
optimized graph it can write out is tied to the ORT build, the execution provider and the CPU, so the
cache key holds all three next to the artifact's own hash; anything that differs makes a new entry.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import tempfile
from pathlib import Path

OPTIMIZED_FILE, OPTIMIZED_DATA = "optimized.onnx", "optimized.onnx.data"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def cache_key(model_path: Path, provider: str, rewrite: str = "") -> str:
    """The model file's and its data file's identity (size, mtime, name) + ORT version, provider and CPU, and
    the load-time rewrite applied to the graph, if any."""
    import onnxruntime as ort

    files = sorted(p for p in Path(model_path).parent.iterdir() if p.name.startswith(Path(model_path).name))
    identity = {
        "model": str(Path(model_path).resolve()),
        "files": [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files],
        "ort": ort.__version__,
        "provider": provider,
        "cpu": hashlib.sha256(_cpu_flags().encode()).hexdigest()[:16],
    }
    if rewrite:
        identity["rewrite"] = rewrite
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]


def cached_model(cache_root: Path, key: str) -> Path | None:
    path = cache_root / key / OPTIMIZED_FILE
    return path if path.is_file() else None


def open_and_save(open_with, options, cache_root: Path, key: str):
    """Open a session with `options` while ORT writes the optimized graph into a private directory, then
    publish that directory under `key` in one rename (concurrent first opens: one wins, all sessions work)."""
    cache_root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=cache_root))
    options.optimized_model_filepath = str(staging / OPTIMIZED_FILE)
    options.add_session_config_entry("session.optimized_model_external_initializers_file_name", OPTIMIZED_DATA)
    options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    try:
        session = open_with(options)
        if (staging / OPTIMIZED_FILE).is_file():
            mask = os.umask(0)
            os.umask(mask)
            os.chmod(staging, 0o777 & ~mask)  # mkdtemp is private; other users of the cache read it too
            try:
                os.rename(staging, cache_root / key)
            except OSError:  # another process published it first
                pass
        return session
    finally:
        shutil.rmtree(staging, ignore_errors=True)
