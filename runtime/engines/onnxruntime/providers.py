"""Execution providers: which one runs a device (the accelerator plugin's first provider this ONNX Runtime
installation has), the options it is opened with, and why it did not start."""

from __future__ import annotations

import ctypes.util
import glob
import os
import sys
from typing import Callable

from vllm_sr_runtime.accelerators import ProviderSpec
from vllm_sr_runtime.devices import installed_accelerators
from vllm_sr_runtime.errors import UnsupportedDeviceError


def _library_found(stem: str) -> bool:
    """A shared library on the loader's path, or in a pip-installed nvidia-* / rocm package."""
    if ctypes.util.find_library(stem):
        return True
    for root in sys.path:
        if glob.glob(os.path.join(root, "nvidia", "*", "lib", f"lib{stem}*.so*")):
            return True
    return False


def providers_for(device_kind: str) -> tuple[ProviderSpec, ...]:
    return installed_accelerators()[device_kind].providers


def select_provider(device_kind: str, available: list[str]) -> ProviderSpec:
    """The device's most preferred provider that this ONNX Runtime installation has."""
    specs = providers_for(device_kind)
    for spec in specs:
        if spec.name in available:
            return spec
    wanted = " or ".join(f"{spec.name} (package {spec.package})" for spec in specs)
    packages = " or ".join(spec.package for spec in specs)
    raise UnsupportedDeviceError(
        f"ONNX Runtime has no {wanted} in this installation (available: {', '.join(available)}); "
        f"install the {packages} package (and not the plain onnxruntime one) for device {device_kind}"
    )


def missing_pieces(spec: ProviderSpec, library_found: Callable[[str], bool] = _library_found) -> list[str]:
    return [f"lib{stem} ({what})" for stem, what in spec.libraries if not library_found(stem)]


def provider_start_error(
    device_kind: str, started: list[str], detail: str = "", library_found: Callable[[str], bool] = _library_found, provider: ProviderSpec | None = None
) -> UnsupportedDeviceError:
    """The error for a session whose provider did not start (ORT logs the reason and falls back to CPU):
    names the missing libraries where some are missing."""
    spec = provider or providers_for(device_kind)[0]
    missing = missing_pieces(spec, library_found)
    why = f"missing: {'; '.join(missing)}" if missing else "its libraries were found; see ONNX Runtime's log above for the reason"
    extra = f" ({detail})" if detail else ""
    return UnsupportedDeviceError(
        f"{spec.name} did not start for device {device_kind}{extra}: {why}. The session got {', '.join(started) or 'no provider'} instead; "
        "the runtime does not fall back to CPU on a GPU device"
    )
