"""The eager PyTorch engine: runs a family's module on a device."""

from __future__ import annotations

import numpy as np
import torch


class TorchEngine:
    name = "torch"

    def __init__(self, module: torch.nn.Module, device: torch.device, input_names: tuple[str, ...], shared_input_names: tuple[str, ...] = ()):
        self.module = module
        self.device = device
        self.input_names = input_names
        self.shared_input_names = shared_input_names

    def _tensors(self, inputs: dict[str, np.ndarray], names: tuple[str, ...]) -> dict[str, torch.Tensor]:
        return {name: torch.from_numpy(np.ascontiguousarray(inputs[name])).to(self.device) for name in names}

    def forward(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        with torch.inference_mode():
            output = self.module(**self._tensors(inputs, self.input_names))
        return output.float().cpu().numpy()

    def forward_shared(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        """A shared_context pass: the prefix once, then the suffix rows from its cache."""
        with torch.inference_mode():
            output = self.module.forward_shared(**self._tensors(inputs, self.shared_input_names))
        return output.float().cpu().numpy()

    @property
    def reads_media(self) -> bool:
        return getattr(self.module, "visual", None) is not None

    def forward_media(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        """Rows that read images/videos: the vision tower, its features in place of the placeholders."""
        with torch.inference_mode():
            output = self.module.forward_media(**self._tensors(inputs, tuple(inputs)))
        return output.float().cpu().numpy()
