"""Requests with images/videos on ONNX Runtime: the vision graph per group of equal-size segments, then the
media text graph with the features in place of the placeholders (an artifact's "media" section)."""

from __future__ import annotations

import numpy as np

from vllm_sr_runtime.engines.feature_memo import FeatureMemo, Modalities
from vllm_sr_runtime.engines.onnxruntime.vision_segments import VisionLayout, assemble, segment_groups


class MediaGraphs:
    def __init__(self, vision_session, text_session, layout: VisionLayout, output_name: str, modalities: Modalities):
        self.vision = vision_session
        self.text = text_session
        self.layout = layout
        self.output_name = output_name
        self.vision_output = vision_session.get_outputs()[0].name
        features = {value.name: value for value in text_session.get_inputs()}[modalities[0][2]]
        self.hidden_size = int(features.shape[-1])
        self.memo = FeatureMemo(modalities)

    def features(self, pixel_values: np.ndarray, grid_thw: np.ndarray, run_options=None) -> np.ndarray:
        """The vision tower's output for one modality, in transformers' order [merged tokens, hidden]."""
        groups = segment_groups(pixel_values, grid_thw, self.layout)
        outputs = [self.vision.run([self.vision_output], group.inputs, run_options)[0] for group in groups]
        return assemble(groups, outputs, grid_thw, self.layout.spatial_merge_size**2)

    def forward(self, inputs: dict[str, np.ndarray], run_options=None) -> np.ndarray:
        feed = self.memo.features(
            inputs, lambda pixels, grid: self.features(inputs[pixels], inputs[grid], run_options), lambda: np.zeros((0, self.hidden_size), dtype=np.float32)
        )
        for value in self.text.get_inputs():
            if value.name not in feed:
                feed[value.name] = np.ascontiguousarray(inputs[value.name])
        return self.text.run([self.output_name], feed, run_options)[0].astype(np.float32, copy=False)
