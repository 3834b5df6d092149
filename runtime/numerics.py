"""The numerics policy: one table, per family and device class (DESIGN.md, spec 3.1 / 3.2)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Numerics:
    parameter_dtype: torch.dtype  # backbone parameters as resident on the device
    autocast_dtype: torch.dtype | None  # autocast around the backbone, None = off
    readout_dtype: torch.dtype = torch.float32  # heads and softmax

    @property
    def label(self) -> str:
        names = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
        text = names[self.parameter_dtype]
        if self.autocast_dtype is not None:
            text += f"+autocast-{names[self.autocast_dtype]}"
        return text


POLICY: dict[tuple[str, str], Numerics] = {
    # CPU: FP32 everywhere (BF16-stored weights upcast once at load).
    ("decision2", "cpu"): Numerics(torch.float32, None),
    ("decision3", "cpu"): Numerics(torch.float32, None),
    # GPU: Decision 2.0 runs BF16-resident Linear weights under BF16 autocast; Decision 3.0 BF16 parameters,
    # no autocast. Heads, readout and softmax stay FP32 for both.
    ("decision2", "gpu"): Numerics(torch.bfloat16, torch.bfloat16),
    ("decision3", "gpu"): Numerics(torch.bfloat16, None),
}


def numerics_for(family: str, device_class: str) -> Numerics:
    return POLICY[(family, device_class)]
