"""The two graphs an artifact needs for requests with images/videos (packages with a vision tower).

vision.onnx: the vision tower over equal-size attention segments (export/vision_graph.py) -> features.
model_media.onnx: the module's forward_features (token ids + the features + 3-D positions -> probabilities),
its weights read from the main graph's data file where equal. Text-only requests keep using model.onnx.
"""

from __future__ import annotations


import onnx
import torch

from vllm_sr_runtime.export.graph_emit import emit_graph, io_schema, translation_table
from vllm_sr_runtime.export.smoke import SMOKE_QUESTIONS, SMOKE_STATE, check_smoke, smoke_parity
from vllm_sr_runtime.export.context import ExportContext
from vllm_sr_runtime.export.streaming import trace
from vllm_sr_runtime.export.vision_graph import VISION_DYNAMIC_AXES, VISION_OUTPUT, SegmentedVision
from vllm_sr_runtime.engines.onnxruntime.vision_segments import SEGMENT_INPUTS, VisionLayout, segment_groups

VISION_FILE, VISION_DATA_FILE = "vision.onnx", "vision.onnx.data"
MEDIA_MODEL_FILE, MEDIA_DATA_FILE = "model_media.onnx", "model_media.onnx.data"  # its own weights only
MEDIA_PHASES = ("vision trace", "vision write", "media trace", "media write", "media smoke")


def export_media(context: ExportContext) -> dict:
    """Trace, write and smoke-test both media graphs into the artifact; returns the manifest's "media" section.
    Both are traced from the weightless module and their weights streamed (the media text graph's read from
    the main graph's file); the smoke parity runs when the export holds the eager module.
    The vision graph stays FP32 under --dtype int8 (a small share of the work, and its error would reach
    every visual token); under fp16/bf16 it is in that dtype, as the module it is traced from."""
    family, streamed, temp, dtype, opset, phase = context.family, context.streamed, context.temp, context.dtype, context.opset, context.phase
    module = streamed.module
    media = family.sample_media()
    layout = VisionLayout.of(module.visual)
    phase("vision trace")
    # The video's two frame pairs: a sample with 2 segments of 4 merge blocks keeps both axes symbolic.
    (sample,) = segment_groups(media.pixel_values_videos, media.video_grid_thw, layout)
    wrapper = SegmentedVision(module.visual).eval()
    vision = trace(streamed, wrapper, sample.inputs, opset, SEGMENT_INPUTS, VISION_DYNAMIC_AXES, VISION_OUTPUT, translations={})
    context.step()
    phase("vision write")
    vision_dtype = "fp32" if dtype == "int8" else dtype
    proto, _ = emit_graph(vision, temp, VISION_FILE, VISION_DATA_FILE, vision_dtype)
    vision_io = {"inputs": io_schema(proto.graph.input), "outputs": io_schema(proto.graph.output)}
    del vision, proto
    onnx.checker.check_model(str(temp / VISION_FILE), full_check=False)
    context.step()
    phase("media trace")
    batch = family.plan(SMOKE_STATE, SMOKE_QUESTIONS, media=media).batches[0]
    hidden = family.backbone_config().hidden_size
    features = {
        "image_features": feature_placeholder(module, media.image_grid_thw, hidden),
        "video_features": feature_placeholder(module, media.video_grid_thw, hidden),
    }
    inputs = {**batch.inputs, **features}
    text = trace(
        streamed, module, inputs, opset, family.media_input_names, family.media_dynamic_axes, family.output_name, translation_table(family.backbone_config()), "forward_features"
    )  # fmt: skip
    context.step()
    phase("media write")
    proto, weights = emit_graph(text, temp, MEDIA_MODEL_FILE, MEDIA_DATA_FILE, dtype, reuse=context.reuse, int8=context.int8)
    text_io = {"inputs": io_schema(proto.graph.input), "outputs": io_schema(proto.graph.output)}
    del text, proto
    onnx.checker.check_model(str(temp / MEDIA_MODEL_FILE), full_check=False)
    context.step()
    phase("media smoke")
    if context.engine is not None:
        context.engine.attach_media(temp / VISION_FILE, temp / MEDIA_MODEL_FILE, layout, family.media_modalities)
    smoke = None
    if context.eager is not None:
        smoke = {"with_video": smoke_parity(family, context.eager, context.engine, media=media)}
        smoke["images_only"] = smoke_parity(family, context.eager, context.engine, media=family.sample_media(videos=False))
        for what, result in smoke.items():
            check_smoke(result, dtype, f"media smoke parity ({what.replace('_', ' ')})")
    context.step()
    return {
        "vision": {"model_file": VISION_FILE, "dtype": vision_dtype, "io": vision_io, "dynamic_axes": _axes(VISION_DYNAMIC_AXES), "layout": layout.to_dict()},
        "text": {"model_file": MEDIA_MODEL_FILE, "io": text_io, "dynamic_axes": _axes(family.media_dynamic_axes), "weights_from_main": weights["shared"]},
        "smoke_parity": smoke,
    }


def feature_placeholder(module: torch.nn.Module, grid, hidden_size: int) -> torch.Tensor:
    """Zeros shaped like the vision tower's features for `grid` (one row per merged patch block): all a trace
    of forward_features needs (its values do not reach the graph)."""
    merge = int(module.visual.config.spatial_merge_size)
    rows = 0 if grid is None else int(torch.as_tensor(grid).prod(-1).sum()) // (merge * merge)
    return torch.zeros((rows, hidden_size))


def _axes(axes: dict) -> dict:
    return {name: {str(k): v for k, v in named.items()} for name, named in axes.items()}
