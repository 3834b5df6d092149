"""Where each weight of a family's module comes from, so a module can be built without its weights (meta
tensors, the shapes and dtypes read from safetensors headers) and each weight read later, one at a time.

This is what lets `export` trace the module of a 27B package on an ordinary machine: the trace needs only
shapes, and the weights are streamed from the package into the artifact tensor by tensor.
"""

from __future__ import annotations

import mmap
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch
import numpy as np
from safetensors import safe_open

from vllm_sr_runtime.errors import PackageError
from vllm_sr_runtime.packages.safetensors_header import safetensors_data_start, safetensors_header

CHUNK_BYTES = 64 * 2**20  # what streaming holds of one weight at a time
SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}  # fmt: skip


@dataclass(frozen=True)
class TensorRef:
    """One tensor of one safetensors file, its shape and stored dtype, and where its bytes start (from the header)."""

    file: Path
    key: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    offset: int = -1  # absolute byte offset of the tensor's data in the file

    def read(self) -> torch.Tensor:
        with safe_open(str(self.file), framework="pt") as handle:
            return handle.get_tensor(self.key)

    def meta(self) -> torch.Tensor:
        return torch.empty(self.shape, dtype=self.dtype, device="meta")


@dataclass(frozen=True)
class LoraDelta:
    """A LoRA pair merged into its base weight as PEFT's merge does: W += ((B @ A) * scaling).to(W.dtype)."""

    a: TensorRef
    b: TensorRef
    scaling: float


@dataclass(frozen=True)
class WeightSource:
    """How one parameter of the module is made: a package tensor converted to the module's dtype, plus an
    optional merged LoRA delta."""

    ref: TensorRef
    dtype: torch.dtype
    lora: LoraDelta | None = None

    def load(self) -> torch.Tensor:
        weight = self.ref.read().to(self.dtype)
        if self.lora is not None:
            delta = (self.lora.b.read().float() @ self.lora.a.read().float()) * self.lora.scaling
            weight += delta.to(weight.dtype)
        return weight

    def chunks(self, *, transpose: bool = False, max_bytes: int | None = None) -> Iterator[torch.Tensor]:
        """The weight (or, for a 2-D one, its transpose) in row-major blocks of at most about `max_bytes`,
        read from the package's file as they are needed, and the file's pages given back after each block:
        memory holds one block, not the tensor. A LoRA merge is computed whole (a GEMM's rounding can depend
        on its shape, and the merge must equal PEFT's)."""
        shape = self.ref.shape
        if self.lora is not None or len(shape) == 0 or (transpose and len(shape) != 2) or self.ref.offset < 0:
            weight = self.load()
            yield weight.t().contiguous() if transpose else weight
            return
        item = torch.empty((), dtype=self.dtype).element_size()
        outer = shape[1] if transpose else shape[0]
        inner = int(np.prod(shape)) // max(1, outer)
        per_step = max(1, int((max_bytes or CHUNK_BYTES) // max(1, item * inner)))
        with open(self.ref.file, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # a read-only map: nothing here writes to it
                stored = torch.frombuffer(mapped, dtype=self.ref.dtype, count=int(np.prod(shape)), offset=self.ref.offset).view(shape)
            try:
                for start in range(0, outer, per_step):
                    stop = min(outer, start + per_step)
                    view = stored[:, start:stop].t() if transpose else stored[start:stop]
                    block = view.to(self.dtype).contiguous() if view.dtype != self.dtype else view.contiguous().clone()
                    del view
                    yield block
                    _release(mapped, self.ref.offset, stored.numel() * stored.element_size())
            finally:
                del stored  # no view may outlive the map


def _release(mapped: mmap.mmap, offset: int, length: int) -> None:
    """Drop the mapped pages of a tensor from this process's resident set (they stay in the page cache)."""
    if not hasattr(mapped, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
        return
    start = offset - offset % mmap.PAGESIZE
    mapped.madvise(mmap.MADV_DONTNEED, start, min(len(mapped) - start, length + (offset - start)))


def tensor_index(files: list[Path], prefix: str, root: Path) -> dict[str, TensorRef]:
    """Every tensor whose key starts with `prefix` (the prefix removed), read from the files' headers only."""
    index: dict[str, TensorRef] = {}
    for path in files:
        rel = path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)
        start = safetensors_data_start(path)
        for key, entry in safetensors_header(path, rel).items():
            if key.startswith(prefix):
                dtype = SAFETENSORS_DTYPES.get(entry["dtype"])
                if dtype is None:
                    raise PackageError(f"tensor {key} has unsupported dtype {entry['dtype']}", rel)
                index[key[len(prefix) :]] = TensorRef(path, key, tuple(entry["shape"]), dtype, start + int(entry["data_offsets"][0]))
    if not index:
        raise PackageError(f"no tensors with prefix {prefix!r}", ", ".join(p.name for p in files))
    return index


def meta_tensors(index: dict[str, TensorRef]) -> dict[str, torch.Tensor]:
    return {name: ref.meta() for name, ref in index.items()}


@contextmanager
def parameters_on_meta():
    """Modules built inside get their parameters on the meta device (no memory, no random init) and their
    buffers (rotary inverse frequencies and the like, computed from the config) for real."""
    register = torch.nn.Module.register_parameter

    def register_on_meta(module: torch.nn.Module, name: str, param: torch.nn.Parameter | None) -> None:
        register(module, name, param)
        if param is not None and not param.is_meta:
            module._parameters[name] = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    torch.nn.Module.register_parameter = register_on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register  # type: ignore[method-assign]
