"""Qwen3.5's vision tower over batches of equal-size attention segments: the module traced into vision.onnx.

transformers' forward loops over images (grid_thw.tolist(), split by cu_seqlens) and cannot be traced with
dynamic shapes. This wrapper runs the same weights on [segments, merge blocks, merge², ...] inputs prepared
by vllm_sr_runtime.engines.onnxruntime.vision_segments: no loop and no mask, since attention stays inside a segment.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.models.qwen3_5.modeling_qwen3_5 import apply_rotary_pos_emb_vision

from vllm_sr_runtime.engines.onnxruntime.vision_segments import SEGMENT_INPUTS

VISION_OUTPUT = "visual_features"
VISION_DYNAMIC_AXES = {name: {0: "segments", 1: "merge_blocks"} for name in SEGMENT_INPUTS}


class SegmentedVision(torch.nn.Module):
    def __init__(self, visual: torch.nn.Module):
        super().__init__()
        self.visual = visual

    def forward(self, pixel_values, interp_indices, interp_weights, position_ids):
        visual = self.visual
        segments, blocks, unit = pixel_values.shape[:3]
        patches, length = segments * blocks * unit, blocks * unit
        hidden = visual.patch_embed(pixel_values.reshape(patches, -1))
        taps = interp_indices.shape[-1]
        position = (visual.pos_embed(interp_indices.reshape(patches, taps)) * interp_weights.reshape(patches, taps)[:, :, None]).sum(1)
        hidden = hidden + position.to(hidden.dtype)
        cos, sin = visual.rotary_pos_emb(hidden, position_ids.reshape(patches, -1))
        cos, sin = cos.reshape(segments, length, -1), sin.reshape(segments, length, -1)
        hidden = hidden.reshape(segments, length, -1)
        for block in visual.blocks:  # Qwen3_5VisionBlock.forward with attention batched over segments
            hidden = hidden + segment_attention(block.attn, block.norm1(hidden), cos, sin)
            hidden = hidden + block.mlp(block.norm2(hidden))
        return visual.merger(hidden.reshape(patches, -1)).reshape(segments, blocks, -1)


def segment_attention(attention: torch.nn.Module, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Qwen3_5VisionAttention on [segments, patches, dim]: each segment attends to itself only."""
    segments, length, _ = hidden.shape
    query, key, value = attention.qkv(hidden).reshape(segments, length, 3, attention.num_heads, -1).unbind(2)
    query, key = apply_rotary_pos_emb_vision(query, key, cos, sin)
    output = F.scaled_dot_product_attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), scale=attention.scaling)
    return attention.proj(output.transpose(1, 2).reshape(segments, length, -1))
