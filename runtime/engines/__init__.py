"""Engines turn rows (named arrays) into readout outputs; they know nothing of prompts or answers."""

from __future__ import annotations

from typing import Protocol

import numpy as np


class Engine(Protocol):
    name: str
    golden: dict | None  # the exact answers of the golden suite its artifact recorded (vllm_sr_runtime.golden), if any

    def forward(self, inputs: dict[str, np.ndarray]) -> np.ndarray: ...
