"""Traced graphs of a single MatMul (and optionally a second reader of its activation) whose weights are package
tensors: what export/int8.py's quantize_matmuls rewrites, small enough to check against NumPy references."""

from __future__ import annotations

import numpy as np


def matmul_graph(weight: np.ndarray, *, second_reader: bool = False):
    """x [rows, K] @ weight -> y. With `second_reader`, x [batch, rows, K] is also read by a MatMul with -weight
    ("other.weight") and y = x @ w - x @ (-w) = 2 x @ w (two readers of one activation)."""
    import onnx_ir as ir

    from vllm_sr_runtime.export.streaming import TracedGraph

    lead = ["batch", "rows"] if second_reader else ["rows"]
    x = ir.Value(name="x", shape=ir.Shape([*lead, weight.shape[0]]), type=ir.TensorType(ir.DataType.FLOAT))
    w = ir.Value(name="w", shape=ir.Shape(list(weight.shape)), type=ir.TensorType(ir.DataType.FLOAT), const_value=ir.tensor(weight, name="w"))
    first = ir.Node("", "MatMul", [x, w], name="first" if second_reader else "linear")
    nodes, initializers, output = [first], [w], first.outputs[0]
    if second_reader:
        flipped = np.ascontiguousarray(-weight)
        v = ir.Value(name="v", shape=ir.Shape(list(weight.shape)), type=ir.TensorType(ir.DataType.FLOAT), const_value=ir.tensor(flipped, name="v"))
        second = ir.Node("", "MatMul", [x, v], name="second")
        sub = ir.Node("", "Sub", [first.outputs[0], second.outputs[0]], name="difference")
        nodes, initializers, output = [first, second, sub], [w, v], sub.outputs[0]
    output.name, output.dtype, output.shape = "y", ir.DataType.FLOAT, ir.Shape([*lead, weight.shape[1]])
    graph = ir.Graph([x], [output], nodes=nodes, initializers=initializers, opset_imports={"": 21})
    traced = TracedGraph(ir.Model(graph, ir_version=10), sources={})
    traced.provenance[id(w.const_value)] = ("param", "layer.weight")
    if second_reader:
        traced.provenance[id(initializers[1].const_value)] = ("param", "other.weight")
    return traced
