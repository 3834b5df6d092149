"""The portable variant: every com.microsoft node rewritten into standard ai.onnx ops.

CausalConvWithState -> Conv (depthwise, left padding K-1) then SiLU; LinearAttention (gated_delta) ->
a Scan over tokens carrying the [B, H, dk, dv] state. Slower than the fused kernels, but it runs on
execution providers without the contrib ops (MIGraphX).
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper, numpy_helper
import numpy as np


class _Names:
    def __init__(self, prefix: str):
        self.prefix = prefix
        self.count = 0

    def __call__(self, hint: str) -> str:
        self.count += 1
        return f"{self.prefix}/{hint}_{self.count}"


def _const(name: str, values, dtype=np.int64) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(values, dtype=dtype), name))


def _attr(node: onnx.NodeProto, name: str, default=None):
    for attribute in node.attribute:
        if attribute.name == name:
            return helper.get_attribute_value(attribute)
    return default


def _initializer_shape(model: onnx.ModelProto, name: str) -> list[int] | None:
    for init in model.graph.initializer:
        if init.name == name:
            return list(init.dims)
    return None


def _lower_conv(node: onnx.NodeProto, model: onnx.ModelProto, names: _Names) -> list[onnx.NodeProto]:
    x, weight = node.input[0], node.input[1]
    kernel_shape = _weight_shape(model, weight)
    channels, kernel = kernel_shape[0], kernel_shape[-1]
    conv_out = names("conv")
    nodes = [
        helper.make_node(
            "Conv", [x, weight] + ([node.input[2]] if len(node.input) > 2 and node.input[2] else []), [conv_out],
            group=channels, kernel_shape=[kernel], pads=[kernel - 1, 0], strides=[1], dilations=[1],
        )
    ]  # fmt: skip
    output = node.output[0]
    if (_attr(node, "activation", b"none") or b"none").decode() in ("silu", "swish"):
        gate = names("sigmoid")
        nodes += [helper.make_node("Sigmoid", [conv_out], [gate]), helper.make_node("Mul", [conv_out, gate], [output])]
    else:
        nodes.append(helper.make_node("Identity", [conv_out], [output]))
    if len(node.output) > 1 and node.output[1]:
        # The carry state (last K-1 inputs) is not used by prefill graphs; emit it for completeness.
        start, end, axes = names("start"), names("end"), names("axes")
        nodes += [
            _const(start, [-(kernel - 1)]), _const(end, [np.iinfo(np.int64).max]), _const(axes, [2]),
            helper.make_node("Slice", [x, start, end, axes], [node.output[1]]),
        ]  # fmt: skip
    return nodes


def _weight_shape(model: onnx.ModelProto, name: str) -> list[int]:
    shape = _initializer_shape(model, name)
    if shape is not None:
        return shape
    inferred = onnx.shape_inference.infer_shapes(model)
    for value in list(inferred.graph.value_info) + list(inferred.graph.input):
        if value.name == name:
            return [d.dim_value for d in value.type.tensor_type.shape.dim]
    raise ValueError(f"cannot find the shape of conv weight {name}")


def _scan_body(heads: int, key_dim: int, value_dim: int, scale: float) -> onnx.GraphProto:
    f = TensorProto.FLOAT
    nodes = [
        _const("qk_shape", [0, heads, key_dim]), _const("v_shape", [0, heads, value_dim]), _const("flat", [0, heads * value_dim]),
        _const("ax_last", [-1]), _const("ax_2", [2]), _const("ax_23", [2, 3]),
        helper.make_node("Constant", [], ["scale"], value=numpy_helper.from_array(np.asarray(scale, dtype=np.float32), "scale")),
        helper.make_node("Reshape", ["q_t", "qk_shape"], ["q"]),
        helper.make_node("Reshape", ["k_t", "qk_shape"], ["k"]),
        helper.make_node("Reshape", ["v_t", "v_shape"], ["v"]),
        helper.make_node("Exp", ["g_t"], ["decay"]),
        helper.make_node("Unsqueeze", ["decay", "ax_23"], ["decay4"]),
        helper.make_node("Mul", ["state_in", "decay4"], ["decayed"]),
        helper.make_node("Unsqueeze", ["k", "ax_last"], ["k4"]),
        helper.make_node("Mul", ["decayed", "k4"], ["sk"]),
        helper.make_node("ReduceSum", ["sk", "ax_2"], ["kv_mem"], keepdims=0),
        helper.make_node("Sub", ["v", "kv_mem"], ["err"]),
        helper.make_node("Unsqueeze", ["beta_t", "ax_last"], ["beta3"]),
        helper.make_node("Mul", ["err", "beta3"], ["delta"]),
        helper.make_node("Unsqueeze", ["delta", "ax_2"], ["delta4"]),
        helper.make_node("Mul", ["k4", "delta4"], ["update"]),
        helper.make_node("Add", ["decayed", "update"], ["state_out"]),
        helper.make_node("Mul", ["q", "scale"], ["qs"]),
        helper.make_node("Unsqueeze", ["qs", "ax_last"], ["q4"]),
        helper.make_node("Mul", ["state_out", "q4"], ["sq"]),
        helper.make_node("ReduceSum", ["sq", "ax_2"], ["o"], keepdims=0),
        helper.make_node("Reshape", ["o", "flat"], ["o_t"]),
    ]  # fmt: skip
    inputs = [
        helper.make_tensor_value_info("state_in", f, ["B", heads, key_dim, value_dim]),
        helper.make_tensor_value_info("q_t", f, ["B", heads * key_dim]),
        helper.make_tensor_value_info("k_t", f, ["B", heads * key_dim]),
        helper.make_tensor_value_info("v_t", f, ["B", heads * value_dim]),
        helper.make_tensor_value_info("g_t", f, ["B", heads]),
        helper.make_tensor_value_info("beta_t", f, ["B", heads]),
    ]
    outputs = [
        helper.make_tensor_value_info("state_out", f, ["B", heads, key_dim, value_dim]),
        helper.make_tensor_value_info("o_t", f, ["B", heads * value_dim]),
    ]
    return helper.make_graph(nodes, "gated_delta_step", inputs, outputs)


def _lower_linear_attention(node: onnx.NodeProto, names: _Names, dims: tuple[int, int]) -> list[onnx.NodeProto]:
    if (_attr(node, "update_rule", b"gated_delta") or b"").decode() != "gated_delta":
        raise ValueError("only the gated_delta LinearAttention can be lowered")
    heads = int(_attr(node, "kv_num_heads"))
    key_dim, value_dim = dims
    scale = float(_attr(node, "scale", 0.0) or key_dim**-0.5)
    q, k, v, past, decay, beta = (list(node.input) + [""] * 6)[:6]
    if past:
        raise ValueError("prefill graphs carry no past_state")
    shape, batch, state_shape, zeros = names("shape"), names("batch"), names("state_shape"), names("zeros")
    start, end, dims_name = names("s0"), names("s1"), names("dims")
    final_state = node.output[1] if len(node.output) > 1 and node.output[1] else names("final_state")
    return [
        helper.make_node("Shape", [q], [shape]),
        _const(start, [0]), _const(end, [1]),
        helper.make_node("Slice", [shape, start, end], [batch]),
        _const(dims_name, [heads, key_dim, value_dim]),
        helper.make_node("Concat", [batch, dims_name], [state_shape], axis=0),
        helper.make_node("ConstantOfShape", [state_shape], [zeros], value=numpy_helper.from_array(np.zeros(1, np.float32))),
        helper.make_node(
            "Scan", [zeros, q, k, v, decay, beta], [final_state, node.output[0]],
            num_scan_inputs=5, scan_input_axes=[1] * 5, scan_output_axes=[1],
            body=_scan_body(heads, key_dim, value_dim, scale),
        ),
    ]  # fmt: skip


def lower_to_portable(model: onnx.ModelProto, gdn_dims: tuple[int, int] | None) -> onnx.ModelProto:
    """Returns a copy with no com.microsoft node. `gdn_dims` = (key head dim, value head dim)."""
    result = onnx.ModelProto()
    result.CopyFrom(model)
    graph = result.graph
    rewritten: list[onnx.NodeProto] = []
    for index, node in enumerate(graph.node):
        names = _Names(f"portable{index}")
        if node.domain == "com.microsoft" and node.op_type == "CausalConvWithState":
            rewritten += _lower_conv(node, result, names)
        elif node.domain == "com.microsoft" and node.op_type == "LinearAttention":
            if gdn_dims is None:
                raise ValueError("LinearAttention node but no Gated DeltaNet dimensions")
            rewritten += _lower_linear_attention(node, names, gdn_dims)
        elif node.domain == "com.microsoft":
            raise ValueError(f"no standard-op lowering for com.microsoft {node.op_type}")
        else:
            rewritten.append(node)
    del graph.node[:]
    graph.node.extend(rewritten)
    kept = [entry for entry in result.opset_import if entry.domain != "com.microsoft"]
    del result.opset_import[:]
    result.opset_import.extend(kept)
    return result
