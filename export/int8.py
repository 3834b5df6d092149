"""`--dtype int8` applied to the traced graph before its weights are written, one weight at a time.

Each weight is quantized symmetrically to int8 with one scale per output column. Each activation read by
quantized MatMuls is quantized once and shared by all of them (q, k and v read one), in one of these forms:
- `token` (default): one scale per token (row), symmetric, stored as uint8 around a fixed zero point of 128 so
  ORT's fast u8 x s8 kernel runs it: one per-axis QuantizeLinear per activation, then per MatMul one
  MatMulIntegerToFloat (integer product and column scales in one kernel) and one Mul by the row scales.
  One outlier token no longer costs every other token its precision: on the d3-lite seed-3 package it took
  the changed decisions from 25/80 to 16/80, not to the 1% target: Gaussian noise of int8's weight rounding
  size alone already changes 4/80 there (`parity --weight-noise int8`), so no int8 form can pass it.
- `tensor`: ORT's dynamic quantizer's pattern (`quantize_dynamic`: DynamicQuantizeLinear, uint8, one scale
  for the whole tensor), which ORT fuses into DynamicQuantizeMatMul / MatMulIntegerToFloat.
- `block`: ORT's MatMulNBits at 8 bits: the weight rounded per output column and block of `NBITS_BLOCK` inputs,
  and (accuracy_level 4) the activation rounded per token and block of as many channels inside the kernel, so an
  outlier channel costs only its own block its precision. On outlier activations (8 channels x30, one token
  x20; 512x1024x3584, 2 cores) its error was 0.98% RMS against per-tensor int8's 25%, at 1.8x fp32's speed and
  0.35x per-tensor int8's (`/work/notes/nbits_bench.py`).
- `split` (for the MatMuls that would otherwise stay FP32, per token only): weight and activation each as two int8
  halves, value ~ scale * (high + low / SPLIT_LOW_STEPS), the low half the high half's rounding residual quantized
  again: ~15 bits. Two MatMulIntegerToFloat: high x high, and both cross terms in one product over [high | low]
  activations and a [low; high] weight; the low x low term is left out (~1/64,000 of the first). On outlier
  activations its error was ~1/100 of per token's (`/work/notes/hilo_bench.py`), and on d3-lite seed 3 the measured
  choice in this form answered `parity --suite short` like the same choice in FP32, 1.57x faster (AMX host).
Weights take 8 bits by default ([-127, 127]); with `weight_bits=7` ([-63, 63], the split form's low halves too) for x86
hosts without VNNI: ORT's u8 x s8 kernel there (AVX2, AVX-512 without VNNI) sums pairs of products in 16 bits with
saturation (VPMADDUBSW), 255 x 127 x 2 overflows, 255 x 63 x 2 does not (measured under QEMU's Haswell: 8-bit weights
wrong by up to 19% of the product, 7-bit exact); the block form's kernel does not saturate and keeps 8 bits.
Which MatMuls stay FP32: always the readout (outside the quantized towers) and the fixed rule below
(`INT8_FP32_PROJECTIONS`); under `--int8-fp32 measured` (the default) also the ones the package's own first-order
sensitivity names (`export.int8_sensitivity`), passed in through `keep_fp32`. Under `--int8-sensitive block`,
with per-token activations, the measurement first moves the most harmful MatMuls to the block form (`blocked`) and
keeps FP32 only those for which that is not enough.
The quantized weight is computed when the writer reaches it, from the package's tensor, so the exporter never
holds more than one weight; the values are those of `quantize_dynamic`
(`onnxruntime.quantization.quant_utils.quantize_data`, vectorized), which a test checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import numpy as np
import onnx_ir as ir

from vllm_sr_runtime.export.int8_options import ACTIVATION_FORMS, WEIGHT_BITS_CHOICES
from vllm_sr_runtime.export.streaming import TracedGraph

# Backbone weights kept FP32 under --dtype int8, by parameter-name suffix: the token mixers' output
# projections. Their inputs (attention / Gated DeltaNet outputs) carry the outliers that per-tensor
# dynamic activation quantization handles worst: on a confident d3-lite package, keeping just these
# ~10% of the FLOPs in FP32 took int8's changed decisions from 12/39 to 0/39 on its flip-prone requests
# (other groups kept FP32 instead: 3-11/39).
# The Gated DeltaNet's in_proj_a / in_proj_b feed its decay and write strength (the gate math the numerics
# policy keeps FP32; an error there compounds over the whole sequence): FP32 too, at ~0.5% of the FLOPs. On
# the d3-lite seed-3 package int8 had failed on (25/80 per tensor), per-token activations changed 16/80, and
# these two kept FP32 as well 11/80 (all Gated DeltaNet projections FP32: 9/80): still far from 1%.
# The FP32 MatMuls take ~20% of int8's time at 510 tokens (ORT profile). With per-token activations,
# quantizing o_proj/out_proj too still changes 0/80 on seed 0 but 16/80 (not 11/80) on seed 3: they stay FP32.
# Left to the measured choice instead (d3-lite seed 0, built-in calibration): it kept 13 of the 24 FP32 and 29 other
# Linears (42 MatMuls, against 26 beside the rule), and int8 ran no faster (2,037 ms against 1,974 at 510 tokens).
INT8_FP32_PROJECTIONS = ("linear_attn.out_proj.weight", "self_attn.o_proj.weight", "linear_attn.in_proj_a.weight", "linear_attn.in_proj_b.weight")
QMAX = 127  # symmetric signed int8 weights: [-127, 127] (ORT's WeightSymmetric default for QInt8)
TOKEN_ZERO_POINT = 128  # per-token activations: round(x / scale) in [-127, 127], stored as uint8 + 128
NBITS_BLOCK = 32  # `block`: weight and activation values per scale along the reduced axis
NBITS_ZERO_POINT = 128  # MatMulNBits' zero point at 8 bits when none is given: the values are stored as uint8 + 128
NBITS_ACCURACY_LEVEL = 4  # int8 activations (per token and block) and an integer product, not FP32 compute
BLOCK_ROWS = 1024  # rows quantized per step, so temporaries stay a fraction of the weight
WEIGHT_BITS = WEIGHT_BITS_CHOICES[0]  # the default; 7 for hosts whose int8 kernel saturates


def weight_qmax(bits: int) -> int:
    """The largest int8 weight value at `bits` bits: 127 at 8, 63 at 7."""
    return (1 << (bits - 1)) - 1


def split_low_steps(qmax: int) -> int:
    """How many times finer the split form's low halves step than the high ones, for halves in [-qmax, qmax]: a
    rounding residual (at most half a step) fills the low half's range, weights' and activations' alike (one product
    reads both)."""
    return 2 * qmax


# `split` at 8 bits: a value's rounding residual (at most half its int8 step) quantized again with a step this many
# times finer, so it fits [-127, 127]: the two int8 halves together hold the value to ~1/64,000 of its row's or column's peak
SPLIT_LOW_STEPS = split_low_steps(QMAX)  # 254


def stays_fp32(name: str, quantized_towers: tuple[str, ...]) -> bool:
    """Whether the MatMul reading the module weight `name` stays FP32 under --dtype int8: weights outside the
    family's quantized towers (the readout / candidate head, whose logits are the answer) always do."""
    return not name.startswith(quantized_towers) or name.endswith(INT8_FP32_PROJECTIONS)


@dataclass(frozen=True)
class Int8Layout:
    """Where `--dtype int8` puts the weights of one export's graphs (the main, shared_context and media text
    graphs read the same): the family's quantized `towers`, less the fixed rule's and the measured choice's `kept`
    FP32 weights; `blocked`'s in the block form, `split`'s and (with `split_rule`) the fixed rule's in the split form;
    the integer products' weights at `weight_bits`; the `embedding_tables` stored as int8 rows."""

    towers: tuple[str, ...] = ()
    activations: str = "token"
    kept: frozenset[str] = frozenset()
    blocked: frozenset[str] = frozenset()
    split: frozenset[str] = frozenset()
    split_rule: bool = False
    weight_bits: int = WEIGHT_BITS
    embedding_tables: tuple[str, ...] = ()

    def keeps_fp32(self, name: str) -> bool:
        return stays_fp32(name, self.towers) or name in self.kept

    def splits(self, name: str) -> bool:
        return name in self.split or (self.split_rule and name.startswith(self.towers) and stays_fp32(name, self.towers))


def quantize_per_channel(weight: np.ndarray, axis: int, qmax: int = QMAX) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 quantization of a 2-D weight with one scale per index of `axis` into [-qmax, qmax]: (int8
    values, float32 scales), at 8 bits equal to quant_utils.quantize_data applied to each channel as ORT's quantizer does."""
    weight = np.asarray(weight, dtype=np.float32)
    reduce = 1 - axis
    absmax = np.maximum(np.abs(np.minimum(weight.min(axis=reduce), 0)), np.maximum(weight.max(axis=reduce), 0))
    exact = (absmax.astype(np.float64) * 2) / (2 * qmax)
    scale = exact.astype(np.float32)
    scale[exact < np.finfo(np.float32).tiny] = 1.0
    quantized = np.empty(weight.shape, dtype=np.int8)
    for start in range(0, weight.shape[0], BLOCK_ROWS):
        rows = slice(start, start + BLOCK_ROWS)
        divisor = scale[rows, None] if axis == 0 else scale[None, :]
        block = np.round(weight[rows] / divisor)
        np.clip(block, -qmax - 1, qmax, out=block)
        quantized[rows] = block
    return quantized, scale


def quantize_split(weight: np.ndarray, axis: int, qmax: int = QMAX) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The `split` form of a 2-D weight: (high int8 values, low int8 values, float32 scales per index of `axis`), the
    high half `quantize_per_channel`'s and the low half its rounding residual in steps `split_low_steps(qmax)` times
    finer (SPLIT_LOW_STEPS at 8 bits), both halves in [-qmax, qmax], so weight ~ scale * (high + low / steps)."""
    weight = np.asarray(weight, dtype=np.float32)
    high, scale = quantize_per_channel(weight, axis, qmax)
    steps = split_low_steps(qmax)
    low = np.empty(weight.shape, dtype=np.int8)
    for start in range(0, weight.shape[0], BLOCK_ROWS):
        rows = slice(start, start + BLOCK_ROWS)
        divisor = scale[rows, None] if axis == 0 else scale[None, :]
        residual = np.round((weight[rows] - high[rows] * divisor) / (divisor / steps))
        np.clip(residual, -qmax, qmax, out=residual)
        low[rows] = residual
    return high, low, scale


@dataclass
class _LazyQuantized:
    """One weight's quantized values and scales (`quantize` returns both), computed once when the writer reaches
    the first of them; the values pass keeps the scales for the scales pass."""

    quantize: Callable[[], tuple[np.ndarray, np.ndarray]]
    _scale: np.ndarray | None = field(default=None, repr=False)

    def values(self) -> ir.Tensor:
        quantized, self._scale = self.quantize()
        return ir.tensor(quantized)

    def scale(self) -> ir.Tensor:
        if self._scale is None:
            _, self._scale = self.quantize()
        scale, self._scale = self._scale, None
        return ir.tensor(scale)


class _Planned(NamedTuple):
    """One lazy initializer to be: its name, element type, shape and provenance."""

    name: str
    dtype: ir.DataType
    shape: list[int]
    provenance: tuple


def _lazy_pair(traced: TracedGraph, quantize: Callable[[], tuple[np.ndarray, np.ndarray]], values: _Planned, scales: _Planned) -> tuple[ir.Value, ir.Value]:
    """The values and scales `quantize` computes, computed once when the writer reaches them, as initializers
    registered with their provenance (so a second graph of the artifact reuses the first one's bytes); values first:
    the scales come from the values' pass."""
    lazy = _LazyQuantized(quantize)
    made = []
    for plan, read in ((values, lazy.values), (scales, lazy.scale)):
        shape = ir.Shape(plan.shape)
        value = ir.Value(
            name=plan.name, shape=shape, type=ir.TensorType(plan.dtype), const_value=ir.LazyTensor(read, dtype=plan.dtype, shape=shape, name=plan.name)
        )  # fmt: skip
        traced.provenance[id(value.const_value)] = plan.provenance
        traced.model.graph.register_initializer(value)
        made.append(value)
    return made[0], made[1]


def _per_channel_of(load: Callable[[], np.ndarray], axis: int, transpose: bool, qmax: int = QMAX) -> Callable[[], tuple[np.ndarray, np.ndarray]]:
    """`quantize_per_channel` of what `load` returns (output channels on `axis`), its values transposed where the
    MatMul reads the transpose."""

    def quantize() -> tuple[np.ndarray, np.ndarray]:
        quantized, scale = quantize_per_channel(load(), axis, qmax)
        return (np.ascontiguousarray(quantized.T) if transpose else quantized), scale

    return quantize


class _SplitOnce:
    """One weight's split form (`quantize_split`), loaded and computed once for both weights its products read: the
    high half ([inputs, outputs], the per-token product's, equal to `quantize_per_channel`'s) and the cross-term
    weight (its low half stacked on its high half along the inputs, [2 x inputs, outputs], read by [high | low]
    activations, with the low half's scales). The halves are dropped once both have been taken."""

    def __init__(self, load: Callable[[], np.ndarray], axis: int, transpose: bool, qmax: int = QMAX):
        self.load, self.axis, self.transpose, self.qmax = load, axis, transpose, qmax
        self._halves: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._waiting = {"high", "cross"}

    def _take(self, part: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        halves = self._halves if self._halves is not None else quantize_split(self.load(), self.axis, self.qmax)
        self._waiting.discard(part)
        self._halves = halves if self._waiting else None
        high, low, scale = halves
        return (high.T, low.T, scale) if self.transpose else halves

    def high(self) -> tuple[np.ndarray, np.ndarray]:
        high, _, scale = self._take("high")
        return np.ascontiguousarray(high), scale

    def cross(self) -> tuple[np.ndarray, np.ndarray]:
        high, low, scale = self._take("cross")
        return np.concatenate([low, high], axis=0), (scale / split_low_steps(self.qmax)).astype(np.float32)


def quantize_matmuls(
    traced: TracedGraph, keep_fp32: Callable[[str], bool], activations: str = "token", blocked: Callable[[str], bool] = lambda name: False,
    split: Callable[[str], bool] = lambda name: False, weight_bits: int = WEIGHT_BITS,
) -> int:
    """Rewrite every FP32 MatMul whose weight is a package tensor (or its transpose) that `keep_fp32` does
    not keep into a dynamic int8 MatMul (activations quantized per `token`, per `tensor` or per `block`; the
    weights `blocked` names in the block form whatever `activations` says; those `split` names, kept or not, in the
    split form: per token, weight and activation each as two int8 halves, two integer products), the integer
    products' weights at `weight_bits` (8, or 7 for hosts whose int8 kernel saturates); returns how many were rewritten."""
    if activations not in ACTIVATION_FORMS:
        raise ValueError(f"int8 activations are quantized per {' or per '.join(ACTIVATION_FORMS)}, not {activations!r}")
    if weight_bits not in WEIGHT_BITS_CHOICES:
        raise ValueError(f"int8 weights take {' or '.join(map(str, WEIGHT_BITS_CHOICES))} bits, not {weight_bits!r}")
    qmax = weight_qmax(weight_bits)
    graph = traced.model.graph
    constants = _Constants(graph)
    quantized_inputs: dict[int, tuple[ir.Value, ir.Value, ir.Value]] = {}
    token_rows: dict[int, TokenRows] = {}
    both_halves: dict[int, ir.Value] = {}
    weights: dict[int, tuple[ir.Value, ir.Value, ir.Value]] = {}
    cross_weights: dict[int, tuple[ir.Value, ir.Value, ir.Value]] = {}
    rewritten, contrib = 0, activations == "token"
    for node in list(graph):
        if node.op_type != "MatMul" or node.domain != "" or len(node.inputs) != 2:
            continue
        activation, weight = node.inputs
        provenance = traced.provenance.get(id(weight.const_value)) if weight is not None and weight.is_initializer() else None
        if provenance is None or provenance[0] not in ("param", "transpose"):
            continue
        splits = split(provenance[1])
        if splits and activations != "token":
            raise ValueError("the split form reads activations per token")
        if keep_fp32(provenance[1]) and not splits:
            continue
        if weight.dtype != ir.DataType.FLOAT or len(weight.shape) != 2 or activation.dtype != ir.DataType.FLOAT:
            continue
        if provenance[0] == "transpose" and provenance[2] != (1, 0):
            continue
        base = node.name or node.outputs[0].name
        if activations == "block" or blocked(provenance[1]):
            if id(weight) not in weights:
                weights[id(weight)] = _blocked_weight(traced, weight, provenance)
            nbits = ir.Node(
                "com.microsoft", "MatMulNBits", [activation, *weights[id(weight)]],
                [ir.AttrInt64("K", weight.shape[0]), ir.AttrInt64("N", weight.shape[1]), ir.AttrInt64("bits", 8),
                 ir.AttrInt64("block_size", NBITS_BLOCK), ir.AttrInt64("accuracy_level", NBITS_ACCURACY_LEVEL)],
                name=f"{base}_blocked",
            )  # fmt: skip
            nbits.outputs[0].name = f"{node.outputs[0].name}_blocked"
            ir.convenience.replace_nodes_and_values(graph, node, [node], [nbits], [node.outputs[0]], [nbits.outputs[0]])
            rewritten += 1
            contrib = True
            continue
        new_nodes = []
        if id(activation) not in quantized_inputs:
            if activations == "token":
                nodes, token_rows[id(activation)] = _per_token(activation, weight.shape[0], constants)
                quantized_inputs[id(activation)] = token_rows[id(activation)].quantized
            else:
                nodes, quantized_inputs[id(activation)] = _per_tensor(activation, weight.shape[0], constants)
            new_nodes += nodes
        if id(weight) not in weights:
            load, axis, transpose = _weight_loader(traced, weight, provenance)
            if splits:  # both weights of the split form from one load and one quantization
                once = _SplitOnce(load, axis, transpose, qmax)
                weights[id(weight)] = _quantized_weight(traced, weight, provenance, once.high)
                cross_weights[id(weight)] = _quantized_weight(traced, weight, provenance, once.cross, cross=True)
            else:
                weights[id(weight)] = _quantized_weight(traced, weight, provenance, _per_channel_of(load, axis, transpose, qmax))
        a_q, a_scale, a_zero = quantized_inputs[id(activation)]
        w_q, w_scale, w_zero = weights[id(weight)]
        if activations == "tensor":  # quantize_dynamic's pattern, which ORT fuses (MatMulIntegerToFloat)
            integer = ir.Node("", "MatMulInteger", [a_q, w_q, a_zero, w_zero], name=f"{base}_quant")
            integer.outputs[0].name = f"{node.outputs[0].name}_output_quantized"
            cast = ir.Node("", "Cast", integer.outputs, [ir.AttrInt64("to", ir.DataType.FLOAT)], name=f"{base}_cast")
            cast.outputs[0].name = f"{integer.outputs[0].name}_cast_output"
            scales = ir.Node("", "Mul", [a_scale, w_scale], name=f"{base}_scales_mul")
            scales.outputs[0].name = f"{base}_scales_mul:0"
            result = ir.Node("", "Mul", [cast.outputs[0], scales.outputs[0]], name=f"{base}_output_scale_mul")
            new_nodes += [integer, cast, scales, result]
        elif splits:
            # x w ~ high x high + (high x low weight + low activation x high) / split_low_steps(qmax), the two cross terms in one
            # product over the inputs twice ([high | low] x [low; high]); the low x low term is ~1/64,000 of the first.
            # Two products and one Add: a three-input Sum took 18% of a 510-token forward on ORT's CPU provider.
            if id(activation) not in both_halves:
                nodes, both_halves[id(activation)] = _both_halves(activation.name, token_rows[id(activation)], constants, split_low_steps(qmax))
                new_nodes += nodes
            w_cross, w_cross_scale, _ = cross_weights[id(weight)]
            unit = constants.get("unit_scale", np.array(1.0, dtype=np.float32))
            high = ir.Node("com.microsoft", "MatMulIntegerToFloat", [a_q, w_q, unit, w_scale, a_zero, w_zero], name=f"{base}_split_high")
            crossed = ir.Node("com.microsoft", "MatMulIntegerToFloat", [both_halves[id(activation)], w_cross, unit, w_cross_scale, a_zero, w_zero], name=f"{base}_split_cross")
            for product in (high, crossed):
                product.outputs[0].name = product.name
            total = _node("Add", [high.outputs[0], crossed.outputs[0]], f"{base}_split_add")
            result = _node("Mul", [total.outputs[0], a_scale], f"{base}_row_scale_mul")
            new_nodes += [high, crossed, total, result]
        else:
            # The integer product and the columns' scales in one kernel (ORT's MatMulIntegerToFloat, whose A scale
            # is one number: 1 here), then the rows' own scales. Not Mul(Cast(MatMulInteger), Mul(a_scale,
            # w_scale)): ORT's fusion of that pattern read the [rows, 1] scale as one number in the full d3 graph
            # (max |dp| 0.91 against 0.17 with optimizations off); test_export's per-token graph test fails on that pattern.
            columns = ir.Node(
                "com.microsoft", "MatMulIntegerToFloat", [a_q, w_q, constants.get("unit_scale", np.array(1.0, dtype=np.float32)), w_scale, a_zero, w_zero],
                name=f"{base}_quant",
            )  # fmt: skip
            columns.outputs[0].name = f"{node.outputs[0].name}_column_scaled"
            result = _node("Mul", [columns.outputs[0], a_scale], f"{base}_row_scale_mul")
            new_nodes += [columns, result]
        ir.convenience.replace_nodes_and_values(graph, node, [node], new_nodes, [node.outputs[0]], [result.outputs[0]])
        rewritten += 1
    if rewritten and contrib:
        graph.opset_imports.setdefault("com.microsoft", 1)
    for name, value in list(graph.initializers.items()):
        if not value.uses() and not value.is_graph_output():
            graph.initializers.pop(name)
    return rewritten


class _Constants:
    """Scalar initializers the activation quantization reads, registered once per graph."""

    def __init__(self, graph: ir.Graph):
        self.graph, self.values = graph, {}

    def get(self, name: str, array: np.ndarray) -> ir.Value:
        if name not in self.values:
            value = ir.Value(name=f"int8_{name}", shape=ir.Shape(array.shape), type=ir.TensorType(ir.DataType.from_numpy(array.dtype)), const_value=ir.tensor(array, name=f"int8_{name}"))
            self.graph.register_initializer(value)
            self.values[name] = value
        return self.values[name]


def _node(op: str, inputs: list[ir.Value], name: str, attributes: list | None = None) -> ir.Node:
    node = ir.Node("", op, inputs, attributes or [], name=name)
    node.outputs[0].name = name
    return node


def _per_tensor(activation: ir.Value, channels: int, constants: _Constants) -> tuple[list[ir.Node], tuple[ir.Value, ir.Value, ir.Value]]:
    """quantize_dynamic's form: DynamicQuantizeLinear (uint8, one scale and zero point for the tensor)."""
    dynamic = ir.Node("", "DynamicQuantizeLinear", [activation], num_outputs=3, name=f"{activation.name}_QuantizeLinear")
    for output, suffix in zip(dynamic.outputs, ("quantized", "scale", "zero_point")):
        output.name = f"{activation.name}_{suffix}"
    return [dynamic], tuple(dynamic.outputs)


@dataclass(frozen=True)
class TokenRows:
    """A per-token quantized activation: `quantized` (values, scales [..., 1], zero point) as the MatMuls read it,
    and its [rows, channels] view with the per-row scales and zero points that its low half is quantized from."""

    quantized: tuple[ir.Value, ir.Value, ir.Value]
    rows: ir.Value
    quantized_rows: ir.Value
    row_scales: ir.Value
    zero_points: ir.Value
    shape: ir.Value


def _both_halves(name: str, token: TokenRows, constants: _Constants, steps: int = SPLIT_LOW_STEPS) -> tuple[list[ir.Node], ir.Value]:
    """The `split` form's [high | low] halves of a per-token activation along its channels: the low half is its
    rounding residual (x less the dequantized high half, at most half a step) quantized per row in steps `steps`
    times finer (the weights' low halves' too: one product reads both), with the same zero point."""
    dequantized = _node("DequantizeLinear", [token.quantized_rows, token.row_scales, token.zero_points], f"{name}_high_rows", [ir.AttrInt64("axis", 0)])
    residual = _node("Sub", [token.rows, dequantized.outputs[0]], f"{name}_residual_rows")
    low_scales = _node("Mul", [token.row_scales, constants.get(f"low_step_{steps}", np.array(1.0 / steps, dtype=np.float32))], f"{name}_low_row_scales")
    low_rows = _node("QuantizeLinear", [residual.outputs[0], low_scales.outputs[0], token.zero_points], f"{name}_low_rows", [ir.AttrInt64("axis", 0)])
    low = _node("Reshape", [low_rows.outputs[0], token.shape], f"{name}_low")
    both = _node("Concat", [token.quantized[0], low.outputs[0]], f"{name}_both_halves", [ir.AttrInt64("axis", -1)])
    return [dequantized, residual, low_scales, low_rows, low, both], both.outputs[0]


def _per_token(activation: ir.Value, channels: int, constants: _Constants) -> tuple[list[ir.Node], TokenRows]:
    """One symmetric scale per token: scale = max |x| over the row / 127 (a floor keeps all-zero rows finite),
    q = round(x / scale) + 128 as uint8, zero point 128, so the MatMul runs ORT's u8 x s8 kernel. The rows are
    quantized by one per-axis QuantizeLinear over the activation seen as [rows, channels] (one pass instead of
    Div, Round, Add and Cast: four)."""
    name = activation.name
    absolute = _node("Abs", [activation], f"{name}_abs")
    peak = _node("ReduceMax", [absolute.outputs[0], constants.get("last_axis", np.array([-1], dtype=np.int64))], f"{name}_row_max", [ir.AttrInt64("keepdims", 1)])
    scaled = _node("Mul", [peak.outputs[0], constants.get("inverse_qmax", np.array(1.0 / QMAX, dtype=np.float32))], f"{name}_row_scale_raw")
    scale = _node("Max", [scaled.outputs[0], constants.get("scale_floor", np.array(np.finfo(np.float32).tiny, dtype=np.float32))], f"{name}_row_scale")
    rows = _node("Reshape", [activation, constants.get(f"rows_of_{channels}", np.array([-1, channels], dtype=np.int64))], f"{name}_rows")
    row_scales = _node("Reshape", [scale.outputs[0], constants.get("flat", np.array([-1], dtype=np.int64))], f"{name}_row_scales")
    count = _node("Shape", [row_scales.outputs[0]], f"{name}_row_count")
    zero = constants.get("zero_point", np.array(TOKEN_ZERO_POINT, dtype=np.uint8))
    zero_points = _node("Expand", [zero, count.outputs[0]], f"{name}_row_zero_points")
    quantized_rows = _node("QuantizeLinear", [rows.outputs[0], row_scales.outputs[0], zero_points.outputs[0]], f"{name}_quantized_rows", [ir.AttrInt64("axis", 0)])
    shape = _node("Shape", [activation], f"{name}_shape")
    quantized = _node("Reshape", [quantized_rows.outputs[0], shape.outputs[0]], f"{name}_quantized")
    nodes = [absolute, peak, scaled, scale, rows, row_scales, count, zero_points, quantized_rows, shape, quantized]
    token = TokenRows((quantized.outputs[0], scale.outputs[0], zero), rows.outputs[0], quantized_rows.outputs[0], row_scales.outputs[0], zero_points.outputs[0], shape.outputs[0])
    return nodes, token


def _weight_loader(traced: TracedGraph, weight: ir.Value, provenance: tuple) -> tuple[Callable[[], np.ndarray], int, bool]:
    """(load, the axis of its output channels, whether the MatMul reads its transpose): the package tensor as stored
    where the graph's weight is one (a transposed one is quantized per row), else the graph's constant."""
    source = traced.sources.get(provenance[1])
    if source is not None:
        transposed = provenance[0] == "transpose"
        return (lambda: source.load().detach().float().numpy()), (0 if transposed else 1), transposed
    const = weight.const_value
    return const.numpy, 1, False


def _quantized_weight(
    traced: TracedGraph, weight: ir.Value, provenance: tuple, quantize: Callable[[], tuple[np.ndarray, np.ndarray]], cross: bool = False
) -> tuple[ir.Value, ir.Value, ir.Value | None]:
    """The int8 weight `quantize` computes (with `cross`, the split form's cross-term weight, twice the rows), its
    per-column scales and zero points (none for `cross`), as lazy initializers with provenance (so a second graph of
    the artifact reuses the first one's bytes)."""
    kind, name = provenance[0], provenance[1]
    rows, columns = weight.shape[0] * (2 if cross else 1), weight.shape[1]
    half = "_cross" if cross else ""
    q_value, scale_value = _lazy_pair(
        traced, quantize,
        _Planned(f"{weight.name}_quantized{half}", ir.DataType.INT8, [rows, columns], ("int8 cross" if cross else "int8", name, kind)),
        _Planned(f"{weight.name}_scale{half}", ir.DataType.FLOAT, [columns], ("int8 cross scale" if cross else "int8 scale", name, kind)),
    )  # fmt: skip
    if cross:  # the cross product reads the high weight's zero points (one per output column either way)
        return q_value, scale_value, None
    zero_value = ir.Value(
        name=f"{weight.name}_zero_point", shape=ir.Shape([columns]), type=ir.TensorType(ir.DataType.INT8),
        const_value=ir.tensor(np.zeros(columns, dtype=np.int8), name=f"{weight.name}_zero_point"),
    )  # fmt: skip
    traced.provenance[id(zero_value.const_value)] = ("int8 zero point", columns)
    traced.model.graph.register_initializer(zero_value)
    return q_value, scale_value, zero_value


def quantize_blocks(weight: np.ndarray, block: int = NBITS_BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric 8-bit quantization of a [columns, inputs] weight (the MatMul's output columns first, as a torch
    Linear stores it) with one scale per column and block of `block` inputs, in MatMulNBits' layout: (uint8
    [columns, blocks, block] holding round(w / scale) + 128, float32 scales [columns, blocks]). A last partial
    block is padded with zeros."""
    weight = np.asarray(weight, dtype=np.float32)
    columns, inputs = weight.shape
    blocks = -(-inputs // block)
    quantized = np.empty((columns, blocks, block), dtype=np.uint8)
    scales = np.empty((columns, blocks), dtype=np.float32)
    for start in range(0, columns, BLOCK_ROWS):
        rows = weight[start : start + BLOCK_ROWS]
        padded = np.zeros((rows.shape[0], blocks * block), dtype=np.float32)
        padded[:, :inputs] = rows
        padded = padded.reshape(rows.shape[0], blocks, block)
        scale = np.abs(padded).max(axis=2) / QMAX
        scale[scale < np.finfo(np.float32).tiny] = 1.0
        values = np.clip(np.round(padded / scale[..., None]), -QMAX, QMAX) + NBITS_ZERO_POINT
        quantized[start : start + BLOCK_ROWS] = values
        scales[start : start + BLOCK_ROWS] = scale
    return quantized, scales


def _blocked_weight(traced: TracedGraph, weight: ir.Value, provenance: tuple) -> tuple[ir.Value, ir.Value]:
    """The MatMulNBits weight and its per-block scales as lazy initializers with provenance."""
    kind, name = provenance[0], provenance[1]
    inputs, columns = weight.shape[0], weight.shape[1]
    blocks = -(-inputs // NBITS_BLOCK)
    source = traced.sources.get(name)
    if source is not None:  # a Linear's weight is stored [columns, inputs] already; a plain one is transposed
        load = (lambda: source.load().detach().float().numpy()) if kind == "transpose" else (lambda: source.load().detach().float().numpy().T)
    else:
        const = weight.const_value
        load = lambda: const.numpy().T  # noqa: E731
    return _lazy_pair(
        traced, lambda: quantize_blocks(load()),
        _Planned(f"{weight.name}_blocked", ir.DataType.UINT8, [columns, blocks, NBITS_BLOCK], ("int8 blocks", name, kind)),
        _Planned(f"{weight.name}_block_scales", ir.DataType.FLOAT, [columns, blocks], ("int8 block scales", name, kind)),
    )  # fmt: skip


def quantize_embeddings(traced: TracedGraph, is_table: Callable[[str], bool]) -> int:
    """Rewrite every Gather over rows of a package table that `is_table` names (the token embeddings) to read an int8
    table with one scale per row: Gather of the rows and of their scales, Cast and Mul, so a token's vector is
    scale x int8 row (8 bits whatever the host: no integer product reads it). Returns how many were rewritten; the
    table and its scales are lazy initializers with provenance, shared by the artifact's other graphs."""
    graph = traced.model.graph
    tables: dict[int, tuple[ir.Value, ir.Value]] = {}
    rewritten = 0
    for node in list(graph):
        if node.op_type != "Gather" or node.domain != "" or node.attributes.get_int("axis", 0) != 0:
            continue
        table, ids = node.inputs
        provenance = traced.provenance.get(id(table.const_value)) if table.const_value is not None else None
        if provenance is None or provenance[0] != "param" or not is_table(provenance[1]) or len(table.shape) != 2:
            continue
        if id(table) not in tables:
            source = traced.sources[provenance[1]]
            rows, columns = table.shape[0], table.shape[1]

            def quantize(source=source) -> tuple[np.ndarray, np.ndarray]:
                values, scale = quantize_per_channel(source.load().detach().float().numpy(), 0)
                return values, scale.reshape(-1, 1)

            q_value, scale_value = _lazy_pair(
                traced, quantize,
                _Planned(f"{table.name}_quantized_rows", ir.DataType.INT8, [rows, columns], ("int8 rows", provenance[1])),
                _Planned(f"{table.name}_row_scales", ir.DataType.FLOAT, [rows, 1], ("int8 row scales", provenance[1])),
            )  # fmt: skip
            tables[id(table)] = (q_value, scale_value)
        q_value, scale_value = tables[id(table)]
        base = node.name or node.outputs[0].name
        rows_read = _node("Gather", [q_value, ids], f"{base}_int8_rows", [ir.AttrInt64("axis", 0)])
        scales_read = _node("Gather", [scale_value, ids], f"{base}_row_scales", [ir.AttrInt64("axis", 0)])
        widened = _node("Cast", [rows_read.outputs[0]], f"{base}_rows_float", [ir.AttrInt64("to", ir.DataType.FLOAT)])
        result = _node("Mul", [widened.outputs[0], scales_read.outputs[0]], f"{base}_dequantized")
        ir.convenience.replace_nodes_and_values(graph, node, [node], [rows_read, scales_read, widened, result], [node.outputs[0]], [result.outputs[0]])
        rewritten += 1
    for name, value in list(graph.initializers.items()):  # the FP32 tables no node reads any more
        if id(value) in tables and not value.uses():
            graph.initializers.pop(name)
    return rewritten
