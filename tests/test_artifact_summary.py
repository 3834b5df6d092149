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
    assert lines[1] == "int8: per token activations, per output channel 8-bit weights, FP32 choice rule; FP32: linear_attn.out_proj.weight"
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
