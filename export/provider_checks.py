"""Structural checks of a graph against what an ONNX Runtime provider registers, from tables vendored with
their source: which nodes the MIGraphX provider would not take (migraphx_ops.json: its op allow-list, tensor
types and the inputs MIGraphX must know when it compiles), and which typed nodes have no CUDA kernel for their
floating-point type (cuda_kernels.json). With CPU fallback disabled, either fails the session on the GPU."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import onnx
from onnx import TensorProto


FLOATS = {TensorProto.FLOAT: "FLOAT", TensorProto.FLOAT16: "FLOAT16", TensorProto.BFLOAT16: "BFLOAT16"}


@lru_cache(maxsize=None)
def provider_rules(table: str = "migraphx_ops.json") -> dict:
    return json.loads((Path(__file__).with_name(table)).read_text())


def element_types(model: onnx.ModelProto) -> dict[str, int]:
    """Each tensor's element type, by shape inference where it runs (a graph with nodes of a domain onnx does
    not know keeps what is declared)."""
    graph = model.graph
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except onnx.shape_inference.InferenceError:
        inferred = model
    types = {v.name: v.type.tensor_type.elem_type for v in list(inferred.graph.value_info) + list(graph.input) + list(graph.output)}
    types.update({init.name: init.data_type for init in graph.initializer})
    return types


def cuda_kernel_gaps(model: onnx.ModelProto) -> list[str]:
    """One line per node whose floating-point tensors have a type the CUDA provider registers no kernel of
    that op for (or whose op it has no kernel for at all)."""
    kernels = provider_rules("cuda_kernels.json")["float_types"]
    types = element_types(model)
    gaps = []
    for node in model.graph.node:
        key = f"{node.domain or 'ai.onnx'}::{node.op_type}"
        used = {FLOATS[types[name]] for name in list(node.input) + list(node.output) if name and types.get(name) in FLOATS}
        if key not in kernels:
            gaps.append(f"{node.op_type} {node.name or node.output[0]}: no CUDA kernel in the vendored table")
        elif used - set(kernels[key]):
            gaps.append(f"{node.op_type} {node.name or node.output[0]}: no CUDA kernel for {', '.join(sorted(used - set(kernels[key])))}")
    return gaps


def migraphx_refusals(model: onnx.ModelProto) -> list[str]:
    """One line per node the MIGraphX provider would refuse (empty when it takes the whole graph)."""
    rules = provider_rules()
    ops, constant_inputs = set(rules["ops"]), rules["constant_inputs"]
    types = {getattr(TensorProto, name) for name in rules["types"]}
    graph = model.graph
    element_type = element_types(model)
    producers = {output: node for node in graph.node for output in node.output}
    initializers = {init.name for init in graph.initializer}
    graph_inputs = {value.name for value in graph.input} - initializers
    known: dict[str, bool] = {}

    def compile_time(name: str) -> bool:
        """MIGraphX's can_eval: an initializer, or computed only from initializers and Shape nodes."""
        if name in initializers:
            return True
        if name in graph_inputs or name not in producers:
            return False
        if name not in known:
            node = producers[name]
            known[name] = node.op_type == "Shape" or all(compile_time(i) for i in node.input if i)
        return known[name]

    problems = []
    for node in graph.node:
        label = f"{node.op_type} {node.name or node.output[0]}"
        if node.domain not in ("", "ai.onnx"):
            problems.append(f"{label}: domain {node.domain} (the provider runs ai.onnx ops only)")
            continue
        if node.op_type not in ops:
            problems.append(f"{label}: not in the provider's op list")
            continue
        bad_types = {
            TensorProto.DataType.Name(element_type[name])
            for name in list(node.input) + list(node.output)
            if name and element_type.get(name) and element_type[name] not in types
        }
        if bad_types:
            problems.append(f"{label}: tensor type {', '.join(sorted(bad_types))}")
        for index in constant_inputs.get(node.op_type, []):
            if index < len(node.input) and node.input[index] and not compile_time(node.input[index]):
                problems.append(f"{label}: input {index} ({node.input[index]}) is not known at compile time")
        if node.op_type == "Loop" and not (node.input[0] and compile_time(node.input[0])):
            problems.append(f"{label}: the trip count is not a constant")
        if node.op_type in ("MatMulInteger", "ConvInteger") and len([i for i in node.input if i]) != 2:
            problems.append(f"{label}: zero-point inputs (the provider takes two inputs)")
    return problems
