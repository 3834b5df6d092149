"""The eager PyTorch engine: runs a family's module on a device."""

from __future__ import annotations

import numpy as np
import torch


class TorchEngine:
    name = "torch"

    def __init__(self, module: torch.nn.Module, device: torch.device, input_names: tuple[str, ...]):
        self.module = module
        self.device = device
        self.input_names = input_names

    def forward(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        tensors = {name: torch.from_numpy(np.ascontiguousarray(inputs[name])).to(self.device) for name in self.input_names}
        with torch.inference_mode():
            output = self.module(**tensors)
        return output.float().cpu().numpy()
