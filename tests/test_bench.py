"""bench forward and bench http on tiny fixtures: the JSON shape and the derived figures (no timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import vllm_sr_runtime
from vllm_sr_runtime.bench.flops import GemmCeilings
from hub_server import PINNED_REVISION, HubServer
from server_harness import Server, metric_total, unloadable_copy

ROW_FIELDS = {"profile", "length", "questions", "concurrency", "median_ms", "p90_ms", "rps", "ratio_to_exact", "gflops", "fraction_of_limit"}


def test_bench_forward(packages, default_artifact, tmp_path):
    artifact = default_artifact("d3")
    out = tmp_path / "bench"
    result = subprocess.run(
        [sys.executable, "-m", "vllm_sr_runtime.cli", "bench", str(packages["d3"]), "--artifact", str(artifact), "--lengths", "200,400",
         "--questions", "1,8", "--repeats", "2", "--out", str(out), "--plot", "--quiet", "--ort-profile"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((out / "bench.json").read_text())
    assert report["mode"] == "forward" and report["gemm_limit_gflops"] > 0 and report["machine"]["cpus_in_affinity"] >= 1
    limits, samples = report["gemm_limits"], report["gemm_limit_samples"]  # both ceilings, same shape and threads
    assert set(limits) == set(samples) == {"fp32", "int8"} and limits["fp32"] == report["gemm_limit_gflops"] and limits["int8"] > 0
    for kind in limits:  # one sample per round of repeats (2 lengths x 2 question counts x 2); the ceiling: the fastest
        assert len(samples[kind]) == 2 * 2 * 2 and limits[kind] == max(samples[kind])
        assert report["gemm_limit_spread"][kind] == pytest.approx(max(samples[kind]) / min(samples[kind]))
    rows = report["rows"]
    assert len(rows) == 2 * 2 * 2  # profiles x lengths x question counts
    for row in rows:
        assert ROW_FIELDS <= set(row)
        assert row["median_ms"] > 0 and row["p90_ms"] >= row["min_ms"] and row["concurrency"] == 1
        assert abs(row["gflops"] - row["gflop"] / (row["median_ms"] / 1000)) < 1e-6 * max(1.0, row["gflops"])
        assert row["ceiling"] == "fp32"  # exact and the fp32 artifact: the fp32 ceiling
        assert row["limit"] == limits["fp32"] and abs(row["fraction_of_limit"] - row["gflops"] / row["limit"]) < 1e-9
    for row in rows:
        exact = next(r for r in rows if r["profile"] == "exact" and r["target_length"] == row["target_length"] and r["questions"] == row["questions"])
        assert abs(row["ratio_to_exact"] - exact["median_ms"] / row["median_ms"]) < 1e-9
        if row["profile"] == "max_speed":  # the artifact's last layer computes the readout's row only: less work counted
            assert 0.5 * exact["gflop"] < row["gflop"] < exact["gflop"]
        assert row["length"] <= row["target_length"] or row["length"] == min(r["length"] for r in rows)
    assert (out / "latency_vs_length.png").stat().st_size > 1000
    assert "GEMM limit" in result.stdout and "int8 GEMM limit" in result.stdout and "samples between the rows" in result.stdout
    ops = report["ort_profile"]["max_speed"]["ops"]  # where the graph's time goes, by op type
    assert {"MatMul", "LinearAttention", "Conv"} <= {row["op"] for row in ops}
    assert abs(sum(row["share"] for row in ops) - 1.0) < 1e-6 and all(row["ms_per_run"] >= 0 for row in ops)
    assert "exact" not in report["ort_profile"] and "ONNX Runtime time by op type" in result.stdout
    profiled = report["ort_profile"]["max_speed"]
    matmul = next(row for row in ops if row["op"] == "MatMul")  # products judged against their arithmetic's ceiling
    assert matmul["ceiling"] == "fp32" and matmul["gop_per_run"] > 0
    assert abs(matmul["gops"] - matmul["gop_per_run"] / (matmul["ms_per_run"] / 1000)) < 1e-6 * matmul["gops"]
    assert abs(matmul["fraction_of_ceiling"] - matmul["gops"] / limits["fp32"]) < 1e-9
    assert all("gops" not in row for row in ops if row["op"] in ("LinearAttention", "Conv"))
    products = [row for row in ops if "gops" in row]
    assert abs(profiled["product_share"] - sum(row["share"] for row in products)) < 1e-9
    same_request = next(r for r in rows if r["profile"] == "max_speed" and r["target_length"] == 400 and r["questions"] == 1)
    assert profiled["ceiling"] == "fp32" and profiled["length"] == same_request["length"]
    bound = same_request["gflop"] / (profiled["product_ms_per_run"] / 1000) / limits["fp32"]  # the row's work over the products' time
    assert abs(profiled["bound"] - bound) < 1e-9 * bound and "with every other op free" in result.stdout


@pytest.mark.parametrize("form", ["fp32", "int8", "attention"])
def test_the_profile_counts_each_products_work_from_its_shapes(form, tmp_path):
    """One product node of known shape, batched: the profile's operations per run are 2 x rows x inputs x columns
    (attention: Q K^T and the weights times V, every query head against every key, grouped key/value heads)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from vllm_sr_runtime.bench.ort_profile import profile_by_op

    batch, m, k, n = 2, 48, 64, 40
    rng = np.random.default_rng(0)
    if form == "attention":
        heads, kv_heads, keys, key_dim, value_dim = 4, 2, 40, 32, 24
        shapes = {"q": [batch, heads, m, key_dim], "k": [batch, kv_heads, keys, key_dim], "v": [batch, kv_heads, keys, value_dim]}
        graph = helper.make_graph(
            [helper.make_node("Attention", ["q", "k", "v"], ["y"])], "attention",
            [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in shapes.items()],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        )  # fmt: skip
        path = tmp_path / "attention.onnx"
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)]), path)
        rows = profile_by_op(path, {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}, runs=2)
        product = next(row for row in rows if row["op"] == "Attention")
        assert product["ceiling"] == "fp32" and abs(product["gop_per_run"] - 2 * batch * heads * m * keys * (key_dim + value_dim) / 1e9) < 1e-15
        return
    if form == "fp32":
        nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
        weights = [numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), "w")]
        feed = {"x": rng.standard_normal((batch, m, k)).astype(np.float32)}
        x_type = TensorProto.FLOAT
    else:
        nodes = [helper.make_node("MatMulIntegerToFloat", ["x", "w", "a_scale", "w_scale"], ["y"], domain="com.microsoft")]
        weights = [numpy_helper.from_array(rng.integers(-127, 128, (k, n)).astype(np.int8), "w"),
                   numpy_helper.from_array(np.array(0.02, np.float32), "a_scale"), numpy_helper.from_array(np.full(n, 0.01, np.float32), "w_scale")]  # fmt: skip
        feed = {"x": rng.integers(0, 256, (batch, m, k)).astype(np.uint8)}
        x_type = TensorProto.UINT8
    graph = helper.make_graph(nodes, "product", [helper.make_tensor_value_info("x", x_type, [batch, m, k])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, m, n])], weights)
    path = tmp_path / "product.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]), path)
    rows = profile_by_op(path, feed, runs=2)
    product = next(row for row in rows if "gops" in row)
    assert product["op"] == nodes[0].op_type and product["ceiling"] == form
    assert abs(product["gop_per_run"] - 2 * batch * m * k * n / 1e9) < 1e-15


def test_bench_http(packages, tmp_path):
    """Started while the server's model is still loading (from a slow Hub: /health 503 "loading"), bench waits
    for it: not one of its requests may be a 503."""
    revision = PINNED_REVISION
    with HubServer() as hub:
        hub.add("synthetic/d3-tiny", revision, packages["d3"])
        hub.listing_delay_s = 15.0
        server = Server(
            [f"synthetic/d3-tiny@{revision}", "--device", "cpu", "--cache-dir", str(tmp_path / "cache")], env={"HF_ENDPOINT": hub.endpoint}, log=tmp_path / "log"
        )  # fmt: skip
        try:
            server.wait(status=503, settled=False)
            out = tmp_path / "bench"
            result = subprocess.run(
                [sys.executable, "-m", "vllm_sr_runtime.cli", "bench", "--mode", "http", "--url", f"http://127.0.0.1:{server.port}",
                 "--concurrency", "1,4", "--duration", "1.5", "--out", str(out), "--plot", "--quiet"],
                capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            assert result.returncode == 0, result.stderr[-2000:]
            metrics = server.request("GET", "/metrics").body.decode()
        finally:
            server.stop()
    # every request is new to the server's result cache: bench measures the model, not the cache
    hits, misses = (metric_total(metrics, "vllm_sr_runtime_result_cache_questions_total", outcome=outcome) for outcome in ("hit", "miss"))
    assert hits == 0 and misses > 0, (hits, misses)
    assert result.stdout.splitlines()[0].split()[-1] == "errors"  # the table shows failed requests too
    report = json.loads((out / "bench.json").read_text())
    rows = report["rows"]
    assert [row["concurrency"] for row in rows] == [1, 4]
    for row in rows:
        assert ROW_FIELDS <= set(row) and row["rps"] > 0 and row["errors"] == 0
        assert row["statuses"]["200"] > 0 and row["p99_ms"] >= row["median_ms"]
    assert (out / "rps_vs_clients.png").is_file()
    assert "waiting for the server's models to load" in result.stderr


def test_bench_http_spreads_over_every_served_model(packages, tmp_path):
    """A server of several models answers 400 to a request that names none: bench names one in each request, by
    default every ready model in turn, or the ones asked for. A run in which the server answered no request
    fails with the server's own error, and writes no report."""
    models = tmp_path / "models.yaml"
    models.write_text(f"- model: {packages['d3']}\n  name: first\n- model: {packages['d2_qwen3']}\n  name: second\n")
    server = Server(["--models", str(models), "--device", "cpu"], log=tmp_path / "log")

    def bench(*args: str) -> tuple[subprocess.CompletedProcess, Path]:
        out = tmp_path / f"bench-{len(list(tmp_path.iterdir()))}"
        command = [sys.executable, "-m", "vllm_sr_runtime.cli", "bench", *args, "--mode", "http", "--url", f"http://127.0.0.1:{server.port}",
                   "--concurrency", "2", "--duration", "1.5", "--out", str(out), "--quiet"]  # fmt: skip
        return subprocess.run(command, capture_output=True, text=True, timeout=300), out / "bench.json"

    try:
        server.wait()
        spread, spread_report = bench()
        chosen, chosen_report = bench("second")
        missing, missing_report = bench("first,nothere")
        refused, refused_report = bench("nothere")
    finally:
        server.stop()
    assert spread.returncode == 0 and chosen.returncode == 0, (spread.stderr[-2000:], chosen.stderr[-2000:])
    [row] = json.loads(spread_report.read_text())["rows"]
    assert row["errors"] == 0 and set(row["rps_per_model"]) == {"first", "second"} and min(row["rps_per_model"].values()) > 0
    assert sum(row["rps_per_model"].values()) == pytest.approx(row["rps"])
    [row] = json.loads(chosen_report.read_text())["rows"]
    assert row["errors"] == 0 and list(row["rps_per_model"]) == ["second"] and row["rps"] > 0
    # half its requests name a model the server does not serve: measured, with the server's answer kept
    assert missing.returncode == 0, missing.stderr[-2000:]
    [row] = json.loads(missing_report.read_text())["rows"]
    assert row["errors"] > 0 and row["rps_per_model"]["first"] > 0 and row["rps_per_model"]["nothere"] == 0
    assert "model_not_found" in row["first_errors"]["404"]
    assert refused.returncode == 2 and "no request succeeded" in refused.stderr and "model_not_found" in refused.stderr, refused.stderr[-2000:]
    assert not refused_report.exists()


def test_bench_http_refuses_a_server_whose_models_failed(packages, tmp_path):
    broken = unloadable_copy(packages["d3"], tmp_path / "broken")
    server = Server([str(broken), "--device", "cpu"], log=tmp_path / "log")
    try:
        server.wait(status=503)
        result = subprocess.run(
            [sys.executable, "-m", "vllm_sr_runtime.cli", "bench", "--mode", "http", "--url", f"http://127.0.0.1:{server.port}",
             "--concurrency", "1", "--duration", "1", "--out", str(tmp_path / "bench"), "--quiet"],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    finally:
        server.stop()
    assert result.returncode == 2 and "models failed to load, nothing to measure" in result.stderr and "tokenizer.json" in result.stderr
    assert not (tmp_path / "bench" / "bench.json").exists()


def test_bench_export_reports_each_phase_and_the_whole_run(packages, tmp_path):
    out = tmp_path / "bench-export"
    result = subprocess.run(
        [sys.executable, "-m", "vllm_sr_runtime.cli", "bench", str(packages["d2_qwen3"]), "--mode", "export", "--dtype", "fp32,int8", "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((out / "bench.json").read_text())
    assert report["mode"] == "export"
    for dtype in ("fp32", "int8"):
        rows = {r["phase"]: r for r in report["rows"] if r["dtype"] == dtype}
        assert {"load", "trace", "write", "session", "smoke", "startup", "total"} <= set(rows)
        assert rows["total"]["peak_rss_mb"] >= max(r["peak_rss_mb"] or 0 for r in rows.values() if r["phase"] != "total")
        assert rows["total"]["seconds"] >= rows["trace"]["seconds"] > 0 and rows["total"]["artifact_mb"] > 0
        assert rows["total"]["smoke"] is False  # bench measures the export itself unless asked
    assert "peak RSS MiB" in result.stdout


class ScriptedCeilings(GemmCeilings):
    """Ceiling samples from a script (a host whose GEMM speed halves for a while), no GEMM run."""

    def __init__(self, script: list[float]):
        self.script, self.samples = list(script), {"fp32": [], "int8": []}

    def sample(self) -> dict[str, float]:
        value = self.script.pop(0)
        taken = {"fp32": value, "int8": 4 * value}
        for kind, sample in taken.items():
            self.samples[kind].append(sample)
        return taken


def test_every_row_is_judged_against_the_fastest_ceiling_sample_of_the_run(packages):
    """A host whose GEMM runs at half speed for some samples: a row is not judged against a slow sample (which
    would let it pass the ceiling), whichever round of repeats that sample fell in."""
    from vllm_sr_runtime.bench.forward import run_forward

    model = vllm_sr_runtime.load(packages["d3"], profile="exact")
    ceilings = ScriptedCeilings([150.0, 160.0, 140.0, 300.0, 320.0, 150.0])  # one sample per round, slow ones among them
    rows = run_forward({"exact": model}, [60, 120], [1], 3, ceilings, lambda: None)
    assert ceilings.samples["fp32"] == [150.0, 160.0, 140.0, 300.0, 320.0, 150.0]  # one per round, after the models
    for row in rows:
        assert row["limit"] == 320.0 and row["fraction_of_limit"] == pytest.approx(row["gflops"] / 320.0)
    assert ceilings.best() == {"fp32": 320.0, "int8": 1280.0} and ceilings.spread()["fp32"] == pytest.approx(320 / 140)
    fixed = run_forward({"exact": model}, [60], [1], 2, {"fp32": 200.0}, lambda: None)[0]  # numbers given: used as they are
    assert fixed["limit"] == 200.0 and fixed["fraction_of_limit"] == pytest.approx(fixed["gflops"] / 200.0)
    unmeasured = run_forward({"exact": model}, [60], [1], 1, None, lambda: None)[0]  # a GPU run: no CPU ceiling to judge it by
    assert unmeasured["limit"] is None and unmeasured["fraction_of_limit"] is None and unmeasured["gflops"] > 0


class RecordingModel:
    """A loaded model that records the state length of every request it answers."""

    def __init__(self, model, calls: list):
        self.model, self.calls = model, calls

    def __getattr__(self, name):
        return getattr(self.model, name)

    def ask(self, state, questions, *media):
        self.calls.append(len(state))
        return self.model.ask(state, questions, *media)


def test_every_round_runs_every_length_so_drift_moves_the_cost_curve_alike(packages):
    from vllm_sr_runtime.bench.forward import run_forward

    calls: list[int] = []
    model = RecordingModel(vllm_sr_runtime.load(packages["d3"], profile="exact"), calls)
    rows = run_forward({"exact": model}, [60, 400], [1], 3, None, lambda: None)
    short, long = sorted(set(calls))
    assert calls == [short, long] * 4  # one warm-up of each length, then three rounds of both (not 1+3 short, then 1+3 long)
    assert [row["target_length"] for row in rows] == [60, 400] and all(row["runs"] == 3 for row in rows)


class Int8Labelled(RecordingModel):
    """A loaded model that reports itself as an int8 artifact (only `ceiling_for` reads it)."""

    dtype = "int8"


def test_a_row_keeps_its_dtypes_ceiling_label_whatever_limits_are_known(packages):
    """An int8 row is labelled with the int8 ceiling whether its limit was measured, missing (a GPU run) or given;
    only a single fixed number judges every row against fp32."""
    from vllm_sr_runtime.bench.forward import run_forward

    model = Int8Labelled(vllm_sr_runtime.load(packages["d3"], profile="exact"), [])
    unmeasured = run_forward({"int8": model}, [60], [1], 1, None, lambda: None)[0]
    assert unmeasured["ceiling"] == "int8" and unmeasured["limit"] is None and unmeasured["fraction_of_limit"] is None
    only_fp32 = run_forward({"int8": model}, [60], [1], 1, {"fp32": 200.0}, lambda: None)[0]
    assert only_fp32["ceiling"] == "int8" and only_fp32["limit"] is None
    both = run_forward({"int8": model}, [60], [1], 1, {"fp32": 200.0, "int8": 800.0}, lambda: None)[0]
    assert both["ceiling"] == "int8" and both["limit"] == 800.0
    one_number = run_forward({"int8": model}, [60], [1], 1, 200.0, lambda: None)[0]
    assert one_number["ceiling"] == "fp32" and one_number["limit"] == 200.0



def test_each_dtype_is_judged_against_its_own_ceiling():
    from vllm_sr_runtime.bench.flops import ceiling_for

    assert [ceiling_for(dtype) for dtype in ("fp32", "fp16", "bf16", "int8")] == ["fp32", "fp32", "fp32", "int8"]


def test_bench_row_labels_tell_two_artifacts_of_one_dtype_apart():
    """Two int8 forms benched side by side get one row each, named by folder; other labels are unchanged."""
    import pytest

    from vllm_sr_runtime.commands.bench_cmd import row_labels

    entries = [("exact", "fp32", None), ("max_speed", "fp32", "/a/A"), ("max_speed", "int8", "/a/token"), ("max_speed", "int8", "/b/tensor")]
    assert row_labels(entries, 3) == ["exact", "max_speed-fp32", "max_speed-int8@token", "max_speed-int8@tensor"]
    assert row_labels([("exact", "fp32", None), ("max_speed", "int8", "/a/A8")], 1) == ["exact", "max_speed"]
    assert row_labels([("shared_context", "fp32", "/a/A"), ("shared_context", "int8", "/a/B")], 2) == ["shared_context-onnx-fp32", "shared_context-onnx-int8"]
    with pytest.raises(ValueError, match="distinct folders"):
        row_labels([("max_speed", "int8", "/a/A8"), ("max_speed", "int8", "/b/A8")], 2)


@pytest.mark.parametrize("name", ["d2_qwen3", "d2_qwen3_5", "d3"])
def test_causal_attention_counts_each_query_against_the_keys_up_to_it(packages, name):
    """A causal model's full attention does T(T+1)/2 query-key pairs of work (what the CPU engine's blocks run), a
    non-causal one T^2; the rest of the count is the same."""
    from vllm_sr_runtime.bench.flops import forward_flops

    family = vllm_sr_runtime.load(packages[name], profile="exact").family
    config = family.backbone_config()
    layer_types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
    per_pair = 2 * 2 * config.num_attention_heads * config.head_dim * layer_types.count("full_attention")
    rows, tokens = 3, 101
    causal, full = forward_flops(config, rows, tokens, causal=True), forward_flops(config, rows, tokens)
    assert full - causal == rows * per_pair * (tokens * tokens - tokens * (tokens + 1) / 2)
    assert family.causal_attention == (name != "d3")  # the d3 fixture is non-causal, as the released packages


@pytest.mark.parametrize("name", ["d2_qwen3", "d2_qwen3_5", "d3"])
def test_a_pruned_last_layer_counts_its_per_row_work_at_the_readouts_rows(packages, name):
    """An exported graph's last layer (readout_rows) computes queries, output projection and MLP at the K rows the
    readout reads, each query against all T keys; keys/values and every earlier layer at all T rows."""
    from vllm_sr_runtime.bench.flops import batches_flops, forward_flops

    family = vllm_sr_runtime.load(packages[name], profile="exact").family
    config = family.backbone_config()
    last = (getattr(config, "layer_types", None) or ["full_attention"])[-1]
    assert last == "full_attention"  # the fixtures' last layer (Qwen3.5's pattern ends with one)
    hidden, heads, head_dim = config.hidden_size, config.num_attention_heads, config.head_dim
    q_width = heads * head_dim * (2 if config.model_type == "qwen3_5_text" else 1)
    per_row = 2 * (3 * hidden * config.intermediate_size + hidden * q_width + heads * head_dim * hidden)
    rows, tokens, kept = 2, 97, 5
    for causal in (False, True):
        full = forward_flops(config, rows, tokens, causal)
        pairs = tokens * (tokens + 1) / 2 if causal else tokens * tokens
        removed = per_row * (tokens - kept) + 2 * 2 * heads * head_dim * (pairs - kept * tokens)
        assert forward_flops(config, rows, tokens, causal, last_layer_rows=kept) == pytest.approx(full - rows * removed)
        assert forward_flops(config, rows, tokens, causal, last_layer_rows=tokens) == full
    plan = family.plan("a state to read", {"q": {"type": "choice", "instructions": "Which?", "criteria": {"a": "A", "b": "B", "c": None}}})
    (batch,) = plan.batches
    read = family.readout_row_count(batch.inputs)
    assert read == (4 if name.startswith("d2") else 1)  # three options' endpoints and the query token; d3: the last token
    width = batch.inputs["input_ids"].shape[1]
    assert batches_flops(family, [batch], readout_rows_only=True) == pytest.approx(
        forward_flops(config, 1, width, family.causal_attention, last_layer_rows=read)
    )
    assert batches_flops(family, [batch]) == pytest.approx(forward_flops(config, 1, width, family.causal_attention))


def test_bench_reads_the_last_layers_form_from_the_artifact():
    from types import SimpleNamespace

    from vllm_sr_runtime.bench.flops import computes_readout_rows_only

    def model(artifact):
        return SimpleNamespace(engine=SimpleNamespace(artifact=artifact))

    assert computes_readout_rows_only(model({"last_layer": "readout_rows"}))
    assert not computes_readout_rows_only(model({"last_layer": "full"}))
    assert not computes_readout_rows_only(model({"dtype": "fp32"}))  # an artifact from before the field: the full layer
    assert not computes_readout_rows_only(SimpleNamespace(engine=SimpleNamespace()))  # eager exact


def test_ort_profile_refuses_graphs_served_off_the_cpu():
    """The profiler opens graphs on ORT's CPU provider: an ONNX Runtime row on a GPU is refused before any timing
    (it would be profiled on the wrong machine), eager rows on a GPU and ONNX rows on the CPU are not."""
    from types import SimpleNamespace

    from vllm_sr_runtime.bench.ort_profile import refuse_off_cpu
    from vllm_sr_runtime.devices import Device

    def model(kind: str, index: int | None, graph: bool) -> SimpleNamespace:
        return SimpleNamespace(device=Device(kind, index), engine=SimpleNamespace(model_path="model.onnx") if graph else SimpleNamespace())

    refuse_off_cpu({"exact": model("cuda", 0, graph=False), "max_speed": model("cpu", None, graph=True)})
    # a shared_context graph is not profiled (its main graph is max_speed's), so its device is no reason to refuse
    refuse_off_cpu({"max_speed": model("cpu", None, graph=True), "shared_context-onnx-fp32": model("cuda", 0, graph=True)})
    with pytest.raises(ValueError) as refused:
        refuse_off_cpu({"exact": model("cuda", 0, graph=False), "max_speed-fp32": model("cpu", None, graph=True), "max_speed-int8": model("cuda", 1, graph=True)})
    message = str(refused.value)
    assert "max_speed-int8 on cuda:1" in message and "max_speed-fp32" not in message and "exact" not in message
    assert "--device cpu" in message
