"""ONNX Runtime's optimized graph, saved on a session's first open and loaded as is on later opens.

ORT re-runs every graph transformer (fusions, constant folding, layout) each time a session opens. The
optimized graph it can write out is tied to the ORT build, the execution provider and the CPU, so the
cache key holds all three next to the artifact's files' identity; anything that differs makes a new entry.
An entry is about as large as the artifact (fp32: ~4 bytes a parameter), and nothing else would ever remove one
whose key stopped matching (a re-exported or deleted artifact, an ORT upgrade, another rewrite), so each store also
removes the entries that cannot open again (their artifact's files changed: each entry records what it was keyed by
in `entry.json`) and those unused for a week (an artifact not on this filesystem may be another host's, in a shared
cache; a hit marks an entry used), and staging an interrupted store left.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from vllm_sr_runtime.cpu_features import cpu_flags

OPTIMIZED_FILE, OPTIMIZED_DATA = "optimized.onnx", "optimized.onnx.data"
ENTRY_FILE = "entry.json"
STAGING_ABANDONED_S = 24 * 3600  # a store in progress writes its staging now; one this old was interrupted
UNUSED_S = 7 * 24 * 3600


def entry_identity(model_path: Path, provider: str, rewrite: str = "") -> dict:
    """What an entry is keyed by: the model file's and its data file's identity (name, size, mtime), the ORT
    version, provider and CPU, and the load-time rewrite applied to the graph, if any."""
    import onnxruntime as ort

    identity = {
        "model": str(Path(model_path).resolve()),
        "files": _files(Path(model_path)),
        "ort": ort.__version__,
        "provider": provider,
        "cpu": hashlib.sha256(cpu_flags().encode()).hexdigest()[:16],
    }
    if rewrite:
        identity["rewrite"] = rewrite
    return identity


def key_of(identity: dict) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]


def _files(model_path: Path) -> list[list]:
    """[name, size, mtime] of the model file and the files named after it (its external data)."""
    files = sorted(p for p in model_path.parent.iterdir() if p.name.startswith(model_path.name))
    return [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files]


def cached_model(cache_root: Path, key: str) -> Path | None:
    """The entry's graph, its use recorded (the entry's mtime: what keeps an entry another host uses)."""
    path = cache_root / key / OPTIMIZED_FILE
    if not path.is_file():
        return None
    try:
        os.utime(path.parent)
    except OSError:  # a read-only cache still serves
        pass
    return path


def open_and_save(open_with, options, cache_root: Path, key: str, identity: dict | None = None):
    """Open a session with `options` while ORT writes the optimized graph into a private directory, then
    publish that directory under `key` in one rename (concurrent first opens: one wins, all sessions work).
    `identity` (what `entry_identity` returned for `key`) is recorded beside the graph; then `remove_stale`."""
    cache_root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=cache_root))
    options.optimized_model_filepath = str(staging / OPTIMIZED_FILE)
    options.add_session_config_entry("session.optimized_model_external_initializers_file_name", OPTIMIZED_DATA)
    options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    try:
        session = open_with(options)
        if (staging / OPTIMIZED_FILE).is_file():
            if identity is not None:
                (staging / ENTRY_FILE).write_text(json.dumps(identity, sort_keys=True))
            mask = os.umask(0)
            os.umask(mask)
            os.chmod(staging, 0o777 & ~mask)  # mkdtemp is private; other users of the cache read it too
            try:
                os.rename(staging, cache_root / key)
            except OSError:  # another process published it first
                pass
            remove_stale(cache_root)
        return session
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def remove_stale(cache_root: Path) -> list[str]:
    """Remove the entries whose artifact's files changed, those unused for a week, and staging directories a day
    old. Returns the names removed."""
    removed = []
    for entry in sorted(cache_root.iterdir()):
        if not entry.is_dir():
            continue
        if entry.name.startswith("."):
            stale = _age_s(entry) > STAGING_ABANDONED_S
        else:
            stale = _still_opens(entry) is False or _age_s(entry) > UNUSED_S
        if stale:
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry.name)
    return removed


def _still_opens(entry: Path) -> bool | None:
    """False: the artifact's files here differ from the entry's; True: they match; None: cannot tell."""
    try:
        identity = json.loads((entry / ENTRY_FILE).read_text())
        model = Path(identity["model"])
        if not model.is_file():
            return None
        return _files(model) == identity["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _age_s(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return 0.0
