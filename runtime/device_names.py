"""The spelling of a device, auto | KIND[:N], checked without importing torch or any accelerator plugin (so
`serve`'s master can refuse a misspelt device before it starts a worker)."""

from __future__ import annotations

import re
from typing import Iterable

from vllm_sr_runtime.errors import UnsupportedDeviceError

DEVICE_PATTERN = re.compile(r"^([a-z][a-z0-9_]*)(?::(\d+))?$")


def split_device_name(text: str, kinds: Iterable[str], shown: str | None = None) -> tuple[str, int | None]:
    """(kind, index or None) of `text`, whose kind must be `auto` or one of `kinds` (accelerator plugin names).
    `shown` is how the error lists them (default: the names)."""
    kinds = list(kinds)
    match = DEVICE_PATTERN.match(text.strip().lower()) if isinstance(text, str) else None
    if not match or (match.group(1) != "auto" and match.group(1) not in kinds):
        raise UnsupportedDeviceError(f"device {text!r} is not one of auto, {shown or ', '.join(kinds)}")
    kind, index = match.group(1), match.group(2)
    if kind == "auto" and index is not None:
        raise UnsupportedDeviceError("auto takes no device index")
    return kind, None if index is None else int(index)
