"""Engines turn rows (named arrays) into readout outputs; they know nothing of prompts or answers, and no family:
what they read of a model is the family interface, by duck type (ModelSource). An engine plugin registers an
EngineBuilder in the `vllm_sr_runtime.engines` entry point group."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np


class Engine(Protocol):
    name: str  # the engine plugin's name
    golden: dict | None  # the exact answers of the golden suite its artifact recorded (vllm_sr_runtime.golden), if any

    def forward(self, inputs: dict[str, np.ndarray]) -> np.ndarray: ...

    # Optional: `weight_bytes() -> int`, the bytes of the weights it holds (the model card and /metrics report it).
    # Optional: `interruptible(interrupt) -> context manager`: while inside, a pass in flight ends early once the
    # vllm_sr_runtime.interrupts.Interrupt is set (from another thread), raising Interrupted. Without it, passes run
    # whole and the model only skips the ones still to come.


class ModelSource(Protocol):
    """The parts of a family (vllm_sr_runtime.families.base.Family) an engine reads."""

    name: str
    model_name: str
    package: Any  # .model_sha256
    input_names: tuple[str, ...]
    shared_input_names: tuple[str, ...]
    output_name: str
    media_modalities: tuple[tuple[str, str, str], ...]
    reads_media: bool
    export_spec: Any  # None: the family has no exported graphs
    parameter_count: int | None  # the parameters the model loads, as the package states them (None: unknown)

    def numerics(self, device_class: str) -> Any: ...

    def build_module(self, numerics: Any, device: Any, *, weights: bool = True) -> Any: ...


class EngineBuilder(Protocol):
    """An engine plugin: builds the engine one loaded model runs on. Returns (engine, numerics label)."""

    def __call__(self, family: ModelSource, device: Any, profile: Any, *, artifact: Any = None, cache_dir: Any = None) -> tuple[Engine, str]: ...
