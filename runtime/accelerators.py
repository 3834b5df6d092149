"""Accelerator plugins: a device kind (`--device cpu | cuda[:N] | rocm[:N]`), how many this process sees, where
eager PyTorch runs on it, and the ONNX Runtime providers that run artifacts on it, in order of preference.

The provider options are chosen for the runtime's contract, not left at ORT's defaults:
- CUDA: the arena grows by what is asked (kSameAsRequested: no doubling past a long request), cuDNN searches
  the fastest conv algorithm once per shape (EXHAUSTIVE: the GDN causal conv is a depthwise Conv), TF32 off
  (fp32 artifacts must answer like `exact`'s FP32 within 1e-4; TF32 MatMuls do not).
- MIGraphX: never downcasts an artifact to fp16 by itself (the artifact's dtype is the one exported and judged).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

import torch


@dataclass(frozen=True)
class ProviderSpec:
    name: str  # ONNX Runtime's provider name
    package: str  # the pip package that brings it
    variant: str | None  # the artifact variant it needs (None: any)
    libraries: tuple[tuple[str, str], ...] = ()  # (shared library, what it is / how to get it) the provider loads
    options: Callable[[int | None], dict[str, str]] = field(default=lambda index: {}, compare=False)  # by device index


@dataclass(frozen=True)
class Accelerator:
    kind: str  # the --device name
    device_class: str  # cpu | gpu: the column of a family's numerics policy
    torch_type: str  # torch's device type for eager PyTorch on it (HIP devices are torch's "cuda" too)
    providers: tuple[ProviderSpec, ...]  # ONNX Runtime providers, most preferred first
    # Artifact dtypes its providers have kernels for (ORT's CPU provider implements no bf16 Mul or MatMul; the
    # CUDA provider's contrib GDN kernels take float, float16 and bfloat16).
    artifact_dtypes: tuple[str, ...]
    visible: Callable[[], int] = field(compare=False)  # devices of this kind this process sees
    auto_rank: int = 0  # --device auto takes the visible kind of highest rank
    indexed: bool = True  # cuda:N; cpu takes no index
    why_absent: Callable[[], str] = field(default=lambda: "none visible", compare=False)
    # Whether an error raised by a forward on this device left the device unusable in this process, so that only a
    # new process gets a working one (`serve` then restarts the worker).
    device_fault: Callable[[BaseException], bool] = field(default=lambda error: False, compare=False)

    @property
    def variant(self) -> str | None:
        """The artifact variant this device needs when every provider of it needs the same one."""
        variants = {spec.variant for spec in self.providers}
        return variants.pop() if len(variants) == 1 else None


# CUDA and HIP errors are sticky: once a kernel faults (an illegal address, a device-side assert, a launch failure),
# every later call on the process's context fails the same way. Running out of memory is not one of them: the
# allocation failed and the context is fine, so the next request may fit.
GPU_FAULT = re.compile(
    r"CUDA error|CUDA failure|CUBLAS failure|CUBLAS_STATUS_|CUDNN failure|CUDNN_STATUS_|cudaError|HIP error|HIP failure"
    r"|hipError|HIPBLAS_STATUS_|MIOPEN failure|miopenStatus|device-side assert|illegal memory access"
)
NOT_A_FAULT = re.compile(r"out of memory|ALLOC_FAILED|Failed to allocate", re.IGNORECASE)


def gpu_device_fault(error: BaseException) -> bool:
    """Whether `error` (or an error it was raised from) is a sticky CUDA or HIP error, from torch
    (`torch.AcceleratorError`, or a message its checks write) or from ONNX Runtime's GPU providers."""
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        text = str(cause)
        if isinstance(cause, torch.OutOfMemoryError) or NOT_A_FAULT.search(text):
            return False
        if isinstance(cause, torch.AcceleratorError) or GPU_FAULT.search(text):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def _torch_gpu_flavour() -> str | None:
    if not torch.cuda.is_available():
        return None
    return "rocm" if getattr(torch.version, "hip", None) else "cuda"


def _gpus(flavour: str) -> Callable[[], int]:
    return lambda: torch.cuda.device_count() if _torch_gpu_flavour() == flavour else 0


def _gpu_absent(flavour: str) -> Callable[[], str]:
    def why() -> str:
        seen = _torch_gpu_flavour()
        return f"this torch build sees {seen} devices" if seen else "no GPU is visible to this torch build"

    return why


CPU = Accelerator(
    "cpu", "cpu", "cpu", (ProviderSpec("CPUExecutionProvider", "onnxruntime", None),), ("fp32", "fp16", "int8"),
    visible=lambda: 1, auto_rank=0, indexed=False,
)  # fmt: skip
CUDA = Accelerator(
    "cuda", "gpu", "cuda",
    (
        ProviderSpec(
            "CUDAExecutionProvider", "onnxruntime-gpu", None,
            (
                ("cudart", "the CUDA runtime (CUDA 13 for onnxruntime-gpu's current wheels: pip install nvidia-cuda-runtime-cu13)"),
                ("cublas", "cuBLAS (pip install nvidia-cublas-cu13)"),
                ("cudnn", "cuDNN 9 (the GDN causal conv is a cuDNN Conv: pip install nvidia-cudnn-cu13)"),
            ),
            options=lambda index: {
                "device_id": str(int(index or 0)),
                "arena_extend_strategy": "kSameAsRequested",
                "cudnn_conv_algo_search": "EXHAUSTIVE",
                "do_copy_in_default_stream": "1",
                "use_tf32": "0",
            },
        ),
    ),
    ("fp32", "fp16", "bf16"), visible=_gpus("cuda"), auto_rank=10, why_absent=_gpu_absent("cuda"), device_fault=gpu_device_fault,
)  # fmt: skip
ROCM = Accelerator(
    "rocm", "gpu", "cuda",
    (
        ProviderSpec(
            "MIGraphXExecutionProvider", "onnxruntime-migraphx", "portable",
            (("amdhip64", "the HIP runtime (ROCm)"), ("migraphx_c", "MIGraphX (ROCm's migraphx package)")),
            options=lambda index: {"device_id": str(int(index or 0)), "migraphx_fp16_enable": "0"},
        ),
    ),
    ("fp32", "fp16"), visible=_gpus("rocm"), auto_rank=10, why_absent=_gpu_absent("rocm"), device_fault=gpu_device_fault,
)  # fmt: skip
