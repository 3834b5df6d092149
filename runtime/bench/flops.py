"""FLOP counts of a forward pass, and this machine's GEMM limit measured with ONNX Runtime's MatMul."""

from __future__ import annotations

import time

import numpy as np


def forward_flops(config, rows: int, tokens: int) -> float:
    """2 x (linear parameters) per token, plus attention's QK^T and AV on full-attention layers and the
    Gated DeltaNet recurrence (state update and read, ~6 x dk x dv per head and token)."""
    hidden, ffn = config.hidden_size, config.intermediate_size
    layer_types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
    heads, kv, head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    per_token = 0.0
    attention = 0.0
    for kind in layer_types:
        per_token += 3 * hidden * ffn
        if kind == "full_attention":
            q_width = heads * head_dim * (2 if getattr(config, "model_type", "") == "qwen3_5_text" else 1)
            per_token += hidden * (q_width + 2 * kv * head_dim) + heads * head_dim * hidden
            attention += 2 * 2 * tokens * tokens * heads * head_dim
        else:
            key_dim = config.linear_key_head_dim * config.linear_num_key_heads
            value_dim = config.linear_value_head_dim * config.linear_num_value_heads
            per_token += hidden * (2 * key_dim + 2 * value_dim + 2 * config.linear_num_value_heads) + value_dim * hidden
            attention += tokens * 6 * config.linear_num_value_heads * config.linear_key_head_dim * config.linear_value_head_dim
    return rows * (2 * per_token * tokens + attention)


def gemm_limit(m: int = 512, k: int = 1024, n: int = 3584, repeats: int = 20) -> float:
    """GFLOP/s of one fp32 MatMul in ONNX Runtime with this process's threads (the machine's practical ceiling)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from runtime.engines.onnxruntime import session_options

    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((k, n), dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "gemm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
        initializer=[weight],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = ort.InferenceSession(model.SerializeToString(), sess_options=session_options("cpu"), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((m, k), dtype=np.float32)
    for _ in range(3):
        session.run(None, {"x": x})
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        session.run(None, {"x": x})
        times.append(time.perf_counter() - start)
    return 2 * m * k * n / float(np.median(times)) / 1e9
