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
    """Depthwise causal conv over channels-last [B, T, C] with kernel [C, K], no bias, then SiLU. Channels-last as
    the projection writes it and the recurrence reads it: the graph's translation meets both without layout passes."""
    return qwen3_5.causal_conv1d_fn(x.transpose(1, 2), weight, None, activation="silu").transpose(1, 2).contiguous()


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


@torch.library.custom_op("vsr::gated_delta_rule_state", mutates_args=())
def gated_delta_rule_state(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, initial_state: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule from an optional initial state [B, Hv, dk, dv]; returns (output, final state)."""
    out, state = qwen3_5.torch_chunk_gated_delta_rule(
        query, key, value, g=g, beta=beta, initial_state=initial_state, output_final_state=True, use_qk_l2norm_in_kernel=True
    )
    return out.contiguous(), state.contiguous()


@gated_delta_rule_state.register_fake
def _(query, key, value, g, beta, initial_state):
    batch, _, heads, value_dim = value.shape
    return value.new_empty(value.shape), value.new_empty((batch, heads, key.shape[-1], value_dim), dtype=torch.float32)


def gdn_forward(self: qwen3_5.Qwen3_5GatedDeltaNet, hidden_states: torch.Tensor, cache=None, attention_mask=None, **kwargs):
    """Qwen3_5GatedDeltaNet.forward for prefill, the conv and the recurrence as custom ops.

    With a cache (profile shared_context: one prefix pass, then suffix rows continuing it) the layer keeps
    its own state on the cache object: the prefix's last K-1 conv inputs (channels-last) and its final recurrent state,
    both for one row, broadcast over the suffix rows (transformers' cache pads and copies in place, which
    does not trace with a dynamic prefix length).
    """
    hidden_states = qwen3_5.apply_mask_to_padding_states(hidden_states, attention_mask)
    batch_size, seq_len, _ = hidden_states.shape
    mixed_qkv = self.in_proj_qkv(hidden_states)  # [B, T, C]: the conv reads it channels-last
    z = self.in_proj_z(hidden_states).reshape(batch_size, seq_len, -1, self.head_v_dim)
    b = self.in_proj_b(hidden_states)
    a = self.in_proj_a(hidden_states)
    states = None
    if cache is not None:
        states = cache.__dict__.setdefault("vsr_gdn_states", {})
    previous = states.get(self.layer_idx) if states is not None else None
    weight = self.conv1d.weight.squeeze(1)
    tail_length = weight.shape[-1] - 1
    if previous is None:
        conv_input = mixed_qkv
    else:
        conv_input = torch.cat([previous[0].expand(batch_size, -1, -1), mixed_qkv], dim=1)
    mixed_qkv = causal_conv1d_silu(conv_input, weight)
    if previous is not None:
        mixed_qkv = mixed_qkv[:, tail_length:]
    if states is not None and previous is None:
        conv_tail = F.pad(conv_input, (0, 0, tail_length, 0))[:, -tail_length:]  # [1, K-1, C]; zeros where the prefix is shorter
    query, key, value = torch.split(mixed_qkv, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
    query = query.reshape(batch_size, seq_len, -1, self.head_k_dim)
    key = key.reshape(batch_size, seq_len, -1, self.head_k_dim)
    value = value.reshape(batch_size, seq_len, -1, self.head_v_dim)
    beta = b.sigmoid()
    g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
    if states is None:
        core = gated_delta_rule(query, key, value, g, beta)
    else:
        initial = None if previous is None else previous[1].expand(batch_size, -1, -1, -1)
        core, final_state = gated_delta_rule_state(query, key, value, g, beta, initial)
        if previous is None:
            states[self.layer_idx] = (conv_tail, final_state)
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
