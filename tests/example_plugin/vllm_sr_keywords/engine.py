"""The `counting` engine: for every row and option, how many of the option's word ids occur in the row's state.

It knows no family: its contract is three named arrays (state_ids [rows, words], option_ids [rows, options,
words], option_mask [rows, options]; -1 pads) in, one array [rows, options] out."""

from __future__ import annotations

import numpy as np

from vllm_sr_runtime.errors import UnsupportedDeviceError


class CountingEngine:
    name = "counting"
    golden = None  # no artifact: nothing recorded to replay

    def forward(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        state, options, mask = inputs["state_ids"], inputs["option_ids"], inputs["option_mask"]
        found = (options[:, :, :, None] == state[:, None, None, :]).any(-1) & (options >= 0)
        counts = found.sum(-1).astype(np.float32)
        return np.where(mask, counts, np.float32(np.nan))  # padded options are not answers


def build(family, device, profile, **options) -> tuple[CountingEngine, str]:
    """The engine plugin's entry point: (engine, numerics label) for a model on a device."""
    if device.kind != "cpu":
        raise UnsupportedDeviceError(f"the counting engine runs on cpu only, not {device.name}")
    if options.get("artifact") is not None:
        raise UnsupportedDeviceError("the counting engine runs no artifact")
    return CountingEngine(), "int-counts"
