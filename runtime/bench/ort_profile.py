"""Where an ONNX Runtime forward spends its time: ORT's per-node profiler, summed by op type, with the
multiply-adds of every matrix-product node (from the shapes the profiler records) so each product op's
throughput can be set against the machine's ceiling for its arithmetic."""

from __future__ import annotations

import collections
import json
import os
import tempfile
from pathlib import Path

import numpy as np

# Matrix-product ops and the ceiling each is judged against. The MatMul family reads A [..., M, K] and writes
# [..., M, N] (no transposed A), so the profiler's shapes give its work: 2 * M * N * K per batch. Attention (ONNX's,
# 4-D: Q [B, Hq, T, Dq], K [B, Hk, S, Dq], V [B, Hk, S, Dv]) is two products, Q K^T and the weights times V: every
# query head against every key position, whatever the mask (ORT's CPU kernel computes them all).
PRODUCT_CEILINGS = {
    "MatMul": "fp32",
    "MatMulIntegerToFloat": "int8",
    "MatMulInteger": "int8",
    "DynamicQuantizeMatMul": "int8",
    "MatMulNBits": "int8",
    "Attention": "fp32",
}


def product_ops(op: str, args: dict) -> float | None:
    """Arithmetic operations (2 per multiply-add) of one profiled product node; None for other ops or missing shapes."""
    if op not in PRODUCT_CEILINGS:
        return None
    shapes = [next(iter(entry.values()), None) for entry in args.get("input_type_shape") or []]
    outputs = [next(iter(entry.values()), None) for entry in args.get("output_type_shape") or []]
    if op == "Attention":
        if len(shapes) < 3 or not all(shape and len(shape) == 4 for shape in shapes[:3]):
            return None
        (batch, heads, queries, _), (_, _, keys, key_dim), value_dim = shapes[0], shapes[1], shapes[2][-1]
        return 2.0 * batch * heads * queries * keys * (key_dim + value_dim)
    if not shapes or not shapes[0] or not outputs or not outputs[0]:
        return None
    return 2.0 * float(np.prod(outputs[0])) * shapes[0][-1]


CONTROL_FLOW = frozenset({"If", "Loop", "Scan"})


def profiled_graphs(models: dict) -> dict[str, Path]:
    """The rows `--ort-profile` profiles and each one's graph: every ONNX Runtime model but the shared_context ones
    (their main graph is max_speed's)."""
    graphs = {label: getattr(model.engine, "model_path", None) for label, model in models.items() if not label.startswith("shared_context")}
    return {label: path for label, path in graphs.items() if path is not None}


def refuse_off_cpu(models: dict) -> None:
    """`--ort-profile` opens each graph on ORT's CPU provider: a model served on another device would be profiled
    on a machine it does not run on, and ORT's per-node times on a GPU provider are kernel launches (the kernels
    run asynchronously), not the GPU's time. Raises before any timing, naming the rows that cannot be profiled."""
    elsewhere = {label: models[label].device.name for label in profiled_graphs(models) if models[label].device.kind != "cpu"}
    if elsewhere:
        rows = ", ".join(f"{label} on {device}" for label, device in elsewhere.items())
        raise ValueError(
            f"--ort-profile times ONNX Runtime's CPU provider node by node; {rows} would be profiled on the CPU instead "
            "(and per-node times on a GPU provider are kernel launches, not GPU time): bench with --device cpu to "
            "profile, or use the GPU vendor's profiler (nsys, rocprofv3) for the device"
        )


def profile_by_op(model_path: Path, inputs: dict[str, np.ndarray], runs: int = 3) -> list[dict]:
    """Runs the graph `runs` times (after one unprofiled warm-up) with profiling on; rows sorted by time. The
    graph is opened as the CPU engine serves it (full attention over query blocks); control-flow nodes (If, Loop)
    are not rows of their own: the nodes inside them are."""
    import onnxruntime as ort

    from vllm_sr_runtime.engines.onnxruntime import attention_blocks, graph_source, session_options

    options = session_options("cpu")
    source, config = graph_source(model_path, attention_blocks.ATTENTION_QUERY_BLOCK)
    for key, value in config.items():
        options.add_session_config_entry(key, value)
    with tempfile.TemporaryDirectory() as scratch:
        options.enable_profiling = True
        options.profile_file_prefix = os.path.join(scratch, "ort")
        session = ort.InferenceSession(source, sess_options=options, providers=["CPUExecutionProvider"])
        feed = {i.name: np.ascontiguousarray(inputs[i.name]) for i in session.get_inputs()}
        for _ in range(runs + 1):
            session.run(None, feed)
        events = json.loads(Path(session.end_profiling()).read_text())
    runs_seen = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "model_run")
    warm_up_end = runs_seen[0][1] if len(runs_seen) > runs else -1
    totals: collections.Counter[str] = collections.Counter()
    work: collections.Counter[str] = collections.Counter()
    nodes: dict[str, set[str]] = collections.defaultdict(set)
    for event in events:
        if event.get("ts", 0) <= warm_up_end:
            continue  # the warm-up run (first-run allocations) is not what a served request sees
        if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
            op = event["args"]["op_name"]
            if op in CONTROL_FLOW:  # its time is its subgraph nodes', which have events of their own
                continue
            totals[op] += event["dur"]
            nodes[op].add(event["name"])
            operations = product_ops(op, event["args"])
            if operations is not None:
                work[op] += operations
    overall = sum(totals.values()) or 1
    rows = []
    for op, micros in totals.most_common():
        row = {"op": op, "ms_per_run": micros / runs / 1000, "share": micros / overall, "nodes": len(nodes[op])}
        if op in work and micros > 0:
            row["gop_per_run"] = work[op] / runs / 1e9
            row["gops"] = work[op] / (micros / 1e6) / 1e9
            row["ceiling"] = PRODUCT_CEILINGS[op]
        rows.append(row)
    return rows


def judge_products(rows: list[dict], limits: dict[str, float], work: float, ceiling: str) -> dict:
    """Each product row's fraction of the ceiling for its arithmetic (in place), and the graph's summary: the share of
    its time in product ops, their milliseconds per run, and `bound`: the fraction of `ceiling` the graph would reach
    doing `work` (operations per run, as the bench rows count them) if every other op took no time."""
    products = [row for row in rows if "gops" in row]
    for row in products:
        row["fraction_of_ceiling"] = row["gops"] / limits[row["ceiling"]] if limits.get(row["ceiling"]) else None
    product_ms = sum(row["ms_per_run"] for row in products)
    bound = work / (product_ms / 1000) / 1e9 / limits[ceiling] if product_ms > 0 and limits.get(ceiling) else None
    return {"product_share": sum(row["share"] for row in products), "product_ms_per_run": product_ms, "ceiling": ceiling, "bound": bound}


def print_profile(label: str, rows: list[dict], top: int = 12) -> None:
    print(f"ONNX Runtime time by op type ({label}):")
    for row in rows[:top]:
        line = f"  {row['op']:<24} {row['ms_per_run']:9.1f} ms/run  {100 * row['share']:5.1f}%  {row['nodes']:4d} nodes"
        if row.get("fraction_of_ceiling") is not None:
            unit = "GOP/s" if row["ceiling"] == "int8" else "GFLOP/s"
            line += f"  {row['gops']:6.1f} {unit} = {row['fraction_of_ceiling']:.2f} of the {row['ceiling']} ceiling"
        print(line)
