"""Devices over accelerator plugins: what `--device auto` picks and why, indexes checked against what is
visible, and ONNX Runtime providers taken in the accelerator's order of preference."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from vllm_sr_runtime.accelerators import CPU, CUDA, ROCM, ProviderSpec
from vllm_sr_runtime.devices import auto_choice, parse_device
from vllm_sr_runtime.engines.onnxruntime.providers import provider_start_error, select_provider
from vllm_sr_runtime.errors import UnsupportedDeviceError


def fleet(cuda: int = 0, rocm: int = 0) -> dict:
    """The built-in accelerators, seeing `cuda` / `rocm` devices."""
    return {
        "cpu": CPU,
        "cuda": dataclasses.replace(CUDA, visible=lambda: cuda, why_absent=lambda: "no GPU is visible to this torch build"),
        "rocm": dataclasses.replace(ROCM, visible=lambda: rocm, why_absent=lambda: "this torch build sees cuda devices"),
    }


def test_devices_parse_over_the_accelerators_and_say_why_a_device_is_absent():
    assert parse_device("cpu", fleet()).torch_device.type == "cpu"
    assert parse_device("auto", fleet()).name == "cpu"
    assert parse_device("auto", fleet(rocm=2)).name == "rocm:0"
    assert parse_device("rocm:1", fleet(rocm=2)).torch_device.index == 1
    assert parse_device("rocm:1", fleet(rocm=2)).torch_device.type == "cuda"  # HIP devices are torch's cuda
    with pytest.raises(UnsupportedDeviceError, match="no GPU"):
        parse_device("cuda", fleet())
    with pytest.raises(UnsupportedDeviceError, match="sees cuda"):
        parse_device("rocm:0", fleet(cuda=1))
    with pytest.raises(UnsupportedDeviceError, match="1 cuda device"):
        parse_device("cuda:3", fleet(cuda=1))
    with pytest.raises(UnsupportedDeviceError, match=r"one of auto, cpu, cuda\[:N\], rocm\[:N\]"):
        parse_device("tpu", fleet())
    with pytest.raises(UnsupportedDeviceError, match="cpu takes no device index"):
        parse_device("cpu:1", fleet())
    for not_text in (None, 0):  # load(device=None) was an AttributeError
        with pytest.raises(UnsupportedDeviceError, match=rf"device {not_text!r} is not one of auto"):
            parse_device(not_text, fleet())


def test_auto_takes_the_visible_kind_of_highest_rank_and_says_why():
    device, reasons = auto_choice(fleet(cuda=2))
    assert device.name == "cuda:0" and reasons == ["cuda: 2 visible, picked cuda:0"]
    device, reasons = auto_choice(fleet())
    assert device.name == "cpu"
    assert reasons == ["cuda: no GPU is visible to this torch build", "rocm: this torch build sees cuda devices", "cpu: 1 visible, picked cpu"]
    npu = dataclasses.replace(CUDA, kind="npu", visible=lambda: 1, auto_rank=20)  # a plugin accelerator ranked first
    assert auto_choice({**fleet(cuda=1), "npu": npu})[0].name == "npu:0"


def test_an_accelerator_lists_providers_in_order_of_preference(monkeypatch):
    tensorrt = ProviderSpec("TensorrtExecutionProvider", "onnxruntime-gpu", None, options=lambda index: {"device_id": str(index or 0)})
    two = dataclasses.replace(CUDA, providers=(tensorrt, *CUDA.providers))
    monkeypatch.setattr("vllm_sr_runtime.engines.onnxruntime.providers.installed_accelerators", lambda: {"cuda": two})
    assert select_provider("cuda", ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]) is tensorrt
    assert select_provider("cuda", ["CUDAExecutionProvider", "CPUExecutionProvider"]).name == "CUDAExecutionProvider"
    with pytest.raises(UnsupportedDeviceError, match="no TensorrtExecutionProvider .* or CUDAExecutionProvider"):
        select_provider("cuda", ["CPUExecutionProvider"])


def test_gpu_provider_options_are_chosen_for_parity_and_memory():
    def options(kind: str, index: int | None, provider: str) -> dict[str, str]:  # as the engine opens its session
        return select_provider(kind, [provider, "CPUExecutionProvider"]).options(index)

    cuda = options("cuda", 1, "CUDAExecutionProvider")
    assert cuda["device_id"] == "1" and cuda["use_tf32"] == "0"  # fp32 artifacts answer like exact's FP32
    assert cuda["cudnn_conv_algo_search"] == "EXHAUSTIVE" and cuda["arena_extend_strategy"] == "kSameAsRequested"
    assert options("rocm", None, "MIGraphXExecutionProvider") == {"device_id": "0", "migraphx_fp16_enable": "0"}
    assert options("cpu", None, "CPUExecutionProvider") == {}


def test_missing_provider_and_missing_libraries_are_named():
    with pytest.raises(UnsupportedDeviceError, match="no CUDAExecutionProvider .* install the onnxruntime-gpu package"):
        select_provider("cuda", ["CPUExecutionProvider"])
    with pytest.raises(UnsupportedDeviceError, match="no MIGraphXExecutionProvider .* onnxruntime-migraphx"):
        select_provider("rocm", ["CPUExecutionProvider"])
    error = str(provider_start_error("cuda", ["CPUExecutionProvider"], library_found=lambda stem: stem != "cudnn"))
    assert "CUDAExecutionProvider did not start" in error and "libcudnn (cuDNN 9" in error
    assert "libcudart" not in error and "does not fall back to CPU" in error
    found_all = str(provider_start_error("rocm", [], library_found=lambda stem: True))
    assert "libraries were found" in found_all


def test_devices_command_reports_what_auto_picks_and_every_accelerator():
    done = subprocess.run([sys.executable, "-m", "vllm_sr_runtime.cli", "devices", "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    kinds = {row["kind"]: row for row in report["accelerators"]}
    assert set(kinds) >= {"cpu", "cuda", "rocm"} and kinds["cpu"]["distribution"] == "vllm-sr-runtime"
    assert kinds["cpu"]["visible"] == 1 and kinds["cpu"]["providers"][0] == {"name": "CPUExecutionProvider", "package": "onnxruntime", "installed": True}
    assert report["auto"]["device"] == ("cpu" if kinds["cuda"]["visible"] + kinds["rocm"]["visible"] == 0 else report["auto"]["device"])
    assert report["auto"]["why"][-1].startswith(report["auto"]["device"].split(":")[0] + ":")
    text = subprocess.run([sys.executable, "-m", "vllm_sr_runtime.cli", "devices"], capture_output=True, text=True, timeout=120)
    assert f"auto -> {report['auto']['device']}" in text.stdout
    from vllm_sr_runtime.cpu_features import int8_products_saturate

    saturates = int8_products_saturate()  # this CPU's flags: the int8 weight bits its ONNX Runtime products take
    assert report["cpu_int8"]["products_saturate"] is saturates and report["cpu_int8"]["int8_weight_bits"] == (7 if saturates else 8)
    assert f"--int8-weight-bits {report['cpu_int8']['int8_weight_bits']}" in text.stdout


def test_gpu_device_faults_are_the_sticky_errors_not_running_out_of_memory():
    """A fault restarts the serving worker (only a new process gets a clean CUDA or HIP context); out of memory, a
    request's own error or any CPU error does not."""
    import torch

    sticky = [
        torch.AcceleratorError("CUDA error: an illegal memory access was encountered"),
        RuntimeError("CUDA error: device-side assert triggered\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions."),
        RuntimeError("[ONNXRuntimeError] : 1 : FAIL : CUDA failure 700: an illegal memory access was encountered ; GPU=0 ; expr=cudaStreamSynchronize(stream);"),
        RuntimeError("CUBLAS failure 13: CUBLAS_STATUS_EXECUTION_FAILED ; GPU=0"),
        RuntimeError("HIP error: the launch timed out and was terminated"),
    ]
    recoverable = [
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Failed to allocate memory for requested buffer of size 1073741824"),
        RuntimeError("CUDA failure 2: out of memory ; GPU=0"),
        RuntimeError("CUBLAS failure 3: CUBLAS_STATUS_ALLOC_FAILED"),
        ValueError("an input the engine refused"),
    ]
    assert all(CUDA.device_fault(error) and ROCM.device_fault(error) for error in sticky)
    assert not any(CUDA.device_fault(error) for error in recoverable)
    assert not any(CPU.device_fault(error) for error in sticky)
    try:  # an engine that wraps the device's error still reports it
        try:
            raise sticky[0]
        except RuntimeError as inner:
            raise RuntimeError("the forward failed") from inner
    except RuntimeError as wrapped:
        assert CUDA.device_fault(wrapped)
