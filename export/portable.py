"""The portable variant: one graph per static sequence length, in ops every execution provider has.

The causal conv is a standard depthwise Conv in every variant; LinearAttention (gated_delta) -> the
chunked algorithm with a static chunk count (export/chunked_gdn.py); Attention and RMSNormalization ->
primitive ops (and LayerNormalization, Gelu, GatherND, which the readout heads use). No Scan or Loop: MIGraphX compiles static shapes, and its ONNX Runtime provider lists
neither Scan nor the opset-23 fused ops.
"""

from __future__ import annotations

import onnx

from vllm_sr_runtime.export.chunked_gdn import GraphBuilder, lower_gated_delta
from vllm_sr_runtime.export.primitive_ops import attribute, lower_attention, lower_gather_nd, lower_gelu, lower_layer_norm, lower_rms_norm


def lower_to_portable(
    model: onnx.ModelProto,
    gdn_dims: tuple[int, int] | None,
    attention_heads: tuple[int, int],
    length: int,
    sequence_dims: tuple[str, ...] = ("sequence",),
) -> onnx.ModelProto:
    """A copy for sequences of exactly `length` tokens (the graph inputs' `sequence_dims` fixed to it) in
    ops every provider has: no com.microsoft node, no Scan or Loop, no opset-23 fused op.
    `gdn_dims` = (key head dim, value head dim); `attention_heads` = (query heads, key/value heads)."""
    result = onnx.ModelProto()
    result.CopyFrom(model)
    graph = result.graph
    for value in graph.input:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param in sequence_dims:
                dim.dim_value = length
    del graph.value_info[:]
    _rewrite(graph, lambda node, builder: _lower_contrib(node, builder, gdn_dims, length))
    shapes = _static_shapes(result)  # inferred once no contrib node (which has no shape inference) is left
    _rewrite(graph, lambda node, builder: _lower_fused(node, builder, shapes, attention_heads))
    kept = [entry for entry in result.opset_import if entry.domain != "com.microsoft"]
    del result.opset_import[:]
    result.opset_import.extend(kept)
    return result


def _rewrite(graph: onnx.GraphProto, lower) -> None:
    """Replace each node by `lower(node, builder)`'s nodes, or keep it where that returns None."""
    rewritten: list[onnx.NodeProto] = []
    for index, node in enumerate(graph.node):
        nodes = lower(node, GraphBuilder(f"{node.op_type}{index}"))
        rewritten.extend([node] if nodes is None else nodes)
    del graph.node[:]
    graph.node.extend(rewritten)


def _lower_contrib(node: onnx.NodeProto, builder: GraphBuilder, gdn_dims, length: int) -> list[onnx.NodeProto] | None:
    if node.domain != "com.microsoft":
        return None
    if node.op_type != "LinearAttention":
        raise ValueError(f"no standard-op lowering for com.microsoft {node.op_type}")
    if gdn_dims is None:
        raise ValueError("LinearAttention node but no Gated DeltaNet dimensions")
    if (attribute(node, "update_rule", b"gated_delta") or b"").decode() != "gated_delta":
        raise ValueError("only the gated_delta LinearAttention can be lowered")
    key_dim, value_dim = gdn_dims
    return lower_gated_delta(
        node, builder, heads=int(attribute(node, "kv_num_heads")), key_dim=key_dim, value_dim=value_dim,
        scale=float(attribute(node, "scale", 0.0) or key_dim**-0.5), length=length,
    )  # fmt: skip


def _lower_fused(node: onnx.NodeProto, builder: GraphBuilder, shapes: dict, heads: tuple[int, int]) -> list[onnx.NodeProto] | None:
    if node.op_type == "RMSNormalization":
        return lower_rms_norm(node, builder, shapes[f"{node.input[0]}#type"])
    if node.op_type == "Attention":
        return lower_attention(node, builder, shapes[f"{node.input[0]}#type"], shapes, heads)
    if node.op_type == "LayerNormalization":
        return lower_layer_norm(node, builder, shapes[f"{node.input[0]}#type"])
    if node.op_type == "Gelu":
        return lower_gelu(node, builder, shapes[f"{node.input[0]}#type"])
    if node.op_type == "GatherND":
        return lower_gather_nd(node, builder, shapes)
    return None


def _static_shapes(model: onnx.ModelProto) -> dict:
    """name -> shape (ints where known, else the symbol) and name#type -> element type, by shape inference."""
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    found: dict = {}
    for value in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        tensor = value.type.tensor_type
        found[f"{value.name}#type"] = tensor.elem_type
        found[value.name] = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim]
    for init in model.graph.initializer:
        found.setdefault(f"{init.name}#type", init.data_type)
        found.setdefault(init.name, list(init.dims))
    return found
