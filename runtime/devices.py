"""Device selection: auto | KIND[:N] over the installed accelerator plugins (cpu, cuda, rocm built in); an absent
device is a clear error, and `auto`'s choice comes with its reasons (`vllm-sr-runtime devices`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch

from vllm_sr_runtime.accelerators import Accelerator
from vllm_sr_runtime.device_names import split_device_name
from vllm_sr_runtime.errors import UnsupportedDeviceError


def installed_accelerators() -> dict[str, Accelerator]:
    from vllm_sr_runtime.plugins import installed

    return installed("accelerator").objects()


@dataclass(frozen=True)
class Device:
    kind: str  # an accelerator plugin's name: cpu | cuda | rocm | ...
    index: int | None
    accelerator: Accelerator | None = None  # None: looked up among the installed plugins

    @property
    def spec(self) -> Accelerator:
        return self.accelerator or installed_accelerators()[self.kind]

    @property
    def torch_device(self) -> torch.device:
        torch_type = self.spec.torch_type
        return torch.device(torch_type) if torch_type == "cpu" else torch.device(torch_type, self.index or 0)

    @property
    def device_class(self) -> str:
        return self.spec.device_class

    @property
    def name(self) -> str:
        return self.kind if self.index is None else f"{self.kind}:{self.index}"


def auto_choice(accelerators: Mapping[str, Accelerator] | None = None) -> tuple[Device, list[str]]:
    """What `--device auto` picks: the visible kind of highest rank (GPUs before the CPU), and why."""
    accelerators = installed_accelerators() if accelerators is None else accelerators
    reasons = []
    for spec in sorted(accelerators.values(), key=lambda spec: -spec.auto_rank):
        count = spec.visible()
        if count > 0:
            device = Device(spec.kind, 0 if spec.indexed else None, spec)
            reasons.append(f"{spec.kind}: {count} visible, picked {device.name}")
            return device, reasons
        reasons.append(f"{spec.kind}: {spec.why_absent()}")
    raise UnsupportedDeviceError(f"no accelerator plugin sees a device ({'; '.join(reasons)})")


def parse_device(text: str, accelerators: Mapping[str, Accelerator] | None = None) -> Device:
    accelerators = installed_accelerators() if accelerators is None else accelerators
    shown = ", ".join(f"{kind}[:N]" if spec.indexed else kind for kind, spec in accelerators.items())
    kind, index = split_device_name(text, accelerators, shown)
    if kind == "auto":
        return auto_choice(accelerators)[0]
    spec = accelerators[kind]
    if not spec.indexed:
        if index is not None:
            raise UnsupportedDeviceError(f"{kind} takes no device index")
        return Device(kind, None, spec)
    count = spec.visible()
    if count == 0:
        raise UnsupportedDeviceError(f"device {text} is not available: {spec.why_absent()}")
    number = int(index or 0)
    if number >= count:
        raise UnsupportedDeviceError(f"device {text} is not available: {count} {kind} device(s) visible")
    return Device(kind, number, spec)
