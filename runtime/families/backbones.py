"""Build transformers' own text model classes and load safetensors weights into them strictly."""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Callable

import torch
from safetensors import safe_open
from transformers import Qwen3Config, Qwen3Model, Qwen3_5TextConfig, Qwen3_5TextModel
from transformers.models.qwen3_5 import modeling_qwen3_5

from vllm_sr_runtime.errors import PackageError

BACKBONES = {
    "qwen3": (Qwen3Config, Qwen3Model),
    "qwen3_5_text": (Qwen3_5TextConfig, Qwen3_5TextModel),
}


GATED_DELTA_RULES = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule")


def _outside_autocast(rule: Callable) -> Callable:
    @functools.wraps(rule)
    def run(query: torch.Tensor, *args, **kwargs):
        if not torch.is_autocast_enabled(query.device.type):
            return rule(query, *args, **kwargs)
        with torch.autocast(query.device.type, enabled=False):
            return rule(query, *args, **kwargs)

    run.vsr_outside_autocast = True
    return run


def keep_gated_delta_rule_fp32() -> None:
    """transformers' PyTorch gated delta rule (what runs without flash-linear-attention, e.g. on every GPU of
    ours) casts q/k/v/g/beta to FP32, but under a BF16 autocast (Decision 2.0's GPU policy) its matmuls run
    in BF16 again. The released runtime's FLA kernels accumulate in FP32; so does this, by running the rule
    outside autocast (a no-op where autocast is off): on an H200, a tiny Qwen3.5 Decision 2.0 package's BF16
    answers moved from FP32's by a median |dp| of 0.036 with it, 0.093 without. Idempotent."""
    for name in GATED_DELTA_RULES:
        rule = getattr(modeling_qwen3_5, name)
        if not getattr(rule, "vsr_outside_autocast", False):
            setattr(modeling_qwen3_5, name, _outside_autocast(rule))


class _ReferenceRuleNotice(logging.Filter):
    """Drops transformers' notice that the Gated DeltaNet kernels fall back to their PyTorch reference: that reference
    is what this runtime runs on purpose (`exact`'s numerics, and the rule kept FP32 above), so the notice, printed on
    the first eager forward of every Python API user, says nothing they can act on. Every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "is falling back to its reference PyTorch implementation" not in record.getMessage()


def silence_reference_rule_notice() -> None:
    """Idempotent; touches only the logger of transformers' kernel integration."""
    logger = logging.getLogger("transformers.integrations.hub_kernels")
    if not any(isinstance(existing, _ReferenceRuleNotice) for existing in logger.filters):
        logger.addFilter(_ReferenceRuleNotice())


def text_config_from_dict(model_type: str, data: dict):
    config_cls, _ = BACKBONES[model_type]
    fields = {k: v for k, v in data.items() if k not in ("model_type", "transformers_version", "architectures")}
    config = config_cls(**fields)
    config._attn_implementation = "sdpa"
    return config


def read_tensors(files: list[Path], prefix: str, root: Path) -> dict[str, torch.Tensor]:
    """Tensors whose key starts with `prefix`, with the prefix removed."""
    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        with safe_open(str(path), framework="pt") as handle:
            for key in handle.keys():
                if key.startswith(prefix):
                    tensors[key[len(prefix) :]] = handle.get_tensor(key)
    if not tensors:
        raise PackageError(f"no tensors with prefix {prefix!r}", ", ".join(p.relative_to(root).as_posix() for p in files))
    return tensors


def build_text_model(model_type: str, config, state_dict: dict[str, torch.Tensor], dtype: torch.dtype, where: str) -> torch.nn.Module:
    """Instantiate without random init (meta device), then take the package's tensors as parameters."""
    _, model_cls = BACKBONES[model_type]
    if model_cls is Qwen3_5TextModel:
        keep_gated_delta_rule_fp32()
        silence_reference_rule_notice()
    with torch.device("meta"):
        model = model_cls(config)
    expected = set(model.state_dict())
    missing = sorted(expected - set(state_dict))
    unexpected = sorted(set(state_dict) - expected)
    if missing or unexpected:
        detail = f"missing {missing[:3]}" if missing else f"unexpected {unexpected[:3]}"
        raise PackageError(f"weights do not fit the {model_type} config: {detail}", where)
    shapes = model.state_dict()
    for key, tensor in state_dict.items():
        if tuple(tensor.shape) != tuple(shapes[key].shape):
            raise PackageError(f"{key} has shape {tuple(tensor.shape)}, the config needs {tuple(shapes[key].shape)}", where)
    model.load_state_dict({k: v.to(dtype) for k, v in state_dict.items()}, strict=True, assign=True)
    # Non-persistent buffers (rotary inverse frequencies) are not in the checkpoint: rebuild those modules.
    for name, module in list(model.named_modules()):
        if type(module).__name__.endswith("RotaryEmbedding"):
            parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
            setattr(parent, name.rsplit(".", 1)[-1], type(module)(config=config))
    for name, buffer in model.named_buffers():
        if buffer.is_meta:
            raise PackageError(f"buffer {name} was not initialised", where)
    return model.eval()
