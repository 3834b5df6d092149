"""What export and verify say of an artifact's numerics (runtime/artifact_summary.py), from its manifest alone."""

from __future__ import annotations

import vllm_sr_runtime.artifact_summary as summary
from vllm_sr_runtime.cli import artifact_lines


def manifest(weight_bits: int, **int8) -> dict:
    return {
        "dtype": "int8", "smoke_parity": None, "smoke": {"reason": "--smoke off"},
        "int8": {"activations": "per token", "weights": "per output channel", "weight_bits": weight_bits, "fp32_choice": "rule", "measured": None, **int8},
    }  # fmt: skip


def test_an_eight_bit_artifact_is_said_to_be_refused_where_the_cpus_products_saturate(monkeypatch):
    monkeypatch.setattr(summary, "widest_int8_weight_bits", lambda: 7)  # an x86-64 host without VNNI
    lines = artifact_lines(manifest(8, kept_fp32=["linear_attn.out_proj.weight"]))
    assert lines[0] == "no smoke parity (--smoke off): judge it with `vllm-sr-runtime parity`"
    assert lines[1] == "int8: per token activations, per output channel 8-bit weights, FP32 choice rule; FP32: linear_attn.out_proj.weight; embedding table fp32"
    assert lines[-1] == summary.SATURATES_HERE
    assert summary.SATURATES_HERE not in artifact_lines(manifest(7))  # 7-bit weights fit the saturating sums
    monkeypatch.setattr(summary, "widest_int8_weight_bits", lambda: 8)  # VNNI, AMX or ARM
    assert summary.SATURATES_HERE not in artifact_lines(manifest(8))
    assert "split form: self_attn.o_proj.weight" in artifact_lines(manifest(8, split=["self_attn.o_proj.weight"]))[1]


def test_a_claimed_dtype_is_checked_against_the_graphs_weights():
    from collections import Counter

    assert summary.claim_mismatch("fp16", Counter(FLOAT16=900, FLOAT=100)) is None  # norms and the head stay FP32
    assert summary.claim_mismatch("fp16", Counter(FLOAT16=100, FLOAT=900)) == "it claims fp16 and only 10% of its weight bytes are float16"
    assert summary.claim_mismatch("int8", Counter(FLOAT=700, INT8=300)) is None  # the embedding table and FP32 MatMuls
    assert summary.claim_mismatch("int8", Counter(FLOAT=1000)) == "it claims int8 and holds no integer weights"


def test_verify_reports_the_weights_by_type_and_refuses_an_artifact_that_is_not_what_it_claims(default_artifact, tmp_path, capsys):
    """An fp32 artifact whose artifact.json was edited to say fp16 (the manifest lists the other files' hashes, not
    its own) holds FP32 weights: verify says so and fails."""
    import json
    import shutil

    from vllm_sr_runtime.cli import main

    artifact = tmp_path / "artifact"
    shutil.copytree(default_artifact("d3"), artifact)
    assert main(["verify", str(artifact)]) == 0
    said = capsys.readouterr().out
    data = (artifact / "model.onnx.data").stat().st_size
    line = next(line for line in said.splitlines() if line.startswith("weights of the main graph: float "))
    assert 0.98 * data <= int(line.split("float ")[1].split(" bytes")[0].replace(",", "")) <= data  # the weights file, read from the graph alone
    manifest = json.loads((artifact / "artifact.json").read_text())
    (artifact / "artifact.json").write_text(json.dumps({**manifest, "dtype": "fp16"}))
    assert main(["verify", str(artifact)]) == 1
    assert "is not what it claims: it claims fp16 and only 0% of its weight bytes are float16" in capsys.readouterr().err
    (artifact / "artifact.json").write_text(json.dumps({**manifest, "dtype": "int8", "int8": {"activations": "per token", "measured": None}}))
    assert main(["verify", str(artifact)]) == 1  # the graph's int64 shape constants are no integer weights
    assert "it claims int8 and holds no integer weights" in capsys.readouterr().err


def test_only_matrices_count_toward_the_claim(tmp_path):
    """An int8 graph's per-column zero points (1-D int8) are not int8 weights: a graph of FP32 matrices with them
    claims int8 falsely."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    weight = numpy_helper.from_array(np.ones((8, 4), dtype=np.float32), "weight")
    zero = numpy_helper.from_array(np.zeros(4, dtype=np.int8), "zero_point")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "weight"], ["y"])], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8])], [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])],
        initializer=[weight, zero],
    )  # fmt: skip
    onnx.save(helper.make_model(graph), tmp_path / "model.onnx")
    sizes = summary.weight_bytes_by_type(tmp_path / "model.onnx")
    assert sizes.all == {"FLOAT": 128, "INT8": 4}
    matrices = sizes.matrices
    assert matrices == {"FLOAT": 128} and summary.claim_mismatch("int8", matrices) == "it claims int8 and holds no integer weights"


def test_the_measured_line_says_what_the_int8_embedding_table_alone_moves():
    """An artifact measured with its table as int8 rows (int8.measured.predicted_spread_embedding) says that share;
    one measured before the field existed, or with the table FP32, says nothing of it."""
    measured = {
        "rows": 30, "calibration": {"file": None}, "kept": ["a.weight"], "kept_share_of_quantizable_macs": 0.12, "blocked": [],
        "blocked_share_of_quantizable_macs": 0.0, "split": [], "split_share_of_quantizable_macs": 0.0, "predicted_spread_all_int8": 0.485,
        "predicted_spread_chosen": 0.223, "target": 0.25, "calibration_parity": None,
    }  # fmt: skip
    (plain,) = summary.measured_int8_lines(measured)
    assert plain.endswith("predicted margin spread 0.485 -> 0.223 of the margin (target 0.25)")
    assert summary.measured_int8_lines({**measured, "predicted_spread_embedding": None}) == [plain]
    (line,) = summary.measured_int8_lines({**measured, "predicted_spread_embedding": 0.104})
    assert line == plain + "; the int8 embedding table alone: 0.104 (included in both)"


def test_the_calibration_is_named_with_its_media_requests():
    """A measured choice says where it was calibrated and how many of those requests read images/videos; the hint to
    calibrate on one's own traffic names media only for a package whose built-in calibration had some."""
    text = {"file": None, "requests": 8, "questions": 30, "media_requests": 0}
    media = {"file": None, "requests": 10, "questions": 37, "media_requests": 2}
    file = {"file": {"name": "traffic.jsonl", "sha256": "0" * 64}, "requests": 3, "questions": 9, "media_requests": 1}
    assert summary.calibration_source(text) == " (built-in requests)"
    assert summary.calibration_source({"file": None}) == " (built-in requests)"  # an artifact measured before media rows
    assert summary.calibration_source(media) == " (built-in requests; 2 of 10 requests with images/videos)"
    assert summary.calibration_source(file) == " from traffic.jsonl; 1 of 3 requests with images/videos"
    assert "sample media" not in summary.builtin_calibration_hint(text) and "data URLs" not in summary.builtin_calibration_hint(text)
    assert "; 2 of those requests asked again with the family's random-pixel sample media" in summary.builtin_calibration_hint(media)
    assert summary.builtin_calibration_hint(file) is None
