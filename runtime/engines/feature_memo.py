"""The vision features of the request being answered, computed once for all of its batches."""

from __future__ import annotations

from typing import Callable, TypeVar

import numpy as np

# (pixel input, grid input, feature input of the media text graph) per modality, as the family declares them
Modalities = tuple[tuple[str, str, str], ...]
Features = TypeVar("Features")


def vision_inputs(modalities: Modalities) -> frozenset[str]:
    return frozenset(name for pixels, grid, _ in modalities for name in (pixels, grid))


class FeatureMemo:
    """A request's question rows come in batches of 8 that share one pixel array (media_batches puts the
    same object in each), so the vision tower's output for that array is kept until another array comes.
    Keyed by identity, not content: the memo holds the array, so its id cannot be reused meanwhile."""

    def __init__(self, modalities: Modalities) -> None:
        self.modalities = modalities
        self._pixels: dict[str, np.ndarray] = {}
        self._features: dict[str, object] = {}

    def features(
        self, inputs: dict[str, np.ndarray], compute: Callable[[str, str], Features], empty: Callable[[], Features]
    ) -> dict[str, Features]:
        """The media text graph's feature inputs for one batch of rows: `compute(pixel input, grid input)`
        for a modality the request carries (once per pixel array), `empty()` for one it does not."""
        found: dict[str, Features] = {}
        for pixels, grid, name in self.modalities:
            if inputs.get(pixels) is None:
                found[name] = empty()
                continue
            if self._pixels.get(name) is not inputs[pixels]:
                self._features[name] = compute(pixels, grid)
                self._pixels[name] = inputs[pixels]
            found[name] = self._features[name]
        return found
