"""The two graphs an artifact needs for requests with images/videos (packages with a vision tower).

vision.onnx: the vision tower over equal-size attention segments (export/vision_graph.py) -> features.
model_media.onnx: the module's forward_features (token ids + the features + 3-D positions -> probabilities),
its weights read from the main graph's data file where equal. Text-only requests keep using model.onnx.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import torch

from export.exporter import MODEL_FILE, SMOKE_QUESTIONS, SMOKE_STATE, _check_smoke, _io_schema, _trace, _write_graph, smoke_parity
from export.graph_passes import op_counts, trim_contrib_outputs
from export.vision_graph import VISION_DYNAMIC_AXES, VISION_OUTPUT, SegmentedVision
from runtime.errors import ArtifactError
from runtime.families.base import Family
from runtime.families.decision3.vision_segments import SEGMENT_INPUTS, VisionLayout, segment_groups

VISION_FILE, VISION_DATA_FILE = "vision.onnx", "vision.onnx.data"
MEDIA_MODEL_FILE, MEDIA_DATA_FILE = "model_media.onnx", "model_media.onnx.data"  # its own weights only
MEDIA_PHASES = ("vision trace", "vision write", "media trace", "media write", "media smoke")


def export_media(
    family: Family,
    module: torch.nn.Module,
    engine: Any,
    temp: Path,
    *,
    variant: str,
    dtype: str,
    opset: int,
    phase,
    bar,
    keep_fp32: set[str],
    run_smoke: bool = True,
) -> dict:
    """Trace, write and smoke-test both media graphs into `temp`; returns the manifest's "media" section.
    The vision graph stays FP32 under --dtype int8 (a small share of the work, and its error would reach
    every visual token)."""
    media = family.sample_media()
    layout = VisionLayout.of(module.visual)
    phase("vision trace")
    # The video's two frame pairs: a sample with 2 segments of 4 merge blocks keeps both axes symbolic.
    (sample,) = segment_groups(media.pixel_values_videos, media.video_grid_thw, layout)
    vision = _trace(SegmentedVision(module.visual).eval(), sample.inputs, opset, SEGMENT_INPUTS, VISION_DYNAMIC_AXES, VISION_OUTPUT, translations={})
    vision_io = {"inputs": _io_schema(vision.graph.input), "outputs": _io_schema(vision.graph.output)}
    bar.update()
    phase("vision write")
    _write_graph(vision, temp, "fp32", VISION_FILE, VISION_DATA_FILE)
    del vision
    onnx.checker.check_model(str(temp / VISION_FILE), full_check=False)
    bar.update()
    phase("media trace")
    batch = family.plan(SMOKE_STATE, SMOKE_QUESTIONS, media=media).batches[0]
    with torch.no_grad():
        features = {
            "image_features": module.visual_features(torch.from_numpy(media.pixel_values), torch.from_numpy(media.image_grid_thw)),
            "video_features": module.visual_features(torch.from_numpy(media.pixel_values_videos), torch.from_numpy(media.video_grid_thw)),
        }
    inputs = {**batch.inputs, **{name: value.numpy() for name, value in features.items()}}
    text = _trace(module, inputs, opset, family.media_input_names, family.media_dynamic_axes, family.output_name, "forward_features")
    trim_contrib_outputs(text)
    if variant == "portable":
        from export.exporter import _gdn_dims
        from export.portable import lower_to_portable

        text = lower_to_portable(text, _gdn_dims(module))
    text_io = {"inputs": _io_schema(text.graph.input), "outputs": _io_schema(text.graph.output)}
    bar.update()
    phase("media write")
    weights = _write_graph(text, temp, dtype, MEDIA_MODEL_FILE, MEDIA_DATA_FILE, base=temp / MODEL_FILE, keep_fp32=keep_fp32)
    del text
    onnx.checker.check_model(str(temp / MEDIA_MODEL_FILE), full_check=False)
    if variant == "portable":
        for file in (VISION_FILE, MEDIA_MODEL_FILE):
            if any(key.startswith("com.microsoft::") for key in op_counts(onnx.load(str(temp / file), load_external_data=False))):
                raise ArtifactError(f"portable {file} still holds com.microsoft nodes")
    bar.update()
    phase("media smoke")
    engine.attach_media(temp / VISION_FILE, temp / MEDIA_MODEL_FILE, layout)
    smoke = None
    if run_smoke:
        smoke = {"with_video": smoke_parity(family, module, engine, media=media)}
        smoke["images_only"] = smoke_parity(family, module, engine, media=family.sample_media(videos=False))
        for what, result in smoke.items():
            _check_smoke(result, dtype, f"media smoke parity ({what.replace('_', ' ')})")
    bar.update()
    return {
        "vision": {"model_file": VISION_FILE, "dtype": "fp32", "io": vision_io, "dynamic_axes": _axes(VISION_DYNAMIC_AXES), "layout": layout.to_dict()},
        "text": {"model_file": MEDIA_MODEL_FILE, "io": text_io, "dynamic_axes": _axes(family.media_dynamic_axes), "weights_from_main": weights["shared"]},
        "smoke_parity": smoke,
    }


def _axes(axes: dict) -> dict:
    return {name: {str(k): v for k, v in named.items()} for name, named in axes.items()}
