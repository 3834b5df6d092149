"""The suite can tell causal from non-causal attention (Decision 3.0 reads the prompt both ways in its
full-attention layers): the tiny fixtures have two full-attention layers, so earlier positions' outputs of
the first one reach the readout, and a causal reading of the same weights answers differently by far more
than any tolerance the tests use. (Exported graphs: tests/test_export.py and tests/test_vision.py.)"""

from __future__ import annotations

import vllm_sr_runtime
from attention_direction import FAR, TOLERANCE, full_attention_layers, max_difference


def test_tiny_decision3_fixtures_have_two_full_attention_layers(packages):
    for name in ("d3", "d3_causal", "d3_vision", "d3_vision_causal"):
        layers = full_attention_layers(packages[name])
        assert len(layers) >= 2, name  # one, and last, would hide the attention direction from the readout


def test_exact_tells_causal_from_noncausal(models):
    assert max_difference(models("d3"), models("d3_causal")) > FAR


def test_shared_context_on_a_noncausal_package_is_approximate(models, packages):
    """Sharing the prefix drops the prefix -> question direction: the loss is visible on the tiny fixture, and
    the model says so; on a causal package the profile is exact."""
    shared = vllm_sr_runtime.load(packages["d3"], profile="shared_context", shared_min_tokens=1, allow_approximate_shared_context=True)
    assert shared.family.card()["shared_context"] == "approximate"
    assert max_difference(shared, models("d3")) > FAR
    causal = vllm_sr_runtime.load(packages["d3_causal"], profile="shared_context", shared_min_tokens=1)
    assert causal.family.card()["shared_context"] == "exact"
    assert max_difference(causal, models("d3_causal")) <= TOLERANCE
