"""The export as it was before weights were streamed: torch.onnx (dynamo) over the module *with* its
weights, optimized by torch.onnx itself. The streamed exporter must produce the same graphs and the same
weight values; the tests compare against this."""

from __future__ import annotations

import onnx
import torch

from vllm_sr_runtime.export.gdn_ops import patched_gdn
from vllm_sr_runtime.export.graph_passes import trim_contrib_outputs
from vllm_sr_runtime.export.streaming import trace_arguments, tracer_notices_silenced


def reference_trace(module, sample: dict, input_names, dynamic_axes: dict, output_name: str, translations: dict, method: str = "forward") -> onnx.ModelProto:
    kwargs, shapes = trace_arguments(sample, input_names, dynamic_axes)
    if method != "forward":
        module.forward = getattr(module, method)
    try:
        with patched_gdn(module), torch.no_grad(), tracer_notices_silenced():
            program = torch.onnx.export(
                module, (), kwargs=kwargs, dynamic_shapes=shapes, dynamo=True, opset_version=23, custom_translation_table=translations,
                input_names=list(input_names), output_names=[output_name], optimize=True, verbose=False,
            )  # fmt: skip
    finally:
        if method != "forward":
            del module.forward
    model = program.model_proto
    trim_contrib_outputs(model)
    return model


def signature(model: onnx.ModelProto) -> tuple[list, dict[str, tuple]]:
    """The graph's ops in order and every initializer's dtype, shape and bytes, by name."""
    from onnx import numpy_helper

    ops = [(node.domain, node.op_type, tuple(node.input), tuple(node.output)) for node in model.graph.node]
    weights = {}
    for tensor in model.graph.initializer:
        array = numpy_helper.to_array(tensor)
        weights[tensor.name] = (str(array.dtype), array.shape, array.tobytes())
    return ops, weights


def assert_same_graph(streamed: onnx.ModelProto, reference: onnx.ModelProto) -> None:
    ops, weights = signature(streamed)
    ref_ops, ref_weights = signature(reference)
    assert [op[:2] for op in ops] == [op[:2] for op in ref_ops], "different ops"
    assert ops == ref_ops, "same ops, different wiring"
    assert weights.keys() == ref_weights.keys(), sorted(set(weights) ^ set(ref_weights))[:5]
    different = [name for name in weights if weights[name] != ref_weights[name]]
    assert not different, f"weights differ: {different[:5]}"
