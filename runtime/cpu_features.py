"""What this CPU's instruction set means for ONNX Runtime's CPU kernels: its flags, and whether ORT's u8 x s8 integer
product saturates on it.

ORT's MLAS runs MatMulInteger / MatMulIntegerToFloat / DynamicQuantizeMatMul (uint8 activations x int8 weights) on
x86-64 with VPMADDUBSW where the CPU has AVX2 (or AVX-512) but no VNNI: it adds each pair of byte products into a
saturating 16-bit sum, and 255 x 127 x 2 = 64,770 does not fit 32,767, so the product comes out wrong wherever two
neighbouring 8-bit weights are large. With VNNI (AVX512_VNNI, AVX_VNNI) or AMX the pairs accumulate in 32 bits; with
only SSE4.1 MLAS widens to 16 bits first; ARM's dot-product kernels do not saturate either. ONNX Runtime's quantizer
documents the same hazard (its `reduce_range`: 7-bit weights, 255 x 63 x 2 = 32,130 fits). Measured under QEMU's
Haswell model (AVX2, no VNNI): an 8-bit-weight product wrong by up to 19% of its largest output, 7-bit weights exact.
"""

from __future__ import annotations

import platform
from pathlib import Path

VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})  # /proc/cpuinfo names of the 32-bit byte dot products
SATURATING_FLAGS = frozenset({"avx2", "avx512bw"})  # VPMADDUBSW's homes, used where no VNNI flag is present
FULL_WEIGHT_BITS = 8  # int8 weights in [-127, 127]
SAFE_WEIGHT_BITS = 7  # in [-63, 63]: 255 x 63 x 2 fits a signed 16-bit sum


def cpu_flags() -> str:
    """The CPU's flags as /proc/cpuinfo lists them (platform.processor() where there is no such file)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def int8_products_saturate(flags: str | None = None, machine: str | None = None) -> bool:
    """Whether ORT's u8 x s8 integer product saturates on this CPU (or on one with these `flags` and `machine`):
    x86-64 with AVX2 or AVX-512BW and none of the VNNI / AMX byte dot products."""
    machine = (machine if machine is not None else platform.machine()).lower()
    if machine not in ("x86_64", "amd64"):
        return False
    present = set((flags if flags is not None else cpu_flags()).split())
    return bool(present & SATURATING_FLAGS) and not present & VNNI_FLAGS


def widest_int8_weight_bits(saturates: bool | None = None) -> int:
    """The widest int8 weights ORT's integer products take correctly on this CPU (`saturates` overrides the
    detection): 8, or 7 where they saturate."""
    return SAFE_WEIGHT_BITS if (int8_products_saturate() if saturates is None else saturates) else FULL_WEIGHT_BITS
