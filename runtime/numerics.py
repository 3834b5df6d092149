"""Numerics: how a module's parameters and compute are held; each family declares its policy per device class
(DESIGN.md, spec 3.1 / 3.2). Heads, readout and softmax stay FP32 in every policy."""

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


# The policies the built-in families declare (each family's `numerics_policy`).
FP32 = Numerics(torch.float32, None)  # CPU: FP32 everywhere (BF16-stored weights upcast once at load)
BF16_AUTOCAST = Numerics(torch.bfloat16, torch.bfloat16)  # BF16-resident Linear weights under BF16 autocast
BF16 = Numerics(torch.bfloat16, None)  # BF16 parameters, no autocast
