"""ONNX translations of the custom ops: ONNX Runtime contrib ops (com.microsoft) for fused kernels."""

from __future__ import annotations

import onnxscript
from onnxscript import opset18 as op

from vllm_sr_runtime.export.contrib_schemas import register_contrib_schemas

register_contrib_schemas()
MSFT = onnxscript.values.Opset(domain="com.microsoft", version=1)
L2_EPS = 1e-6  # transformers' l2norm: x * rsqrt(sum(x^2) + 1e-6); the contrib op's own qk_l2_norm differs


def make_causal_conv1d_silu(channels: int, kernel: int):
    """Channels-last [B, T, C] x [C, K] -> a standard depthwise Conv (left padding K-1) then SiLU, as a 2-D conv over
    [B, C, 1, T] between two 4-D transposes (NHWC -> NCHW and back).

    That form is what ONNX Runtime's CPU NCHWc transformer takes whole: the transposes become the channels-last
    ReorderInput/ReorderOutput of its blocked depthwise conv, so no layout pass is left around the conv (at 4,094
    tokens x 6144 channels 40-44 ms against 60-64 ms for the 1-D conv between 3-D transposes, equal at 510; every
    provider has Conv and Transpose). The conv itself runs 2.6x faster than com.microsoft CausalConvWithState, whose
    channels-last form (no transposes either) ran 5x slower than this on the CPU EP ([1, 510, 6144]: 25.9 vs 5.0 ms).
    """

    def causal_conv1d_silu(x, weight):
        kernel_weight = op.Reshape(weight, op.Constant(value_ints=[channels, 1, 1, kernel]))
        nhwc = op.Unsqueeze(x, op.Constant(value_ints=[1]))  # [B, 1, T, C]
        nchw = op.Transpose(nhwc, perm=[0, 3, 1, 2])  # [B, C, 1, T]
        convolved = op.Conv(nchw, kernel_weight, group=channels, kernel_shape=[1, kernel], pads=[0, kernel - 1, 0, 0], strides=[1, 1], dilations=[1, 1])
        activated = op.Mul(convolved, op.Sigmoid(convolved))
        return op.Squeeze(op.Transpose(activated, perm=[0, 2, 3, 1]), op.Constant(value_ints=[1]))  # [B, T, C]

    return causal_conv1d_silu


def _l2norm(x):
    total = op.ReduceSum(op.Mul(x, x), op.Constant(value_ints=[-1]), keepdims=1)
    return op.Mul(x, op.Reciprocal(op.Sqrt(op.Add(total, op.CastLike(op.Constant(value_float=L2_EPS), total)))))


def _repeat_heads(x, repeats: int):
    """repeat_interleave over the head axis of [B, T, H, D] (inverse GQA maps head h to h // repeats)."""
    if repeats == 1:
        return x
    expanded = op.Unsqueeze(x, op.Constant(value_ints=[3]))  # [B, T, H, 1, D]
    shape = op.Shape(expanded)
    target = op.Concat(op.Slice(shape, [0], [3]), op.Constant(value_ints=[repeats]), op.Slice(shape, [4], [5]), axis=0)
    tiled = op.Expand(expanded, target)
    return op.Reshape(tiled, op.Constant(value_ints=[0, 0, -1, 0]))


def _linear_attention(query, key, value, g, beta, past_state, value_heads: int, repeats: int, scale: float):
    """LinearAttention (update_rule gated_delta) on [B, T, H*D] packed heads, L2 norm in standard ops:
    (output [B, T, Hv, dv] like `value`, present state [B, Hv, dk, dv])."""
    q = _repeat_heads(_l2norm(op.Cast(query, to=1)), repeats)
    k = _repeat_heads(_l2norm(op.Cast(key, to=1)), repeats)
    packed = op.Constant(value_ints=[0, 0, -1])
    outputs = MSFT.LinearAttention(
        op.Reshape(q, packed),
        op.Reshape(k, packed),
        op.Reshape(op.Cast(value, to=1), packed),
        past_state,
        op.Cast(g, to=1),
        op.Cast(beta, to=1),
        q_num_heads=value_heads,
        kv_num_heads=value_heads,
        update_rule="gated_delta",
        scale=scale,
        _outputs=2,
    )
    restored = op.Reshape(outputs[0], op.Constant(value_ints=[0, 0, value_heads, -1]))
    return op.CastLike(restored, value), outputs[1]


def make_gated_delta_rule(value_heads: int, key_heads: int, key_dim: int):
    """The prefill recurrence from a zero state."""
    repeats, scale = value_heads // key_heads, key_dim**-0.5

    def gated_delta_rule(query, key, value, g, beta):
        output, _ = _linear_attention(query, key, value, g, beta, None, value_heads, repeats, scale)
        return output

    return gated_delta_rule


def make_gated_delta_rule_state(value_heads: int, key_heads: int, key_dim: int):
    """The recurrence from an optional past state (shared_context's suffix rows), returning its final state."""
    repeats, scale = value_heads // key_heads, key_dim**-0.5

    def gated_delta_rule_state(query, key, value, g, beta, initial_state=None):
        past = None if initial_state is None else op.Cast(initial_state, to=1)
        return _linear_attention(query, key, value, g, beta, past, value_heads, repeats, scale)

    return gated_delta_rule_state
