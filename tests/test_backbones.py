"""Our backbones against transformers' own loading, the non-causal mode, and batch-composition invariance."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import Qwen3Model, Qwen3_5TextConfig, Qwen3_5TextModel
from transformers.masking_utils import create_recurrent_attention_mask

from conftest import load_kwargs

torch.manual_seed(0)


def sample_ids(rows: int, length: int, vocab: int = 1600, pad_left: int = 0, pad_right: int = 0):
    ids = torch.randint(0, vocab, (rows, length))
    mask = torch.ones(rows, length, dtype=torch.long)
    if pad_left:
        mask[0, :pad_left] = 0
    if pad_right:
        mask[-1, length - pad_right :] = 0
    return ids, mask


@pytest.mark.parametrize("name,cls", [("d2_qwen3", Qwen3Model), ("d2_qwen3_5", Qwen3_5TextModel)])
def test_decision2_backbone_bit_identical_to_transformers(packages, models, name, cls):
    reference = cls.from_pretrained(str(packages[name] / "backbone"), dtype=torch.float32, attn_implementation="sdpa").eval()
    ours = models(name).engine.module.backbone
    ids, mask = sample_ids(3, 29, pad_right=5)
    with torch.inference_mode():
        expected = reference(input_ids=ids, attention_mask=mask).last_hidden_state
        actual = ours(input_ids=ids, attention_mask=mask).last_hidden_state
    assert torch.equal(actual, expected)


def test_decision2_adapter_bit_identical_to_transformers_plus_peft(packages, models):
    from peft import PeftModel
    from transformers import Qwen3_5ForConditionalGeneration

    base_dir = load_kwargs("d2_lora", packages["d2_lora"])["base_path"]
    full = Qwen3_5ForConditionalGeneration.from_pretrained(str(base_dir), dtype=torch.float32, attn_implementation="sdpa")
    text = full.model.language_model.eval()
    reference = PeftModel.from_pretrained(text, str(packages["d2_lora"] / "adapter"), is_trainable=False).eval()
    ours = models("d2_lora").engine.module.backbone
    ids, mask = sample_ids(2, 21, pad_right=3)
    with torch.inference_mode():
        expected = reference(input_ids=ids, attention_mask=mask).last_hidden_state
        actual = ours(input_ids=ids, attention_mask=mask).last_hidden_state
        base_only = Qwen3_5TextModel.from_pretrained(
            str(base_dir), config=full.config.text_config, key_mapping={r"^model\.language_model\.": ""}, dtype=torch.float32
        ).eval()(input_ids=ids, attention_mask=mask).last_hidden_state
    assert torch.equal(actual, expected)
    assert not torch.allclose(actual, base_only, atol=1e-4)  # the adapter is really applied


def reference_d3(package_dir, noncausal: bool):
    config = json.loads((package_dir / "config.json").read_text())["text_config"]
    text_config = Qwen3_5TextConfig(**{k: v for k, v in config.items() if k not in ("model_type", "architectures")})
    model = Qwen3_5TextModel.from_pretrained(
        str(package_dir), config=text_config, key_mapping={r"^language_model\.": ""}, dtype=torch.float32, attn_implementation="sdpa"
    ).eval()
    if noncausal:  # the released runtime's forward pre-hook, written independently here

        def hook(module, args, kwargs):
            mask = kwargs["attention_mask"]
            embeds = module.embed_tokens(kwargs["input_ids"])
            kwargs["attention_mask"] = {
                "full_attention": mask.bool()[:, None, None, :],
                "linear_attention": create_recurrent_attention_mask(config=module.config, inputs_embeds=embeds, attention_mask=mask),
            }
            return args, kwargs

        model.register_forward_pre_hook(hook, with_kwargs=True)
    return model


@pytest.mark.parametrize("name,noncausal", [("d3", True), ("d3_causal", False)])
def test_decision3_text_tower_bit_identical_to_transformers(packages, models, name, noncausal):
    reference = reference_d3(packages[name], noncausal)
    module = models(name).engine.module
    ids, mask = sample_ids(3, 31, pad_left=6)
    positions = torch.arange(31).expand(3, -1)
    with torch.inference_mode():
        expected = reference(input_ids=ids, attention_mask=mask, position_ids=positions).last_hidden_state
        actual = module.hidden_states(ids, mask, positions)
    assert torch.equal(actual, expected)


def mixer_outputs(module, ids, mask):
    outputs = {}
    hooks = []
    for index, layer in enumerate(module.text_model.layers):
        mixer = layer.linear_attn if layer.block_type == "linear_attention" else layer.self_attn

        def save(_, __, out, index=index, kind=layer.block_type):
            outputs[index] = (kind, (out[0] if isinstance(out, tuple) else out).clone())

        hooks.append(mixer.register_forward_hook(save))
    with torch.inference_mode():
        module.hidden_states(ids, mask, torch.arange(ids.shape[1]).expand(ids.shape[0], -1))
    for hook in hooks:
        hook.remove()
    return outputs


@pytest.mark.parametrize("name,noncausal", [("d3", True), ("d3_causal", False)])
def test_noncausal_mode_is_real(models, name, noncausal):
    module = models(name).engine.module
    ids, mask = sample_ids(1, 24)
    changed = ids.clone()
    changed[0, 20] = (changed[0, 20] + 1) % 1600
    before, after = mixer_outputs(module, ids, mask), mixer_outputs(module, changed, mask)
    kinds = {kind for kind, _ in before.values()}
    assert kinds == {"linear_attention", "full_attention"}
    first_full = min(index for index, (kind, _) in before.items() if kind == "full_attention")
    for index, (kind, out) in before.items():
        earlier_same = torch.equal(out[0, :20], after[index][1][0, :20])
        if kind == "linear_attention":
            # GDN is causal; past a bidirectional layer its inputs already hold the future, so only the
            # layers before the first full-attention layer (and every layer of a causal model) are checked.
            if index < first_full or not noncausal:
                assert earlier_same, f"GDN layer {index} saw the future"
        elif noncausal:
            assert not earlier_same, f"full-attention layer {index} is not bidirectional"
        else:
            assert earlier_same, f"causal full-attention layer {index} saw the future"


QUESTIONS = {
    "target": {"type": "choice", "instructions": "Which domain fits best?", "criteria": {"code": "Programming", "math": "Mathematics", "law": None}},
    "n1": {"type": "noul", "instructions": "Is it about sorting?"},
    "s1": {"type": "score", "instructions": "How hard is it?", "criteria": ["easy", "medium", "hard", "expert"]},
    "c2": {"type": "choice", "instructions": "A much longer question that makes this row the widest of the batch by far, on purpose.", "criteria": {f"k{i}": f"option number {i}" for i in range(12)}},
    "n2": {"type": "noul", "instructions": "Short?"},
    "s2": {"type": "score", "criteria": ["no", "yes"]},
    "c3": {"type": "choice", "instructions": "x", "criteria": {"a": None, "b": None}},
    "n3": {"type": "noul", "instructions": "Is the user asking for code and an explanation of running time?", "criteria": {"true": "yes it is", "false": "no"}},
}


@pytest.mark.parametrize("name", ["d2_qwen3", "d2_qwen3_5", "d2_lora", "d3", "d3_causal"])
def test_batch_composition_does_not_change_answers(models, name):
    model = models(name)
    state = "Write a Python function that merges two sorted lists and explain its running time."
    alone = model.ask(state, {"target": QUESTIONS["target"]})["target"]
    together = model.ask(state, QUESTIONS)
    assert list(together) == list(QUESTIONS)
    for key, p in alone["probabilities"].items():
        assert abs(together["target"]["probabilities"][key] - p) <= 1e-6
    last = model.ask(state, dict(reversed(list(QUESTIONS.items()))))["target"]
    assert np.allclose(list(last["probabilities"].values()), list(alone["probabilities"].values()), atol=1e-6, rtol=0)


def test_the_gated_delta_rule_runs_in_fp32_under_a_bf16_autocast():
    """Decision 2.0's GPU policy is a BF16 autocast; the recurrence inside must not fall back to BF16 matmuls."""
    from transformers.models.qwen3_5 import modeling_qwen3_5

    from vllm_sr_runtime.families.backbones import GATED_DELTA_RULES, keep_gated_delta_rule_fp32

    keep_gated_delta_rule_fp32()
    keep_gated_delta_rule_fp32()  # idempotent: wrapped once
    generator = torch.Generator().manual_seed(3)
    batch, length, heads, dim = 1, 96, 2, 16
    query, key, value = (torch.randn(batch, length, heads, dim, generator=generator).bfloat16() for _ in range(3))
    g = -torch.rand(batch, length, heads, generator=generator) * 0.3
    beta = torch.rand(batch, length, heads, generator=generator).bfloat16()
    for name in GATED_DELTA_RULES[:1]:  # the prefill rule (the recurrent one only runs with a cache, one token)
        rule = getattr(modeling_qwen3_5, name)
        stock = rule.__wrapped__
        assert not hasattr(stock, "vsr_outside_autocast")
        kwargs = {"initial_state": None, "output_final_state": False, "use_qk_l2norm_in_kernel": True}
        fp32, _ = stock(query, key, value, g=g, beta=beta, **kwargs)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ours, _ = rule(query, key, value, g=g, beta=beta, **kwargs)
            stock_autocast, _ = stock(query, key, value, g=g, beta=beta, **kwargs)
        assert torch.equal(ours, fp32)
        assert not torch.equal(stock_autocast, fp32)  # what it guards against: BF16 matmuls inside the rule


def test_the_python_api_prints_no_reference_kernel_notice_and_keeps_every_other_record(packages):
    """transformers printed "`chunk_gated_delta_rule` is falling back to its reference PyTorch implementation ..."
    on every first eager forward of a Gated DeltaNet model through load() (the CLI silenced transformers wholesale).
    The runtime runs that reference on purpose; only that notice is dropped, and only from transformers' kernel logger."""
    import os
    import subprocess
    import sys

    code = (
        "import vllm_sr_runtime, sys\n"
        f"model = vllm_sr_runtime.load({str(packages['d2_qwen3_5'])!r})\n"
        "print(model.ask('x', {'q': {'type': 'noul'}})['q']['type'])\n"
        "from transformers.utils import logging\n"
        "logging.get_logger('transformers.integrations.hub_kernels').warning('another notice')\n"
    )
    env = os.environ | {"TRANSFORMERS_VERBOSITY": "warning"}  # transformers' default level (the suite may set error)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "noul", done.stderr[-2000:]
    assert "falling back to its reference PyTorch implementation" not in done.stderr
    assert "another notice" in done.stderr
