"""The memory budget for weights: each engine plugin's estimate before a load matches what its built engine holds,
a model whose estimate passes the budget is refused before its weights load, one whose measured weights pass it is
refused too, and serve's --memory-budget shares a worker's budget among its models."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import vllm_sr_runtime
from server_harness import Server
from vllm_sr_runtime.errors import MemoryBudgetExceeded
from vllm_sr_runtime.plugins import plugin
from vllm_sr_runtime.profiles import profile_named


@pytest.mark.parametrize(("name", "profile"), [("d3", "exact"), ("d2_qwen3", "exact"), ("d3", "max_speed"), ("d3", "shared_context")])
def test_the_estimate_before_a_load_is_what_the_engine_then_holds(packages, default_artifact, name: str, profile: str):
    artifact = default_artifact(name) if profile != "exact" else None
    model = vllm_sr_runtime.load(packages[name], profile=profile, artifact=artifact, allow_approximate_shared_context=True)
    estimate = plugin("engine", model.card()["engine"]).expected_weight_bytes(model.family, model.device, profile_named(profile), artifact=artifact)
    assert model.weight_bytes and abs(estimate - model.weight_bytes) <= 0.02 * model.weight_bytes, (estimate, model.weight_bytes)


def test_a_model_over_the_budget_is_refused_before_its_weights_load(packages, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("the engine was built")

    monkeypatch.setattr("vllm_sr_runtime.model.build_engine", never)
    with pytest.raises(MemoryBudgetExceeded, match="estimated before loading") as refused:
        vllm_sr_runtime.load(packages["d3"], memory_budget_bytes=100_000)
    assert refused.value.budget == 100_000 and refused.value.needed > 100_000


def test_weights_that_pass_the_budget_once_loaded_are_refused_too(packages, monkeypatch):
    model = vllm_sr_runtime.load(packages["d3"])
    held = model.weight_bytes
    # an engine plugin whose estimate is too low: the measured weights still hold the budget
    monkeypatch.setattr(plugin("engine", "torch"), "expected_weight_bytes", lambda *args, **kwargs: 1)
    with pytest.raises(MemoryBudgetExceeded, match="hold"):
        vllm_sr_runtime.load(packages["d3"], memory_budget_bytes=held - 1)
    assert vllm_sr_runtime.load(packages["d3"], memory_budget_bytes=held).weight_bytes == held


def test_serve_shares_a_workers_budget_among_its_models(packages, tmp_path: Path):
    held = vllm_sr_runtime.load(packages["d3"]).weight_bytes
    models = tmp_path / "models.yaml"
    models.write_text(f"models:\n  - model: {packages['d3']}\n    name: one\n  - model: {packages['d3']}\n    name: two\n")
    budget_gib = 1.5 * held / 1024**3  # room for one of the two
    server = Server(["--models", str(models), "--device", "cpu", "--memory-budget", f"{budget_gib:.9f}"], log=tmp_path / "log")
    try:
        server.wait(503)
        states = server.request("GET", "/health").json()["models"]
        assert sorted(state["status"] for state in states.values()) == ["failed", "ready"], states
        [reason] = [state["reason"] for state in states.values() if state["status"] == "failed"]
        assert reason.startswith("MemoryBudgetExceeded") and "estimated before loading" in reason, reason
        assert "after" not in reason  # never retried
        left = int(re.search(r"has [0-9.]+ GiB \(([0-9,]+) bytes\) left", reason).group(1).replace(",", ""))
        assert left == int(budget_gib * 1024**3) - held, reason  # the worker's budget less the model that loaded
    finally:
        server.stop()


def test_a_close_call_checks_exact_engine_counts_in_the_budget(packages, default_artifact):
    artifact = default_artifact("d3")
    fast = vllm_sr_runtime.load(packages["d3"], profile="max_speed", artifact=artifact).weight_bytes
    eager = vllm_sr_runtime.load(packages["d3"]).weight_bytes
    both = vllm_sr_runtime.load(packages["d3"], profile="max_speed", artifact=artifact, close_call_margin=0.1, memory_budget_bytes=fast + eager)
    assert both.weight_bytes == fast + eager and both.card()["weight_bytes"] == fast + eager
    with pytest.raises(MemoryBudgetExceeded, match="estimated before loading"):  # room for the fast engine alone
        vllm_sr_runtime.load(packages["d3"], profile="max_speed", artifact=artifact, close_call_margin=0.1, memory_budget_bytes=fast + eager // 2)


def test_a_stale_cached_artifact_is_estimated_as_the_export_that_replaces_it(packages, default_artifact, tmp_path: Path):
    """A vision package's cached artifact without media graphs (exported before artifacts held them) is exported
    again when max_speed loads: the estimate is that export's FP32 parameters, not the stale artifact's files."""
    import shutil

    from vllm_sr_runtime.engines.onnxruntime.builder import cached_artifact_dir

    model = vllm_sr_runtime.load(packages["d3_vision"])
    cache = tmp_path / "cache"
    stale = cached_artifact_dir(model.family, "contrib", "fp32", cache)
    shutil.copytree(default_artifact("d3"), stale)  # a verified artifact with no media graphs where the vision package's goes
    estimate = plugin("engine", "onnxruntime").expected_weight_bytes(model.family, model.device, profile_named("max_speed"), cache_dir=cache)
    assert estimate == 4 * model.family.parameter_count
