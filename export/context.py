"""What every graph of one export shares: the package's family, the weightless module, the artifact's
temporary folder and options, the progress, and (once the main graph is written) its weights and session."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from vllm_sr_runtime.export.int8_options import WEIGHT_BITS_CHOICES
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
    int8_activations: str = "token"  # --dtype int8: activation scales per token or per tensor
    int8_kept: frozenset[str] = frozenset()  # --dtype int8: weights the package's measured sensitivity keeps FP32
    int8_blocked: frozenset[str] = frozenset()  # --dtype int8: weights it moves to the block form
    int8_split: frozenset[str] = frozenset()  # --dtype int8: weights the measurement moves to the split form
    int8_split_rule: bool = False  # --dtype int8: the fixed rule's FP32 projections run in the split form
    int8_weight_bits: int = WEIGHT_BITS_CHOICES[0]  # --dtype int8: the integer products' weights, 8 or 7 bits
    int8_embedding_tables: tuple[str, ...] = ()  # --dtype int8 --int8-embedding int8: the tables stored as int8 rows
