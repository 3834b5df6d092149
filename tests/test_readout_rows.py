"""The last decoder layer at the readout's rows only (families/readout_rows.py): the rows it returns are the full
model's rows at those positions, only those rows go through the layer's per-row work, and the traced form's
answers are the full model's."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config, Qwen3Model, Qwen3_5TextConfig, Qwen3_5TextModel

from vllm_sr_runtime.export.exporter import build_export_module
from vllm_sr_runtime.export.smoke import SMOKE_QUESTIONS, SMOKE_STATE
from vllm_sr_runtime.families.readout_rows import last_layer_at, prunable

from conftest import load_kwargs

torch.manual_seed(0)


def mlp_rows(text_model: torch.nn.Module):
    """Records the row count of every input the last layer's MLP sees."""
    seen: list[int] = []
    handle = text_model.layers[-1].mlp.register_forward_hook(lambda _, args, __: seen.append(args[0].shape[1]))
    return seen, handle


def both(text_model, positions, **inputs):
    """(full last hidden state gathered at positions, the patched model's output, rows its last MLP saw)."""
    with torch.inference_mode():
        full = text_model(**inputs).last_hidden_state
        seen, handle = mlp_rows(text_model)
        with last_layer_at(text_model, positions):
            rows = text_model(**inputs).last_hidden_state
        handle.remove()
    expected = torch.stack([full[b, positions[b]] for b in range(full.shape[0])])
    return expected, rows, seen


def padded(rows: int, length: int, pad_right: int, vocab: int = 1600):
    ids = torch.randint(0, vocab, (rows, length))
    mask = torch.ones(rows, length, dtype=torch.long)
    if pad_right:
        mask[-1, length - pad_right :] = 0
    return ids, mask


# Unordered, repeated, first and last positions; the last row's positions stay before its padding.
POSITIONS = torch.tensor([[28, 0, 7, 7, 15], [3, 28, 1, 20, 11], [22, 5, 0, 23, 9]])


@pytest.mark.parametrize("name", ["d2_qwen3", "d2_qwen3_5"])
@pytest.mark.parametrize("pad_right", [0, 5])
def test_causal_backbone_rows_equal_the_full_models(models, name, pad_right):
    """Causal backbones (Qwen3 and Qwen3.5); without padding transformers passes no mask (the rows build their
    causal one), with padding a [B, 1, T, T] mask whose rows are selected."""
    backbone = models(name).engine.module.backbone
    ids, mask = padded(3, 29, pad_right)
    expected, rows, seen = both(backbone, POSITIONS, input_ids=ids, attention_mask=mask)
    assert rows.shape == (3, 5, backbone.config.hidden_size)
    torch.testing.assert_close(rows, expected, rtol=0, atol=2e-5)
    assert seen == [5]  # the MLP ran on the selected rows only


@pytest.mark.parametrize("expand_over_queries", [False, True])
def test_noncausal_d3_rows_equal_the_full_models(models, expand_over_queries):
    """Decision 3.0's bidirectional masks: one row broadcast over the queries, or one row per query (the export's)."""
    module = models("d3").engine.module
    ids, mask = padded(3, 29, 0)
    mask[0, :6] = 0  # left padding, as d3 pads
    positions = torch.tensor([[28], [28], [28]])
    embeds = module.text_model.embed_tokens(ids)
    module.full_mask_over_queries = expand_over_queries
    try:
        masks = module.attention_masks(embeds, mask)
    finally:
        module.full_mask_over_queries = False
    expected, rows, seen = both(module.text_model, positions, inputs_embeds=embeds, attention_mask=masks, position_ids=torch.arange(29).expand(3, -1), use_cache=False)
    torch.testing.assert_close(rows, expected, rtol=0, atol=2e-5)
    assert seen == [1]


def test_gated_deltanet_last_layer_selects_its_output():
    """A hybrid whose last layer is Gated DeltaNet: the recurrence runs over every row, the MLP on the selected ones."""
    config = Qwen3_5TextConfig(
        vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        head_dim=16, linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
        layer_types=["full_attention", "linear_attention"],
    )  # fmt: skip
    config._attn_implementation = "sdpa"
    model = Qwen3_5TextModel(config).eval()
    assert prunable(model)
    ids, mask = padded(2, 13, 0, vocab=300)
    positions = torch.tensor([[12, 4], [0, 9]])
    expected, rows, seen = both(model, positions, input_ids=ids, attention_mask=mask)
    torch.testing.assert_close(rows, expected, rtol=0, atol=2e-5)
    assert seen == [2]


def test_sliding_window_last_layer_is_not_pruned():
    config = Qwen3Config(
        vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        head_dim=16, use_sliding_window=True, sliding_window=4, max_window_layers=0, layer_types=["sliding_attention", "sliding_attention"],
    )  # fmt: skip
    assert not prunable(Qwen3Model(config))
    config.layer_types = ["sliding_attention", "full_attention"]
    assert prunable(Qwen3Model(config))


@pytest.mark.parametrize("name", ["d2_qwen3", "d2_qwen3_5", "d3", "d3_causal"])
def test_export_module_answers_like_the_full_module(packages, name):
    """The module graphs are traced from: its last layer runs on the readout's rows (each option's endpoint and the
    query for Decision 2.0, the last token for Decision 3.0) and answers like the full module on padded rows."""
    import vllm_sr_runtime

    family = vllm_sr_runtime.load(packages[name], **load_kwargs(name, packages[name])).family
    full = build_export_module(family, "fp32")
    pruned = build_export_module(family, "fp32", readout_rows_only=True)
    assert not full.readout_rows_only and pruned.readout_rows_only
    inputs = family.plan(SMOKE_STATE, SMOKE_QUESTIONS).batches[0].inputs
    args = [torch.as_tensor(inputs[key]) for key in family.input_names]
    text_model = pruned.backbone if name.startswith("d2") else pruned.text_model
    with torch.inference_mode():
        expected = full(*args)
        seen, handle = mlp_rows(text_model)
        actual = pruned(*args)
        handle.remove()
    rows = inputs["option_index"].shape[1] + 1 if name.startswith("d2") else 1
    assert seen == [rows] and rows < inputs["input_ids"].shape[1]
    finite = torch.isfinite(expected)
    assert torch.equal(finite, torch.isfinite(actual))
    torch.testing.assert_close(actual[finite], expected[finite], rtol=0, atol=1e-5)


def test_rows_continue_a_cached_prefix(models):
    """A suffix pass after a cached prefix (what shared_context does): the rows attend to the prefix's keys too."""
    backbone = models("d2_qwen3").engine.module.backbone
    ids, _ = padded(1, 12, 0)
    positions = torch.tensor([[3, 0, 2]])
    with torch.inference_mode():
        full = backbone(input_ids=ids).last_hidden_state[:, 8:]
        cache = backbone(input_ids=ids[:, :8], use_cache=True).past_key_values
        with last_layer_at(backbone, positions):
            rows = backbone(input_ids=ids[:, 8:], cache=cache, use_cache=True).last_hidden_state
    torch.testing.assert_close(rows, full[:, positions[0]], rtol=0, atol=2e-5)


@pytest.mark.parametrize("name", ["d2_qwen3", "d2_qwen3_5", "d3", "d3_causal"])
def test_shared_context_module_answers_like_the_full_module(packages, name):
    """forward_shared (the shared_context graph's source): the suffix pass's last layer at the readout's rows,
    attending to the cached prefix's keys too, answers like the full module."""
    import vllm_sr_runtime

    family = vllm_sr_runtime.load(packages[name], **load_kwargs(name, packages[name])).family
    full = build_export_module(family, "fp32")
    pruned = build_export_module(family, "fp32", readout_rows_only=True)
    plan = family.share(family.plan(SMOKE_STATE, SMOKE_QUESTIONS), 0)
    assert plan.batches[0].shared
    inputs = plan.batches[0].inputs
    args = [torch.as_tensor(inputs[key]) for key in family.shared_input_names]
    text_model = pruned.backbone if name.startswith("d2") else pruned.text_model
    with torch.inference_mode():
        expected = full.forward_shared(*args)
        seen, handle = mlp_rows(text_model)
        actual = pruned.forward_shared(*args)
        handle.remove()
    rows = inputs["option_index"].shape[1] + 1 if name.startswith("d2") else 1
    assert seen == [inputs["prefix_ids"].shape[1], rows]  # the prefix pass runs whole, the suffix pass at the rows
    finite = torch.isfinite(expected)
    assert torch.equal(finite, torch.isfinite(actual))
    torch.testing.assert_close(actual[finite], expected[finite], rtol=0, atol=1e-5)
