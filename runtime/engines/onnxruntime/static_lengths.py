"""Graphs with static sequence lengths (the portable variant, for compilers such as MIGraphX): a batch of
rows is padded to the shortest graph that holds it, on the side and with the fills the artifact records,
so that no real token sees a pad. Each graph's session opens on first use (or all at once: `open_all`)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable

import numpy as np

from vllm_sr_runtime.errors import ArtifactError

SEQUENCE_AXIS = 1  # rows are [batch, sequence]


class StaticLengthSessions:
    """Looks like one ONNX Runtime session (get_inputs, get_providers, run) over a graph per length."""

    def __init__(self, root: Path, buckets: dict, open_graph: Callable[[Path], Any]):
        self.graphs = sorted((int(graph["length"]), root / graph["model_file"]) for graph in buckets["graphs"])
        self.side = buckets["padding"]["side"]
        self.fills = buckets["padding"]["values"]
        self._open_graph = open_graph
        self._sessions: dict[int, Any] = {}
        self._lock = threading.Lock()

    @property
    def lengths(self) -> list[int]:
        return [length for length, _ in self.graphs]

    def length_for(self, tokens: int) -> int:
        for length, _ in self.graphs:
            if tokens <= length:
                return length
        raise ArtifactError(f"rows of {tokens} tokens are longer than this artifact's longest static length ({self.graphs[-1][0]})")

    def session(self, length: int):
        with self._lock:
            if length not in self._sessions:
                self._sessions[length] = self._open_graph(dict(self.graphs)[length])
            return self._sessions[length]

    def open_all(self) -> None:
        for length in self.lengths:
            self.session(length)

    def get_inputs(self):
        return self.session(self.lengths[0]).get_inputs()

    def get_providers(self) -> list[str]:
        return self.session(self.lengths[0]).get_providers()

    def pad(self, feed: dict[str, np.ndarray], length: int) -> dict[str, np.ndarray]:
        padded = {}
        for name, array in feed.items():
            if name not in self.fills or array.ndim <= SEQUENCE_AXIS:
                padded[name] = array
                continue
            missing = length - array.shape[SEQUENCE_AXIS]
            widths = [(0, 0)] * array.ndim
            widths[SEQUENCE_AXIS] = (missing, 0) if self.side == "left" else (0, missing)
            padded[name] = np.pad(array, widths, constant_values=self.fills[name])
        return padded

    def resolve(self, feed: dict[str, np.ndarray]) -> tuple[Any, dict[str, np.ndarray]]:
        """The session of the shortest graph that holds these rows, and the rows padded to its length."""
        tokens = max(array.shape[SEQUENCE_AXIS] for name, array in feed.items() if name in self.fills)
        length = self.length_for(tokens)
        return self.session(length), self.pad(feed, length)

    def run(self, output_names: list[str], feed: dict[str, np.ndarray], run_options=None):
        session, padded = self.resolve(feed)
        return session.run(output_names, padded, run_options)
