"""Execution providers: which one a device kind uses, the options it is opened with, and why it did not start.

The options are chosen for the runtime's contract, not left at ORT's defaults:
- CUDA: the arena grows by what is asked (kSameAsRequested: no doubling past a long request), cuDNN searches
  the fastest conv algorithm once per shape (EXHAUSTIVE: the GDN causal conv is a depthwise Conv), TF32 off
  (fp32 artifacts must answer like `exact`'s FP32 within 1e-4; TF32 MatMuls do not).
- MIGraphX: never downcasts an artifact to fp16 by itself (the artifact's dtype is the one exported and judged).
"""

from __future__ import annotations

import ctypes.util
import glob
import os
import sys
from dataclasses import dataclass
from typing import Callable

from vllm_sr_runtime.errors import UnsupportedDeviceError


@dataclass(frozen=True)
class ProviderSpec:
    name: str  # ONNX Runtime's provider name
    package: str  # the pip package that brings it
    variant: str | None  # the artifact variant it needs (None: any)
    libraries: tuple[tuple[str, str], ...]  # (shared library, what it is / how to get it) the provider loads


PROVIDERS = {
    "cpu": ProviderSpec("CPUExecutionProvider", "onnxruntime", None, ()),
    "cuda": ProviderSpec(
        "CUDAExecutionProvider", "onnxruntime-gpu", None,
        (
            ("cudart", "the CUDA runtime (CUDA 13 for onnxruntime-gpu's current wheels: pip install nvidia-cuda-runtime-cu13)"),
            ("cublas", "cuBLAS (pip install nvidia-cublas-cu13)"),
            ("cudnn", "cuDNN 9 (the GDN causal conv is a cuDNN Conv: pip install nvidia-cudnn-cu13)"),
        ),
    ),
    "rocm": ProviderSpec(
        "MIGraphXExecutionProvider", "onnxruntime-migraphx", "portable",
        (
            ("amdhip64", "the HIP runtime (ROCm)"),
            ("migraphx_c", "MIGraphX (ROCm's migraphx package)"),
        ),
    ),
}  # fmt: skip


def provider_options(device_kind: str, device_index: int | None) -> dict[str, str]:
    if device_kind == "cuda":
        return {
            "device_id": str(int(device_index or 0)),
            "arena_extend_strategy": "kSameAsRequested",
            "cudnn_conv_algo_search": "EXHAUSTIVE",
            "do_copy_in_default_stream": "1",
            "use_tf32": "0",
        }
    if device_kind == "rocm":
        return {"device_id": str(int(device_index or 0)), "migraphx_fp16_enable": "0"}
    return {}


def _library_found(stem: str) -> bool:
    """A shared library on the loader's path, or in a pip-installed nvidia-* / rocm package."""
    if ctypes.util.find_library(stem):
        return True
    for root in sys.path:
        if glob.glob(os.path.join(root, "nvidia", "*", "lib", f"lib{stem}*.so*")):
            return True
    return False


def missing_pieces(device_kind: str, library_found: Callable[[str], bool] = _library_found) -> list[str]:
    return [f"lib{stem} ({what})" for stem, what in PROVIDERS[device_kind].libraries if not library_found(stem)]


def check_provider_available(device_kind: str, available: list[str]) -> str:
    spec = PROVIDERS[device_kind]
    if spec.name not in available:
        raise UnsupportedDeviceError(
            f"ONNX Runtime has no {spec.name} in this installation (available: {', '.join(available)}); "
            f"install the {spec.package} package (and not the plain onnxruntime one) for device {device_kind}"
        )
    return spec.name


def provider_start_error(device_kind: str, started: list[str], detail: str = "", library_found: Callable[[str], bool] = _library_found) -> UnsupportedDeviceError:
    """The error for a session whose provider did not start (ORT logs the reason and falls back to CPU):
    names the missing libraries where some are missing."""
    spec = PROVIDERS[device_kind]
    missing = missing_pieces(device_kind, library_found)
    why = f"missing: {'; '.join(missing)}" if missing else "its libraries were found; see ONNX Runtime's log above for the reason"
    extra = f" ({detail})" if detail else ""
    return UnsupportedDeviceError(
        f"{spec.name} did not start for device {device_kind}{extra}: {why}. The session got {', '.join(started) or 'no provider'} instead; "
        "the runtime does not fall back to CPU on a GPU device"
    )
