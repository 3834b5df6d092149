"""Checks before any work that the output disk can hold the artifact."""

from __future__ import annotations

import shutil
from pathlib import Path

from vllm_sr_runtime.errors import ArtifactError

# Bytes on disk per parameter: fp32 writes 4; int8 writes 1 for the quantized MatMul weights and 4 for what
# stays FP32 (embeddings, norms, the head and the token mixers' output projections).
BYTES_PER_PARAMETER = {"fp32": 4.0, "int8": 2.0}
DISK_MARGIN = 1.1


def check_disk_space(out: Path, parameters: int | None, dtype: str) -> int | None:
    """Refuse before any work when the disk that will hold `out` has less room than the artifact needs
    (estimated from the package's parameter count); returns the estimate in bytes."""
    if not parameters:
        return None
    needed = int(parameters * BYTES_PER_PARAMETER.get(dtype, 4.0) * DISK_MARGIN)
    probe = Path(out).resolve()
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < needed:
        raise ArtifactError(
            f"not enough disk space for the artifact: {parameters:,} parameters as {dtype} need about {readable(needed)} "
            f"under {probe}, {readable(free)} free"
        )
    return needed


def readable(count: int) -> str:
    """Bytes in the largest binary unit that keeps the figure at least 1 (a tiny package's 1.4 MiB is not 0.0 GiB)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} bytes"
