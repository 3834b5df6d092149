"""Full attention over blocks of queries, the CPU engine's load-time rewrite: the op's own answers, bounded work per
block, and only the nodes it is right for."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from vllm_sr_runtime.engines.onnxruntime.attention_blocks import split_attention_queries

HEADS, SIZE, BLOCK = 4, 8, 16


def attention_model(mask_type: int | None, *, causal: int = 0, mask_rows: str = "T", query_rank: int = 4, past: bool = False, second_output: bool = False) -> onnx.ModelProto:
    query_shape = ["B", HEADS, "T", SIZE] if query_rank == 4 else ["B", "T", HEADS * SIZE]
    inputs = [helper.make_tensor_value_info("q", TensorProto.FLOAT, query_shape)]
    inputs += [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["B", HEADS, "T", SIZE] if query_rank == 4 else ["B", "T", HEADS * SIZE]) for name in "kv"]
    names = ["q", "k", "v"]
    if mask_type is not None:
        inputs.append(helper.make_tensor_value_info("mask", mask_type, ["B", 1, mask_rows, "T"]))
        names.append("mask")
    if past:
        names += [""] * (4 - len(names)) + ["past_k", "past_v"]
        inputs += [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["B", HEADS, "P", SIZE]) for name in ("past_k", "past_v")]
    outputs = ["y", "present_k"] if second_output else ["y"]
    attributes = {"scale": SIZE**-0.5, "is_causal": causal}
    if query_rank == 3:
        attributes.update(q_num_heads=HEADS, kv_num_heads=HEADS)
    node = helper.make_node("Attention", names, outputs, **attributes)
    graph_outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, query_shape if name == "y" else ["B", HEADS, "T", SIZE]) for name in outputs]
    return helper.make_model(helper.make_graph([node], "attention", inputs, graph_outputs), opset_imports=[helper.make_opsetid("", 23)])


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("mask_type", [TensorProto.BOOL, TensorProto.FLOAT, None], ids=["bool mask", "additive mask", "no mask"])
def test_blocked_attention_answers_exactly_as_the_op(mask_type):
    """Below, at, just past and at several blocks, with a padded row whose last keys are masked: the same numbers."""
    model = attention_model(mask_type)
    blocked = onnx.ModelProto()
    blocked.CopyFrom(model)
    assert split_attention_queries(blocked, BLOCK) == 1
    onnx.checker.check_model(blocked)
    assert {node.op_type for node in blocked.graph.node} == {"Shape", "Greater", "If"}
    whole, split = session(model), session(blocked)
    rng = np.random.default_rng(0)
    for length in (5, BLOCK, BLOCK + 1, 3 * BLOCK - 7, 3 * BLOCK):
        feed = {name: rng.standard_normal((2, HEADS, length, SIZE)).astype(np.float32) for name in "qkv"}
        if mask_type is not None:
            keys = np.ones((2, 1, 1, length), bool)
            keys[1, ..., length - 3 :] = False
            mask = np.broadcast_to(keys, (2, 1, length, length)).copy()
            feed["mask"] = mask if mask_type == TensorProto.BOOL else np.where(mask, 0.0, -np.inf).astype(np.float32)
        expected, answered = whole.run(None, feed)[0], split.run(None, feed)[0]
        assert answered.shape == expected.shape == (2, HEADS, length, SIZE)
        assert np.array_equal(answered, expected), length


def test_each_block_runs_at_most_block_queries():
    """The Loop's attention reads queries and mask rows sliced alike, and each of its runs holds one block of queries
    (its score matrix is bounded by the block, not the prompt): 3 blocks and 5 rows make 4 blocks of `BLOCK`."""
    blocked = attention_model(TensorProto.BOOL)
    split_attention_queries(blocked, BLOCK)
    then = next(a.g for node in blocked.graph.node if node.op_type == "If" for a in node.attribute if a.name == "then_branch")
    loop = next(node for node in then.node if node.op_type == "Loop")
    body = next(a.g for a in loop.attribute if a.name == "body")
    inner = next(node for node in body.node if node.op_type == "Attention")
    assert {node.output[0] for node in body.node if node.op_type == "Slice"} == {inner.input[0], inner.input[3]}
    length = 3 * BLOCK + 5
    rng = np.random.default_rng(1)
    feed = {name: rng.standard_normal((1, HEADS, length, SIZE)).astype(np.float32) for name in "qkv"}
    feed["mask"] = np.ones((1, 1, length, length), bool)
    blocks = session(_expose(blocked, loop.output[0])).run([loop.output[0]], feed)[0]
    assert blocks.shape == (4, 1, HEADS, BLOCK, SIZE)


def _expose(model: onnx.ModelProto, name: str) -> onnx.ModelProto:
    """The If's then-branch value `name` as a graph output (the graph then runs the blocked branch inline)."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    graph = exposed.graph
    if_node = next(node for node in graph.node if node.op_type == "If")
    then = next(a.g for a in if_node.attribute if a.name == "then_branch")
    index = list(graph.node).index(if_node)
    graph.node.remove(if_node)
    for offset, node in enumerate([*then.node, helper.make_node("Identity", [then.output[0].name], list(if_node.output))]):
        graph.node.insert(index + offset, node)
    graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    return exposed


@pytest.mark.parametrize(
    "options",
    [{"causal": 1}, {"mask_rows": 1}, {"query_rank": 3}, {"past": True}, {"second_output": True}],
    ids=["causal", "one mask row for every query", "3-D packed heads", "past key/value", "present key read"],
)
def test_nodes_the_blocks_would_change_are_left_as_exported(options):
    model = attention_model(TensorProto.BOOL, **options)
    before = model.SerializeToString()
    assert split_attention_queries(model, BLOCK) == 0
    assert model.SerializeToString() == before


def test_the_block_is_a_positive_count():
    with pytest.raises(ValueError, match="block"):
        split_attention_queries(attention_model(None), 0)
