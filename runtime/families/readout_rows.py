"""The last decoder layer computed only at the positions a readout reads.

A readout reads a few positions of the last hidden state (Decision 3.0: the last token; Decision 2.0: each option's
endpoint and the query token), so the last layer's work for every other row is thrown away: its queries, attention,
output projection and MLP are per-row work, and only its keys and values (full attention) or its recurrence (Gated
DeltaNet) need every row. With the layer patched as below, the text model returns the hidden state of the selected
rows only, [batch, K, hidden], in their order (after a cached prefix too: shared_context's question pass): one
layer's per-token work and one layer's quadratic attention less per forward (about 1/L of a prompt's cost for L
layers, more at long prompts). The answers are the unpruned model's up to float rounding (other GEMM shapes), which
is why `exact` (the reference numerics) keeps the full model and only exported graphs take this form (their smoke
parity checks it against the full eager model)."""

from __future__ import annotations

import sys
import types
from contextlib import contextmanager
from typing import Iterator

import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS


def gather_rows(values: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """values[b, positions[b, k]] for [B or 1, T, ...] values and [B, K] positions -> [B, K, ...] (rotary tables
    without position ids have one row for the batch)."""
    values = values.expand(positions.shape[0], *([-1] * (values.dim() - 1)))
    index = positions.reshape(*positions.shape, *([1] * (values.dim() - 2))).expand(-1, -1, *values.shape[2:])
    return torch.gather(values, 1, index)


def prunable(text_model: torch.nn.Module) -> bool:
    """Whether the text model's last layer has the shape `last_layer_at` patches: a full-attention layer without a
    sliding window (whose mask `attention_rows` does not rebuild), or a Gated DeltaNet layer."""
    layers = getattr(text_model, "layers", None)
    if not layers:
        return False
    last = layers[-1]
    if hasattr(last, "linear_attn"):
        return True
    attention = getattr(last, "self_attn", None)
    return attention is not None and getattr(attention, "sliding_window", None) is None and hasattr(attention, "q_norm")


@contextmanager
def last_layer_at(text_model: torch.nn.Module, positions: torch.Tensor) -> Iterator[None]:
    """While open, the text model's last layer computes (and the model returns) only the rows at `positions`
    ([batch, K], any order, repeats allowed)."""
    layer = text_model.layers[-1]

    def forward(self, hidden_states, position_embeddings, attention_mask=None, position_ids=None, cache=None, **kwargs):
        residual = gather_rows(hidden_states, positions)
        normed = self.input_layernorm(hidden_states)
        if hasattr(self, "linear_attn"):  # the recurrence needs every row; only its output is selected
            mixed = gather_rows(self.linear_attn(hidden_states=normed, cache=cache, attention_mask=attention_mask, **kwargs), positions)
        else:
            mixed = attention_rows(self.self_attn, normed, positions, position_embeddings, attention_mask, cache)
        hidden = residual + mixed
        return hidden + self.mlp(self.post_attention_layernorm(hidden))

    layer.forward = types.MethodType(forward, layer)
    try:
        yield
    finally:
        del layer.forward


def attention_rows(attention: torch.nn.Module, normed: torch.Tensor, positions: torch.Tensor, position_embeddings, mask, cache=None) -> torch.Tensor:
    """A Qwen3 / Qwen3.5 attention module's output at `positions` only: queries from those rows, keys and values
    from every row, after a cached prefix's when `cache` holds one (shared_context's suffix pass); Qwen3.5's output
    gate is the second half of its q_proj, as in its own forward."""
    batch, length, _ = normed.shape
    rows = positions.shape[1]
    head_dim = attention.head_dim
    apply_rotary = sys.modules[type(attention).__module__].apply_rotary_pos_emb  # each model's own (Qwen3.5: partial)
    query = attention.q_proj(gather_rows(normed, positions))
    gate = None
    if query.shape[-1] == 2 * attention.config.num_attention_heads * head_dim:
        query, gate = torch.chunk(query.view(batch, rows, -1, head_dim * 2), 2, dim=-1)
        gate = gate.reshape(batch, rows, -1)
    query = attention.q_norm(query.reshape(batch, rows, -1, head_dim)).transpose(1, 2)
    key = attention.k_norm(attention.k_proj(normed).view(batch, length, -1, head_dim)).transpose(1, 2)
    value = attention.v_proj(normed).view(batch, length, -1, head_dim).transpose(1, 2)
    cos, sin = position_embeddings
    query, _ = apply_rotary(query, query, gather_rows(cos, positions), gather_rows(sin, positions))
    _, key = apply_rotary(key, key, cos, sin)
    past = 0
    if cache is not None:
        past = cache.get_seq_length(attention.layer_idx)
        key, value = cache.update(key, value, attention.layer_idx)
    rows_mask = mask_rows(mask, positions, key.shape[2], attention.is_causal, past)
    interface = ALL_ATTENTION_FUNCTIONS[attention.config._attn_implementation]
    output, _ = interface(attention, query, key, value, rows_mask, dropout=0.0, scaling=attention.scaling, is_causal=False)
    output = output.reshape(batch, rows, -1)
    if gate is not None:
        output = output * torch.sigmoid(gate)
    return attention.o_proj(output)


def mask_rows(mask: torch.Tensor | None, positions: torch.Tensor, keys: int, causal: bool, past: int = 0) -> torch.Tensor | None:
    """The selected queries' rows of a [B, 1 or H, T, keys] attention mask (a mask with one query row already
    broadcasts). None stands for causal without padding (transformers' SDPA path then passes no mask): the rows
    see the keys up to their own position, after `past` cached ones."""
    if mask is None:
        if not causal:
            return None
        key_positions = torch.arange(keys, device=positions.device)
        return key_positions[None, None, None, :] <= (positions + past)[:, None, :, None]
    if mask.shape[2] == 1:
        return mask
    mask = mask.expand(positions.shape[0], -1, -1, -1)
    index = positions[:, None, :, None].expand(-1, mask.shape[1], -1, mask.shape[3])
    return torch.gather(mask, 2, index)
