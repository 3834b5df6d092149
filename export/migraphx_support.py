"""Which nodes of a graph ONNX Runtime's MIGraphX provider would not take (and so, with CPU fallback
disabled, would fail the session): its op allow-list, its tensor types and its rules for inputs that
must be known when MIGraphX compiles (shapes, axes, slice bounds), vendored in migraphx_ops.json."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import onnx
from onnx import TensorProto


@lru_cache(maxsize=1)
def provider_rules() -> dict:
    return json.loads((Path(__file__).with_name("migraphx_ops.json")).read_text())


def unsupported_nodes(model: onnx.ModelProto) -> list[str]:
    """One line per node the provider would refuse (empty when it takes the whole graph)."""
    rules = provider_rules()
    ops, constant_inputs = set(rules["ops"]), rules["constant_inputs"]
    types = {getattr(TensorProto, name) for name in rules["types"]}
    graph = model.graph
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except onnx.shape_inference.InferenceError:  # nodes of an unknown domain: check what is declared
        inferred = model
    element_types = {v.name: v.type.tensor_type.elem_type for v in list(inferred.graph.value_info) + list(graph.input) + list(graph.output)}
    element_types.update({init.name: init.data_type for init in graph.initializer})
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
            TensorProto.DataType.Name(element_types[name])
            for name in list(node.input) + list(node.output)
            if name and element_types.get(name) and element_types[name] not in types
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
