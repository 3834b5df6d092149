"""Engines turn rows (named arrays) into readout outputs; they know nothing of prompts or answers."""

from __future__ import annotations

from typing import Protocol

import numpy as np


class Engine(Protocol):
    name: str

    def forward(self, inputs: dict[str, np.ndarray]) -> np.ndarray: ...
