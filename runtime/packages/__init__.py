"""Model packages: where they come from (local dir, Hub id@rev) and the checks shared by every family."""

from vllm_sr_runtime.packages.files import (
    canonical_json,
    check_inventory,
    list_package_files,
    sha256_file,
    sha256_bytes,
)
from vllm_sr_runtime.packages.resolve import PackageRef, parse_model_ref, resolve_package
from vllm_sr_runtime.packages.safetensors_header import safetensors_element_count, safetensors_header

__all__ = [
    "PackageRef",
    "canonical_json",
    "check_inventory",
    "list_package_files",
    "parse_model_ref",
    "resolve_package",
    "safetensors_element_count",
    "safetensors_header",
    "sha256_bytes",
    "sha256_file",
]
