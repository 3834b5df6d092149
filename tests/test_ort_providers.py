"""The ORT engine's providers: options set on purpose, a clear error naming what is missing when a GPU
provider cannot start (never a silent CPU fallback), and IO binding with reused buffers (run on CPU here)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from vllm_sr_runtime.engines.onnxruntime import open_session
from vllm_sr_runtime.engines.onnxruntime.io_binding import DeviceBuffers
from vllm_sr_runtime.errors import UnsupportedDeviceError


def tiny_model(path) -> None:
    weight = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3) / 10, "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Softmax", ["m"], ["probabilities"], axis=-1)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", 4])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["rows", 3])], [weight],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_a_session_that_fell_back_to_cpu_is_refused(tmp_path, monkeypatch):
    """ORT logs a provider that fails to start and runs on CPU instead; on a GPU device that is an error."""
    tiny_model(tmp_path / "m.onnx")
    real = ort.InferenceSession
    requested = {}

    def falls_back(path, sess_options=None, providers=None):
        requested["providers"] = providers
        return real(path, providers=["CPUExecutionProvider"])  # what ORT does when the provider fails to start

    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(ort, "InferenceSession", falls_back)
    with pytest.raises(UnsupportedDeviceError, match="CUDAExecutionProvider did not start .* got CPUExecutionProvider instead"):
        open_session(tmp_path / "m.onnx", "cuda", 0)
    assert requested["providers"][0][0] == "CUDAExecutionProvider" and requested["providers"][0][1]["use_tf32"] == "0"


def test_io_binding_reuses_input_buffers_and_answers_like_run(tmp_path):
    tiny_model(tmp_path / "m.onnx")
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    buffers = DeviceBuffers("cpu", 0, kept=2)
    rng = np.random.default_rng(0)
    for rows in (2, 2, 2, 5, 2):
        x = rng.standard_normal((rows, 4), dtype=np.float32)
        np.testing.assert_array_equal(buffers.run(session, "probabilities", {"x": x}), session.run(["probabilities"], {"x": x})[0])
    assert buffers.allocations == 2  # one buffer per shape, refilled in place for the repeats
    for rows in (6, 7, 2):  # past `kept` shapes: the least recently used are dropped and made again when needed
        buffers.run(session, "probabilities", {"x": rng.standard_normal((rows, 4), dtype=np.float32)})
    assert buffers.allocations == 5
