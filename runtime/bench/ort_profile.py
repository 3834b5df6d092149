"""Where an ONNX Runtime forward spends its time: ORT's per-node profiler, summed by op type."""

from __future__ import annotations

import collections
import json
import os
import tempfile
from pathlib import Path

import numpy as np


def profile_by_op(model_path: Path, inputs: dict[str, np.ndarray], runs: int = 3) -> list[dict]:
    """Runs the graph `runs` times (after one unprofiled warm-up) with profiling on; rows sorted by time."""
    import onnxruntime as ort

    from vllm_sr_runtime.engines.onnxruntime import session_options

    options = session_options("cpu")
    with tempfile.TemporaryDirectory() as scratch:
        options.enable_profiling = True
        options.profile_file_prefix = os.path.join(scratch, "ort")
        session = ort.InferenceSession(str(model_path), sess_options=options, providers=["CPUExecutionProvider"])
        feed = {i.name: np.ascontiguousarray(inputs[i.name]) for i in session.get_inputs()}
        for _ in range(runs + 1):
            session.run(None, feed)
        events = json.loads(Path(session.end_profiling()).read_text())
    runs_seen = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "model_run")
    warm_up_end = runs_seen[0][1] if len(runs_seen) > runs else -1
    totals: collections.Counter[str] = collections.Counter()
    nodes: dict[str, set[str]] = collections.defaultdict(set)
    for event in events:
        if event.get("ts", 0) <= warm_up_end:
            continue  # the warm-up run (first-run allocations) is not what a served request sees
        if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
            op = event["args"]["op_name"]
            totals[op] += event["dur"]
            nodes[op].add(event["name"])
    overall = sum(totals.values()) or 1
    return [
        {"op": op, "ms_per_run": micros / runs / 1000, "share": micros / overall, "nodes": len(nodes[op])}
        for op, micros in totals.most_common()
    ]


def print_profile(label: str, rows: list[dict], top: int = 12) -> None:
    print(f"ONNX Runtime time by op type ({label}):")
    for row in rows[:top]:
        print(f"  {row['op']:<24} {row['ms_per_run']:9.1f} ms/run  {100 * row['share']:5.1f}%  {row['nodes']:4d} nodes")
