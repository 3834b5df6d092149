"""`export --dtype int8 --int8-fp32 measured`: the first-order sensitivity that chooses which MatMuls stay FP32."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch

import vllm_sr_runtime
from vllm_sr_runtime.cpu_features import SAFE_WEIGHT_BITS, int8_products_saturate
from vllm_sr_runtime.export import int8_options, int8_sensitivity
from vllm_sr_runtime.errors import ArtifactError
from vllm_sr_runtime.export.exporter import build_export_module, export_package, measure_int8_sensitivity
from vllm_sr_runtime.export.int8 import INT8_FP32_PROJECTIONS, NBITS_BLOCK
from vllm_sr_runtime.families.answers import answer_distribution
from vllm_sr_runtime.parity.suite import short_suite


def _rounded_per_row(values: torch.Tensor, block: int | None = None) -> torch.Tensor:
    """Symmetric int8 rounding with one scale per row (last axis), or per row and block of `block` entries of
    it, written independently of the exporter."""
    if block is not None:
        blocks = values.reshape(*values.shape[:-1], values.shape[-1] // block, block)
        return _rounded_per_row(blocks).reshape(values.shape)
    steps = values.abs().amax(dim=-1, keepdim=True) / 127
    steps = torch.where(steps > 0, steps, torch.ones_like(steps))
    return torch.round(values / steps) * steps


def _log_margin(family, module, state, questions, indices=None):
    (batch,) = family.plan(state, questions).batches
    inputs = {name: torch.from_numpy(np.ascontiguousarray(batch.inputs[name])) for name in family.input_names}
    with torch.no_grad():
        row = module(**inputs)[0].double().numpy()
    distribution = answer_distribution(family.answer(batch.items[0], row))
    top, second = indices or [int(i) for i in np.argsort(distribution)[::-1][:2]]
    return math.log(distribution[top]) - math.log(distribution[second]), (top, second)


FRACTION = 0.05


@pytest.mark.parametrize("name,form", [("d3", "token"), ("d2_qwen3_5", "token"), ("d3", "block"), ("d2_qwen3_5", "block")])
def test_first_order_prediction_matches_the_margin_change_of_quantizing_one_linear(packages, models, name, form):
    """The measured first-order change is the derivative it claims to be: for the Linears it ranks most harmful,
    adding a small fraction (+-5%, central differences) of int8's rounding error to just that Linear's weight (per output channel) and
    input (per token) in the eager module moves the answer's log-margin by that fraction of the prediction. (At the
    full rounding error the layers are not that linear: on these tiny fixtures one layer-0 projection moves 0.6x
    its prediction; the choice only needs the ranking and the scale.) Within 20%: the finite differences agree with
    each other from 1% to 20% of the rounding error, and with autograd's derivative to 1-2% on most Linears but up
    to ~15% on a few (not chased further). Leaving out either term (weight or input rounding) misses by far more.
    The `block` form (MatMulNBits) rounds both per row and block of 32 inputs."""
    block = NBITS_BLOCK if form == "block" else None
    family = models(name).family
    module = build_export_module(family, "fp32")
    requests = [(state, {key: question}) for state, questions in int8_sensitivity.builtin_calibration().requests for key, question in questions.items()][:20]  # near-ties skipped: the tiny packages hold many
    checked = 0
    flags = [p.requires_grad for p in module.parameters()]
    for state, questions in requests:
        try:
            measured = int8_sensitivity.measure(family, module, [(state, questions)], form=form)
        except ValueError:  # a near-tie: nothing to measure on this row
            continue
        assert measured.variance.shape == (1, len(measured.names)) and [p.requires_grad for p in module.parameters()] == flags
        baseline, indices = _log_margin(family, module, state, questions)
        assert baseline == pytest.approx(measured.margins[0], rel=1e-4)
        layers = dict(module.named_modules())
        for index in np.argsort(-measured.variance[0])[:2]:
            layer = layers[measured.names[index].removesuffix(".weight")]
            original = layer.weight.detach().clone()
            moved = []
            for fraction in (FRACTION, -FRACTION):  # central differences: the second-order term cancels
                with torch.no_grad():
                    layer.weight.copy_(original + fraction * (_rounded_per_row(original, block) - original))
                hook = layer.register_forward_pre_hook(lambda _, args, f=fraction: (args[0] + f * (_rounded_per_row(args[0], block) - args[0]),))
                try:
                    moved.append(_log_margin(family, module, state, questions, indices)[0])
                finally:
                    hook.remove()
                    with torch.no_grad():
                        layer.weight.copy_(original)
            moved = (moved[0] - moved[1]) / (2 * FRACTION)
            predicted = math.sqrt(measured.variance[0, index])
            assert predicted > 0 and abs(abs(moved) - predicted) <= 0.2 * predicted, (measured.names[index], moved, predicted)
            checked += 1
        if checked >= 4:
            break
    assert checked >= 4


def test_the_builtin_calibration_is_the_suite_generators_questions_that_parity_short_does_not_ask():
    """The built-in calibration file is regenerated here: the built-in suite's short requests (limit 4,094 tokens,
    d3-lite's) that follow `--suite short`'s 80 questions, 30 questions of every type, none of them a request that
    `parity --suite short` asks (so a parity run of an int8 artifact is not judged on its own calibration)."""
    parity_short = {request.id for request in short_suite(4094, 80)}
    expected = [request for request in short_suite(4094, 110) if request.id not in parity_short]
    calibration = int8_sensitivity.builtin_calibration()
    assert [(state, questions) for state, questions in calibration.requests] == [(request.state, request.questions) for request in expected]
    assert calibration.source == {"file": None, "requests": 8, "questions": 30, "media_requests": 0}
    assert {question["type"] for _, questions in calibration.requests for question in questions.values()} == {"choice", "score", "noul"}
    assert any(isinstance(state, dict) for state, _ in calibration.requests) and any(isinstance(state, str) for state, _ in calibration.requests)


def test_choice_keeps_the_most_harmful_linears_until_every_row_meets_the_target():
    sensitivity = int8_sensitivity.Sensitivity(
        names=["a", "b", "c"], macs=np.array([1.0, 1.0, 2.0]),
        variance=np.array([[4.0, 1.0, 0.0], [0.0, 0.0, 1.0]]), margins=np.array([1.0, 0.5]),
    )  # fmt: skip
    # harm (variance / margin^2 summed over rows): a 4, b 1, c 4 (row 2's margin is half): c before b
    assert int8_sensitivity.choose(sensitivity, target=100) == []
    assert int8_sensitivity.choose(sensitivity, target=2.1) == ["a"]  # spreads sqrt(5) / 1 = 2.24 and 2 -> 1 and 2
    assert int8_sensitivity.choose(sensitivity, target=1.5) == ["a", "c"]
    assert int8_sensitivity.choose(sensitivity, target=0.1) == ["a", "c", "b"]
    summary = int8_sensitivity.summary(sensitivity, ["a", "c"], 1.5)
    assert summary["kept_share_of_quantizable_macs"] == 0.75 and summary["predicted_spread_chosen"] == 1.0
    assert summary["predicted_spread_all_int8"] == round(math.sqrt(5), 4)
    assert [(a["predicted_change_all_int8"], a["predicted_change_chosen"]) for a in summary["answers"]] == [(round(math.sqrt(5), 5), 1.0), (1.0, 0.0)]


def test_tiers_move_the_most_harmful_linears_to_the_block_form_before_fp32():
    """Block form first, most harmful first; FP32 only where every Linear in the block form still misses the target,
    and then the blocked Linears the target no longer needs go back to the per-token form."""
    sensitivity = int8_sensitivity.Sensitivity(
        names=["a", "b", "c"], macs=np.array([1.0, 1.0, 2.0]),
        variance=np.array([[4.0, 1.0, 0.0], [0.0, 0.0, 1.0]]), margins=np.array([1.0, 0.5]),
        tier_variance=np.array([[1.0, 0.25, 0.0], [0.0, 0.0, 0.25]]), tier_form="block",
    )  # fmt: skip
    assert int8_sensitivity.choose_tiers(sensitivity, target=100) == ([], [])
    # a blocked: spreads sqrt(1 + 1) = 1.41 and 2 -> c blocked too: 1.41 and 1
    assert int8_sensitivity.choose_tiers(sensitivity, target=1.5) == ([], ["a", "c"])
    # all three blocked: 1.12 and 1 -> a FP32: 0.5 and 1 -> c FP32: 0.5 and 0; b back per token would make row 1
    # sqrt(1) = 1 > 0.6: b stays blocked
    assert int8_sensitivity.choose_tiers(sensitivity, target=0.6) == (["a", "c"], ["b"])
    # all three blocked -> a FP32: 0.5 and 1 meet 1.0; b back per token: 1 and 1, still met; c back: row 2 is 2, not
    kept, blocked = int8_sensitivity.choose_tiers(sensitivity, target=1.0)
    assert (kept, blocked) == (["a"], ["c"])
    summary = int8_sensitivity.summary(sensitivity, kept, 1.0, blocked)
    assert summary["blocked"] == ["c"] and summary["blocked_share_of_quantizable_macs"] == 0.5 and summary["kept_share_of_quantizable_macs"] == 0.25
    assert summary["predicted_spread_chosen"] == 1.0 and summary["split"] == [] and summary["split_share_of_quantizable_macs"] == 0.0
    sensitivity.tier_form = "split"  # the same choice, recorded as the split tier's
    split = int8_sensitivity.summary(sensitivity, kept, 1.0, blocked)
    assert split["split"] == ["c"] and split["split_share_of_quantizable_macs"] == 0.5 and split["blocked"] == []


@pytest.mark.parametrize("name", ["d3", "d2_qwen3_5"])
def test_the_int8_embedding_tables_rounding_is_measured_as_what_no_choice_removes(models, name):
    """With the token embedding table stored as int8 rows, each calibration row's measured fixed change is the
    derivative it claims to be (a fraction of every row's rounding added to the eager table moves the log-margin by
    that fraction of it, within 20%); it adds to every choice's spread, so the choice keeps at least the Linears it
    keeps without it, and the summary records it."""
    family = models(name).family
    module = build_export_module(family, "fp32")
    (table_name,) = family.export_spec.embedding_tables
    table = dict(module.named_modules())[table_name.removesuffix(".weight")]
    requests = [(state, {key: question}) for state, questions in int8_sensitivity.builtin_calibration().requests for key, question in questions.items()]
    flags = [p.requires_grad for p in module.parameters()]
    plain = int8_sensitivity.measure(family, module, requests)
    measured = int8_sensitivity.measure(family, module, requests, embedding_tables=family.export_spec.embedding_tables)
    assert [p.requires_grad for p in module.parameters()] == flags
    assert plain.fixed_variance is None and plain.fixed_spread() is None
    assert measured.fixed_variance.shape == measured.margins.shape and (measured.fixed_variance > 0).all()
    np.testing.assert_allclose(measured.variance, plain.variance, rtol=1e-6)  # the Linears' terms are unchanged
    original = table.weight.detach().clone()
    checked = 0
    for state, questions in requests:
        try:
            one = int8_sensitivity.measure(family, module, [(state, questions)], embedding_tables=family.export_spec.embedding_tables)
        except ValueError:  # a near-tie: nothing to measure on this row
            continue
        baseline, indices = _log_margin(family, module, state, questions)
        assert baseline == pytest.approx(one.margins[0], rel=1e-4)
        moved = []
        for fraction in (FRACTION, -FRACTION):  # central differences: the second-order term cancels
            with torch.no_grad():
                table.weight.copy_(original + fraction * (_rounded_per_row(original) - original))
            try:
                moved.append(_log_margin(family, module, state, questions, indices)[0])
            finally:
                with torch.no_grad():
                    table.weight.copy_(original)
        moved = (moved[0] - moved[1]) / (2 * FRACTION)
        predicted = math.sqrt(one.fixed_variance[0])
        assert abs(abs(moved) - predicted) <= 0.2 * predicted, (moved, predicted)
        checked += 1
        if checked == 3:
            break
    assert checked == 3
    target = float(np.median(plain.spread()))
    assert set(int8_sensitivity.choose(plain, target)) <= set(int8_sensitivity.choose(measured, target))
    kept = int8_sensitivity.choose(measured, target)
    summary = int8_sensitivity.summary(measured, kept, target)
    assert summary["predicted_spread_embedding"] == round(measured.fixed_spread(), 4)
    assert summary["predicted_spread_chosen"] >= summary["predicted_spread_embedding"]
    assert int8_sensitivity.summary(plain, int8_sensitivity.choose(plain, target), target)["predicted_spread_embedding"] is None


def test_an_int8_embedding_table_that_alone_misses_the_target_is_refused(models):
    """No choice of FP32 MatMuls undoes the table's rounding: where it alone moves a calibration answer beyond the
    target, the measured export refuses the table, saying why and what to do; a target it meets passes."""
    family = models("d3").family
    tables = family.export_spec.embedding_tables
    builtin = int8_sensitivity.builtin_calibration()
    calibration = dataclasses.replace(builtin, requests=builtin.requests[:2])
    with pytest.raises(ArtifactError, match=r"--int8-embedding int8: rounding the token embedding table's rows alone .* needs its table FP32"):
        measure_int8_sensitivity(family, 1e-6, calibration, embedding_tables=tables)
    measured, _ = measure_int8_sensitivity(family, 10.0, calibration, embedding_tables=tables)
    assert 0 < measured["predicted_spread_embedding"] <= 10.0 and measured["kept"] == []


def test_the_split_tier_is_measured_with_the_rounding_its_two_halves_leave(models):
    """Measured with a `split` tier, each Linear's predicted margin change in the split form is what rounding both
    halves leaves: orders of magnitude below per token's (~1/254 of its error, so ~1/64,000 of its variance), not
    zero (the split form is not treated as FP32)."""
    family = models("d3").family
    module = build_export_module(family, "fp32")
    requests = list(int8_sensitivity.builtin_calibration().requests)[:2]
    measured = int8_sensitivity.measure(family, module, requests, form="token", tier="split")
    assert measured.tier_form == "split" and measured.tier_variance.shape == measured.variance.shape
    per_token, split = measured.variance.sum(axis=0), measured.tier_variance.sum(axis=0)
    # each change is a signed sum, so a Linear whose per-token errors happen to cancel keeps a larger share
    assert (split > 0).all() and (split < per_token / 100).all()
    assert np.median(split / per_token) < 1 / 10_000
    with pytest.raises(ValueError, match="middle tier"):
        int8_sensitivity.measure(family, module, requests, form="token", tier="tensor")


def test_measured_int8_keeps_the_chosen_matmuls_fp32_in_the_graph(packages, tmp_path):
    """The measured choice reaches the graph: each blocked weight's MatMul is a MatMulNBits, each kept weight's
    stays FP32 (one per-token int8 MatMul fewer than the fixed rule's graph per moved weight), the manifest records
    the choice and the graph's answers to the calibration questions, and the CLI flags select the rule and the target."""
    rule = export_package(packages["d3"], tmp_path / "rule", dtype="int8", progress=False, smoke="off", int8_fp32="rule")
    assert rule["int8"]["fp32_choice"] == "rule" and rule["int8"]["measured"] is None
    result = subprocess.run(
        [sys.executable, "-m", "vllm_sr_runtime.cli", "export", str(packages["d3"]), "--out", str(tmp_path / "measured"),
         "--dtype", "int8", "--int8-target", "0.2", "--int8-sensitive", "block", "--smoke", "off", "--quiet",
         "--int8-weight-bits", str(SAFE_WEIGHT_BITS)],  # served below: a width every CPU's products take; the target
        # is set for it (7-bit weights: all-int8 spread 0.47 on the tiny d3, 3 weights in the block form and 2 kept FP32 meet 0.2)
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    manifest = json.loads((tmp_path / "measured" / "artifact.json").read_text())
    measured = manifest["int8"]["measured"]
    assert manifest["int8"]["fp32_choice"] == "measured" and measured["target"] == 0.2 and not manifest["smoke"]["ran"]
    assert measured["kept"] and measured["predicted_spread_chosen"] <= 0.2 < measured["predicted_spread_all_int8"]
    assert f"{len(measured['kept'])} MatMuls" in result.stdout and "--int8-calibration FILE.jsonl" in result.stdout
    mostly_fp32 = measured["kept_share_of_quantizable_macs"] >= int8_options.MOSTLY_FP32_SHARE
    assert ("runs not far from --dtype fp32's speed" in result.stdout) == mostly_fp32
    # without the smoke parity (no second eager model), the finished graph ran on the calibration questions against
    # the eager answers the calibration computed: what the served artifact answers there
    exact = vllm_sr_runtime.load(packages["d3"])
    served = vllm_sr_runtime.load(packages["d3"], profile="max_speed", artifact=tmp_path / "measured")
    worst, changed = 0.0, 0
    for state, questions in int8_sensitivity.builtin_calibration().requests:
        left, right = exact.ask(state, questions), served.ask(state, questions)
        for key in questions:
            a, b = np.array(answer_distribution(left[key])), np.array(answer_distribution(right[key]))
            worst, changed = max(worst, float(np.abs(a - b).max())), changed + int(a.argmax() != b.argmax())
    checked = measured["calibration_parity"]
    assert checked["questions"] == 30 and checked["decisions_changed"] == changed
    assert checked["max_abs_diff"] == pytest.approx(worst, rel=1e-3, abs=1e-6)
    assert f"int8 graph on the calibration questions: {changed}/30 decisions changed" in result.stdout
    # the close-call margin that keeps every decision of those questions exact's: twice the largest move
    assert checked["close_call_margin"] == pytest.approx(2 * worst, rel=1e-3, abs=1e-6)
    assert f"serve --close-call-margin {checked['close_call_margin']:.2g}" in result.stdout
    # `verify` says the same of the artifact, and close_call_margin "artifact" serves with that margin (which answers
    # it replaces: test_close_calls)
    verified = subprocess.run([sys.executable, "-m", "vllm_sr_runtime.cli", "verify", str(tmp_path / "measured")], capture_output=True, text=True, timeout=120)
    assert verified.returncode == 0 and f"serve --close-call-margin {checked['close_call_margin']:.2g}" in verified.stdout, verified.stdout
    assert f"int8 graph on the calibration questions: {changed}/30 decisions changed" in verified.stdout
    assert f"{len(measured['kept'])} MatMuls kept FP32" in verified.stdout and f"{SAFE_WEIGHT_BITS}-bit weights, FP32 choice measured" in verified.stdout
    confirmed = vllm_sr_runtime.load(packages["d3"], profile="max_speed", artifact=tmp_path / "measured", close_call_margin="artifact")
    assert confirmed.card()["close_calls"]["margin"] == checked["close_call_margin"] and confirmed.card()["close_calls"]["margin_from"] == "artifact"
    # the harmful ones in the block form first (one MatMulNBits each), FP32 where that missed the target
    fused, nbits = "com.microsoft::MatMulIntegerToFloat", "com.microsoft::MatMulNBits"
    assert measured["blocked"] and not set(measured["blocked"]) & set(measured["kept"])
    assert f"{len(measured['blocked'])} in the block form" in result.stdout
    assert rule["op_counts"][fused] - manifest["op_counts"][fused] == len(measured["kept"]) + len(measured["blocked"])
    assert manifest["op_counts"][nbits] == len(measured["blocked"]) and nbits not in rule["op_counts"]
    assert manifest["op_counts"]["ai.onnx::MatMul"] - rule["op_counts"]["ai.onnx::MatMul"] == len(measured["kept"])
    # the kept weights are in the graph as FP32 initializers, bit for bit the package's
    graph = onnx.load(str(tmp_path / "measured" / "model.onnx"))
    fp32 = [onnx.numpy_helper.to_array(t) for t in graph.graph.initializer if t.data_type == onnx.TensorProto.FLOAT and len(t.dims) == 2]
    module = build_export_module(vllm_sr_runtime.load(packages["d3"]).family, "fp32")
    parameters = dict(module.named_parameters())
    for name in measured["kept"]:
        weight = parameters[name].detach().numpy()
        assert any(w.shape == c.shape and np.array_equal(w, c) for w in fp32 for c in (weight, weight.T)), name


def test_split_runs_the_fp32_projections_as_two_int8_products_each(packages, tmp_path):
    """`--int8-sensitive split` under the fixed rule: every tower MatMul the rule keeps FP32 becomes two
    MatMulIntegerToFloat (high x high and the cross terms) reading its activation's shared [high | low] halves; only
    the readout's MatMuls stay FP32; the smoke parity passes and the manifest names the split weights."""
    rule = export_package(packages["d3"], tmp_path / "rule", dtype="int8", progress=False, smoke="off", int8_fp32="rule")
    # its 8-bit weights are smoke-tested where this CPU's integer products take them (VNNI, AMX, ARM); where 8-bit
    # weights saturate the products, the graph is checked for its form only
    saturates = int8_products_saturate()
    split = export_package(packages["d3"], tmp_path / "split", dtype="int8", progress=False, smoke="off" if saturates else "on", int8_fp32="rule", int8_sensitive="split")
    assert split["int8"]["sensitive"] == "split" and split["int8"]["split"] == list(INT8_FP32_PROJECTIONS) and split["int8"]["kept_fp32"] == []
    assert rule["int8"]["sensitive"] == "fp32" and rule["int8"]["split"] == [] and rule["int8"]["kept_fp32"] == list(INT8_FP32_PROJECTIONS)
    fused, matmul = "com.microsoft::MatMulIntegerToFloat", "ai.onnx::MatMul"
    moved = rule["op_counts"][matmul] - split["op_counts"].get(matmul, 0)
    assert moved > 0 and split["op_counts"][fused] - rule["op_counts"][fused] == 2 * moved
    assert split["op_counts"]["ai.onnx::Concat"] - rule["op_counts"].get("ai.onnx::Concat", 0) > 0
    assert saturates or (split["smoke"]["ran"] and split["smoke_parity"]["decisions_changed"] == 0)
    family = vllm_sr_runtime.load(packages["d3"]).family
    module = build_export_module(family, "fp32")
    towers = [p.detach().numpy() for name, p in module.named_parameters() if name.startswith(family.export_spec.quantized_towers) and p.dim() == 2]

    def fp32_tower_matmuls(artifact):
        graph = onnx.load(str(artifact / "model.onnx"))
        weights = {t.name: onnx.numpy_helper.to_array(t) for t in graph.graph.initializer if t.data_type == onnx.TensorProto.FLOAT and len(t.dims) == 2}
        read = [weights[node.input[1]] for node in graph.graph.node if node.op_type == "MatMul" and node.input[1] in weights]
        return graph, sum(any(w.shape == c.shape and np.array_equal(w, c) for c in (t, t.T)) for w in read for t in towers)

    assert fp32_tower_matmuls(tmp_path / "rule")[1] > 0
    graph, left_fp32 = fp32_tower_matmuls(tmp_path / "split")
    assert left_fp32 == 0  # only the readout's MatMuls stay FP32
    produced = {output: node for node in graph.graph.node for output in node.output}
    crosses = [node for node in graph.graph.node if node.name.endswith("_split_cross")]
    assert len(crosses) == moved and all(produced[node.input[0]].op_type == "Concat" for node in crosses)
    with pytest.raises(ValueError, match="per token"):
        export_package(packages["d3"], tmp_path / "tensor", dtype="int8", progress=False, smoke="off", int8_fp32="rule", int8_activations="tensor", int8_sensitive="split")


def test_measured_names_are_the_weights_the_int8_rewrite_quantizes_for_a_lora_package(packages, models, tmp_path):
    """On a base + LoRA adapter package (merged weights in the graph) every Linear the measurement ranks is one the
    int8 rewrite would quantize: keeping all of them FP32 leaves no int8 MatMul."""
    family = models("d2_lora").family
    module = build_export_module(family, "fp32")
    names = list(int8_sensitivity.quantizable_linears(module, family.export_spec.quantized_towers))
    assert names and not any("lora_" in name or "base_layer" in name for name in names)
    from vllm_sr_runtime.export.exporter import export_family

    manifest = export_family(family, tmp_path / "all-kept", variant="contrib", dtype="int8", progress=False, smoke="off", int8_target=1e-9)
    assert manifest["int8"]["measured"]["kept"] and set(manifest["int8"]["measured"]["kept"]) <= set(names)
    assert manifest["int8"]["measured"]["predicted_spread_chosen"] == 0.0
    assert manifest["op_counts"].get("com.microsoft::MatMulIntegerToFloat", 0) == 0


def test_measured_int8_is_refused_before_loading_where_its_backward_does_not_fit(packages, tmp_path, monkeypatch):
    """Where ~16 bytes per parameter are not free the export refuses with the numbers and the way out (`rule`),
    leaves no artifact, and the fixed rule still exports in the same memory."""
    from vllm_sr_runtime.export import exporter

    monkeypatch.setattr(exporter, "available_memory_bytes", lambda: 1024)
    skeleton_only = exporter.build_export_module

    def no_eager_model(family, dtype, *, weights=True, **options):
        assert not weights, "the eager model was loaded"
        return skeleton_only(family, dtype, weights=False, **options)

    monkeypatch.setattr(exporter, "build_export_module", no_eager_model)
    with pytest.raises(ArtifactError, match=r"--int8-fp32 rule") as refused:
        export_package(packages["d3"], tmp_path / "measured", dtype="int8", progress=False, smoke="off")
    assert "GiB free" in str(refused.value) and not (tmp_path / "measured").exists()


def _write_requests(path, requests):
    path.write_text("".join(json.dumps(request) + "\n" for request in requests))
    return path


def test_a_calibration_file_is_what_the_measurement_runs_on(packages, models, tmp_path):
    """`--int8-calibration FILE.jsonl`: the measurement runs one pass per answer of the file's requests (near-ties
    aside), the manifest names the file by sha256, and a request the family cannot render, one with media for a
    package without a vision tower, or a file given without int8 measured is refused before any work."""
    from vllm_sr_runtime.export.exporter import measure_int8_sensitivity

    family = models("d3").family
    requests = [
        {"id": "a", "state": "Route this: which database fits a write-heavy workload?", "questions": {"d": {"type": "choice", "criteria": {"sql": None, "kv": None, "graph": None}}, "y": {"type": "noul", "instructions": "Is it about data?"}}},
        {"state": {"user": "Score the difficulty of a proof.", "history": []}, "questions": {"s": {"type": "score", "criteria": ["easy", "medium", "hard", "expert"]}}},
    ]  # fmt: skip
    path = _write_requests(tmp_path / "traffic.jsonl", requests)
    calibration = int8_sensitivity.calibration_requests(path)
    assert calibration.source == {"file": {"name": "traffic.jsonl", "sha256": __import__("hashlib").sha256(path.read_bytes()).hexdigest()}, "requests": 2, "questions": 3, "media_requests": 0}
    int8_sensitivity.check_calibration(family, calibration)

    measured, answers = measure_int8_sensitivity(family, 0.5, calibration)
    exact_answers = [answer_distribution(answer) for request in requests for answer in _answers_of(models("d3"), request)]
    assert len(answers) == 3 and all(np.allclose(a, b, atol=1e-5) for a, b in zip(exact_answers, answers))  # near-ties included
    near_ties = 0
    for request in requests:
        for answer in _answers_of(models("d3"), request):
            ordered = sorted(answer_distribution(answer), reverse=True)
            near_ties += ordered[0] - ordered[1] < int8_sensitivity.NEAR_TIE_MARGIN
    assert measured["rows"] == 3 - near_ties > 0 and measured["calibration"] == calibration.source
    assert measure_int8_sensitivity(family, 0.5)[0]["calibration"] == {"file": None, "requests": 8, "questions": 30, "media_requests": 0}

    bad = _write_requests(tmp_path / "bad.jsonl", [{"state": "x", "questions": {"q": {"type": "choice", "criteria": {}}}}])
    with pytest.raises(ValueError, match=r"bad.jsonl:1: questions\['q'\]: a choice needs 2..255 options"):  # as the server refuses it
        int8_sensitivity.calibration_requests(bad)
    unrendered = _write_requests(tmp_path / "levels.jsonl", [{"state": "x", "questions": {"q": {"type": "score", "criteria": ["same", "same"]}}}])
    with pytest.raises(ValueError, match="calibration request 1: q: "):  # a question this family cannot render
        int8_sensitivity.check_calibration(family, int8_sensitivity.calibration_requests(unrendered))
    media = _write_requests(tmp_path / "media.jsonl", [{"id": "pic", "state": "x", "questions": requests[0]["questions"], "images": ["data:image/png;base64,AA=="]}])
    with pytest.raises(ValueError, match="calibration request 1 with media: model .* has no vision tower"):
        int8_sensitivity.check_calibration(family, int8_sensitivity.calibration_requests(media))
    with pytest.raises(ValueError, match="--int8-calibration"):
        export_package(packages["d3"], tmp_path / "rule", dtype="int8", int8_fp32="rule", int8_calibration=path, progress=False)
    assert not (tmp_path / "rule").exists()


def _answers_of(model, request):
    return model.ask(request["state"], request["questions"]).values()
