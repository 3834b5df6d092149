"""Passes over the exported ONNX graph."""

from __future__ import annotations

import collections

import onnx
import onnx_ir as ir

# Outputs ONNX Runtime requires each contrib node to declare; trailing optional ones beyond these select
# CUDA-only extended paths, so they are dropped when nothing reads them.
CONTRIB_REQUIRED_OUTPUTS = {"CausalConvWithState": 2, "LinearAttention": 2}


def trim_contrib_outputs(model: onnx.ModelProto) -> None:
    used = {name for node in model.graph.node for name in node.input} | {o.name for o in model.graph.output}
    for node in model.graph.node:
        keep = CONTRIB_REQUIRED_OUTPUTS.get(node.op_type) if node.domain == "com.microsoft" else None
        if keep is None:
            continue
        while len(node.output) > keep and node.output[-1] not in used:
            node.output.pop()


def drop_untyped_shapes(model: ir.Model) -> int:
    """Forget the shapes of values that have no type: the contrib ops' outputs (no type inference) as torch.onnx
    leaves them. The serializer writes no value_info for them either way, but warns once per value (one line per
    Gated DeltaNet layer in every export). Returns how many."""
    dropped = 0
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        for value in node.outputs:
            if value.type is None and value.shape is not None:
                value.shape = None
                dropped += 1
    return dropped


def op_counts(model: onnx.ModelProto) -> dict[str, int]:
    """{"domain::OpType": count} over the main graph and every subgraph, sorted by key."""
    counts: collections.Counter[str] = collections.Counter()

    def visit(graph: onnx.GraphProto) -> None:
        for node in graph.node:
            counts[f"{node.domain or 'ai.onnx'}::{node.op_type}"] += 1
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:
                    visit(attribute.g)
                for sub in attribute.graphs:
                    visit(sub)

    visit(model.graph)
    return dict(sorted(counts.items()))


def cast_mixed_rms_norms(model: onnx.ModelProto) -> int:
    """onnxscript's RMSNorm fusion folds the upcast of `x.float()` into RMSNormalization's stash_type, which
    leaves a reduced-precision X beside an FP32 scale (Qwen3.5's `1 + weight.float()`); ONNX and ORT type X
    and Y alike there, so such a node does not load. The upcast is put back as a Cast: the norm statistics
    and the scaling run in FP32 as in the module. Returns the number of nodes fixed."""
    graph = model.graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*graph.value_info, *graph.input, *graph.output]}
    types.update({t.name: t.data_type for t in graph.initializer})
    fixed = 0
    for index in range(len(graph.node) - 1, -1, -1):
        node = graph.node[index]
        if node.op_type != "RMSNormalization" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
            continue
        x_type, scale_type = types.get(node.input[0]), types.get(node.input[1])
        if x_type is None or scale_type is None or x_type == scale_type:
            continue
        cast_output = f"{node.input[0]}_as_{onnx.TensorProto.DataType.Name(scale_type).lower()}_for_{node.name or index}"
        graph.node.insert(index, onnx.helper.make_node("Cast", [node.input[0]], [cast_output], to=scale_type, name=f"{cast_output}_cast"))
        node.input[0] = cast_output
        fixed += 1
    return fixed
