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
    sliced = {node.output[0]: node.input[0] for node in _nodes(body) if node.op_type == "Slice"}
    inner = [node for node in _nodes(body) if node.op_type == "Attention"]
    assert len(inner) == 2  # every key, or the keys the block attends to
    for node in inner:
        assert sliced[node.input[0]].endswith("padded_query")
        mask = sliced[node.input[3]]
        assert (sliced[mask] if mask in sliced else mask).endswith("padded_mask")
    length = 3 * BLOCK + 5
    rng = np.random.default_rng(1)
    feed = {name: rng.standard_normal((1, HEADS, length, SIZE)).astype(np.float32) for name in "qkv"}
    feed["mask"] = np.ones((1, 1, length, length), bool)
    blocks = session(_expose(blocked, loop.output[0])).run([loop.output[0]], feed)[0]
    assert blocks.shape == (4, 1, HEADS, BLOCK, SIZE)


def _nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    found = []
    for node in graph.node:
        found.append(node)
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                found += _nodes(attribute.g)
    return found


def causal_mask(batch: int, length: int, lengths: list[int]) -> np.ndarray:
    """Decision 2.0's mask: each query attends to itself and the keys before it, none of a row's right padding."""
    mask = np.tril(np.ones((length, length), bool))[None, None].repeat(batch, 0)
    for row, real in enumerate(lengths):
        mask[row, ..., real:] = False
    return mask


def blocked_and_whole(mask_type: int = TensorProto.BOOL) -> tuple[ort.InferenceSession, ort.InferenceSession]:
    model = attention_model(mask_type)
    blocked = onnx.ModelProto()
    blocked.CopyFrom(model)
    assert split_attention_queries(blocked, BLOCK) == 1
    onnx.checker.check_model(blocked)
    return session(blocked), session(model)


def test_blocks_under_a_causal_or_padded_mask_answer_as_the_op():
    """Blocks that read only their attended keys: the op's numbers (up to the summation order) under a causal mask
    with right padding, a left-padded full mask, and a mask whose row attends to nothing (that block reads every key,
    as the op: equal bit for bit, whatever the op makes of such a row)."""
    split, whole = blocked_and_whole()
    rng = np.random.default_rng(2)
    for length in (5, BLOCK + 1, 3 * BLOCK - 7, 3 * BLOCK):
        feed = {name: rng.standard_normal((2, HEADS, length, SIZE)).astype(np.float32) for name in "qkv"}
        left_padded = np.ones((2, 1, length, length), bool)
        left_padded[..., : min(3, length - 1)] = False
        empty_row = causal_mask(2, length, [length, length])
        empty_row[1, 0, length - 1] = False
        for name, mask in (("causal", causal_mask(2, length, [length, max(1, length - 4)])), ("left padded", left_padded), ("empty row", empty_row)):
            expected, answered = (s.run(None, {**feed, "mask": mask})[0] for s in (whole, split))
            if name == "empty row":
                assert np.array_equal(answered, expected, equal_nan=True), (name, length)
            else:
                np.testing.assert_allclose(answered, expected, rtol=1e-6, atol=1e-6, err_msg=f"{name} {length}")


def test_a_causal_block_reads_no_key_after_its_rows():
    """A key that is not a number poisons every answer that reads it (0 x NaN is NaN), whatever the mask says: the op
    reads every key for every query; the blocks before the key's own block do not read it."""
    split, whole = blocked_and_whole()
    length, poisoned = 4 * BLOCK - 5, 2 * BLOCK + 3  # the last block padded with rows that attend everywhere
    rng = np.random.default_rng(3)
    feed = {name: rng.standard_normal((1, HEADS, length, SIZE)).astype(np.float32) for name in "qkv"}
    feed["v"][:, :, poisoned] = np.nan
    feed["mask"] = causal_mask(1, length, [length])
    assert np.isnan(whole.run(None, feed)[0]).all()
    answered = split.run(None, feed)[0]
    assert np.isfinite(answered[:, :, : 2 * BLOCK]).all()
    assert np.isnan(answered[:, :, poisoned:]).all()
    left_padded = np.ones((1, 1, length, length), bool)
    left_padded[..., : poisoned + 1] = False  # every row masks the key: no block reads it, the padded rows' range aside
    assert np.isfinite(split.run(None, {**feed, "mask": left_padded})[0]).all()


def test_an_additive_mask_keeps_every_key():
    """What an additive mask leaves out is a matter of magnitudes, not a flag: its blocks read every key."""
    split, _ = blocked_and_whole(TensorProto.FLOAT)
    length = 2 * BLOCK
    rng = np.random.default_rng(4)
    feed = {name: rng.standard_normal((1, HEADS, length, SIZE)).astype(np.float32) for name in "qkv"}
    feed["v"][:, :, length - 1] = np.nan
    feed["mask"] = np.where(causal_mask(1, length, [length]), 0.0, -np.inf).astype(np.float32)
    assert np.isnan(split.run(None, feed)[0]).all()


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
