"""What every graph of one export shares: the package's family, the weightless module, the artifact's
temporary folder and options, the progress, and (once the main graph is written) its weights and session."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from vllm_sr_runtime.export.int8 import Int8Layout
from vllm_sr_runtime.export.streaming import Provenance, StreamedModule
from vllm_sr_runtime.families.base import Family


@dataclass
class ExportContext:
    family: Family
    streamed: StreamedModule
    temp: Path
    variant: str
    dtype: str
    opset: int
    phase: Callable[[str], None]
    step: Callable[[], Any]  # one phase done (the progress bar)
    reuse: dict[Provenance, tuple[str, int, int]] = field(default_factory=dict)  # the main graph's weights, where written
    engine: Any = None  # the ORT engine over the main graph, once it loaded
    eager: torch.nn.Module | None = None  # the module with its weights, while the smoke parity runs
    int8: Int8Layout = Int8Layout()  # --dtype int8: where the graphs' weights go (every graph of the export the same)
