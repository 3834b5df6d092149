"""Full attention over blocks of queries on ONNX Runtime's CPU provider.

ORT's CPU `Attention` kernel materialises every head's score matrix for the whole prompt before its softmax:
batch x heads x T x T floats (512 MiB per layer for one 4,094-token row of an 8-head model, 2 GiB for four such
rows), and at those sizes it runs below the GEMM speed it reaches on smaller blocks. Each query's softmax reads
only its own score row, so the same answer comes from running the op on blocks of query rows against all keys:
the load-time rewrite below turns each eligible node into `If(T > block)`: a `Loop` over query blocks (queries
and mask rows padded to whole blocks; the padded rows are dropped), else the node as exported. Numbers are the
kernel's own (each block's rows go through the same kernel as before). Under a boolean mask each block reads only
the keys its rows attend to (first to last): a causal graph's blocks skip the keys after them, half of attention's
work at long prompts (Decision 2.0), and a padded batch skips the padding. Applied on CPU sessions only: other
providers have kernels of their own (flash or memory-efficient attention), and the artifact stays as exported.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

ATTENTION_QUERY_BLOCK = 512
SEQUENCE_AXIS = 2  # 4-D Attention: [batch, heads, sequence, head size]
KEY_AXIS = 3  # 4-D mask: [batch, heads or 1, queries, keys]
FORM = "query-blocks/2"  # names the rewrite's form (optimized-graph cache keys): 2 = blocks read only their attended keys


def split_attention_queries(model: onnx.ModelProto, block: int = ATTENTION_QUERY_BLOCK) -> int:
    """Rewrite every eligible Attention node of the main graph (4-D, non-causal, no past key/value, only its
    output read, a mask absent or holding one row per query) in place; returns how many were rewritten."""
    if block < 1:
        raise ValueError(f"attention query block must be >= 1, not {block}")
    graph = model.graph
    shapes = _shapes(model)
    rewritten = 0
    nodes = []
    for index, node in enumerate(graph.node):
        if _eligible(node, shapes):
            nodes += _blocked(node, index, shapes[node.input[0]][1], _mask_pad_value(node, shapes))
            rewritten += 1
        else:
            nodes.append(node)
    if rewritten:
        del graph.node[:]
        graph.node.extend(nodes)
        _add_shared_constants(graph, block)
    return rewritten


def _shapes(model: onnx.ModelProto) -> dict[str, tuple[list, int]]:
    """name -> (dims as dim_value or dim_param or None, element type) for every typed value of the main graph."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # graphs of domains onnx does not know keep what they declare
        inferred = model
    values = [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]  # inference keeps what was declared
    shapes = {}
    for value in values:
        tensor = value.type.tensor_type
        if not tensor.HasField("shape"):
            continue
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim]
        shapes[value.name] = (dims, tensor.elem_type)
    return shapes


def _eligible(node: onnx.NodeProto, shapes: dict) -> bool:
    if node.op_type != "Attention" or node.domain not in ("", "ai.onnx"):
        return False
    inputs = list(node.input)
    if len(inputs) < 3 or any(inputs[4:]) or not all(inputs[:3]) or any(node.output[1:]):
        return False
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if attributes.get("is_causal", 0):  # the causal diagonal depends on each block's offset
        return False
    query = shapes.get(inputs[0])
    if query is None or len(query[0]) != 4:
        return False
    if len(inputs) > 3 and inputs[3]:
        mask = shapes.get(inputs[3])
        if mask is None or len(mask[0]) != 4:
            return False
        rows, sequence = mask[0][SEQUENCE_AXIS], query[0][SEQUENCE_AXIS]
        if rows is None or rows != sequence:  # one mask row per query, known from the shapes
            return False
    return True


def _mask_pad_value(node: onnx.NodeProto, shapes: dict) -> onnx.TensorProto | None:
    """What a padded query's mask row holds: attend everywhere (True, or 0 for an additive mask), so the
    dropped rows never meet an all-masked softmax."""
    if len(node.input) < 4 or not node.input[3]:
        return None
    element = shapes[node.input[3]][1]
    if element == TensorProto.BOOL:
        return helper.make_tensor("value", TensorProto.BOOL, [], [True])
    return helper.make_tensor("value", element, [], [0.0])


SHARED = "attention_blocks"


def _add_shared_constants(graph: onnx.GraphProto, block: int) -> None:
    """The rewritten nodes' shared constants, those that some node (or subgraph node) reads."""
    ints = {
        "block": [block], "axis": [SEQUENCE_AXIS], "zero": [0], "one": [1], "minus_one": [-1], "pads_lead": [0] * 6, "pads_tail": [0],
        "key_axis": [KEY_AXIS], "row_axes": [0, 1, SEQUENCE_AXIS],
    }  # fmt: skip
    constants = [helper.make_tensor(f"{SHARED}_{name}", TensorProto.INT64, [len(v)], v) for name, v in ints.items()]
    constants.append(helper.make_tensor(f"{SHARED}_true", TensorProto.BOOL, [], [True]))
    read = _names_read(graph)
    graph.initializer.extend(constant for constant in constants if constant.name in read)


def _names_read(graph: onnx.GraphProto) -> set[str]:
    names: set[str] = set()
    for node in graph.node:
        names.update(node.input)
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                names |= _names_read(attribute.g)
    return names


def _blocked(node: onnx.NodeProto, index: int, element: int, mask_pad: onnx.TensorProto | None) -> list[onnx.NodeProto]:
    """If(T > block) then a Loop over query blocks else the node itself: same inputs, same output."""
    s = lambda name: f"{SHARED}_{name}"  # noqa: E731
    p = lambda name: f"{SHARED}{index}_{name}"  # noqa: E731
    query, key, value = node.input[:3]
    mask = node.input[3] if len(node.input) > 3 and node.input[3] else None
    output = node.output[0]
    attributes = list(node.attribute)

    body_nodes = [
        helper.make_node("Mul", [p("i"), s("block")], [p("start")]),
        helper.make_node("Add", [p("start"), s("block")], [p("end")]),
        helper.make_node("Slice", [p("padded_query"), p("start"), p("end"), s("axis")], [p("query_block")]),
    ]
    block_inputs = [p("query_block"), key, value]
    if mask:
        body_nodes.append(helper.make_node("Slice", [p("padded_mask"), p("start"), p("end"), s("axis")], [p("mask_block")]))
        block_inputs.append(p("mask_block"))
    if mask_pad is not None and mask_pad.data_type == TensorProto.BOOL:
        body_nodes += _attention_over_attended_keys(p, s, block_inputs, mask, attributes, element)
    else:
        body_nodes.append(_attention(block_inputs, p("block_output"), p("block_attention"), attributes))
    body_nodes.append(helper.make_node("Identity", [p("cond_in")], [p("cond_out")]))
    body = helper.make_graph(
        body_nodes, p("body"),
        [helper.make_tensor_value_info(p("i"), TensorProto.INT64, []), helper.make_tensor_value_info(p("cond_in"), TensorProto.BOOL, [])],
        [helper.make_tensor_value_info(p("cond_out"), TensorProto.BOOL, []), helper.make_tensor_value_info(p("block_output"), element, [None] * 4)],
    )  # fmt: skip

    # pad = (block - T mod block) mod block, blocks = (T + pad) / block
    blocked_nodes = [
        helper.make_node("Mod", [p("length"), s("block")], [p("rest")]),
        helper.make_node("Sub", [s("block"), p("rest")], [p("short")]),
        helper.make_node("Mod", [p("short"), s("block")], [p("pad")]),
        helper.make_node("Add", [p("length"), p("pad")], [p("padded_length")]),
        helper.make_node("Div", [p("padded_length"), s("block")], [p("count_1d")]),
        helper.make_node("Squeeze", [p("count_1d"), s("zero")], [p("count")]),
        helper.make_node("Concat", [s("pads_lead"), p("pad"), s("pads_tail")], [p("pads")], axis=0),
        helper.make_node("Pad", [query, p("pads")], [p("padded_query")]),
    ]
    if mask:
        blocked_nodes += [
            helper.make_node("Constant", [], [p("mask_pad_value")], value=mask_pad),
            helper.make_node("Pad", [mask, p("pads"), p("mask_pad_value")], [p("padded_mask")]),
        ]
    blocked_nodes += [
        helper.make_node("Loop", [p("count"), s("true")], [p("blocks")], body=body),  # [blocks, B, H, block, Dv]
        helper.make_node("Transpose", [p("blocks")], [p("joined")], perm=[1, 2, 0, 3, 4]),
        helper.make_node("Shape", [query], [p("batch_heads")], start=0, end=2),
        helper.make_node("Shape", [value], [p("value_size")], start=3, end=4),
        helper.make_node("Concat", [p("batch_heads"), s("minus_one"), p("value_size")], [p("joined_shape")], axis=0),
        helper.make_node("Reshape", [p("joined"), p("joined_shape")], [p("padded_output")]),
        helper.make_node("Slice", [p("padded_output"), s("zero"), p("length"), s("axis")], [p("then_output")]),
    ]
    then_branch = helper.make_graph(blocked_nodes, p("blocked"), [], [helper.make_tensor_value_info(p("then_output"), element, [None] * 4)])
    whole = _attention(list(node.input[:4]), p("else_output"), p("whole_attention"), attributes)
    else_branch = helper.make_graph([whole], p("whole"), [], [helper.make_tensor_value_info(p("else_output"), element, [None] * 4)])
    return [
        helper.make_node("Shape", [query], [p("length")], start=SEQUENCE_AXIS, end=SEQUENCE_AXIS + 1),
        helper.make_node("Greater", [p("length"), s("block")], [p("over_one_block")]),
        helper.make_node("If", [p("over_one_block")], [output], name=node.name or p("if"), then_branch=then_branch, else_branch=else_branch),
    ]


def _attention_over_attended_keys(p, s, block_inputs: list[str], mask: str, attributes: list, element: int) -> list[onnx.NodeProto]:
    """The block's attention over the keys its boolean mask rows attend to: from the first key any of the block's
    rows attends to, to the last. A causal mask's first blocks read only the keys before them (half of the prompt's
    work on average); a batch padded on either side skips the padding its rows all mask. Masked keys add exactly
    zero to a softmax, so only the summation order moves (a few units in the last place). The range comes from the
    block's rows of the mask as given (not the padded rows, which attend everywhere); where one of them attends to no
    key at all (the op's answer for that row is not a softmax over attended keys), or the range is every key, the
    block reads every key, as the op did."""
    query_block, key, value, mask_block = block_inputs
    within = lambda name, source, axis: helper.make_node("Slice", [source, p("first"), p("past_last"), s(axis)], [p(name)])  # noqa: E731
    nodes = [
        helper.make_node("Slice", [mask, p("start"), p("end"), s("axis")], [p("mask_rows")]),
        helper.make_node("Cast", [p("mask_rows")], [p("mask_bytes")], to=TensorProto.UINT8),
        helper.make_node("ReduceMax", [p("mask_bytes"), s("key_axis")], [p("row_attends")], keepdims=0),
        helper.make_node("ReduceMin", [p("row_attends")], [p("every_row_attends")], keepdims=0),
        helper.make_node("ReduceMax", [p("mask_bytes"), s("row_axes")], [p("key_attended")], keepdims=0),
        helper.make_node("ArgMax", [p("key_attended")], [p("first")], axis=0, keepdims=1),
        helper.make_node("ArgMax", [p("key_attended")], [p("last")], axis=0, keepdims=1, select_last_index=1),
        helper.make_node("Add", [p("last"), s("one")], [p("past_last")]),
        helper.make_node("Shape", [key], [p("keys")], start=SEQUENCE_AXIS, end=SEQUENCE_AXIS + 1),
        helper.make_node("Sub", [p("past_last"), p("first")], [p("attended")]),
        helper.make_node("Less", [p("attended"), p("keys")], [p("fewer")]),
        helper.make_node("Cast", [p("every_row_attends")], [p("no_empty_row")], to=TensorProto.BOOL),
        helper.make_node("And", [p("fewer"), p("no_empty_row")], [p("trim")]),
    ]
    trimmed = _attention([query_block, p("key_trimmed"), p("value_trimmed"), p("mask_trimmed")], p("trimmed_output"), p("trimmed_attention"), attributes)
    whole = _attention(block_inputs, p("every_key_output"), p("block_attention"), attributes)
    trim_branch = helper.make_graph(
        [
            within("key_trimmed", key, "axis"),
            within("value_trimmed", value, "axis"),
            within("mask_trimmed", mask_block, "key_axis"),
            trimmed,
        ],
        p("attended_keys"), [], [helper.make_tensor_value_info(p("trimmed_output"), element, [None] * 4)],
    )  # fmt: skip
    every_branch = helper.make_graph([whole], p("every_key"), [], [helper.make_tensor_value_info(p("every_key_output"), element, [None] * 4)])
    nodes.append(helper.make_node("If", [p("trim")], [p("block_output")], then_branch=trim_branch, else_branch=every_branch))
    return nodes


def _attention(inputs: list[str], output: str, name: str, attributes: list) -> onnx.NodeProto:
    """An Attention node with the exported node's attributes (scale, softcap, ...)."""
    node = helper.make_node("Attention", inputs, [output], name=name)
    node.attribute.extend(attributes)
    return node
