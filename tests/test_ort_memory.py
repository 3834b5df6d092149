"""The CPU engine's memory across requests of varying lengths: it stays at what the largest forward needs."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("onnxruntime")

# In a child process (RSS is per process): a graph whose eight intermediates all live until its end (~0.6 GiB at
# 128 rows), opened by the engine as `max_speed` opens an artifact, then run on the largest shape alone and on a
# served-like sequence of lengths, each seen twice.
CHILD = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import numpy as np, onnx
    from onnx import TensorProto, helper
    from vllm_sr_runtime.engines.onnxruntime import OrtEngine

    width = 131072
    nodes = [helper.make_node("Mul", ["x", f"c{i}"], [f"b{i}"]) for i in range(8)]
    nodes += [helper.make_node("Sum", [f"b{i}" for i in range(8)], ["s"]), helper.make_node("ReduceSum", ["s"], ["y"], keepdims=0)]
    constants = [helper.make_tensor(f"c{i}", TensorProto.FLOAT, [], [float(i + 1)]) for i in range(8)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])], initializer=constants)
    path = Path(sys.argv[2]) / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    engine = OrtEngine.from_file(path, output_name="y")

    def rss_mib():
        return int(next(line for line in open("/proc/self/status") if line.startswith("VmRSS")).split()[1]) / 1024

    def forward(rows):
        x = np.full((rows, width), 1e-3, np.float32)
        value = float(engine.forward({"x": x}))
        assert abs(value - 36e-3 * rows * width) < 1e-3 * rows * width, value
        del x

    start = rss_mib()
    forward(128)
    largest = rss_mib() - start
    for rows in [int(r) for r in sys.argv[1].split(",")]:
        forward(rows)
    print(json.dumps({"largest_alone": largest, "after_sequence": rss_mib() - start}))
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads VmRSS from /proc")
def test_cpu_sessions_do_not_grow_with_each_repeated_prompt_length(tmp_path):
    sequence = "16,16,32,32,64,64,96,96,128,128"
    done = subprocess.run([sys.executable, "-c", CHILD, sequence, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    growth = json.loads(done.stdout.strip().splitlines()[-1])
    # ORT's memory pattern (one planned block per shape seen twice) roughly doubles this; without it the arena
    # reuses what the largest forward took.
    assert growth["largest_alone"] > 400, growth  # the graph's intermediates were held at all
    assert growth["after_sequence"] < 1.3 * growth["largest_alone"], growth
