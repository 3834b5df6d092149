"""Reads a safetensors header without loading tensors (parameter counts for verification)."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

from vllm_sr_runtime.errors import PackageError

MAX_HEADER_BYTES = 100 * 1024 * 1024


def safetensors_header(path: Path, rel: str | None = None) -> dict[str, dict]:
    name = rel or str(path)
    with open(path, "rb") as handle:
        prefix = handle.read(8)
        if len(prefix) != 8:
            raise PackageError("truncated safetensors file", name)
        (length,) = struct.unpack("<Q", prefix)
        if length > MAX_HEADER_BYTES:
            raise PackageError("safetensors header is implausibly large", name)
        raw = handle.read(length)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise PackageError("safetensors header is not valid JSON", name) from None
    header.pop("__metadata__", None)
    return header


def safetensors_data_start(path: Path) -> int:
    """Byte offset where the tensors' data begins (after the 8-byte length and the JSON header)."""
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
    return 8 + length


def safetensors_element_count(path: Path, rel: str | None = None, prefix: str | None = None) -> int:
    header = safetensors_header(path, rel)
    return sum(
        math.prod(entry["shape"]) for key, entry in header.items() if prefix is None or key.startswith(prefix)
    )
