"""Trace a family's module without its weights, then stream the weights into the artifact tensor by tensor.

The module is built with meta parameters (`Family.build_module(weights=False)`); the trace sees only
shapes. Every initializer of the traced graph becomes a lazy tensor that reads its weight from the
package (`Family.weight_sources`) when it is written, so the exporter holds one weight at a time, never
the model. The graph is optimized exactly as torch.onnx's `optimize=True` does (onnxscript's optimizer
and fusions); the fold that optimizer applies to weights, a Transpose of a weight (any weight up to its
fold size limit, a larger one only when nothing else reads it), is done lazily here first, so the artifact
has today's graph and today's weight values, and every folded weight keeps its provenance (the int8
rewrite picks MatMuls by the parameter name behind their weight).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import onnx
import onnx_ir as ir
import torch
from tqdm import tqdm

from vllm_sr_runtime.export.gdn_ops import patched_gdn
from vllm_sr_runtime.errors import ArtifactError
from vllm_sr_runtime.families.weights import WeightSource

SIZE_THRESHOLD = 1024  # bytes; smaller tensors stay inside the graph file
ALIGNMENT = 4096  # page-aligned offsets let ONNX Runtime map the weights
# onnxscript's constant folder folds ops on inputs up to this many elements, and a Transpose of any size
# when it is the weight's only reader (onnxscript.optimizer._constant_folding).
FOLD_INPUT_SIZE_LIMIT = 8192

Provenance = tuple  # ("param", name), ("transpose", name, perm) or ("content", dtype, shape, sha256): what an initializer holds


@dataclass
class StreamedModule:
    """A module whose tensors are all fake (shapes and dtypes, no data), and how to make each one's real values."""

    module: torch.nn.Module
    loaders: dict[int, tuple[str, Callable[[], torch.Tensor]]]  # id(meta tensor) -> (name in module, loader)
    sources: dict[str, WeightSource] = field(default_factory=dict)  # the package-backed ones, by name in module

    @classmethod
    def of(cls, module: torch.nn.Module, sources: dict[str, WeightSource]) -> "StreamedModule":
        """`module` built without weights: its meta parameters come from `sources`; its real tensors (buffers
        computed from the config, small heads) are kept aside. Every tensor of the module then becomes a fake
        CPU tensor (no memory): a trace on fake CPU tensors decomposes ops exactly as one on real weights does
        (one on the meta device does not: scaled_dot_product_attention gains a reshape there)."""
        values: dict[str, Callable[[], torch.Tensor]] = {}
        for name, tensor in [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]:
            if tensor.is_meta:
                if name not in sources:
                    raise ArtifactError(f"no weight source for {name}: the family's weight_sources does not cover its module")
                values[name] = sources[name].load
            else:
                kept = tensor.detach().clone()
                values[name] = lambda kept=kept: kept
        # torch.export traces modules whose tensors are fake (the public fake-mode helper of torch.onnx is gone).
        from torch._subclasses.fake_tensor import FakeTensorMode

        mode = FakeTensorMode(allow_non_fake_inputs=True)
        with mode:
            for sub in module.modules():
                for key, param in list(sub._parameters.items()):
                    if param is not None:
                        sub._parameters[key] = torch.nn.Parameter(torch.empty(param.shape, dtype=param.dtype, device="cpu"), requires_grad=False)
                for key, buffer in list(sub._buffers.items()):
                    if buffer is not None:
                        sub._buffers[key] = torch.empty(buffer.shape, dtype=buffer.dtype, device="cpu")
        loaders = {}
        for name, tensor in [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]:
            loaders[id(tensor)] = (name, values[name])
        return cls(module, loaders, {name: source for name, source in sources.items() if name in values})

    def named(self, wrapper: torch.nn.Module) -> dict[str, tuple[str, Callable[[], torch.Tensor]]]:
        """The loaders under the names a trace of `wrapper` (the module or a wrapper around part of it) gives."""
        found = {}
        for name, tensor in [*wrapper.named_parameters(remove_duplicate=False), *wrapper.named_buffers(remove_duplicate=False)]:
            if id(tensor) in self.loaders:
                found[name] = self.loaders[id(tensor)]
        return found

    def load(self, name: str) -> torch.Tensor:
        for loaded_name, loader in self.loaders.values():
            if loaded_name == name:
                return loader()
        raise KeyError(name)

    def names(self) -> list[str]:
        return [name for name, _ in self.loaders.values()]


@dataclass
class TracedGraph:
    model: ir.Model
    sources: dict[str, WeightSource]
    provenance: dict[int, Provenance] = field(default_factory=dict)  # id(const_value) -> provenance

    def blocks(self, const) -> Iterator[np.ndarray] | None:
        """A package-backed weight (or its transpose) in blocks read as they are written; None for the rest."""
        provenance = self.provenance.get(id(const))
        if provenance is None or provenance[0] not in ("param", "transpose") or provenance[1] not in self.sources:
            return None
        source = self.sources[provenance[1]]
        if provenance[0] == "transpose" and provenance[2] != (1, 0):
            return None
        return (_raw_block(block) for block in source.chunks(transpose=provenance[0] == "transpose"))


def _ir_tensor(tensor: torch.Tensor, name: str) -> ir.Tensor:
    return ir.tensor_adapters.TorchTensor(tensor.detach().contiguous(), name=name)  # bfloat16 has no numpy dtype


def _raw_block(block: torch.Tensor) -> np.ndarray:
    """A block's bytes as a numpy array (bfloat16 viewed as its 16-bit storage)."""
    block = block.contiguous()
    return (block.view(torch.int16) if block.dtype == torch.bfloat16 else block).numpy()


# What torch.onnx says on every trace that is about torch, not about the graph: dynamic dims that share a constraint
# (the family's axes name them once each already), pytree's deprecation notice, and torchvision's ops it skips.
TRACER_NOTICES = (
    (UserWarning, r"# The axis name: .* will not be used"),
    (FutureWarning, r".*LeafSpec.*"),
)
TRACER_LOGGERS = ("torch.onnx._internal.exporter._registration",)


@contextlib.contextmanager
def tracer_notices_silenced() -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in TRACER_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            for category, message in TRACER_NOTICES:
                warnings.filterwarnings("ignore", message=message, category=category)
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def trace_arguments(sample: dict, input_names, dynamic_axes: dict) -> tuple[dict[str, torch.Tensor], dict[str, dict]]:
    """torch.onnx's keyword inputs (the sample as tensors) and dynamic shapes (one Dim per axis label, shared by
    every input that names it)."""
    kwargs = {}
    for name in input_names:
        value = sample[name]
        kwargs[name] = value if isinstance(value, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(value))
    dims: dict[str, torch.export.Dim] = {}
    dynamic_shapes = {}
    for name in input_names:
        axes = {}
        for axis, label in dynamic_axes.get(name, {}).items():
            dims.setdefault(label, torch.export.Dim(label, min=1, max=1 << 20))
            axes[axis] = dims[label]
        dynamic_shapes[name] = axes
    return kwargs, dynamic_shapes


def trace(
    streamed: StreamedModule,
    wrapper: torch.nn.Module,
    sample: dict,
    opset: int,
    input_names,
    dynamic_axes: dict,
    output_name: str,
    translations: dict,
    method: str = "forward",
) -> TracedGraph:
    """torch.onnx (dynamo) trace of one of `wrapper`'s methods (its tensors fake), its weights lazy."""
    kwargs, dynamic_shapes = trace_arguments(sample, input_names, dynamic_axes)
    if method != "forward":
        wrapper.forward = getattr(wrapper, method)  # the instance attribute wins in nn.Module.__call__
    try:
        with patched_gdn(wrapper), torch.inference_mode(False), torch.no_grad(), tracer_notices_silenced():
            program = torch.onnx.export(
                wrapper, (), kwargs=kwargs, dynamic_shapes=dynamic_shapes, dynamo=True, opset_version=opset,
                custom_translation_table=translations, input_names=list(input_names), output_names=[output_name],
                optimize=False, verbose=False,
            )  # fmt: skip
    finally:
        if method != "forward":
            del wrapper.forward
    traced = TracedGraph(program.model, streamed.sources)
    _make_lazy(traced, streamed.named(wrapper))
    ir.passes.common.InlinePass()(traced.model)
    _fold_weight_transposes(traced)
    import onnxscript.optimizer
    import onnxscript.rewriter.onnx_fusions

    onnxscript.optimizer.optimize_ir(traced.model)
    onnxscript.rewriter.onnx_fusions.fuse(traced.model)
    return traced


def is_fake(tensor: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(tensor, FakeTensor)


def _make_lazy(traced: TracedGraph, loaders: dict[str, tuple[str, Callable[[], torch.Tensor]]]) -> None:
    for name, value in traced.model.graph.initializers.items():
        const = value.const_value
        raw = getattr(const, "raw", None)
        if not (isinstance(raw, torch.Tensor) and (raw.is_meta or is_fake(raw))):
            continue
        if name not in loaders:
            raise ArtifactError(f"initializer {name} of the traced graph has no weight behind it")
        source_name, loader = loaders[name]
        lazy = ir.LazyTensor(lambda loader=loader, name=name: _ir_tensor(loader(), name), dtype=const.dtype, shape=const.shape, name=name)
        value.const_value = lazy
        traced.provenance[id(lazy)] = ("param", source_name)


def _fold_weight_transposes(traced: TracedGraph) -> None:
    graph = traced.model.graph
    for node in list(graph):
        source = node.inputs[0] if node.op_type == "Transpose" and node.domain == "" and node.inputs else None
        if source is None or not source.is_initializer() or id(source.const_value) not in traced.provenance:
            continue
        small = source.const_value.size <= FOLD_INPUT_SIZE_LIMIT
        if not small and (len(source.consumers()) != 1 or source.is_graph_output()):
            continue  # as the optimizer: a large weight's Transpose is folded only when nothing else reads it
        base = source.const_value
        perm_attr = node.attributes.get("perm")
        perm = list(perm_attr.as_ints()) if perm_attr is not None else list(reversed(range(len(base.shape))))
        shape = ir.Shape([base.shape[p] for p in perm])
        output = node.outputs[0]
        lazy = ir.LazyTensor(
            lambda base=base, perm=perm, name=output.name: ir.tensor(np.ascontiguousarray(np.transpose(base.numpy(), perm)), name=name),
            dtype=base.dtype, shape=shape, name=output.name,
        )  # fmt: skip
        folded = ir.Value(name=output.name, shape=shape, type=ir.TensorType(base.dtype), const_value=lazy)
        traced.provenance[id(lazy)] = ("transpose", traced.provenance[id(base)][1], tuple(perm))
        output.replace_all_uses_with(folded)
        graph.remove(node, safe=True)
        if not source.uses() and not source.is_graph_output():
            graph.initializers.pop(source.name)
        graph.register_initializer(folded)


@dataclass
class WrittenWeights:
    index: dict[Provenance, tuple[str, int, int]]  # provenance -> (file, offset, length)
    shared: int = 0  # initializers pointed at another graph's data file
    own: int = 0  # initializers written to this graph's data file
    bytes: int = 0


def write_graph(
    traced: TracedGraph, path: Path, data_file: str, *, progress: bool = False, reuse: dict[Provenance, tuple[str, int, int]] | None = None
) -> tuple[onnx.ModelProto, WrittenWeights]:
    """Write the weights of `traced` to `data_file` beside `path` one at a time (each read from the package
    as it is written), or point them at an earlier graph's file where `reuse` has the same weight; returns
    the graph as a ModelProto whose large initializers are external references."""
    directory = path.parent
    written = WrittenWeights(index={})
    values = list(traced.model.graph.initializers.values())
    total = sum(v.const_value.nbytes for v in values if v.const_value is not None and v.const_value.nbytes >= SIZE_THRESHOLD)
    with open(directory / data_file, "wb") as data, tqdm(
        total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=f"write {data_file}", disable=not progress, leave=False
    ) as bar:
        for value in values:
            const = value.const_value
            if const is None:
                continue
            if const.nbytes < SIZE_THRESHOLD:
                if isinstance(const, ir.LazyTensor):
                    value.const_value = ir.tensor(const.numpy(), name=value.name)
                continue
            # Package weights are known by what they are; the optimizer's own small folds by their content.
            provenance = traced.provenance.get(id(const)) or ("content", str(const.dtype), tuple(const.shape), hashlib.sha256(const.tobytes()).hexdigest())
            if reuse is not None and provenance in reuse:
                location, offset, length = reuse[provenance]
                written.shared += 1
            else:
                offset = -(-data.tell() // ALIGNMENT) * ALIGNMENT
                data.seek(offset)
                blocks = traced.blocks(const)
                for block in blocks if blocks is not None else [np.frombuffer(const.tobytes(), dtype=np.uint8)]:
                    data.write(memoryview(np.ascontiguousarray(block)).cast("B"))
                location, length = data_file, data.tell() - offset
                if length != const.nbytes:
                    raise ArtifactError(f"{value.name}: wrote {length} bytes, the graph expects {const.nbytes}")
                written.own += 1
                written.bytes += length
                written.index[provenance] = (location, offset, length)
            value.const_value = ir.ExternalTensor(location, offset, length, dtype=const.dtype, shape=const.shape, name=value.name, base_dir=directory)
            bar.update(const.nbytes)
    return ir.serde.serialize_model(traced.model), written
