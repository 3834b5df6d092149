"""Writes a graph's weights to its external-data file tensor by tensor, with bytes written and an ETA,
and checks before any work that the output disk can hold the artifact."""

from __future__ import annotations

import shutil
from pathlib import Path

import onnx
from onnx.external_data_helper import set_external_data
from tqdm import tqdm

from runtime.errors import ArtifactError

SIZE_THRESHOLD = 1024  # smaller tensors stay inside the graph file (onnx's own default for external data)
ALIGNMENT = 4096  # page-aligned offsets let ONNX Runtime map the weights instead of copying them
# Bytes on disk per parameter, and the margin above it: fp32 writes 4; int8 stages the fp32 graph and
# writes the quantized one beside it (~4 + 1.3).
BYTES_PER_PARAMETER = {"fp32": 4.0, "int8": 5.5}
DISK_MARGIN = 1.1


def save_with_external_data(model: onnx.ModelProto, path: Path, data_file: str, *, progress: bool = False) -> int:
    """Save `model` to `path`, every initializer of at least SIZE_THRESHOLD bytes moved to `data_file` beside
    it; returns the bytes written to the data file."""
    large = [t for t in model.graph.initializer if t.HasField("raw_data") and len(t.raw_data) >= SIZE_THRESHOLD]
    total = sum(len(t.raw_data) for t in large)
    written = 0
    with open(path.parent / data_file, "wb") as data, tqdm(
        total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=f"write {data_file}", disable=not progress, leave=False
    ) as bar:
        for tensor in large:
            offset = -(-data.tell() // ALIGNMENT) * ALIGNMENT
            data.seek(offset)
            raw = tensor.raw_data
            data.write(raw)
            set_external_data(tensor, location=data_file, offset=offset, length=len(raw))
            tensor.data_location = onnx.TensorProto.EXTERNAL
            tensor.ClearField("raw_data")
            written += len(raw)
            bar.update(len(raw))
    onnx.save_model(model, str(path))
    return written


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
            f"not enough disk space for the artifact: {parameters:,} parameters as {dtype} need about {needed / 2**30:.1f} GiB "
            f"under {probe}, {free / 2**30:.1f} GiB free"
        )
    return needed
