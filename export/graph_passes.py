"""Passes over the exported ONNX graph."""

from __future__ import annotations

import collections

import onnx

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
