"""The vision tower's inputs cut into attention segments, for graphs that cannot loop over images.

Qwen3.5's vision attention never crosses a segment (one image, or one temporal group of a video: h x w
patches), and everything else in the tower is per patch or per 2 x 2 merge block inside a segment. So
the tower's output is the concatenation of its outputs on each segment alone, and segments of equal size
can run as one batch [segments, merge blocks, 4, ...] without any mask. The grid-dependent inputs
(position-embedding interpolation taps, rotary positions) come from transformers' own helpers here, on the
host, instead of from data-dependent loops inside the graph.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch
from transformers.vision_utils import get_vision_interpolation_indices_and_weights, get_vision_position_ids

SEGMENT_INPUTS = ("pixel_values", "interp_indices", "interp_weights", "position_ids")


@dataclass(frozen=True)
class VisionLayout:
    """What the host needs of the vision config to build segment inputs (kept in the artifact manifest)."""

    spatial_merge_size: int
    num_grid_per_side: int
    interpolation_mode: str = "bilinear"
    align_corners: bool = True

    @classmethod
    def of(cls, visual: torch.nn.Module) -> "VisionLayout":
        return cls(visual.spatial_merge_size, visual.num_grid_per_side, visual.interpolation_mode, visual.interpolation_align_corners)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class SegmentGroup:
    segments: list[int]  # segment numbers, in the order of the group's batch rows
    inputs: dict[str, np.ndarray]  # SEGMENT_INPUTS, each [len(segments), merge blocks, merge², ...]


def segment_bounds(grid_thw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first patch, patch count) of every segment: each image, each temporal group of each video."""
    grid = np.asarray(grid_thw, dtype=np.int64).reshape(-1, 3)
    lengths = np.repeat(grid[:, 1] * grid[:, 2], grid[:, 0])
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    return starts, lengths


def segment_groups(pixel_values: np.ndarray, grid_thw: np.ndarray, layout: VisionLayout) -> list[SegmentGroup]:
    """The tower's inputs as batches of equal-size segments (first appearance order)."""
    grid = torch.from_numpy(np.asarray(grid_thw, dtype=np.int64).reshape(-1, 3))
    indices, weights = get_vision_interpolation_indices_and_weights(
        grid, num_grid_per_side=layout.num_grid_per_side, mode=layout.interpolation_mode,
        align_corners=layout.align_corners, spatial_merge_size=layout.spatial_merge_size,
    )  # fmt: skip
    per_patch = {
        "pixel_values": np.asarray(pixel_values, dtype=np.float32),
        "interp_indices": indices.numpy().astype(np.int64, copy=False),
        "interp_weights": weights.numpy().astype(np.float32, copy=False),
        "position_ids": get_vision_position_ids(grid, layout.spatial_merge_size).numpy().astype(np.int64, copy=False),
    }
    starts, lengths = segment_bounds(grid_thw)
    if int(lengths.sum()) != per_patch["pixel_values"].shape[0]:
        raise ValueError(f"{per_patch['pixel_values'].shape[0]} patches for grids holding {int(lengths.sum())}")
    unit = layout.spatial_merge_size**2
    by_length: dict[int, list[int]] = {}
    for segment, length in enumerate(lengths.tolist()):
        by_length.setdefault(length, []).append(segment)
    groups = []
    for length, segments in by_length.items():
        rows = np.concatenate([np.arange(starts[s], starts[s] + length) for s in segments])
        shape = (len(segments), length // unit, unit)
        groups.append(SegmentGroup(segments, {name: array[rows].reshape(*shape, *array.shape[1:]) for name, array in per_patch.items()}))
    return groups


def assemble(groups: list[SegmentGroup], outputs: list[np.ndarray], grid_thw: np.ndarray, unit: int) -> np.ndarray:
    """Per-group outputs [segments, merge blocks, hidden] back into the tower's order [merged tokens, hidden]."""
    starts, lengths = segment_bounds(grid_thw)
    hidden = outputs[0].shape[-1]
    features = np.empty((int(lengths.sum()) // unit, hidden), dtype=np.float32)
    for group, output in zip(groups, outputs):
        for row, segment in enumerate(group.segments):
            first = int(starts[segment]) // unit
            features[first : first + output.shape[1]] = output[row]
    return features
