"""FLOP counts of a forward pass, and this machine's GEMM ceilings (fp32 and dynamic int8) measured with ONNX Runtime."""

from __future__ import annotations

import time

import numpy as np


def forward_flops(config, rows: int, tokens: int, causal: bool = False, last_layer_rows: int | None = None) -> float:
    """2 x (linear parameters) per token, plus attention's QK^T and AV on full-attention layers and the
    Gated DeltaNet recurrence (state update and read, ~6 x dk x dv per head and token). `causal`: each query
    attends to itself and the keys before it, T(T+1)/2 query-key pairs (the work a kernel that skips masked keys
    does, as the CPU engine's query blocks do), not T^2. `last_layer_rows`: the last layer computes its queries,
    output projection and MLP at that many rows per sequence only, each query against all T keys (an exported
    graph's form, families/readout_rows.py); None: the full forward, what `exact` does."""
    layer_types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
    last = len(layer_types) - 1
    per_sequence = sum(
        _layer_flops(config, kind, tokens, tokens if index != last or last_layer_rows is None else last_layer_rows, causal)
        for index, kind in enumerate(layer_types)
    )
    return rows * per_sequence


def _layer_flops(config, kind: str, tokens: int, selected: int, causal: bool) -> float:
    """One layer of one sequence of `tokens`, its per-row work (queries, output projection, MLP) at `selected` rows."""
    hidden, ffn = config.hidden_size, config.intermediate_size
    flops = 2 * 3 * hidden * ffn * selected
    if kind == "full_attention":
        heads, kv, head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        q_width = heads * head_dim * (2 if getattr(config, "model_type", "") == "qwen3_5_text" else 1)
        flops += 2 * hidden * 2 * kv * head_dim * tokens + 2 * (hidden * q_width + heads * head_dim * hidden) * selected
        if selected != tokens:
            pairs = selected * tokens  # the selected queries under a mask: every key is computed
        else:
            pairs = tokens * (tokens + 1) / 2 if causal else tokens * tokens
        return flops + 2 * 2 * pairs * heads * head_dim
    # Gated DeltaNet: the recurrence and its gate read every row; the token mixer's output is selected after it
    key_dim = config.linear_key_head_dim * config.linear_num_key_heads
    value_dim = config.linear_value_head_dim * config.linear_num_value_heads
    flops += 2 * (hidden * (2 * key_dim + 2 * value_dim + 2 * config.linear_num_value_heads) + value_dim * hidden) * tokens
    return flops + tokens * 6 * config.linear_num_value_heads * config.linear_key_head_dim * config.linear_value_head_dim


def batches_flops(family, batches, readout_rows_only: bool = False) -> float:
    """`forward_flops` of every pass of a family's plan (each batch's rows x its padded length); with
    `readout_rows_only`, a graph whose last layer computes only the rows the family's readout reads."""
    config, causal = family.backbone_config(), family.causal_attention
    total = 0.0
    for batch in batches:
        ids = batch.inputs["input_ids"]
        selected = family.readout_row_count(batch.inputs) if readout_rows_only else None
        total += forward_flops(config, int(ids.shape[0]), int(ids.shape[1]), causal, selected)
    return total


def computes_readout_rows_only(model) -> bool:
    """Whether a loaded model runs exported graphs whose last layer computes the readout's rows only (their
    artifact says `last_layer: readout_rows`; artifacts from before the field hold the full layer)."""
    artifact = getattr(getattr(model, "engine", None), "artifact", None) or {}
    return artifact.get("last_layer") == "readout_rows"


GEMM_SHAPE = (512, 1024, 3584)  # rows x hidden x FFN width: a 512-token prompt through a 0.8B-class MLP


def ceiling_for(dtype: str) -> str:
    """Which measured ceiling a row of this artifact dtype is judged against (dynamic int8 MatMuls for int8;
    fp32 MatMul otherwise: eager exact, fp32 and the CPU's fp16 graphs)."""
    return "int8" if dtype == "int8" else "fp32"


class GemmCeilings:
    """The machine's practical ceilings, same shape and threads: fp32 MatMul (GFLOP/s) and the dynamic int8 MatMul
    pattern the int8 artifacts use (GOP/s: activation quantized per tensor at run time, int8 weights per output
    channel; ORT fuses it into one kernel). Each `sample()` times both `runs` times and keeps the medians; the
    ceiling is the fastest sample (`best`). A benchmark samples between its rows: on a shared or power-managed host
    one short measurement can catch the GEMM at well under its speed (2-core VM, AMX host: 187-322 GFLOP/s
    within one run; after a pause it ran at ~200 for its first ~0.5 s, then ~320), and a ceiling read low lets
    rows pass it. Each sample therefore first runs the GEMM for `warm_seconds` untimed."""

    def __init__(self, m: int = GEMM_SHAPE[0], k: int = GEMM_SHAPE[1], n: int = GEMM_SHAPE[2], runs: int = 5, warm_seconds: float = 0.3):
        self.operations = 2.0 * m * k * n
        self.runs, self.warm_seconds = runs, warm_seconds
        self.sessions = {"fp32": _session(_fp32_graph(k, n)), "int8": _session(_int8_graph(k, n))}
        self.input = np.random.default_rng(1).standard_normal((m, k), dtype=np.float32)
        self.samples: dict[str, list[float]] = {name: [] for name in self.sessions}

    def sample(self) -> dict[str, float]:
        """One sample of each ceiling (G(FL)OP/s), kept in `samples` and returned."""
        taken = {}
        for name, session in self.sessions.items():
            started = time.perf_counter()
            while time.perf_counter() - started < self.warm_seconds:  # past the slow start a pause leaves (see above)
                session.run(None, {"x": self.input})
            times = []
            for _ in range(self.runs):
                start = time.perf_counter()
                session.run(None, {"x": self.input})
                times.append(time.perf_counter() - start)
            taken[name] = self.operations / float(np.median(times)) / 1e9
            self.samples[name].append(taken[name])
        return taken

    def best(self) -> dict[str, float]:
        return {name: max(values) for name, values in self.samples.items() if values}

    def spread(self) -> dict[str, float]:
        """Fastest sample over slowest, per ceiling: how much the host's GEMM speed moved during the run."""
        return {name: max(values) / min(values) for name, values in self.samples.items() if values}


def _fp32_graph(k: int, n: int):
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((k, n), dtype=np.float32), "w")
    return helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "gemm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", k])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])],
        initializer=[weight],
    )  # fmt: skip


def _int8_graph(k: int, n: int):
    from onnx import TensorProto, helper, numpy_helper

    weight = np.random.default_rng(0).standard_normal((k, n), dtype=np.float32)
    scale = np.abs(weight).max(axis=0) / 127.0
    quantized = np.clip(np.round(weight / scale), -127, 127).astype(np.int8)
    initializers = [
        numpy_helper.from_array(quantized, "w"), numpy_helper.from_array(np.zeros(n, dtype=np.int8), "w_zero"),
        numpy_helper.from_array(scale.astype(np.float32), "w_scale"),
    ]  # fmt: skip
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "x_scale", "x_zero"]),
        helper.make_node("MatMulInteger", ["xq", "w", "x_zero", "w_zero"], ["acc"]),
        helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["x_scale", "w_scale"], ["scales"]),
        helper.make_node("Mul", ["accf", "scales"], ["y"]),
    ]
    return helper.make_graph(
        nodes, "gemm_int8", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])], initializer=initializers,
    )  # fmt: skip


def _session(graph):
    import onnxruntime as ort
    from onnx import helper

    from vllm_sr_runtime.engines.onnxruntime import session_options

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return ort.InferenceSession(model.SerializeToString(), sess_options=session_options("cpu"), providers=["CPUExecutionProvider"])
