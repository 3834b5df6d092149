"""`--dtype int8` applied to the traced graph before its weights are written, one weight at a time.

The graph gets the pattern ONNX Runtime's dynamic quantizer (`quantize_dynamic`, per-channel, signed int8
weights) writes, and ORT fuses it at session start into DynamicQuantizeMatMul / MatMulIntegerToFloat:
each activation read by quantized MatMuls is quantized once (DynamicQuantizeLinear, uint8, one scale per
tensor) and shared by all of them; each weight is quantized symmetrically with one scale per output
column. The quantized weight is computed when the writer reaches it, from the package's tensor, so the
exporter never holds more than one weight; the values are those of `quantize_dynamic`
(`onnxruntime.quantization.quant_utils.quantize_data`, vectorized), which a test checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import onnx_ir as ir

from vllm_sr_runtime.export.streaming import TracedGraph

# Backbone weights kept FP32 under --dtype int8, by parameter-name suffix: the token mixers' output
# projections. Their inputs (attention / Gated DeltaNet outputs) carry the outliers that per-tensor
# dynamic activation quantization handles worst: on a confident d3-lite package, keeping just these
# ~10% of the FLOPs in FP32 took int8's changed decisions from 12/39 to 0/39 on its flip-prone requests
# (other groups kept FP32 instead: 3-11/39).
INT8_FP32_PROJECTIONS = ("linear_attn.out_proj.weight", "self_attn.o_proj.weight")
QMAX = 127  # symmetric signed int8 weights: [-127, 127] (ORT's WeightSymmetric default for QInt8)
BLOCK_ROWS = 1024  # rows quantized per step, so temporaries stay a fraction of the weight


def stays_fp32(name: str, quantized_towers: tuple[str, ...]) -> bool:
    """Whether the MatMul reading the module weight `name` stays FP32 under --dtype int8: weights outside the
    family's quantized towers (the readout / candidate head, whose logits are the answer) always do."""
    return not name.startswith(quantized_towers) or name.endswith(INT8_FP32_PROJECTIONS)


def quantize_per_channel(weight: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 quantization of a 2-D weight with one scale per index of `axis`: (int8 values, float32
    scales), equal to quant_utils.quantize_data applied to each channel as ORT's quantizer does."""
    weight = np.asarray(weight, dtype=np.float32)
    reduce = 1 - axis
    absmax = np.maximum(np.abs(np.minimum(weight.min(axis=reduce), 0)), np.maximum(weight.max(axis=reduce), 0))
    exact = (absmax.astype(np.float64) * 2) / (2 * QMAX)
    scale = exact.astype(np.float32)
    scale[exact < np.finfo(np.float32).tiny] = 1.0
    quantized = np.empty(weight.shape, dtype=np.int8)
    for start in range(0, weight.shape[0], BLOCK_ROWS):
        rows = slice(start, start + BLOCK_ROWS)
        divisor = scale[rows, None] if axis == 0 else scale[None, :]
        block = np.round(weight[rows] / divisor)
        np.clip(block, -128, 127, out=block)
        quantized[rows] = block
    return quantized, scale


@dataclass
class _QuantizedWeight:
    """One weight's int8 values and scales, computed once when the writer reaches the first of them."""

    load: Callable[[], np.ndarray]
    axis: int  # the output-channel axis of what `load` returns
    transpose: bool  # whether the MatMul reads the transpose of what `load` returns
    _scale: np.ndarray | None = field(default=None, repr=False)

    def values(self) -> ir.Tensor:
        quantized, self._scale = quantize_per_channel(self.load(), self.axis)
        return ir.tensor(np.ascontiguousarray(quantized.T) if self.transpose else quantized)

    def scale(self) -> ir.Tensor:
        if self._scale is None:
            _, self._scale = quantize_per_channel(self.load(), self.axis)
        scale, self._scale = self._scale, None
        return ir.tensor(scale)


def quantize_matmuls(traced: TracedGraph, keep_fp32: Callable[[str], bool]) -> int:
    """Rewrite every FP32 MatMul whose weight is a package tensor (or its transpose) that `keep_fp32` does
    not keep into the dynamic int8 pattern; returns how many were rewritten."""
    graph = traced.model.graph
    activations: dict[int, tuple[ir.Value, ir.Value, ir.Value]] = {}
    weights: dict[int, tuple[ir.Value, ir.Value, ir.Value]] = {}
    rewritten = 0
    for node in list(graph):
        if node.op_type != "MatMul" or node.domain != "" or len(node.inputs) != 2:
            continue
        activation, weight = node.inputs
        provenance = traced.provenance.get(id(weight.const_value)) if weight is not None and weight.is_initializer() else None
        if provenance is None or provenance[0] not in ("param", "transpose") or keep_fp32(provenance[1]):
            continue
        if weight.dtype != ir.DataType.FLOAT or len(weight.shape) != 2 or activation.dtype != ir.DataType.FLOAT:
            continue
        if provenance[0] == "transpose" and provenance[2] != (1, 0):
            continue
        new_nodes = []
        if id(activation) not in activations:
            dynamic = ir.Node("", "DynamicQuantizeLinear", [activation], num_outputs=3, name=f"{activation.name}_QuantizeLinear")
            for output, suffix in zip(dynamic.outputs, ("quantized", "scale", "zero_point")):
                output.name = f"{activation.name}_{suffix}"
            new_nodes.append(dynamic)
            activations[id(activation)] = tuple(dynamic.outputs)
        if id(weight) not in weights:
            weights[id(weight)] = _quantized_weight(traced, weight, provenance)
        a_q, a_scale, a_zero = activations[id(activation)]
        w_q, w_scale, w_zero = weights[id(weight)]
        base = node.name or node.outputs[0].name
        integer = ir.Node("", "MatMulInteger", [a_q, w_q, a_zero, w_zero], name=f"{base}_quant")
        integer.outputs[0].name = f"{node.outputs[0].name}_output_quantized"
        cast = ir.Node("", "Cast", integer.outputs, [ir.AttrInt64("to", ir.DataType.FLOAT)], name=f"{base}_cast")
        cast.outputs[0].name = f"{integer.outputs[0].name}_cast_output"
        scales = ir.Node("", "Mul", [a_scale, w_scale], name=f"{base}_scales_mul")
        scales.outputs[0].name = f"{base}_scales_mul:0"
        result = ir.Node("", "Mul", [cast.outputs[0], scales.outputs[0]], name=f"{base}_output_scale_mul")
        new_nodes += [integer, cast, scales, result]
        ir.convenience.replace_nodes_and_values(graph, node, [node], new_nodes, [node.outputs[0]], [result.outputs[0]])
        rewritten += 1
    for name, value in list(graph.initializers.items()):
        if not value.uses() and not value.is_graph_output():
            graph.initializers.pop(name)
    return rewritten


def _quantized_weight(traced: TracedGraph, weight: ir.Value, provenance: tuple) -> tuple[ir.Value, ir.Value, ir.Value]:
    """The int8 weight, its per-column scales and zero points, as lazy initializers with provenance (so a
    second graph of the artifact reuses the first one's bytes)."""
    kind, name = provenance[0], provenance[1]
    rows, columns = weight.shape[0], weight.shape[1]
    source = traced.sources.get(name)
    if source is not None:  # read the package tensor as stored; a transposed one is quantized per row
        quantized = _QuantizedWeight(lambda: source.load().detach().float().numpy(), 0 if kind == "transpose" else 1, kind == "transpose")
    else:
        const = weight.const_value
        quantized = _QuantizedWeight(lambda: const.numpy(), 1, False)
    key = (name, kind)
    q_value = ir.Value(
        name=f"{weight.name}_quantized", shape=ir.Shape([rows, columns]), type=ir.TensorType(ir.DataType.INT8),
        const_value=ir.LazyTensor(quantized.values, dtype=ir.DataType.INT8, shape=ir.Shape([rows, columns]), name=f"{weight.name}_quantized"),
    )  # fmt: skip
    scale_value = ir.Value(
        name=f"{weight.name}_scale", shape=ir.Shape([columns]), type=ir.TensorType(ir.DataType.FLOAT),
        const_value=ir.LazyTensor(quantized.scale, dtype=ir.DataType.FLOAT, shape=ir.Shape([columns]), name=f"{weight.name}_scale"),
    )  # fmt: skip
    zero_value = ir.Value(
        name=f"{weight.name}_zero_point", shape=ir.Shape([columns]), type=ir.TensorType(ir.DataType.INT8),
        const_value=ir.tensor(np.zeros(columns, dtype=np.int8), name=f"{weight.name}_zero_point"),
    )  # fmt: skip
    traced.provenance[id(q_value.const_value)] = ("int8", *key)
    traced.provenance[id(scale_value.const_value)] = ("int8 scale", *key)
    traced.provenance[id(zero_value.const_value)] = ("int8 zero point", columns)
    for value in (q_value, scale_value, zero_value):  # in this order: the scales come from the values' pass
        traced.model.graph.register_initializer(value)
    return q_value, scale_value, zero_value
