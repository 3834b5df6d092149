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
