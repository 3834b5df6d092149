"""Provider-bound graphs: the portable variant's static-length graphs (checked against the MIGraphX provider's
list) and the CUDA kernel check of contrib graphs."""

from __future__ import annotations

from pathlib import Path

import onnx

from vllm_sr_runtime.errors import ArtifactError
from vllm_sr_runtime.families.base import Family

def check_cuda_kernels(model_path: Path) -> dict:
    """Every typed node of a CUDA-bound graph has a CUDA kernel for its floating-point types (the vendored
    registry table); a gap would fail the session on the GPU with CPU fallback disabled."""
    from vllm_sr_runtime.export.provider_checks import cuda_kernel_gaps, provider_rules

    gaps = cuda_kernel_gaps(onnx.load(str(model_path), load_external_data=False))
    if gaps:
        raise ArtifactError("nodes with no CUDA kernel for their type: " + "; ".join(gaps[:5]))
    return {"gaps": 0, "checked_against": provider_rules("cuda_kernels.json")["source"]}


def static_sequence_lengths(longest_prompt: int, lengths: tuple[int, ...] | None) -> tuple[int, ...]:
    """The portable variant's static lengths: multiples of the GDN chunk, the last covering the package's
    longest prompt."""
    from vllm_sr_runtime.export.chunked_gdn import CHUNK

    top = -(-int(longest_prompt) // CHUNK) * CHUNK
    if lengths:
        chosen = sorted({int(length) for length in lengths})
        bad = [length for length in chosen if length <= 0 or length % CHUNK]
        if bad:
            raise ArtifactError(f"static lengths must be positive multiples of {CHUNK}: {', '.join(map(str, bad))}")
        if chosen[-1] < top:
            chosen.append(top)  # every prompt the package accepts has a graph
        return tuple(length for length in chosen if length <= top)
    chosen, length = [], 128
    while length < top:
        chosen.append(length)
        length *= 2
    return tuple(chosen + [top])


def write_static_graphs(proto: onnx.ModelProto, temp: Path, family: Family, gdn, lengths: tuple[int, ...], longest_file: str) -> dict:
    """The portable graphs, one per static length, all reading the main graph's weights file; the longest is
    `longest_file` (the artifact's main graph). Each is checked node by node against the MIGraphX provider's list."""
    from vllm_sr_runtime.export.provider_checks import migraphx_refusals, provider_rules
    from vllm_sr_runtime.export.portable import lower_to_portable

    config = family.backbone_config()
    heads = (config.num_attention_heads, getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
    graphs = []
    for length in lengths:
        lowered = lower_to_portable(proto, gdn, heads, length)
        try:  # every graph, not only the ones the smoke parity opens: shapes and types must agree throughout
            onnx.shape_inference.infer_shapes(lowered, check_type=True, strict_mode=True, data_prop=True)
        except onnx.shape_inference.InferenceError as exc:
            raise ArtifactError(f"the {length}-token portable graph does not type-check: {str(exc)[:400]}") from None
        problems = migraphx_refusals(lowered)
        if problems:
            raise ArtifactError(f"the {length}-token portable graph has nodes the MIGraphX provider does not take: " + "; ".join(problems[:5]))
        name = longest_file if length == lengths[-1] else f"model_t{length}.onnx"
        onnx.save_model(lowered, str(temp / name))
        graphs.append({"length": length, "model_file": name})
    return {"graphs": graphs, "padding": family.sequence_padding(), "checked_against": provider_rules()["source"]}
