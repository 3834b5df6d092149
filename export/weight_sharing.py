"""A second graph of an artifact that reads its weights from the first graph's data file.

The shared_context graph is traced from the same module as the main graph, so nearly all its initializers
are the main graph's, byte for byte, under the same names. Pointing them at the main graph's external data
file (same offsets) keeps the artifact at one copy of the weights on disk.
"""

from __future__ import annotations

import hashlib
import mmap
from pathlib import Path

import onnx
from onnx.external_data_helper import uses_external_data


def save_sharing_weights(model: onnx.ModelProto, path: Path, data_name: str, base: Path, size_threshold: int = 1024) -> dict:
    """Save `model` at `path`; every initializer equal in type, shape and bytes to an external one of the
    ONNX file `base` (same directory) points into base's data file, the others go to `data_name`.
    Matched by content, not name: the exporter folds transposed weights into constants named by trace order.
    Returns {"shared": count, "own": count}."""
    base_model = onnx.load(str(base), load_external_data=False)
    maps: dict[str, mmap.mmap] = {}
    shared = own = 0
    try:
        index: dict[tuple, onnx.TensorProto] = {}
        for tensor in base_model.graph.initializer:
            if uses_external_data(tensor):
                index.setdefault(_content_key(tensor, _external_bytes(tensor, base.parent, maps)), tensor)
        for tensor in model.graph.initializer:
            if not tensor.HasField("raw_data") or len(tensor.raw_data) < size_threshold:
                continue
            reference = index.get(_content_key(tensor, tensor.raw_data))
            if reference is None:
                own += 1
                continue
            tensor.ClearField("raw_data")
            tensor.data_location = onnx.TensorProto.EXTERNAL
            del tensor.external_data[:]
            tensor.external_data.extend(reference.external_data)
            shared += 1
        # onnx writes only tensors that still hold raw_data; the repointed ones are left as they are.
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=data_name, size_threshold=size_threshold)
    finally:
        for view in maps.values():
            view.close()
    return {"shared": shared, "own": own}


def _external_bytes(tensor: onnx.TensorProto, root: Path, maps: dict[str, mmap.mmap]) -> memoryview:
    entries = {entry.key: entry.value for entry in tensor.external_data}
    location = entries["location"]
    if location not in maps:
        with open(root / location, "rb") as handle:
            maps[location] = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    offset = int(entries.get("offset", 0))
    return memoryview(maps[location])[offset : offset + int(entries["length"])]


def _content_key(tensor: onnx.TensorProto, data) -> tuple:
    return (tensor.data_type, tuple(tensor.dims), len(data), hashlib.sha256(data).hexdigest())
