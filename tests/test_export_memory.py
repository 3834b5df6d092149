"""Export memory is bounded by the largest tensor, not the model: a deeper model of the same width costs the
trace-and-write phases almost nothing more (each export in a child process of its own; no timing)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from vllm_sr_runtime.synthetic.writer import write_synthetic_package

SHALLOW, DEEP = 2, 8


def layer_parameters(hidden: int, ffn: int, heads: int, kv_heads: int, head_dim: int) -> int:
    attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2 + 2 * head_dim
    return attention + 3 * hidden * ffn + 2 * hidden


def trace_and_write_peak(package, out, dtype: str) -> int:
    result = subprocess.run(
        # int8's measured FP32 choice loads the eager model (its own phase, bounded like the smoke parity's): the fixed rule here
        [sys.executable, "-m", "vllm_sr_runtime.cli", "export", str(package), "--out", str(out), "--dtype", dtype, "--smoke", "off", "--quiet"]
        + (["--int8-fp32", "rule"] if dtype == "int8" else []),
        capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    phases = {p["name"]: p for p in json.loads((out / "artifact.json").read_text())["export"]["phases"]}
    assert phases["trace"]["peak_rss_scope"] == "phase"
    return max(phases[name]["peak_rss_bytes"] for name in ("load", "trace", "write"))


@pytest.fixture(scope="module")
def kai_packages(tmp_path_factory) -> dict:
    """Kai's width (hidden 1024, FFN 3072, 16 heads, head dim 128) at two depths: each extra layer holds ~58 MB of
    fp32 weights. Read only, by both dtypes' tests (a Kai-width package takes 15-20 s to write)."""
    root = tmp_path_factory.mktemp("kai")
    return {layers: write_synthetic_package("decision2", root / f"kai-{layers}", backbone="qwen3", size="kai", layers=layers)[0] for layers in (SHALLOW, DEEP)}


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_trace_and_write_memory_does_not_follow_depth(kai_packages, tmp_path, dtype):
    extra = (DEEP - SHALLOW) * layer_parameters(1024, 3072, 16, 8, 128) * 4
    assert extra > 300 * 2**20
    peaks = {layers: trace_and_write_peak(kai_packages[layers], tmp_path / f"artifact-{layers}", dtype) for layers in (SHALLOW, DEEP)}
    grown = peaks[DEEP] - peaks[SHALLOW]
    assert grown < extra / 2, f"{dtype}: trace+write peak grew by {grown / 2**20:.0f} MiB for {extra / 2**20:.0f} MiB of extra weights"
