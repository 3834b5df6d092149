"""Writing a traced graph: int8 rewriting, weights streamed to their file, the graph passes; its I/O schema and
the custom-op translations a family's module needs."""

from __future__ import annotations

from pathlib import Path

import onnx
import torch

from vllm_sr_runtime.export.graph_passes import cast_mixed_rms_norms, drop_untyped_shapes, trim_contrib_outputs
from vllm_sr_runtime.export.int8 import Int8Layout, quantize_embeddings, quantize_matmuls
from vllm_sr_runtime.export.streaming import TracedGraph, write_graph

IO_DTYPES = {1: "float32", 7: "int64", 9: "bool", 10: "float16", 16: "bfloat16"}


def emit_graph(
    traced: TracedGraph,
    temp: Path,
    file: str,
    data_file: str,
    dtype: str,
    *,
    progress: bool = False,
    reuse: dict | None = None,
    int8: Int8Layout = Int8Layout(),
) -> tuple[onnx.ModelProto, dict]:
    """Quantize the graph's MatMuls for int8 (each weight quantized when it is written, where `int8` puts it), stream
    its weights into `data_file` (or point them at the main graph's, where `reuse` has them), apply the graph
    passes, and save it as `file`. Returns the graph (external references) and weight counts."""
    if dtype == "int8":
        quantize_matmuls(traced, int8.keeps_fp32, int8.activations, int8.blocked.__contains__, int8.splits, int8.weight_bits)
        if int8.embedding_tables:
            quantize_embeddings(traced, int8.embedding_tables.__contains__)
    drop_untyped_shapes(traced.model)
    proto, written = write_graph(traced, temp / file, data_file, progress=progress, reuse=reuse)
    trim_contrib_outputs(proto)
    cast_mixed_rms_norms(proto)
    onnx.save_model(proto, str(temp / file))
    return proto, {"shared": written.shared, "own": written.own, "index": written.index}


def io_schema(values) -> list[dict]:
    schema = []
    for value in values:
        tensor = value.type.tensor_type
        shape = [d.dim_param or d.dim_value for d in tensor.shape.dim]
        schema.append({"name": value.name, "dtype": IO_DTYPES.get(tensor.elem_type, str(tensor.elem_type)), "shape": shape})
    return schema


def gdn_dims(config) -> tuple[int, int] | None:
    """(key head dim, value head dim) of a backbone config with Gated DeltaNet layers; None without."""
    if "linear_attention" not in (getattr(config, "layer_types", None) or []):
        return None
    return config.linear_key_head_dim, config.linear_value_head_dim


def translation_table(config) -> dict:
    """The custom-op translations a backbone config (the family's `backbone_config()`) needs."""
    from vllm_sr_runtime.export import translations

    if gdn_dims(config) is None:
        return {}
    return {
        torch.ops.vsr.causal_conv1d_silu.default: translations.make_causal_conv1d_silu(
            2 * config.linear_num_key_heads * config.linear_key_head_dim + config.linear_num_value_heads * config.linear_value_head_dim,
            config.linear_conv_kernel_dim,
        ),
        torch.ops.vsr.gated_delta_rule.default: translations.make_gated_delta_rule(
            config.linear_num_value_heads, config.linear_num_key_heads, config.linear_key_head_dim
        ),
        torch.ops.vsr.gated_delta_rule_state.default: translations.make_gated_delta_rule_state(
            config.linear_num_value_heads, config.linear_num_key_heads, config.linear_key_head_dim
        ),
    }
