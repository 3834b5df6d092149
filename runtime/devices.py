"""Device selection: auto | cpu | cuda[:N] | rocm[:N]; an absent device is a clear error."""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from vllm_sr_runtime.errors import UnsupportedDeviceError

DEVICE_PATTERN = re.compile(r"^(auto|cpu|cuda|rocm)(?::(\d+))?$")


@dataclass(frozen=True)
class Device:
    kind: str  # cpu | cuda | rocm
    index: int | None

    @property
    def torch_device(self) -> torch.device:
        if self.kind == "cpu":
            return torch.device("cpu")
        return torch.device("cuda", self.index or 0)  # HIP devices are torch's "cuda" too

    @property
    def device_class(self) -> str:
        return "cpu" if self.kind == "cpu" else "gpu"

    @property
    def name(self) -> str:
        return self.kind if self.index is None else f"{self.kind}:{self.index}"


def _gpu_flavour() -> str | None:
    if not torch.cuda.is_available():
        return None
    return "rocm" if getattr(torch.version, "hip", None) else "cuda"


def parse_device(text: str, *, probe=_gpu_flavour, count=lambda: torch.cuda.device_count()) -> Device:
    match = DEVICE_PATTERN.match(text.strip().lower())
    if not match:
        raise UnsupportedDeviceError(f"device {text!r} is not one of auto, cpu, cuda[:N], rocm[:N]")
    kind, index = match.group(1), match.group(2)
    if kind == "cpu":
        if index is not None:
            raise UnsupportedDeviceError("cpu takes no device index")
        return Device("cpu", None)
    flavour = probe()
    if kind == "auto":
        if index is not None:
            raise UnsupportedDeviceError("auto takes no device index")
        return Device(flavour, 0) if flavour else Device("cpu", None)
    if flavour != kind:
        have = f"this torch build sees {flavour} devices" if flavour else "no GPU is visible to this torch build"
        raise UnsupportedDeviceError(f"device {text} is not available: {have}")
    number = int(index or 0)
    if number >= count():
        raise UnsupportedDeviceError(f"device {text} is not available: {count()} {kind} device(s) visible")
    return Device(kind, number)
