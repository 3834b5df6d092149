"""7-bit int8 weights for x86 hosts without VNNI, where ONNX Runtime's u8 x s8 product saturates on 8-bit ones:
the detection, the export's 7-bit forms, the refusal of an 8-bit artifact on such a host, and (where QEMU can emulate
such a CPU) the saturation itself."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import onnx
import pytest

import vllm_sr_runtime
from vllm_sr_runtime.engines.onnxruntime import builder
from vllm_sr_runtime import cpu_features
from vllm_sr_runtime.cpu_features import int8_products_saturate
from vllm_sr_runtime.errors import ArtifactError
from vllm_sr_runtime.export import int8_sensitivity
from matmul_graphs import matmul_graph
from vllm_sr_runtime.export.exporter import build_export_module, export_package

HASWELL = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma bmi2"


@pytest.mark.parametrize(
    "flags,machine,saturates",
    [
        (HASWELL, "x86_64", True),  # AVX2, no VNNI: VPMADDUBSW
        (HASWELL + " avx512f avx512bw", "x86_64", True),  # Skylake-SP: AVX-512 without VNNI
        (HASWELL + " avx512f avx512bw avx512_vnni", "x86_64", False),  # Cascade Lake, Zen 4
        (HASWELL + " avx_vnni", "x86_64", False),  # Alder Lake
        (HASWELL + " avx512f avx512bw avx512_vnni amx_int8", "x86_64", False),  # Sapphire Rapids
        ("fpu sse sse2 ssse3 sse4_1 sse4_2", "x86_64", False),  # SSE4.1 only: MLAS widens to 16 bits first
        ("fp asimd asimddp", "aarch64", False),
    ],
)
def test_saturation_is_read_from_the_cpu_flags(flags, machine, saturates):
    assert int8_products_saturate(flags, machine) is saturates


def _quantized_model(weight: np.ndarray, weight_bits: int, split: bool) -> onnx.ModelProto:
    import onnx_ir as ir

    from vllm_sr_runtime.export.int8 import quantize_matmuls

    traced = matmul_graph(weight)
    assert quantize_matmuls(traced, lambda name: False, "token", split=lambda name: split, weight_bits=weight_bits) == 1
    return ir.serde.serialize_model(traced.model)


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _int8_initializers(model: onnx.ModelProto) -> list[np.ndarray]:
    return [onnx.numpy_helper.to_array(t) for t in model.graph.initializer if t.data_type == onnx.TensorProto.INT8 and t.dims and np.prod(t.dims) > 1]


def test_seven_bit_weights_stay_within_63_and_answer_as_their_numpy_reference():
    """At 7 bits every int8 weight the products read (the split form's low halves too) is within [-63, 63], which no
    pair of u8 x s8 products can overflow in 16 bits (255 x 63 x 2 < 32,767); per token the answer is the NumPy
    per-row x per-column reference of 7-bit weights, and the split form at 7 bits (both low halves in steps 126 times
    finer) still holds the product ~50x closer to FP32 than per token does."""
    from vllm_sr_runtime.export.int8 import quantize_per_channel, quantize_split, split_low_steps

    rng = np.random.default_rng(3)
    weight = rng.standard_normal((96, 40)).astype(np.float32)
    x = rng.standard_normal((7, 96)).astype(np.float32)
    exact = x.astype(np.float64) @ weight
    errors = {}
    for split in (False, True):
        eight, seven = _quantized_model(weight, 8, split), _quantized_model(weight, 7, split)
        assert max(int(np.abs(w).max()) for w in _int8_initializers(seven)) == 63
        assert max(int(np.abs(w).max()) for w in _int8_initializers(eight)) == 127
        errors[split] = np.abs(_run(seven, x) - exact).max()
    w_q, w_scale = quantize_per_channel(weight, 1, 63)
    row_scale = np.abs(x).max(-1, keepdims=True) / 127
    x_q = np.round(x / row_scale)
    np.testing.assert_allclose(_run(_quantized_model(weight, 7, False), x), row_scale * (x_q @ w_q.astype(np.float64)) * w_scale, rtol=1e-5, atol=1e-4)
    steps = split_low_steps(63)
    high, low, scale = quantize_split(weight, 1, 63)
    assert steps == 126 and np.abs(low).max() <= 63
    assert np.abs(high * scale + low * (scale / steps) - weight).max() <= (scale / steps).max() / 2 * 1.001
    assert errors[True] * 50 < errors[False]


def test_seven_bit_weights_are_measured_with_their_coarser_rounding(models):
    """The sensitivity pass rounds the weights as the graph will: at 7 bits each Linear's predicted margin change
    grows (the weight's rounding error doubles; the activation's stays), and the split tier stays far below per token."""
    family = models("d3").family
    module = build_export_module(family, "fp32")
    requests = list(int8_sensitivity.builtin_calibration().requests)[:2]
    eight = int8_sensitivity.measure(family, module, requests, form="token", tier="split")
    seven = int8_sensitivity.measure(family, module, requests, form="token", tier="split", weight_bits=7)
    ratio = seven.variance.sum(axis=0) / eight.variance.sum(axis=0)
    assert np.median(ratio) > 1.5 and np.median(ratio) < 4.5
    assert np.median(seven.tier_variance.sum(axis=0) / seven.variance.sum(axis=0)) < 1 / 1_000


def test_an_8bit_int8_artifact_is_refused_on_a_cpu_whose_products_saturate(packages, models, tmp_path, monkeypatch):
    """Exported at 7 bits (smoke-tested, manifest says so) an int8 artifact serves on any CPU; an 8-bit one is refused
    where the products saturate, at load (serve, parity, bench) and before the export's smoke parity, naming the flag."""
    seven = export_package(packages["d3"], tmp_path / "seven", dtype="int8", progress=False, smoke="on", int8_fp32="rule", int8_weight_bits=7)
    assert seven["int8"]["weight_bits"] == 7 and seven["smoke"]["ran"] and seven["smoke_parity"]["decisions_changed"] == 0
    graph = onnx.load(str(tmp_path / "seven" / "model.onnx"))
    assert max(int(np.abs(w).max()) for w in _int8_initializers(graph)) == 63
    eight = tmp_path / "eight"
    shutil.copytree(tmp_path / "seven", eight)
    manifest_path = eight / "artifact.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["int8"].pop("weight_bits")  # an artifact from before the field holds 8-bit weights
    manifest_path.write_text(json.dumps(manifest))
    monkeypatch.setattr(cpu_features, "int8_products_saturate", lambda: True)
    question = {"q": {"type": "noul", "instructions": "Is this a refund?"}}
    answer = vllm_sr_runtime.load(packages["d3"], profile="max_speed", artifact=tmp_path / "seven").ask("The user asks for a refund.", question)["q"]["noul"]
    assert abs(answer - models("d3").ask("The user asks for a refund.", question)["q"]["noul"]) < 0.1
    with pytest.raises(ArtifactError, match="--int8-weight-bits 7"):
        vllm_sr_runtime.load(packages["d3"], profile="max_speed", artifact=eight)
    monkeypatch.setattr(cpu_features, "int8_products_saturate", lambda: False)
    vllm_sr_runtime.load(packages["d3"], profile="max_speed", artifact=eight)
    builder.refuse_saturating_int8({"dtype": "int8", "op_counts": {"com.microsoft::MatMulNBits": 3}}, eight, saturates=True)  # no u8 x s8 product
    builder.refuse_saturating_int8({"dtype": "fp32", "op_counts": {"ai.onnx::MatMul": 3}}, eight, saturates=True)
    monkeypatch.setattr(cpu_features, "int8_products_saturate", lambda: True)
    with pytest.raises(ArtifactError, match="--int8-weight-bits 7"):
        export_package(packages["d3"], tmp_path / "refused", dtype="int8", progress=False, smoke="on", int8_fp32="rule")
    assert not (tmp_path / "refused").exists()
    with pytest.raises(ValueError, match="block form"):
        export_package(packages["d3"], tmp_path / "block", dtype="int8", progress=False, smoke="off", int8_activations="block", int8_weight_bits=7)


QEMU = shutil.which("qemu-x86_64")
RUN_UNDER_QEMU = """
import json, sys, numpy as np, onnxruntime as ort
x = np.load(sys.argv[2])
print(json.dumps(ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"]).run(None, {"x": x})[0].tolist()))
"""


@pytest.mark.skipif(QEMU is None or not sys.platform.startswith("linux"), reason="needs qemu-x86_64 (Debian: qemu-user) to emulate an AVX2 CPU without VNNI")
def test_under_an_emulated_avx2_cpu_8bit_weights_saturate_and_7bit_ones_do_not(tmp_path):
    """What the refusal guards against, on QEMU's Haswell model (AVX2, no VNNI): ORT's per-token int8 product with
    8-bit weights comes out wrong there (large activations next to large weights), with 7-bit weights it is the same
    as on this CPU."""
    rng = np.random.default_rng(5)
    weight = rng.standard_normal((128, 32)).astype(np.float32)
    x = np.abs(rng.standard_normal((8, 128))).astype(np.float32) + 1.0  # every activation large and positive
    np.save(tmp_path / "x.npy", x)
    (tmp_path / "run.py").write_text(RUN_UNDER_QEMU)
    got = {}
    for bits in (8, 7):
        model = _quantized_model(weight, bits, split=False)
        onnx.save(model, tmp_path / f"w{bits}.onnx")
        emulated = subprocess.run(
            [QEMU, "-cpu", "Haswell", sys.executable, str(tmp_path / "run.py"), str(tmp_path / f"w{bits}.onnx"), str(tmp_path / "x.npy")],
            capture_output=True, text=True, timeout=300, check=True,
        )  # fmt: skip
        got[bits] = (np.array(json.loads(emulated.stdout.strip().splitlines()[-1])), _run(model, x))
    scale = np.abs(x @ weight).max()
    assert np.abs(got[8][0] - got[8][1]).max() > 0.01 * scale
    np.testing.assert_allclose(got[7][0], got[7][1], rtol=0, atol=1e-6 * scale)
