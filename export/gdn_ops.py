"""Gated DeltaNet pieces as torch custom ops, so tracing keeps them whole (no unrolled recurrence).

Their eager implementations call transformers' own reference functions, so a patched model computes
exactly what the stock one does; export translates each op to ONNX Runtime contrib ops (com.microsoft).
"""

from __future__ import annotations

import types
from contextlib import contextmanager

import torch
from torch.nn import functional as F
from transformers.models.qwen3_5 import modeling_qwen3_5 as qwen3_5


@torch.library.custom_op("vsr::causal_conv1d_silu", mutates_args=())
def causal_conv1d_silu(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Depthwise causal conv over [B, C, T] with kernel [C, K], no bias, then SiLU."""
    return qwen3_5.causal_conv1d_fn(x, weight, None, activation="silu")


@causal_conv1d_silu.register_fake
def _(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("vsr::gated_delta_rule", mutates_args=())
def gated_delta_rule(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
) -> torch.Tensor:
    """Prefill of the gated delta rule with q/k L2-normalised inside: [B,T,Hk,dk] x2, [B,T,Hv,dv], [B,T,Hv] x2."""
    out, _ = qwen3_5.torch_chunk_gated_delta_rule(
        query, key, value, g=g, beta=beta, initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=True
    )
    return out.contiguous()


@gated_delta_rule.register_fake
def _(query, key, value, g, beta):
    return value.new_empty(value.shape, dtype=value.dtype)


def gdn_forward(self: qwen3_5.Qwen3_5GatedDeltaNet, hidden_states: torch.Tensor, cache=None, attention_mask=None, **kwargs):
    """Qwen3_5GatedDeltaNet.forward for prefill without a cache, the conv and the recurrence as custom ops."""
    hidden_states = qwen3_5.apply_mask_to_padding_states(hidden_states, attention_mask)
    batch_size, seq_len, _ = hidden_states.shape
    mixed_qkv = self.in_proj_qkv(hidden_states).transpose(1, 2)
    z = self.in_proj_z(hidden_states).reshape(batch_size, seq_len, -1, self.head_v_dim)
    b = self.in_proj_b(hidden_states)
    a = self.in_proj_a(hidden_states)
    mixed_qkv = causal_conv1d_silu(mixed_qkv, self.conv1d.weight.squeeze(1)).transpose(1, 2)
    query, key, value = torch.split(mixed_qkv, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
    query = query.reshape(batch_size, seq_len, -1, self.head_k_dim)
    key = key.reshape(batch_size, seq_len, -1, self.head_k_dim)
    value = value.reshape(batch_size, seq_len, -1, self.head_v_dim)
    beta = b.sigmoid()
    g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
    core = gated_delta_rule(query, key, value, g, beta)
    core = self.norm(core.reshape(-1, self.head_v_dim), z.reshape(-1, self.head_v_dim))
    return self.out_proj(core.reshape(batch_size, seq_len, -1))


@contextmanager
def patched_gdn(model: torch.nn.Module):
    """Route every Gated DeltaNet layer of `model` through the custom ops while the context is open."""
    layers = [m for m in model.modules() if isinstance(m, qwen3_5.Qwen3_5GatedDeltaNet)]
    for layer in layers:
        layer.forward = types.MethodType(gdn_forward, layer)
    try:
        yield len(layers)
    finally:
        for layer in layers:
            del layer.forward
