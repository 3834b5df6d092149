"""Profile `shared_context`: a request's common token prefix runs once, every question continues from it.

The prefix pass fills a transformers cache (attention keys/values; Gated DeltaNet conv tail and recurrent
state); the cache is repeated over the question rows and the suffixes run from it, right-padded, at
positions P.. . Causal models get exactly what the full rows compute (the prefix never sees the
questions); Decision 3.0's bidirectional attention loses the prefix -> question direction, which is
why the profile is approximate and judged by `parity`.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache

from vllm_sr_runtime.families.readout_rows import last_layer_at



def common_prefix_length(items: list[Any], limit_of) -> int:
    """Longest token prefix all items share, capped per item by `limit_of(item)` (tokens that must stay
    in the suffix: option endpoints, the readout position)."""
    first = items[0].token_ids
    length = min(limit_of(item) for item in items)
    for item in items[1:]:
        ids = item.token_ids
        shared = 0
        bound = min(length, len(ids))
        while shared < bound and ids[shared] == first[shared]:
            shared += 1
        length = shared
    return max(0, length)


def worth_sharing(count: int, prefix_length: int, min_saved_tokens: int) -> bool:
    return count > 1 and prefix_length > 0 and (count - 1) * prefix_length >= min_saved_tokens


def suffix_arrays(items: list[Any], prefix_length: int, pad_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The shared prefix ids [1, P], the right-padded suffix ids, their mask, and each row's last real
    position (the readout position)."""
    suffixes = [item.token_ids[prefix_length:] for item in items]
    width = max(len(s) for s in suffixes)
    ids = np.full((len(items), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(items), width), dtype=np.int64)
    for row, suffix in enumerate(suffixes):
        ids[row, : len(suffix)] = suffix
        mask[row, : len(suffix)] = 1
    last = np.array([len(s) - 1 for s in suffixes], dtype=np.int64)
    prefix = np.asarray(items[0].token_ids[:prefix_length], dtype=np.int64)[None]
    return prefix, ids, mask, last


def _full_attention_mask(query_valid: torch.Tensor, prefix_length: int, causal: bool) -> torch.Tensor:
    """[B, 1, S, P + S] boolean: every query sees the whole prefix, and the real suffix keys before it
    (causal) or all of them (bidirectional)."""
    rows, width = query_valid.shape
    keys = query_valid.bool()[:, None, None, :].expand(rows, 1, width, width)
    if causal:
        keys = keys & torch.ones(width, width, dtype=torch.bool, device=query_valid.device).tril()
    prefix = torch.ones(rows, 1, width, prefix_length, dtype=torch.bool, device=query_valid.device)
    return torch.cat([prefix, keys], dim=-1)


def _masks(text_model: torch.nn.Module, valid: torch.Tensor, prefix_length: int, causal: bool) -> dict:
    masks = {"full_attention": _full_attention_mask(valid, prefix_length, causal)}
    if "linear_attention" in (getattr(text_model.config, "layer_types", None) or []):
        # Pads are zeroed before each GDN layer; a graph always takes the mask (its shapes are symbolic).
        masks["linear_attention"] = valid if torch.compiler.is_exporting() or not bool(valid.all()) else None
    return masks


def continue_from_prefix(
    text_model: torch.nn.Module,
    prefix_embeds: torch.Tensor,
    suffix_embeds: torch.Tensor,
    suffix_mask: torch.Tensor,
    *,
    causal: bool,
    selected: torch.Tensor | None = None,
) -> torch.Tensor:
    """Last hidden states [B, S, H] of the suffix rows, each continuing the one prefix [1, P, H]; with `selected`
    ([B, K] suffix positions) only those, [B, K, H], the suffix pass's last layer computed at them (readout_rows)."""
    prefix_length = prefix_embeds.shape[1]
    rows, width = suffix_mask.shape
    device = prefix_embeds.device
    cache = DynamicCache(config=text_model.config)
    prefix_valid = torch.ones(1, prefix_length, dtype=torch.long, device=device)
    text_model(
        inputs_embeds=prefix_embeds,
        attention_mask=_masks(text_model, prefix_valid, 0, causal),
        position_ids=torch.arange(prefix_length, device=device)[None],
        cache=cache,
        use_cache=True,
    )
    cache.reorder_cache(torch.zeros(rows, dtype=torch.long, device=device))
    positions = (prefix_length + torch.arange(width, device=device))[None].expand(rows, -1)
    with contextlib.nullcontext() if selected is None else last_layer_at(text_model, selected):
        output = text_model(
            inputs_embeds=suffix_embeds,
            attention_mask=_masks(text_model, suffix_mask, prefix_length, causal),
            position_ids=positions,
            cache=cache,
            use_cache=True,
        )
    return output.last_hidden_state
