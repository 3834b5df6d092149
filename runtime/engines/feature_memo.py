"""The vision features of the request being answered, computed once for all of its batches."""

from __future__ import annotations

from typing import Callable

import numpy as np

# (pixel input, grid input, feature input of the media text graph) per modality
MODALITIES = (("pixel_values", "image_grid_thw", "image_features"), ("pixel_values_videos", "video_grid_thw", "video_features"))
VISION_INPUTS = frozenset(name for pixels, grid, _ in MODALITIES for name in (pixels, grid))


class FeatureMemo:
    """A request's question rows come in batches of 8 that share one pixel array (media_batches puts the
    same object in each), so the vision tower's output for that array is kept until another array comes.
    Keyed by identity, not content: the memo holds the array, so its id cannot be reused meanwhile."""

    def __init__(self) -> None:
        self._pixels: dict[str, np.ndarray] = {}
        self._features: dict[str, object] = {}

    def features(self, name: str, pixels: np.ndarray, compute: Callable[[], object]) -> object:
        if self._pixels.get(name) is not pixels:
            self._features[name] = compute()
            self._pixels[name] = pixels
        return self._features[name]
