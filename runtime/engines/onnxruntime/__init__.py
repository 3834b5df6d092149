"""The ONNX Runtime engine: runs an exported artifact on an execution provider chosen by device."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from runtime.errors import ArtifactError, UnsupportedDeviceError

# device kind -> (execution provider, pip package that brings it, variant it needs)
PROVIDERS = {
    "cpu": ("CPUExecutionProvider", "onnxruntime", None),
    "cuda": ("CUDAExecutionProvider", "onnxruntime-gpu", None),
    "rocm": ("MIGraphXExecutionProvider", "onnxruntime-migraphx", "portable"),
}


def cpu_threads() -> int:
    """The process's CPU affinity, not the host's CPU count (containers, cpusets)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def provider_for(device_kind: str, device_index: int | None, available: list[str]) -> tuple[str, dict]:
    provider, package, _ = PROVIDERS[device_kind]
    if provider not in available:
        raise UnsupportedDeviceError(
            f"ONNX Runtime has no {provider} in this installation (available: {', '.join(available)}); "
            f"install the {package} package for device {device_kind}"
        )
    options = {} if device_kind == "cpu" else {"device_id": int(device_index or 0)}
    return provider, options


def session_options(device_kind: str):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.inter_op_num_threads = 1
    options.intra_op_num_threads = cpu_threads()
    options.log_severity_level = 3
    if device_kind != "cpu":
        options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    return options


class OrtEngine:
    name = "onnxruntime"

    def __init__(self, session, output_name: str, provider: str):
        self.session = session
        self.output_name = output_name
        self.provider = provider
        self.input_names = [i.name for i in session.get_inputs()]

    @classmethod
    def from_file(cls, model_path: Path, *, device_kind: str = "cpu", device_index: int | None = None, output_name: str) -> "OrtEngine":
        import onnxruntime as ort

        provider, provider_options = provider_for(device_kind, device_index, ort.get_available_providers())
        try:
            session = ort.InferenceSession(
                str(model_path), sess_options=session_options(device_kind), providers=[(provider, provider_options)]
            )
        except Exception as exc:  # ORT raises its own Fail/InvalidGraph types
            raise ArtifactError(f"ONNX Runtime cannot open {model_path} on {provider}: {exc}") from None
        return cls(session, output_name, provider)

    def forward(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        feed = {name: np.ascontiguousarray(inputs[name]) for name in self.input_names}
        return self.session.run([self.output_name], feed)[0].astype(np.float32, copy=False)
