"""The standard-op building blocks of the portable variant, checked op by op against their references."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from transformers.models.qwen3_5 import modeling_qwen3_5 as qwen3_5

from vllm_sr_runtime.export.chunked_gdn import GraphBuilder, lower_gated_delta
from vllm_sr_runtime.export.provider_checks import cuda_kernel_gaps, migraphx_refusals
from vllm_sr_runtime.export.primitive_ops import lower_attention, lower_gather_nd, lower_gelu, lower_layer_norm, lower_rms_norm


def run(nodes, inputs: dict[str, np.ndarray], outputs: list[str], out_type: int = TensorProto.FLOAT) -> list[np.ndarray]:
    values = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for name, a in inputs.items()]
    graph = helper.make_graph(nodes, "g", values, [helper.make_tensor_value_info(name, out_type, None) for name in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(outputs, inputs)


@pytest.mark.parametrize("length,decay", [(64, 0.05), (256, 0.05), (192, 2.0)])
def test_chunked_gated_delta_matches_transformers_recurrence(length, decay):
    """Against transformers' token-by-token reference: strong and weak decay, one chunk and several."""
    rng = np.random.default_rng(length)
    batch, heads, key_dim, value_dim = 2, 3, 16, 8
    q = torch.nn.functional.normalize(torch.from_numpy(rng.standard_normal((batch, length, heads, key_dim), dtype=np.float32)), dim=-1)
    k = torch.nn.functional.normalize(torch.from_numpy(rng.standard_normal((batch, length, heads, key_dim), dtype=np.float32)), dim=-1)
    v = torch.from_numpy(rng.standard_normal((batch, length, heads, value_dim), dtype=np.float32))
    g = torch.from_numpy(-decay * rng.random((batch, length, heads), dtype=np.float32))
    beta = torch.from_numpy(rng.random((batch, length, heads), dtype=np.float32))
    expected, state = qwen3_5.torch_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=None, output_final_state=True)
    node = helper.make_node("LinearAttention", ["q", "k", "v", "", "g", "beta"], ["out", "state"], domain="com.microsoft")
    nodes = lower_gated_delta(node, GraphBuilder("gdn"), heads=heads, key_dim=key_dim, value_dim=value_dim, scale=key_dim**-0.5, length=length)
    feed = {
        "q": q.reshape(batch, length, -1).numpy(), "k": k.reshape(batch, length, -1).numpy(),
        "v": v.reshape(batch, length, -1).numpy(), "g": g.numpy(), "beta": beta.numpy(),
    }  # fmt: skip
    out, final = run(nodes, feed, ["out", "state"])
    assert not any(n.op_type in ("Scan", "Loop") for n in nodes)
    np.testing.assert_allclose(out, expected.reshape(batch, length, -1).numpy(), atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(final, state.numpy(), atol=2e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="multiple of the chunk"):
        lower_gated_delta(node, GraphBuilder("x"), heads=heads, key_dim=key_dim, value_dim=value_dim, scale=1.0, length=length + 1)


def test_primitive_norms_gelu_and_gather_match_the_fused_ops():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 16), dtype=np.float32) * 3
    scale, bias = rng.standard_normal(16, dtype=np.float32), rng.standard_normal(16, dtype=np.float32)
    consts = [helper.make_node("Constant", [], [n], value=numpy_helper.from_array(a, n)) for n, a in (("scale", scale), ("bias", bias))]
    cases = [
        (helper.make_node("RMSNormalization", ["x", "scale"], ["y"], epsilon=1e-6, axis=-1), lambda n, b: lower_rms_norm(n, b, TensorProto.FLOAT)),
        (helper.make_node("LayerNormalization", ["x", "scale", "bias"], ["y"], epsilon=1e-5, axis=-1), lambda n, b: lower_layer_norm(n, b, TensorProto.FLOAT)),
        (helper.make_node("Gelu", ["x"], ["y"]), lambda n, b: lower_gelu(n, b, TensorProto.FLOAT)),
        (helper.make_node("Gelu", ["x"], ["y"], approximate="tanh"), lambda n, b: lower_gelu(n, b, TensorProto.FLOAT)),
    ]
    for fused, lower in cases:
        (expected,) = run(consts + [fused], {"x": x}, ["y"])
        (lowered,) = run(consts + lower(fused, GraphBuilder("p")), {"x": x}, ["y"])
        np.testing.assert_allclose(lowered, expected, atol=1e-5, rtol=1e-5, err_msg=fused.op_type)
    data = rng.random((3, 7)) > 0.5
    index = np.stack([rng.integers(0, 3, (4, 5)), rng.integers(0, 7, (4, 5))], axis=-1).astype(np.int64)
    fused = helper.make_node("GatherND", ["data", "index"], ["y"])
    (expected,) = run([fused], {"data": data, "index": index}, ["y"], TensorProto.BOOL)
    lowered_nodes = lower_gather_nd(fused, GraphBuilder("p"), {"data": [3, 7], "index": [4, 5, 2]})
    (lowered,) = run(lowered_nodes, {"data": data, "index": index}, ["y"], TensorProto.BOOL)
    assert np.array_equal(lowered, expected)


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_primitive_attention_matches_the_attention_op_with_masked_rows(kv_heads):
    rng = np.random.default_rng(kv_heads)
    q = rng.standard_normal((2, 4, 6, 8), dtype=np.float32)
    k, v = (rng.standard_normal((2, kv_heads, 6, 8), dtype=np.float32) for _ in range(2))
    mask = np.ones((2, 1, 6, 6), dtype=bool)
    mask[1, :, :, :2] = False  # two padded keys
    fused = helper.make_node("Attention", ["q", "k", "v", "mask"], ["y"], scale=0.3)
    (expected,) = run([fused], {"q": q, "k": k, "v": v, "mask": mask}, ["y"])
    shapes = {"q": [2, 4, 6, 8], "k": [2, kv_heads, 6, 8], "mask#type": TensorProto.BOOL}
    nodes = lower_attention(fused, GraphBuilder("p"), TensorProto.FLOAT, shapes, (4, kv_heads))
    (lowered,) = run(nodes, {"q": q, "k": k, "v": v, "mask": mask}, ["y"])
    np.testing.assert_allclose(lowered, expected, atol=1e-5)
    mask[0, :, 3, :] = False  # a row that sees nothing: finite (uniform), never NaN
    (lowered,) = run(nodes, {"q": q, "k": k, "v": v, "mask": mask}, ["y"])
    assert np.isfinite(lowered).all()


def test_migraphx_check_applies_the_providers_rules():
    def graph(nodes, inputs, initializers=()):
        return helper.make_model(
            helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], list(initializers)),
            opset_imports=[helper.make_opsetid("", 23)],
        )

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])
    shape_input = helper.make_tensor_value_info("shape", TensorProto.INT64, [2])
    from_input = graph([helper.make_node("Reshape", ["x", "shape"], ["y"])], [x, shape_input])
    assert migraphx_refusals(from_input) == ["Reshape y: input 1 (shape) is not known at compile time"]
    from_shape = graph(
        [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Reshape", ["x", "s"], ["y"])], [x]
    )  # a Shape chain is known when MIGraphX compiles
    assert migraphx_refusals(from_shape) == []
    scan = graph([helper.make_node("Identity", ["x"], ["y"]), helper.make_node("Scan", ["x"], ["z"], num_scan_inputs=1, body=helper.make_graph([], "b", [], []))], [x])
    assert migraphx_refusals(scan) == ["Scan z: not in the provider's op list"]
    bf16 = graph([helper.make_node("Cast", ["x"], ["b"], to=TensorProto.BFLOAT16), helper.make_node("Cast", ["b"], ["y"], to=TensorProto.FLOAT)], [x])
    assert migraphx_refusals(bf16) == ["Cast b: tensor type BFLOAT16", "Cast y: tensor type BFLOAT16"]
    contrib = graph([helper.make_node("LinearAttention", ["x"], ["y"], domain="com.microsoft")], [x])
    assert "domain com.microsoft" in migraphx_refusals(contrib)[0]


def test_cuda_kernel_check_flags_types_the_provider_has_no_kernel_for():
    x = helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [2, 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 6])

    def gaps(nodes):
        graph = helper.make_graph(nodes, "g", [x], [y])
        return cuda_kernel_gaps(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)]))

    to_float = helper.make_node("Cast", ["s"], ["y"], to=TensorProto.FLOAT)
    assert gaps([helper.make_node("Sigmoid", ["x"], ["s"]), to_float]) == []  # Sigmoid has a bf16 kernel
    assert gaps([helper.make_node("Sin", ["x"], ["s"]), to_float]) == ["Sin s: no CUDA kernel for BFLOAT16"]
    assert gaps([helper.make_node("Softplus", ["x"], ["s"]), to_float]) == ["Softplus s: no CUDA kernel for BFLOAT16"]
    assert gaps([helper.make_node("Cast", ["x"], ["f"], to=TensorProto.FLOAT), helper.make_node("Sin", ["f"], ["y"])]) == []
    assert gaps([helper.make_node("Mish", ["x"], ["s"]), to_float]) == ["Mish s: no CUDA kernel in the vendored table"]


def test_primitive_attention_in_query_blocks_matches_the_attention_op():
    from vllm_sr_runtime.export.primitive_ops import QUERY_BLOCK

    rng = np.random.default_rng(1)
    length = 2 * QUERY_BLOCK
    q = rng.standard_normal((1, 4, length, 8), dtype=np.float32)
    k, v = (rng.standard_normal((1, 2, length, 8), dtype=np.float32) for _ in range(2))
    mask = np.ones((1, 1, length, length), dtype=bool)
    mask[0, 0, :, :7] = False
    fused = helper.make_node("Attention", ["q", "k", "v", "mask"], ["y"], scale=0.3)
    (expected,) = run([fused], {"q": q, "k": k, "v": v, "mask": mask}, ["y"])
    shapes = {"q": [1, 4, length, 8], "k": [1, 2, length, 8], "mask": [1, 1, length, length], "mask#type": TensorProto.BOOL}
    nodes = lower_attention(fused, GraphBuilder("p"), TensorProto.FLOAT, shapes, (4, 2))
    assert sum(n.op_type == "Softmax" for n in nodes) == 2  # two blocks of query rows
    (lowered,) = run(nodes, {"q": q, "k": k, "v": v, "mask": mask}, ["y"])
    np.testing.assert_allclose(lowered, expected, atol=1e-5)


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_primitive_attention_takes_a_dynamic_query_count(kv_heads):
    """A pruned last layer's queries are the readout's rows, a count the graph does not fix (Decision 2.0's
    options): one block of them against the static keys, for any count the session is fed."""
    rng = np.random.default_rng(7 + kv_heads)
    k, v = (rng.standard_normal((2, kv_heads, 6, 8), dtype=np.float32) for _ in range(2))
    fused = helper.make_node("Attention", ["q", "k", "v", "mask"], ["y"], scale=0.3)
    shapes = {"q": [2, 4, "rows", 8], "k": [2, kv_heads, 6, 8], "mask": [2, 1, "rows", 6], "mask#type": TensorProto.BOOL}
    nodes = lower_attention(fused, GraphBuilder("p"), TensorProto.FLOAT, shapes, (4, kv_heads))
    for rows in (1, 3, 5):
        q = rng.standard_normal((2, 4, rows, 8), dtype=np.float32)
        mask = rng.random((2, 1, rows, 6)) > 0.3
        mask[..., 0] = True
        feed = {"q": q, "k": k, "v": v, "mask": mask}
        (expected,) = run([fused], feed, ["y"])
        (lowered,) = run(nodes, feed, ["y"])
        np.testing.assert_allclose(lowered, expected, atol=1e-5, err_msg=f"{rows} rows")
