"""Opset-23 Attention and RMSNormalization written in older primitive ops (MatMul, Softmax, ReduceMean...).

Providers whose op lists predate opset 23 (MIGraphX's allow-list in ONNX Runtime) take these instead of
the fused nodes. The numerics follow the ONNX function definitions: RMSNormalization normalises in its
stash type (FP32) and casts back before the scale; a fully masked attention row gets uniform weights over
finite scores (never NaN, which would reach the other rows through the next layer's MatMul); long
sequences attend in blocks of query rows so the score matrix is never T x T at once.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from vllm_sr_runtime.export.chunked_gdn import GraphBuilder

# Query rows per attention block: the scores of a block are [rows, keys] per head, not [T, T] (at 8k tokens
# the whole score matrix of one row and head is 256 MB in FP32).
QUERY_BLOCK = 512
LOWEST = {TensorProto.FLOAT: np.finfo(np.float32).min, TensorProto.FLOAT16: np.finfo(np.float16).min}


def attribute(node: onnx.NodeProto, name: str, default=None):
    for item in node.attribute:
        if item.name == name:
            return helper.get_attribute_value(item)
    return default


def lower_rms_norm(node: onnx.NodeProto, builder: GraphBuilder, element_type: int) -> list[onnx.NodeProto]:
    x, scale = node.input[0], node.input[1]
    axis = int(attribute(node, "axis", -1))
    if axis != -1:
        raise ValueError(f"RMSNormalization over axis {axis}: only the last axis is lowered")
    epsilon = float(attribute(node, "epsilon", 1e-5))
    b = builder
    stash = b.op("Cast", [x], to=TensorProto.FLOAT) if element_type != TensorProto.FLOAT else x
    mean_square = b.op("ReduceMean", [b.op("Mul", [stash, stash]), b.const([-1])], keepdims=1)
    inverse = b.op("Reciprocal", [b.op("Sqrt", [b.op("Add", [mean_square, b.const(epsilon, np.float32, "epsilon")])])])
    normalized = b.op("Mul", [stash, inverse])
    if element_type != TensorProto.FLOAT:
        normalized = b.op("Cast", [normalized], to=element_type)
    b.op("Mul", [normalized, scale], output=node.output[0])
    return b.nodes


def lower_attention(
    node: onnx.NodeProto, builder: GraphBuilder, element_type: int, shapes: dict[str, list], heads: tuple[int, int]
) -> list[onnx.NodeProto]:
    """4-D Attention [B, H, T, D] (K/V heads may be fewer: grouped), an optional boolean or additive mask.
    `heads` = (query heads, key/value heads) of the model, for where shape inference does not know them."""
    q, k, v = node.input[0], node.input[1], node.input[2]
    mask = node.input[3] if len(node.input) > 3 else ""
    if len(node.input) > 4 and any(node.input[4:]) or len([o for o in node.output if o]) > 1:
        raise ValueError("Attention with a past key/value cache is not lowered (prefill graphs carry none)")
    if int(attribute(node, "is_causal", 0)) or float(attribute(node, "softcap", 0.0)) or int(attribute(node, "qk_matmul_output_mode", 0)):
        raise ValueError("only non-causal, uncapped Attention is lowered")
    q_shape, k_shape = shapes.get(q), shapes.get(k)
    if not q_shape or len(q_shape) != 4 or not k_shape or len(k_shape) != 4:
        raise ValueError(f"Attention {node.name}: 4-D query and key with known shapes expected")
    heads, kv_heads = (shape[1] if isinstance(shape[1], int) and shape[1] > 0 else fallback for shape, fallback in zip((q_shape, k_shape), heads))
    head_dim, length, key_length = k_shape[3], q_shape[2], k_shape[2]
    if not all(isinstance(d, int) and d > 0 for d in (heads, kv_heads, head_dim, key_length)):
        raise ValueError(f"Attention {node.name}: heads, key length and head size must be static")
    if not (isinstance(length, int) and length > 0):
        length = None  # a dynamic query count (the readout's rows in a pruned last layer): one block
    scale = float(attribute(node, "scale", 0.0) or head_dim**-0.5)
    b = builder
    k_t = b.op("Transpose", [k], perm=[0, 1, 3, 2])
    mask_type = shapes.get(f"{mask}#type") if mask else None
    blocks = length // QUERY_BLOCK if length and length > QUERY_BLOCK and length % QUERY_BLOCK == 0 else 1
    rows = length // blocks if length else None
    queries = b.op_outputs("Split", [q, b.const([rows] * blocks)], blocks, axis=2) if blocks > 1 else [q]
    mask_shape = shapes.get(mask) or [None] * 4
    if mask and blocks > 1 and mask_shape[-2] != 1:
        masks = b.op_outputs("Split", [mask, b.const([rows] * blocks)], blocks, axis=-2)
    else:
        masks = [mask] * blocks  # no mask, or one that broadcasts over the query rows
    outputs = [
        _attend(b, block, k_t, v, block_mask, mask_type, element_type, scale, (heads, kv_heads, head_dim, rows, key_length))
        for block, block_mask in zip(queries, masks)
    ]
    if blocks > 1:
        b.op("Concat", outputs, axis=2, output=node.output[0])
    else:
        b.op("Identity", outputs, output=node.output[0])
    return b.nodes


def _attend(b: GraphBuilder, q: str, k_t: str, v: str, mask: str, mask_type, element_type: int, scale: float, dims: tuple) -> str:
    """Softmax(q k^T * scale + mask) v for one block of query rows [B, H, rows, D] (rows None: not static)."""
    heads, kv_heads, head_dim, rows, key_length = dims
    group = heads // kv_heads
    grouped_rows = group * rows if rows else -1
    rows = rows or -1
    if group > 1:  # [B, Hkv, G*rows, D]: query heads h = kv * G + g share key/value head kv
        q = b.op("Reshape", [q, b.const([0, kv_heads, grouped_rows, head_dim])])
    scores = b.op("MatMul", [q, k_t])
    if element_type != TensorProto.FLOAT:
        scores = b.op("Cast", [scores], to=TensorProto.FLOAT)  # the softmax in FP32
    scores = b.op("Mul", [scores, b.const(scale, np.float32, "scale")])
    if group > 1:  # [B, Hkv, G, rows, S]
        scores = b.op("Reshape", [scores, b.const([0, kv_heads, group, rows, key_length])])
    if mask:
        if group > 1:
            mask = b.op("Unsqueeze", [mask, b.const([1])])  # [B, 1, 1, rows, S] (or broadcastable)
        if mask_type == TensorProto.BOOL:
            scores = b.op("Where", [mask, scores, b.const(LOWEST[TensorProto.FLOAT], np.float32, "lowest")])
        else:
            additive = b.op("Cast", [mask], to=TensorProto.FLOAT) if mask_type != TensorProto.FLOAT else mask
            scores = b.op("Add", [scores, additive])
    weights = b.op("Softmax", [scores], axis=-1)
    if element_type != TensorProto.FLOAT:
        weights = b.op("Cast", [weights], to=element_type)
    if group == 1:
        return b.op("MatMul", [weights, v])
    weights = b.op("Reshape", [weights, b.const([0, kv_heads, grouped_rows, key_length])])  # [B, Hkv, G*rows, S]
    return b.op("Reshape", [b.op("MatMul", [weights, v]), b.const([0, heads, rows, head_dim])])


def lower_layer_norm(node: onnx.NodeProto, builder: GraphBuilder, element_type: int) -> list[onnx.NodeProto]:
    x, scale = node.input[0], node.input[1]
    bias = node.input[2] if len(node.input) > 2 else ""
    if int(attribute(node, "axis", -1)) != -1 or len([o for o in node.output if o]) > 1:
        raise ValueError("LayerNormalization: only the last axis and the normalized output are lowered")
    b, axes = builder, builder.const([-1])
    stash = b.op("Cast", [x], to=TensorProto.FLOAT) if element_type != TensorProto.FLOAT else x
    centered = b.op("Sub", [stash, b.op("ReduceMean", [stash, axes], keepdims=1)])
    variance = b.op("ReduceMean", [b.op("Mul", [centered, centered]), axes], keepdims=1)
    epsilon = b.const(float(attribute(node, "epsilon", 1e-5)), np.float32, "epsilon")
    normalized = b.op("Mul", [centered, b.op("Reciprocal", [b.op("Sqrt", [b.op("Add", [variance, epsilon])])])])
    if element_type != TensorProto.FLOAT:
        normalized = b.op("Cast", [normalized], to=element_type)
    if bias:
        b.op("Add", [b.op("Mul", [normalized, scale]), bias], output=node.output[0])
    else:
        b.op("Mul", [normalized, scale], output=node.output[0])
    return b.nodes


def lower_gelu(node: onnx.NodeProto, builder: GraphBuilder, element_type: int) -> list[onnx.NodeProto]:
    b, x = builder, node.input[0]
    dtype = np.float16 if element_type == TensorProto.FLOAT16 else np.float32
    if (attribute(node, "approximate", b"none") or b"none").decode() == "tanh":
        cubic = b.op("Mul", [b.op("Mul", [b.op("Mul", [x, x]), x]), b.const(0.044715, dtype)])
        inner = b.op("Tanh", [b.op("Mul", [b.op("Add", [x, cubic]), b.const(np.sqrt(2 / np.pi), dtype)])])
    else:
        inner = b.op("Erf", [b.op("Mul", [x, b.const(1 / np.sqrt(2), dtype)])])
    half = b.op("Mul", [x, b.const(0.5, dtype)])
    b.op("Mul", [half, b.op("Add", [inner, b.const(1.0, dtype)])], output=node.output[0])
    return b.nodes


def lower_gather_nd(node: onnx.NodeProto, builder: GraphBuilder, shapes: dict[str, list]) -> list[onnx.NodeProto]:
    """GatherND (batch_dims 0) whose indices address whole elements: a Gather on the flattened data at
    sum(index_k * stride_k). Every data dimension but the first must be static."""
    data, indices = node.input[0], node.input[1]
    data_shape, index_shape = shapes.get(data), shapes.get(indices)
    if int(attribute(node, "batch_dims", 0)) or not data_shape or not index_shape or index_shape[-1] != len(data_shape):
        raise ValueError(f"GatherND {node.name}: only batch_dims 0 with full indices is lowered")
    if not all(isinstance(d, int) and d > 0 for d in data_shape[1:]):
        raise ValueError(f"GatherND {node.name}: the data's trailing dimensions must be static")
    strides = [int(np.prod(data_shape[k + 1 :])) for k in range(len(data_shape))]
    b = builder
    flat_index = b.op("ReduceSum", [b.op("Mul", [indices, b.const(strides)]), b.const([-1])], keepdims=0)
    flat = b.op("Reshape", [data, b.const([-1])])
    b.op("Gather", [flat, flat_index], axis=0, output=node.output[0])
    return b.nodes
