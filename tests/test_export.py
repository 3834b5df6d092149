"""Export: graphs with the fused GDN ops (or standard ops only), dynamic shapes, parity with exact, atomic writes."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

import vllm_sr_runtime
from conftest import load_kwargs
from matmul_graphs import matmul_graph
from vllm_sr_runtime.cpu_features import int8_products_saturate, widest_int8_weight_bits
from vllm_sr_runtime.artifacts import read_artifact
from vllm_sr_runtime.export.exporter import export_package
from vllm_sr_runtime.errors import ArtifactError

CASES = [("d2_qwen3", "contrib"), ("d2_qwen3_5", "contrib"), ("d2_lora", "contrib"), ("d3", "contrib"), ("d2_qwen3_5", "portable"), ("d3", "portable")]
GDN = {"d2_qwen3_5", "d2_lora", "d3"}
WITH_SHARED = {("d2_qwen3_5", "contrib"), ("d3", "contrib")}  # the default exports (with the shared_context graph)


@pytest.fixture(scope="module")
def artifacts(packages, default_artifact, tmp_path_factory):
    root = tmp_path_factory.mktemp("artifacts")
    made = {}
    for name, variant in CASES:
        if (name, variant) in WITH_SHARED:  # the run's other test files read these too: traced once
            made[(name, variant)] = default_artifact(name)
            continue
        out = root / f"{name}-{variant}"
        export_package(packages[name], out, variant=variant, progress=False, **load_kwargs(name, packages[name]))
        made[(name, variant)] = out
    return made


def all_ops(model: onnx.ModelProto) -> list[tuple[str, str]]:
    found = []

    def visit(graph):
        for node in graph.node:
            found.append((node.domain or "ai.onnx", node.op_type))
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:
                    visit(attribute.g)

    visit(model.graph)
    return found


@pytest.mark.parametrize("name,variant", CASES)
def test_graph_ops(artifacts, name, variant):
    model = onnx.load(str(artifacts[(name, variant)] / "model.onnx"), load_external_data=False)
    ops = all_ops(model)
    manifest = json.loads((artifacts[(name, variant)] / "artifact.json").read_text())
    if variant == "contrib" and name in GDN:
        assert ("com.microsoft", "LinearAttention") in ops
        assert ("ai.onnx", "Conv") in ops  # the causal conv: standard depthwise Conv (faster than CausalConvWithState on CPU)
        assert not any(op in ("Loop", "Scan") for _, op in ops), "recurrence must not be unrolled into loops"
        assert "com.microsoft" in manifest["op_domains"]
    if variant == "portable":
        assert not any(domain == "com.microsoft" for domain, _ in ops)
        assert manifest["op_domains"] == ["ai.onnx"]
    assert manifest["variant"] == variant and manifest["dtype"] == "fp32"
    assert manifest["last_layer"] == "readout_rows"  # both variants compute the last layer at the readout's rows
    assert manifest["op_counts"] == dict(sorted(manifest["op_counts"].items()))


def _nchwc_layout_available(tmp_path) -> bool:
    """Whether this CPU's ONNX Runtime rewrites a depthwise Conv into its blocked NCHWc layout (x86 with AVX2 or later)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.ones((16, 1, 1, 4), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], group=16, kernel_shape=[1, 4], pads=[0, 3, 0, 0])], "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 1, 8])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [weight],
    )  # fmt: skip
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "probe.onnx")
    ort.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString(), options, providers=["CPUExecutionProvider"])
    return any(node.op_type == "ReorderInput" for node in onnx.load(str(tmp_path / "probe.onnx")).graph.node)


@pytest.mark.parametrize("name", sorted(GDN))
def test_the_causal_conv_meets_the_projection_and_the_recurrence_without_layout_passes(artifacts, name, tmp_path):
    """The Gated DeltaNet conv reads the projection channels-last and hands the recurrence channels-last: in the
    exported graph it is a 2-D depthwise Conv between two 4-D transposes, which ONNX Runtime's CPU layout pass turns
    into its channels-last reorders, so the optimized graph has no Transpose around any conv."""
    import onnxruntime as ort

    from vllm_sr_runtime.engines.onnxruntime import session_options

    path = artifacts[(name, "contrib")] / "model.onnx"
    model = onnx.load(str(path), load_external_data=False)
    producers = {output: node for node in model.graph.node for output in node.output}
    convs = [node for node in model.graph.node if node.op_type == "Conv"]
    layers = sum(1 for node in model.graph.node if node.op_type == "LinearAttention")  # one conv per Gated DeltaNet layer
    assert len(convs) == layers > 0
    for conv in convs:
        kernel = next(a.ints for a in conv.attribute if a.name == "kernel_shape")
        feeding = producers[conv.input[0]]
        assert len(kernel) == 2 and kernel[0] == 1 and feeding.op_type == "Transpose" and list(feeding.attribute[0].ints) == [0, 3, 1, 2]
    if not _nchwc_layout_available(tmp_path):
        pytest.skip("this CPU's ONNX Runtime has no NCHWc layout pass")
    options = session_options("cpu")
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
    optimized = onnx.load(str(tmp_path / "optimized.onnx"), load_external_data=False)
    by_output = {output: node for node in optimized.graph.node for output in node.output}
    readers: dict[str, list] = {}
    for node in optimized.graph.node:
        for name_in in node.input:
            readers.setdefault(name_in, []).append(node)
    reorders_in = [node for node in optimized.graph.node if node.op_type == "ReorderInput"]
    reorders_out = [node for node in optimized.graph.node if node.op_type == "ReorderOutput"]
    assert len(reorders_in) >= layers and len(reorders_out) >= layers
    assert not any(by_output.get(node.input[0]) is not None and by_output[node.input[0]].op_type == "Transpose" for node in reorders_in)
    assert not any(reader.op_type == "Transpose" for node in reorders_out for reader in readers.get(node.output[0], []))


@pytest.mark.parametrize("name", ["d2_qwen3_5", "d3"])
def test_portable_graphs_have_static_lengths_and_only_migraphx_ops(artifacts, name):
    from vllm_sr_runtime.export.provider_checks import migraphx_refusals

    root = artifacts[(name, "portable")]
    buckets = read_artifact(root)["buckets"]
    lengths = [graph["length"] for graph in buckets["graphs"]]
    assert lengths[0] == 128 and lengths == sorted(lengths) and all(length % 64 == 0 for length in lengths)
    assert buckets["graphs"][-1]["model_file"] == "model.onnx"
    assert buckets["padding"]["side"] == ("left" if name == "d3" else "right")
    for graph in buckets["graphs"]:
        model = onnx.load(str(root / graph["model_file"]), load_external_data=False)
        assert not any(op in ("Scan", "Loop", "Attention", "RMSNormalization") for _, op in all_ops(model))
        sequence = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim][1]
        assert sequence == graph["length"]
        assert migraphx_refusals(model) == [], graph
    contrib = onnx.load(str(artifacts[(name, "contrib")] / "model.onnx"), load_external_data=False)
    refused = migraphx_refusals(contrib)
    assert any("LinearAttention" in line and "domain com.microsoft" in line for line in refused)
    assert any(line.startswith("RMSNormalization") for line in refused)


def random_rows(family, batch: int, length: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    ids = rng.integers(0, 1600, size=(batch, length), dtype=np.int64)
    mask = np.ones((batch, length), dtype=np.int64)
    lengths = [length] + [int(rng.integers(1, length + 1)) for _ in range(batch - 1)]
    rows = {"input_ids": ids, "attention_mask": mask, "position_ids": np.broadcast_to(np.arange(length), (batch, length)).copy()}
    if family.name == "decision3":
        for row, used in enumerate(lengths):  # left padding
            mask[row, : length - used] = 0
            ids[row, : length - used] = family.pad_id
        options = np.zeros((batch, 255), dtype=bool)
        for row in range(batch):
            options[row, : int(rng.integers(2, 41))] = True
        rows["option_mask"] = options
        return rows
    for row, used in enumerate(lengths):  # right padding
        mask[row, used:] = 0
        ids[row, used:] = family.pad_id
    width = 6
    index = np.zeros((batch, width), dtype=np.int64)
    opt_mask = np.zeros((batch, width), dtype=bool)
    for row, used in enumerate(lengths):
        count = min(width, used, int(rng.integers(2, width + 1)))
        index[row, :count] = np.sort(rng.choice(used, size=count, replace=False))
        opt_mask[row, :count] = True
    rows.update(option_index=index, option_mask=opt_mask, query_index=np.array([used - 1 for used in lengths], dtype=np.int64))
    return rows


def probabilities(family, output: np.ndarray, rows) -> np.ndarray:
    if family.name == "decision3":
        return output
    return torch.softmax(torch.from_numpy(output.astype(np.float64)), dim=-1).numpy()


@pytest.mark.parametrize("name,variant", CASES)
def test_one_artifact_serves_every_length_and_batch(artifacts, models, name, variant):
    exact = models(name)
    fast = vllm_sr_runtime.load(exact.family.ref.path, profile="max_speed", artifact=artifacts[(name, variant)], **load_kwargs(name, exact.family.ref.path))
    rng = np.random.default_rng(0)
    for batch in (1, 8):
        for length in (1, 7, 64, 300):
            rows = random_rows(exact.family, batch, length, rng)
            reference = probabilities(exact.family, exact.engine.forward(rows), rows)
            graph = probabilities(exact.family, fast.engine.forward(rows), rows)
            valid = rows["option_mask"]
            diff = np.abs(np.where(valid, reference - graph, 0.0))
            assert diff.max() <= 1e-4, (batch, length, diff.max())
            assert np.array_equal(np.argmax(np.where(valid, reference, -1), -1), np.argmax(np.where(valid, graph, -1), -1))


@pytest.mark.parametrize("name", ["d2_qwen3", "d2_lora", "d3"])
def test_max_speed_answers_like_exact(artifacts, models, name):
    exact = models(name)
    fast = vllm_sr_runtime.load(exact.family.ref.path, profile="max_speed", artifact=artifacts[(name, "contrib")], **load_kwargs(name, exact.family.ref.path))
    assert fast.card()["engine"] == "onnxruntime" and fast.card()["profile"] == "max_speed"
    questions = {
        "domain": {"type": "choice", "instructions": "Domain?", "criteria": {f"k{i}": f"option {i}" for i in range(40)}},
        "reasoning": {"type": "noul", "instructions": "Reasoning?"},
        "difficulty": {"type": "score", "criteria": ["easy", "medium", "hard"]},
        "bad": {"type": "noul", "criteria": {"x": 1}},
    }
    left, right = exact.ask("Merge two sorted lists.", questions), fast.ask("Merge two sorted lists.", questions)
    assert right["bad"] == left["bad"]
    for key in ("domain", "difficulty"):
        assert right[key].get("choice") == left[key].get("choice")
        for option, p in left[key]["probabilities"].items():
            assert abs(right[key]["probabilities"][option] - p) <= 1e-4
    assert abs(right["reasoning"]["noul"] - left["reasoning"]["noul"]) <= 1e-4


def test_same_package_exports_to_the_same_hashes(artifacts, packages, tmp_path):
    again = tmp_path / "again"
    export_package(packages["d3"], again, progress=False, smoke="off")  # the main graph only: its trace is the costly part
    first = json.loads((artifacts[("d3", "contrib")] / "artifact.json").read_text())["files"]
    second = json.loads((again / "artifact.json").read_text())["files"]
    assert {"model.onnx", "model.onnx.data"} <= second.keys()
    assert {name: first[name] for name in second} == second


def test_bench_runs_the_shared_context_graph(artifacts, packages, tmp_path):
    """An artifact with the shared_context graph adds its own bench row next to eager shared_context."""
    out = tmp_path / "bench"
    result = subprocess.run(
        [sys.executable, "-m", "vllm_sr_runtime.cli", "bench", str(packages["d3"]), "--profiles", "exact,shared_context", "--artifact",
         str(artifacts[("d3", "contrib")]), "--lengths", "300", "--questions", "4", "--repeats", "1", "--out", str(out), "--quiet"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    rows = json.loads((out / "bench.json").read_text())["rows"]
    assert sorted(row["profile"] for row in rows) == ["exact", "shared_context", "shared_context-onnx-fp32"]
    assert all(row["questions"] == 4 and row["ratio_to_exact"] > 0 for row in rows)


def test_tampered_or_foreign_artifact_is_refused(artifacts, packages, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(artifacts[("d3", "contrib")], copy)
    data = bytearray((copy / "model.onnx.data").read_bytes())
    data[100] ^= 1
    (copy / "model.onnx.data").write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="model.onnx.data"):
        read_artifact(copy)
    with pytest.raises(ArtifactError, match="not this package"):
        vllm_sr_runtime.load(packages["d3_causal"], profile="max_speed", artifact=artifacts[("d3", "contrib")])


def test_failed_export_keeps_what_was_there(packages, artifacts, tmp_path, monkeypatch):
    import shutil

    from vllm_sr_runtime.export import smoke

    out = tmp_path / "kept"
    shutil.copytree(artifacts[("d3", "contrib")], out)
    before = (out / "artifact.json").read_bytes()
    monkeypatch.setattr(smoke, "SMOKE_TOLERANCE", {"fp32": -1.0})  # any difference fails the smoke parity
    with pytest.raises(ArtifactError, match="smoke parity"):
        export_package(packages["d3"], out, progress=False)
    assert (out / "artifact.json").read_bytes() == before
    assert not list(tmp_path.glob(".kept.partial-*"))


@pytest.mark.parametrize("name", ["d2_qwen3_5", "d3"])
def test_shared_context_graph_answers_like_eager_shared(artifacts, models, name):
    from test_shared_context import STATE, questions

    artifact = artifacts[(name, "contrib")]
    manifest = read_artifact(artifact)
    shared = manifest["shared_context"]
    assert shared["model_file"] == "model_shared.onnx" and shared["weights_from_main"] > 10
    assert {i["name"] for i in shared["io"]["inputs"]} >= {"prefix_ids", "input_ids", "attention_mask"}
    graph = onnx.load(str(artifact / shared["model_file"]), load_external_data=False)
    locations = {e.value for t in graph.graph.initializer for e in t.external_data if e.key == "location"}
    assert "model.onnx.data" in locations  # one copy of the weights on disk
    assert ("com.microsoft", "LinearAttention") in all_ops(graph)
    path = models(name).family.ref.path
    eager = vllm_sr_runtime.load(path, profile="shared_context", shared_min_tokens=1, **load_kwargs(name, path), allow_approximate_shared_context=True)
    fast = vllm_sr_runtime.load(path, profile="shared_context", artifact=artifact, shared_min_tokens=1, **load_kwargs(name, path), allow_approximate_shared_context=True)
    assert fast.card()["engine"] == "onnxruntime" and fast.card()["profile"] == "shared_context"
    qs = questions()
    assert fast.plan(STATE, qs).batches[0].shared
    left, right = eager.ask(STATE, qs), fast.ask(STATE, qs)
    assert fast.shared_questions == len(qs)
    for key, answer in left.items():
        a, b = _flat(answer), _flat(right[key])
        assert a.keys() == b.keys() and max(abs(a[k] - b[k]) for k in a) <= 1e-4
    exact = models(name).ask(STATE, qs)
    worst = max(abs(_flat(exact[k])[o] - _flat(right[k])[o]) for k in qs for o in _flat(exact[k]))
    if models(name).family.shared_context_exact:
        assert worst <= 1e-4  # causal: the shared rows are the full rows
    else:
        assert worst > 1e-3  # non-causal d3: the prefix never sees the questions, and the graph shows it as eager does


def test_shared_context_needs_the_shared_graph(artifacts, packages):
    with pytest.raises(ArtifactError, match="--shared-context"):
        vllm_sr_runtime.load(packages["d3"], profile="shared_context", artifact=artifacts[("d3", "portable")], allow_approximate_shared_context=True)


def _flat(answer: dict) -> dict[str, float]:
    return {"noul": answer["noul"]} if answer["type"] == "noul" else dict(answer["probabilities"])


def test_int8_export_quantizes_the_matmuls(artifacts, packages, models, tmp_path):
    """The per-tensor form (quantize_dynamic's): weights and answers equal ORT's quantizer's."""
    out = tmp_path / "int8"
    manifest = export_package(packages["d3"], out, dtype="int8", progress=False, shared_context=True, int8_activations="tensor", smoke="off", int8_fp32="rule")
    assert manifest["dtype"] == "int8" and manifest["int8"]["activations"] == "per tensor"
    assert manifest["op_counts"].get("ai.onnx::MatMulInteger", 0) > 0
    assert manifest["op_counts"].get("ai.onnx::MatMul", 0) >= 1  # the readout stays FP32
    assert manifest["op_counts"].get("com.microsoft::LinearAttention", 0) > 0
    # FP32 MatMuls are exactly the readout, the token mixers' output projections and the GDN gate inputs (by weight content)
    graph = onnx.load(str(out / "model.onnx"))
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in graph.graph.initializer}
    fp32 = [weights[n.input[1]] for n in graph.graph.node if n.op_type == "MatMul" and n.input[1] in weights]
    module = vllm_sr_runtime.load(packages["d3"], profile="exact").engine.module
    projections = {
        name: p.detach().numpy() for name, p in module.named_parameters()
        if name.endswith(("out_proj.weight", "o_proj.weight", "in_proj_a.weight", "in_proj_b.weight", "down_proj.weight"))
    }  # fmt: skip
    def kept(weight: np.ndarray) -> bool:
        return any(np.array_equal(w, candidate) for w in fp32 for candidate in (weight, weight.T) if w.shape == candidate.shape)
    assert [name for name, weight in projections.items() if not kept(weight)] == [n for n in projections if n.endswith("down_proj.weight")]
    assert len(fp32) == 1 + sum(1 for n in projections if not n.endswith("down_proj.weight"))
    # per-output-channel weight quantization: each quantized weight has one zero point per output column
    integer = [n for n in graph.graph.node if n.op_type == "MatMulInteger" and n.input[1] in weights]
    assert integer and all(weights[n.input[3]].shape == (weights[n.input[1]].shape[1],) for n in integer)
    # one activation quantization per input, shared by the MatMuls that read it (q/k/v, gate/up)
    quantizers = [n for n in graph.graph.node if n.op_type == "DynamicQuantizeLinear"]
    assert len(quantizers) < len(integer) and len({n.input[0] for n in quantizers}) == len(quantizers)
    readers = {n.output[0]: sum(1 for m in integer if m.input[0] == n.output[0]) for n in quantizers}
    assert max(readers.values()) >= 3
    # the weights are quantized as they stream, yet equal what ORT's quantize_dynamic makes of the fp32
    # artifact under the same rule (the MatMuls left FP32 above), answer for answer
    reference = _ort_quantized(artifacts[("d3", "contrib")], fp32, tmp_path / "ort-int8")
    assert _initializer_contents(onnx.load(str(reference))) == _initializer_contents(graph)
    # the shared_context graph reads the main graph's int8 weights instead of writing its own
    shared = onnx.load(str(out / "model_shared.onnx"), load_external_data=False)
    locations = {e.value for t in shared.graph.initializer for e in t.external_data if e.key == "location"}
    assert "model.onnx.data" in locations and any(t.data_type == onnx.TensorProto.INT8 and t.external_data for t in shared.graph.initializer)
    if int8_products_saturate():  # 8-bit weights, as ORT's quantizer makes them: a CPU whose products overflow on them refuses them
        with pytest.raises(ArtifactError, match="--int8-weight-bits 7"):
            vllm_sr_runtime.load(packages["d3"], profile="max_speed", artifact=out)
    else:
        fast = vllm_sr_runtime.load(packages["d3"], profile="max_speed", artifact=out)
        assert fast.dtype == "int8"
        answer = fast.ask("Merge two sorted lists.", {"q": {"type": "choice", "criteria": {"a": None, "b": None, "c": None}}})["q"]
        assert answer["type"] == "choice" and abs(sum(answer["probabilities"].values()) - 1) < 1e-9
    from vllm_sr_runtime.engines.onnxruntime import OrtEngine

    family = models("d3").family
    feeds = family.plan("Merge two sorted lists.", {"q": {"type": "noul"}, "c": {"type": "choice", "criteria": {"a": None, "b": None}}}).batches[0].inputs
    ours = OrtEngine.from_file(out / "model.onnx", device_kind="cpu", output_name=family.output_name).forward(feeds)
    theirs = OrtEngine.from_file(reference, device_kind="cpu", output_name=family.output_name).forward(feeds)
    assert np.array_equal(ours, theirs)


def test_int8_per_token_graph_fuses_dequantization_and_answers_alike_at_every_optimization_level(packages, models, tmp_path):
    """The default int8 form in the full graph: one QuantizeLinear per activation shared by its readers, every
    weight MatMul a MatMulIntegerToFloat (column scales in the kernel) then a row-scale Mul, and ORT's graph
    optimizations change nothing (the fusion trap its row scales once hit answered 0.91 off at EXTENDED)."""
    import onnxruntime as ort

    out = tmp_path / "int8-token"
    manifest = export_package(packages["d3"], out, dtype="int8", progress=False, smoke="on", int8_fp32="rule", int8_weight_bits=widest_int8_weight_bits())
    assert manifest["int8"]["activations"] == "per token" and manifest["smoke"]["ran"]
    counts = manifest["op_counts"]
    fused = counts.get("com.microsoft::MatMulIntegerToFloat", 0)
    assert fused > 0 and counts.get("ai.onnx::MatMulInteger", 0) == 0
    assert 0 < counts["ai.onnx::QuantizeLinear"] < fused  # q/k/v and gate/up read one quantized activation
    family = models("d3").family
    feeds = family.plan("Merge two sorted lists.", {"q": {"type": "noul"}, "c": {"type": "choice", "criteria": {"a": None, "b": None}}}).batches[0].inputs
    answers = []
    levels = (ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED, ort.GraphOptimizationLevel.ORT_ENABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    for index, level in enumerate(levels):
        options = ort.SessionOptions()
        options.graph_optimization_level = level
        disabled = ["NchwcTransformer"] if index == 2 else []
        session = ort.InferenceSession(str(out / "model.onnx"), options, providers=["CPUExecutionProvider"], disabled_optimizers=disabled)
        answers.append(session.run([family.output_name], {i.name: feeds[i.name] for i in session.get_inputs()})[0])
    for other in answers[1:3]:
        np.testing.assert_allclose(other, answers[0], rtol=0, atol=1e-5)
    # The NCHWc layout pass (ORT_ENABLE_ALL on x86) runs the causal conv's blocked kernel, whose last bits differ from
    # the plain Conv's (~1e-6 on the fp32 graph's answers); int8 can move a per-token rounding step on that, so the
    # answers are held to 1e-2 there: the fusion trap answered 0.91 off.
    np.testing.assert_allclose(answers[3], answers[0], rtol=0, atol=1e-2)


def _ort_quantized(fp32_artifact, kept_fp32: list[np.ndarray], staging) -> Path:
    """The fp32 artifact's graph through ORT's quantize_dynamic (per-channel QInt8 weights, constant-B
    MatMuls), excluding the MatMuls whose weights `kept_fp32` holds."""
    import shutil

    from onnxruntime.quantization import QuantType, quantize_dynamic

    staging.mkdir()
    for item in fp32_artifact.iterdir():
        if item.name.startswith("model.onnx"):
            shutil.copyfile(item, staging / item.name)
    graph = onnx.load(str(staging / "model.onnx"))
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in graph.graph.initializer}
    excluded = [
        n.name for n in graph.graph.node
        if n.op_type == "MatMul" and n.input[1] in weights and any(np.array_equal(weights[n.input[1]], w) for w in kept_fp32 if w.shape == weights[n.input[1]].shape)
    ]  # fmt: skip
    assert len(excluded) == len(kept_fp32)
    quantize_dynamic(
        str(staging / "model.onnx"), str(staging / "int8.onnx"), weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"],
        per_channel=True, extra_options={"MatMulConstBOnly": True}, nodes_to_exclude=excluded,
    )  # fmt: skip
    return staging / "int8.onnx"


def _initializer_contents(model: onnx.ModelProto) -> collections.Counter:
    import hashlib

    return collections.Counter(
        (t.data_type, tuple(t.dims), hashlib.sha256(onnx.numpy_helper.to_array(t).tobytes()).hexdigest()) for t in model.graph.initializer
    )  # fmt: skip


def test_int8_weight_quantization_is_ort_quantize_data_per_channel():
    from onnxruntime.quantization.quant_utils import quantize_data

    from vllm_sr_runtime.export.int8 import quantize_per_channel

    rng = np.random.default_rng(0)
    weight = rng.normal(size=(37, 11)).astype(np.float32)
    weight[:, 3] = 0.0  # a dead channel: scale 1, all zeros
    weight[:, 4] = np.abs(weight[:, 4]) + 1  # positive only: the range still includes 0
    weight[5, 6] = 40.0  # one outlier costs only its own channel
    for axis in (0, 1):
        quantized, scale = quantize_per_channel(weight, axis)
        for channel in range(weight.shape[axis]):
            zero, expected_scale, expected = quantize_data(weight.take(channel, axis).flatten(), onnx.TensorProto.INT8, True)
            assert zero == 0 and scale[channel] == expected_scale
            assert np.array_equal(quantized.take(channel, axis), expected)
    assert quantize_per_channel(weight, 1)[1][3] == 1.0


def test_second_open_loads_the_saved_optimized_graph(artifacts, packages, tmp_path):
    from vllm_sr_runtime.engines.onnxruntime.optimized_cache import OPTIMIZED_FILE

    cache = tmp_path / "cache"
    first = vllm_sr_runtime.load(packages["d3"], profile="max_speed", artifact=artifacts[("d3", "contrib")], cache_dir=cache)
    assert first.engine.optimized_cache_use == "stored"
    saved = list((cache / "ort-optimized").glob(f"*/{OPTIMIZED_FILE}"))
    assert len(saved) == 1 and not list((cache / "ort-optimized").glob(".*"))  # published, no staging left
    second = vllm_sr_runtime.load(packages["d3"], profile="max_speed", artifact=artifacts[("d3", "contrib")], cache_dir=cache)
    assert second.engine.optimized_cache_use == "hit"
    questions = {"q": {"type": "choice", "criteria": {"a": None, "b": None, "c": None}}, "n": {"type": "noul"}}
    assert second.ask("Merge two sorted lists.", questions) == first.ask("Merge two sorted lists.", questions)
    saved[0].write_bytes(b"not a model")  # a damaged entry is replaced, never fatal
    third = vllm_sr_runtime.load(packages["d3"], profile="max_speed", artifact=artifacts[("d3", "contrib")], cache_dir=cache)
    assert third.engine.optimized_cache_use == "stored"
    assert third.ask("Merge two sorted lists.", questions) == first.ask("Merge two sorted lists.", questions)


@pytest.mark.parametrize("name", ["d2_qwen3", "d2_qwen3_5", "d3"])
def test_cpu_sessions_run_full_attention_over_query_blocks_with_the_same_answers(artifacts, packages, monkeypatch, tmp_path, name):
    """The CPU engine opens every graph with its full attention over query blocks (attention_blocks): with blocks of
    16 queries every prompt here spans several, and the answers (main graph; shared_context graph where exported) are
    the graph-as-exported's to the bit. The optimized-graph cache keeps the two forms apart."""
    from vllm_sr_runtime.engines.onnxruntime import attention_blocks

    artifact = artifacts[(name, "contrib")]
    rewritable = attention_blocks.split_attention_queries(onnx.load(str(artifact / "model.onnx"), load_external_data=False), 16)
    # every full-attention layer (2 of Qwen3's 2, 1 of the Decision 2.0 hybrid's 4, 2 of Decision 3.0's 8): the causal
    # reading is in the mask's rows, which the blocks slice with their queries
    assert rewritable == {"d2_qwen3": 2, "d2_qwen3_5": 1, "d3": 2}[name]
    questions = {"q": {"type": "choice", "criteria": {"a": None, "b": None, "c": None}}, "n": {"type": "noul"}, "s": {"type": "score", "criteria": ["easy", "medium", "hard"]}}
    state = {"user": "Merge two sorted lists and explain the running time. " * 6, "history": [1, 2, 3]}
    profiles = ["max_speed", "shared_context"] if (name, "contrib") in WITH_SHARED else ["max_speed"]
    cache = tmp_path / "cache"
    answers = {}
    for block in (16, None):
        monkeypatch.setattr(attention_blocks, "ATTENTION_QUERY_BLOCK", block)
        for profile in profiles:
            model = vllm_sr_runtime.load(
                packages[name], profile=profile, artifact=artifact, cache_dir=cache, shared_min_tokens=1, allow_approximate_shared_context=True
            )
            assert model.engine.attention_query_block == block
            # each form its own cache entry: the blocked graph's is never opened for the other
            assert model.engine.optimized_cache_use == ("stored" if profile == profiles[0] else "hit")
            answers[(block, profile)] = model.ask(state, questions)
    for profile in profiles:
        assert answers[(16, profile)] == answers[(None, profile)]


def test_artifact_records_its_smoke_and_where_the_export_went(artifacts):
    from vllm_sr_runtime.export.exporter import PHASES, SHARED_PHASES

    root = artifacts[("d3", "contrib")]
    manifest = json.loads((root / "artifact.json").read_text())
    smoke = manifest["smoke"]
    assert smoke["mode"] == "auto" and smoke["ran"] and smoke["rows"] == manifest["smoke_parity"]["questions"] >= 5
    assert smoke["tolerance"] == 1e-4 and smoke["memory_needed_bytes"] > 0
    phases = manifest["export"]["phases"]
    assert [p["name"] for p in phases] == [*PHASES[:-1], *SHARED_PHASES, PHASES[-1]]
    assert all(p["seconds"] >= 0 and p["peak_rss_bytes"] > 0 for p in phases)
    # Weights are written tensor by tensor at page-aligned offsets (ORT can map them).
    model = onnx.load(str(root / "model.onnx"), load_external_data=False)
    offsets = [int(e.value) for t in model.graph.initializer for e in t.external_data if e.key == "offset"]
    assert offsets and all(offset % 4096 == 0 for offset in offsets)


@pytest.mark.parametrize("name", ["d2_qwen3", "d2_qwen3_5", "d2_lora", "d3"])
def test_streamed_graphs_equal_a_trace_with_weights(artifacts, packages, name):
    """The artifact's graphs (and the shared_context graph) are the ones torch.onnx makes from the module with
    its weights: same ops, same wiring, every weight byte-identical (so the same answers, bit for bit)."""
    from vllm_sr_runtime.export.exporter import build_export_module
    from vllm_sr_runtime.export.graph_emit import translation_table
    from vllm_sr_runtime.export.smoke import SMOKE_QUESTIONS, SMOKE_STATE
    from reference_trace import assert_same_graph, reference_trace
    from vllm_sr_runtime.families import open_family
    from vllm_sr_runtime.packages.resolve import resolve_package

    ref = resolve_package(packages[name])
    family = open_family(ref, **load_kwargs(name, packages[name]))
    module = build_export_module(family, "fp32", readout_rows_only=True)
    artifact = artifacts[(name, "contrib")]
    sample = family.plan(SMOKE_STATE, SMOKE_QUESTIONS).batches[0].inputs
    reference = reference_trace(module, sample, family.input_names, family.dynamic_axes, family.output_name, translation_table(family.backbone_config()))
    assert_same_graph(onnx.load(str(artifact / "model.onnx")), reference)
    if (name, "contrib") in WITH_SHARED:
        inputs = family.share(family.plan(SMOKE_STATE, SMOKE_QUESTIONS), 0).batches[0].inputs
        reference = reference_trace(
            module, inputs, family.shared_input_names, family.shared_dynamic_axes, family.output_name, translation_table(family.backbone_config()), "forward_shared"
        )  # fmt: skip
        assert_same_graph(onnx.load(str(artifact / "model_shared.onnx")), reference)


def test_max_speed_tells_causal_from_noncausal(artifacts, models, packages, tmp_path):
    """The same weights read causally answer far outside the tolerance that max_speed is held to, so the
    max_speed tests would see an exported graph with the wrong attention direction."""
    from attention_direction import FAR, TOLERANCE, max_difference

    causal_artifact = tmp_path / "causal"
    export_package(packages["d3_causal"], causal_artifact, progress=False, smoke="off")
    noncausal = vllm_sr_runtime.load(packages["d3"], profile="max_speed", artifact=artifacts[("d3", "contrib")])
    causal = vllm_sr_runtime.load(packages["d3_causal"], profile="max_speed", artifact=causal_artifact)
    assert max_difference(noncausal, models("d3")) <= TOLERANCE and max_difference(causal, models("d3_causal")) <= TOLERANCE
    assert max_difference(noncausal, causal) > FAR


def test_split_form_holds_a_kept_matmul_to_about_fifteen_bits_with_two_int8_products():
    """A weight the split form names runs as two MatMulIntegerToFloat over per-token activations (high x high, and
    both cross terms in one product: [high | low] x [low; high]): its answer equals a NumPy reference of the two
    halves, and is ~100x closer to FP32 than the per-token form of the other reader of the same activation, which
    shares its high half (one QuantizeLinear for the high half, one for the low)."""
    import onnx_ir as ir
    import onnxruntime as ort

    from vllm_sr_runtime.export.int8 import quantize_matmuls, quantize_per_channel, quantize_split, split_low_steps, weight_qmax

    bits = widest_int8_weight_bits()  # what this CPU's integer products take (7 where 8-bit weights saturate them)
    qmax = weight_qmax(bits)
    SPLIT_LOW_STEPS = split_low_steps(qmax)
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((64, 48)).astype(np.float32)
    x = rng.standard_normal((2, 5, 64)).astype(np.float32)
    x[..., 7] *= 40.0  # an outlier channel: per token, it costs every other channel its precision
    traced = matmul_graph(weight, second_reader=True)
    split_names = {"layer.weight"}
    assert quantize_matmuls(traced, split_names.__contains__, "token", split=split_names.__contains__, weight_bits=bits) == 2
    ops = [node.op_type for node in traced.model.graph]
    assert ops.count("MatMulIntegerToFloat") == 3 and ops.count("QuantizeLinear") == 2 and ops.count("Concat") == 1 and "MatMul" not in ops
    high, low, w_scale = quantize_split(weight, 1, qmax)
    assert np.abs(high * w_scale + low * (w_scale / SPLIT_LOW_STEPS) - weight).max() <= (w_scale / SPLIT_LOW_STEPS).max() / 2 * 1.001
    assert np.array_equal(high, quantize_per_channel(weight, 1, qmax)[0])
    scale = np.maximum(np.abs(x).max(-1, keepdims=True) / 127, np.finfo(np.float32).tiny).astype(np.float32)
    x_high = np.round(x / scale)
    x_low = np.round((x - x_high * scale) / (scale / SPLIT_LOW_STEPS))
    h64, l64 = high.astype(np.float64), low.astype(np.float64)
    split_part = scale * ((x_high @ h64) * w_scale + (x_high @ l64) * (w_scale / SPLIT_LOW_STEPS) + (x_low / SPLIT_LOW_STEPS) @ h64 * w_scale)
    token_part = scale * (x_high @ -h64) * w_scale  # quantize_per_channel(-w) is -high with the same scales
    exact = x.astype(np.float64) @ weight
    split_error, token_error = np.abs(split_part - exact).max(), np.abs(-token_part - exact).max()
    assert split_error * SPLIT_LOW_STEPS / 2.5 < token_error  # about the low half's steps finer: 100x at 8 bits, 50x at 7
    proto = ir.serde.serialize_model(traced.model)
    for level in (ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
        options = ort.SessionOptions()
        options.graph_optimization_level = level
        got = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        np.testing.assert_allclose(got, split_part - token_part, rtol=1e-5, atol=1e-3)


def test_split_form_of_a_transposed_linear_reads_its_package_tensor_per_output_channel():
    """A torch Linear stores [outputs, inputs] and the MatMul reads its transpose: the split form quantizes the
    package tensor per output (its rows), once for both of its weights, and answers as the NumPy reference of those
    halves does."""
    import onnx_ir as ir
    import onnxruntime as ort
    import torch

    from vllm_sr_runtime.export.int8 import quantize_matmuls, quantize_split, split_low_steps, weight_qmax
    from vllm_sr_runtime.export.streaming import TracedGraph

    bits = widest_int8_weight_bits()  # what this CPU's integer products take (7 where 8-bit weights saturate them)
    qmax = weight_qmax(bits)
    SPLIT_LOW_STEPS = split_low_steps(qmax)
    rng = np.random.default_rng(2)
    stored = rng.standard_normal((6, 40)).astype(np.float32)  # 6 outputs, 40 inputs
    x = rng.standard_normal((3, 40)).astype(np.float32)

    class Stored:
        loads = 0

        def load(self):
            Stored.loads += 1
            return torch.from_numpy(stored)

    xv = ir.Value(name="x", shape=ir.Shape(["rows", 40]), type=ir.TensorType(ir.DataType.FLOAT))
    w = ir.Value(name="w", shape=ir.Shape([40, 6]), type=ir.TensorType(ir.DataType.FLOAT), const_value=ir.tensor(np.ascontiguousarray(stored.T), name="w"))
    node = ir.Node("", "MatMul", [xv, w], name="linear")
    node.outputs[0].name, node.outputs[0].dtype, node.outputs[0].shape = "y", ir.DataType.FLOAT, ir.Shape(["rows", 6])
    graph = ir.Graph([xv], [node.outputs[0]], nodes=[node], initializers=[w], opset_imports={"": 21})
    traced = TracedGraph(ir.Model(graph, ir_version=10), sources={"layer.weight": Stored()})
    traced.provenance[id(w.const_value)] = ("transpose", "layer.weight", (1, 0))
    assert quantize_matmuls(traced, lambda name: True, "token", split=lambda name: True, weight_bits=bits) == 1
    high, low, scale = quantize_split(stored, 0, qmax)  # per row of the stored tensor: per output
    assert np.abs(high * scale[:, None] + low * (scale[:, None] / SPLIT_LOW_STEPS) - stored).max() <= (scale / SPLIT_LOW_STEPS).max() / 2 * 1.001
    row_scale = np.abs(x).max(-1, keepdims=True) / 127
    x_high = np.round(x / row_scale)
    x_low = np.round((x - x_high * row_scale) / (row_scale / SPLIT_LOW_STEPS))
    h64, l64 = high.T.astype(np.float64), low.T.astype(np.float64)
    expected = row_scale * ((x_high @ h64) * scale + (x_high @ l64 + x_low @ h64) * (scale / SPLIT_LOW_STEPS))
    proto = ir.serde.serialize_model(traced.model)
    assert Stored.loads == 1  # the high weight and the cross weight come from one load and one quantization
    got = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)
    assert np.abs(got - x.astype(np.float64) @ stored.T).max() < 2e-3 * np.abs(x @ stored.T).max()


@pytest.mark.parametrize("form", ["token", "tensor", "block"])
def test_int8_activation_forms_quantize_each_input_once_and_compute_what_they_say(form):
    """Per token: each row gets its own scale (an outlier row leaves the others' precision alone); the answer
    equals a NumPy per-row x per-column reference under every ORT optimization level (ORT's MatMulIntegerToFloat
    fusion must not treat the row scales as one). Per block: one MatMulNBits per weight, whose answer equals a
    NumPy reference rounding weights and activations per row and block of 32 (an outlier channel costs only its
    own block)."""
    import onnx_ir as ir
    import onnxruntime as ort

    from vllm_sr_runtime.export.int8 import NBITS_BLOCK, NBITS_ZERO_POINT, quantize_blocks, quantize_matmuls, quantize_per_channel, weight_qmax

    bits = widest_int8_weight_bits()  # what this CPU's integer products take (7 where 8-bit weights saturate them)
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((64, 48)).astype(np.float32)
    x = rng.standard_normal((2, 5, 64)).astype(np.float32)
    x[1, 2] *= 300.0  # one outlier token
    if form == "block":
        x[..., 3] *= 300.0  # and one outlier channel, in the first block of 32
    traced = matmul_graph(weight, second_reader=True)
    assert quantize_matmuls(traced, lambda name: False, form, weight_bits=bits) == 2
    ops = [node.op_type for node in traced.model.graph]
    if form == "block":
        assert ops.count("MatMulNBits") == 2 and "QuantizeLinear" not in ops and "MatMul" not in ops
    else:
        # per token: the integer product and the columns' scales in one kernel, the rows' scales after it
        assert ops.count("MatMulIntegerToFloat" if form == "token" else "MatMulInteger") == 2 and ("DynamicQuantizeLinear" in ops) == (form == "tensor")
        assert ops.count("ReduceMax") == ops.count("QuantizeLinear") == (1 if form == "token" else 0)  # one quantization, shared by both readers
    proto = ir.serde.serialize_model(traced.model)
    exact = 2 * x @ weight
    if form == "token":
        w_q, w_scale = quantize_per_channel(weight, 1, weight_qmax(bits))
        scale = np.maximum(np.abs(x).max(-1, keepdims=True) / 127, np.finfo(np.float32).tiny).astype(np.float32)
        x_q = np.round(x / scale)
        expected = 2 * (x_q @ w_q.astype(np.float64)) * scale * w_scale
        others = np.abs(expected - exact)[1, [0, 1, 3, 4]].max()
        assert others < 0.05 * np.abs(exact[1, [0, 1, 3, 4]]).max()  # the outlier row cost the others nothing
    if form == "block":
        w_q, w_scale = quantize_blocks(weight.T)
        assert w_q.shape == (48, 64 // NBITS_BLOCK, NBITS_BLOCK)
        dequantized = ((w_q.astype(np.float64) - NBITS_ZERO_POINT) * w_scale[..., None]).reshape(48, 64).T
        blocks = x.astype(np.float64).reshape(2, 5, 64 // NBITS_BLOCK, NBITS_BLOCK)
        steps = np.abs(blocks).max(-1, keepdims=True) / 127
        rounded = (np.round(blocks / steps) * steps).reshape(2, 5, 64)
        expected = 2 * rounded @ dequantized
        # the outlier channel costs the other block's channels nothing, where one scale per token loses them
        per_token = np.abs(x).max(-1, keepdims=True) / 127
        token_error = np.abs(np.round(x / per_token) * per_token - x)[0, :, NBITS_BLOCK:].max()
        assert np.abs(rounded - x)[0, :, NBITS_BLOCK:].max() < token_error / 100
    for level in (ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
        options = ort.SessionOptions()
        options.graph_optimization_level = level
        got = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        if form == "token":
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-3)
        elif form == "block":
            np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5 * np.abs(exact).max())
        else:
            np.testing.assert_allclose(got, exact, rtol=0.2, atol=0.2 * np.abs(x).max())


def test_untyped_contrib_outputs_serialize_without_a_warning_per_value(caplog):
    """torch.onnx leaves a contrib op's outputs with a shape and no type (the op has no type inference): the serializer
    skips their shapes with one warning each (one per Gated DeltaNet layer of every export). The export drops those
    shapes first: the same graph, no warnings; typed values keep theirs."""
    import logging

    import onnx_ir as ir

    from vllm_sr_runtime.export.graph_passes import drop_untyped_shapes

    def model() -> ir.Model:
        x = ir.Value(name="x", shape=ir.Shape(["batch", 4]), type=ir.TensorType(ir.DataType.FLOAT))
        contrib = ir.Node("com.microsoft", "LinearAttention", [x], num_outputs=2, name="mixer")
        out, state = contrib.outputs
        out.name, out.type, out.shape = "out", ir.TensorType(ir.DataType.FLOAT), ir.Shape(["batch", 4])
        state.name, state.shape = "state", ir.Shape(["batch", 2, 2, 2])  # no type, as traced
        relu = ir.Node("", "Relu", [out], name="relu")
        relu.outputs[0].name, relu.outputs[0].type = "y", ir.TensorType(ir.DataType.FLOAT)
        graph = ir.Graph([x], [relu.outputs[0]], nodes=[contrib, relu], opset_imports={"": 21, "com.microsoft": 1})
        return ir.Model(graph, ir_version=10)

    with caplog.at_level(logging.WARNING):
        as_traced = ir.serde.serialize_model(model())
    assert any("is not known" in record.getMessage() for record in caplog.records)
    caplog.clear()
    cleaned = model()
    assert drop_untyped_shapes(cleaned) == 1
    with caplog.at_level(logging.WARNING):
        proto = ir.serde.serialize_model(cleaned)
    assert not any("is not known" in record.getMessage() for record in caplog.records)
    assert [v.name for v in as_traced.graph.value_info] == ["out", "state"] and not as_traced.graph.value_info[1].HasField("type")
    del as_traced.graph.value_info[1]  # the traced graph's one difference: a value_info holding a name only
    assert proto.SerializeToString() == as_traced.SerializeToString()


def test_an_artifacts_card_counts_the_weights_its_sessions_opened(packages, artifacts):
    """The card's (and /metrics') weight_bytes for an artifact: its graph and weight file, once each."""
    artifact = artifacts[("d3", "contrib")]
    card = vllm_sr_runtime.load(packages["d3"], device="cpu", profile="max_speed", artifact=artifact).card()
    files = sum((artifact / name).stat().st_size for name in ("model.onnx", "model.onnx.data"))
    assert card["weight_bytes"] == files and files > 4 * card["parameters"]
