"""The gated delta rule in standard ONNX ops for a static sequence length: chunked, no Scan or Loop.

The chunked algorithm of transformers' `torch_chunk_gated_delta_rule` (chunks of C tokens): everything
inside a chunk is batched matrix algebra over all chunks at once, with the WY triangular inverse
(I - A)^-1 written as the nilpotent product (I + A)(I + A^2)(I + A^4)... (A is strictly lower triangular,
so A^C = 0). What depends on the state is rearranged so that the only sequential part is
S_{n+1} = M_n S_n + U_n (one MatMul and one Add per chunk, unrolled: the chunk count is static); the
outputs of all chunks then come from one batched MatMul over the stacked states.

Layouts are those of com.microsoft LinearAttention (update_rule gated_delta, q/k already L2-normalised
and repeated to the value heads): q, k [B, T, H*dk], v [B, T, H*dv], log-decay g and beta [B, T, H];
output [B, T, H*dv], final state [B, H, dk, dv].
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

CHUNK = 64


class GraphBuilder:
    """Appends nodes with unique output names under one prefix."""

    def __init__(self, prefix: str):
        self.prefix, self.count, self.nodes = prefix, 0, []

    def name(self, hint: str) -> str:
        self.count += 1
        return f"{self.prefix}/{hint}_{self.count}"

    def op(self, op_type: str, inputs: list[str], hint: str | None = None, output: str | None = None, **attributes) -> str:
        output = output or self.name(hint or op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [output], **attributes))
        return output

    def op_outputs(self, op_type: str, inputs: list[str], count: int, **attributes) -> list[str]:
        outputs = [self.name(op_type.lower()) for _ in range(count)]
        self.nodes.append(helper.make_node(op_type, inputs, outputs, **attributes))
        return outputs

    def const(self, values, dtype=np.int64, hint: str = "const") -> str:
        output = self.name(hint)
        tensor = numpy_helper.from_array(np.asarray(values, dtype=dtype), output)
        self.nodes.append(helper.make_node("Constant", [], [output], value=tensor))
        return output


def lower_gated_delta(
    node: onnx.NodeProto, builder: GraphBuilder, *, heads: int, key_dim: int, value_dim: int, scale: float, length: int, chunk: int = CHUNK
) -> list[onnx.NodeProto]:
    """Nodes computing `node` (LinearAttention, gated_delta, no past state) for sequences of exactly `length`."""
    if length % chunk:
        raise ValueError(f"the static length {length} is not a multiple of the chunk size {chunk}")
    q, k, v, past, g, beta = (list(node.input) + [""] * 6)[:6]
    if past:
        raise ValueError("prefill graphs carry no past_state")
    b, n, c, f32 = builder, length // chunk, chunk, np.float32

    def chunks(x: str, width: int | None) -> str:
        """[B, T, H*w] -> [B, H, N, C, w] (or [B, T, H] -> [B, H, N, C])."""
        if width is None:
            shaped = b.op("Reshape", [x, b.const([0, n, c, heads])])
            return b.op("Transpose", [shaped], perm=[0, 3, 1, 2])
        shaped = b.op("Reshape", [x, b.const([0, n, c, heads, width])])
        return b.op("Transpose", [shaped], perm=[0, 3, 1, 2, 4])

    last = b.const([-1])
    q4 = b.op("Mul", [chunks(q, key_dim), b.const(scale, f32, "scale")])
    k4, v4 = chunks(k, key_dim), chunks(v, value_dim)
    g4, beta4 = chunks(g, None), chunks(beta, None)
    beta5 = b.op("Unsqueeze", [beta4, last])
    k_beta, v_beta = b.op("Mul", [k4, beta5]), b.op("Mul", [v4, beta5])
    g_cum = b.op("CumSum", [g4, b.const(-1)], "g_cum")  # [B, H, N, C]
    lower = np.tril(np.ones((c, c), dtype=f32))
    tril, strict, eye = b.const(lower, f32, "tril"), b.const(lower - np.eye(c, dtype=f32), f32, "strict"), b.const(np.eye(c, dtype=f32), f32, "eye")
    # decay[i, j] = exp(g_cum[i] - g_cum[j]) for j <= i, else 0 (masked before the Exp: no inf * 0)
    diff = b.op("Sub", [b.op("Unsqueeze", [g_cum, last]), b.op("Unsqueeze", [g_cum, b.const([-2])])])
    decay = b.op("Mul", [b.op("Exp", [b.op("Mul", [diff, tril])]), tril], "decay")  # [B, H, N, C, C]
    k_t = b.op("Transpose", [k4], perm=[0, 1, 2, 4, 3])
    a = b.op("Mul", [b.op("Neg", [b.op("MatMul", [k_beta, k_t])]), b.op("Mul", [decay, strict])], "a")
    # (I - A)^-1 = (I + A)(I + A^2)(I + A^4)...: A is strictly lower triangular, A^C = 0
    inverse, power, span = b.op("Add", [a, eye]), a, 2
    while span < c:
        power = b.op("MatMul", [power, power])
        inverse = b.op("Add", [inverse, b.op("MatMul", [inverse, power])], "inverse")
        span *= 2
    g_exp = b.op("Exp", [g_cum])
    value = b.op("MatMul", [inverse, v_beta], "value")  # [B, H, N, C, dv]
    k_cumdecay = b.op("MatMul", [inverse, b.op("Mul", [k_beta, b.op("Unsqueeze", [g_exp, last])])], "k_cumdecay")
    attention = b.op("Mul", [b.op("MatMul", [q4, k_t]), decay], "attention")  # within-chunk, causal
    q_decayed = b.op("Mul", [q4, b.op("Unsqueeze", [g_exp, last])])
    g_last = b.op("Slice", [g_cum, b.const([c - 1]), b.const([c]), b.const([3])])  # [B, H, N, 1]
    k_decayed = b.op("Mul", [k4, b.op("Unsqueeze", [b.op("Exp", [b.op("Sub", [g_last, g_cum])]), last])])
    k_decayed_t = b.op("Transpose", [k_decayed], perm=[0, 1, 2, 4, 3])  # [B, H, N, dk, C]
    # o_n = base_n + query_n S_n;  S_{n+1} = M_n S_n + U_n
    base = b.op("MatMul", [attention, value], "base")
    query = b.op("Sub", [q_decayed, b.op("MatMul", [attention, k_cumdecay])], "query")
    update = b.op("MatMul", [k_decayed_t, value], "update")  # U: [B, H, N, dk, dv]
    decay_last = b.op("Unsqueeze", [b.op("Exp", [g_last]), last])  # [B, H, N, 1, 1]
    key_eye = b.const(np.eye(key_dim, dtype=f32), f32, "key_eye")
    transition = b.op("Sub", [b.op("Mul", [decay_last, key_eye]), b.op("MatMul", [k_decayed_t, k_cumdecay])], "transition")
    states, state = [], None
    for index in range(n):
        at = b.const(index, hint=f"chunk{index}")
        step_update = b.op("Gather", [update, at], axis=2)
        if state is None:
            zero = b.op("Mul", [step_update, b.const(0.0, f32)])
            states.append(zero)
            state = step_update  # S_1 = U_0 (S_0 = 0)
            continue
        states.append(state)
        state = b.op("Add", [b.op("MatMul", [b.op("Gather", [transition, at], axis=2), state]), step_update], "state")
    stacked = b.op("Concat", [b.op("Unsqueeze", [s, b.const([2])]) for s in states], axis=2)  # [B, H, N, dk, dv]
    output = b.op("Add", [base, b.op("MatMul", [query, stacked])])  # [B, H, N, C, dv]
    ordered = b.op("Transpose", [output], perm=[0, 2, 3, 1, 4])  # [B, N, C, H, dv]
    b.op("Reshape", [ordered, b.const([0, length, heads * value_dim])], output=node.output[0])
    if len(node.output) > 1 and node.output[1]:
        b.op("Identity", [state], output=node.output[1])
    return b.nodes
