"""vllm_sr_runtime.load / ask: answers, per-question errors, limits, devices, profiles."""

from __future__ import annotations

import math

import pytest

import vllm_sr_runtime
from vllm_sr_runtime.devices import parse_device
from vllm_sr_runtime.errors import InvalidRequest, UnsupportedDeviceError

STATE = "Write a Python function that merges two sorted lists and explain its running time."
FAMILIES = ["d2_qwen3_5", "d3"]


@pytest.mark.parametrize("name", FAMILIES)
def test_answers_have_the_contract_shape(models, name):
    answers = models(name).ask(
        STATE,
        {
            "domain": {"type": "choice", "instructions": "Domain?", "criteria": {"code": "Programming", "math": None, "law": "Legal"}},
            "reasoning": {"type": "noul", "instructions": "Needs reasoning?"},
            "difficulty": {"type": "score", "instructions": "How hard?", "criteria": ["easy", "medium", "hard"]},
        },
    )
    assert list(answers) == ["domain", "reasoning", "difficulty"]
    domain = answers["domain"]
    assert domain["type"] == "choice" and domain["choice"] in ("code", "math", "law")
    assert math.isclose(sum(domain["probabilities"].values()), 1.0, abs_tol=1e-12)
    assert domain["choice"] == max(domain["probabilities"], key=domain["probabilities"].get)
    assert 0.0 <= domain["confidence"] <= 1.0
    assert set(answers["reasoning"]) == {"type", "noul"} and 0 < answers["reasoning"]["noul"] < 1
    score = answers["difficulty"]
    assert 0 <= score["score"] <= 2 and score["legend"] == {"0": "easy", "1": "medium", "2": "hard"}
    assert math.isclose(score["score"], sum(int(k) * p for k, p in score["probabilities"].items()), abs_tol=1e-12)


@pytest.mark.parametrize("name", FAMILIES)
def test_invalid_question_is_reported_in_place_and_siblings_answered(models, name):
    model = models(name)
    good = {"type": "noul", "instructions": "Is it code?"}
    alone = model.ask(STATE, {"good": good})["good"]
    answers = model.ask(
        STATE,
        {
            "bad_noul": {"type": "noul", "criteria": {"maybe": "x"}},
            "good": good,
            "dup_levels": {"type": "score", "criteria": ["a", "a"]},
            "empty_level": {"type": "score", "criteria": ["a", ""]},
        },
    )
    assert answers["bad_noul"] == {"type": "noul", "error": "invalid_question", "message": answers["bad_noul"]["message"]}
    assert "false and true" in answers["bad_noul"]["message"]
    assert answers["dup_levels"]["error"] == "invalid_question" and "distinct" in answers["dup_levels"]["message"]
    assert answers["empty_level"]["error"] == "invalid_question"
    assert abs(answers["good"]["noul"] - alone["noul"]) <= 1e-6


@pytest.mark.parametrize("name", FAMILIES)
def test_max_length_exceeded_is_never_truncated(models, name):
    model = models(name)
    long_state = "word " * 5000
    answers = model.ask(long_state, {"q": {"type": "noul", "instructions": "ok?"}})
    assert answers["q"]["error"] == "max_length_exceeded"
    assert str(model.family.max_input_tokens) in answers["q"]["message"]


@pytest.mark.parametrize(
    "questions,message",
    [
        ({}, "non-empty"),
        ({f"q{i}": {"type": "noul"} for i in range(65)}, "at most 64"),
        ({"q": {"type": "choice", "criteria": {"only": None}}}, "2..255"),
        ({"q": {"type": "choice", "criteria": {f"k{i}": None for i in range(256)}}}, "2..255"),
        ({"q": {"type": "score", "criteria": ["one"]}}, "2..10"),
        ({"q": {"type": "score", "criteria": [str(i) for i in range(11)]}}, "2..10"),
        ({"q": {"type": "rank", "criteria": []}}, "type"),
        ({"q": {"type": "noul", "extra": 1}}, "unknown field"),
        ({"q": {"type": "choice", "criteria": ["a", "b"]}}, "criteria"),
    ],
)
def test_request_limits(models, questions, message):
    with pytest.raises(InvalidRequest, match=message):
        models("d3").ask(STATE, questions)


@pytest.mark.parametrize("state", [5, 2.5, True, ("a", "b")])
def test_a_state_the_server_refuses_is_refused_by_the_python_api_too(models, state):
    """ask(5, ...) answered with a prompt that held "5", where the server answers 400 for the same body."""
    with pytest.raises(InvalidRequest, match="'state' must be a string, object or array"):
        models("d3").ask(state, {"q": {"type": "noul"}})


def test_limits_at_the_edges_are_answered(models):
    model = models("d3")
    answers = model.ask(
        "s",
        {
            "wide": {"type": "choice", "criteria": {f"k{i}": None for i in range(255)}},
            "two": {"type": "choice", "criteria": {"a": None, "b": None}},
            "ten": {"type": "score", "criteria": [f"level {i}" for i in range(10)]},
        },
    )
    assert len(answers["wide"]["probabilities"]) == 255
    assert len(answers["ten"]["probabilities"]) == 10
    assert len(model.ask("s", {f"q{i}": {"type": "noul"} for i in range(64)})) == 64


def test_calibration_changes_answers_as_declared(models):
    plain, calibrated = models("d2_qwen3_5"), models("d2_calibrated")
    assert calibrated.family.package.temperature_by_type == {"choice": 0.8, "noul": 1.25, "score": 1.5}
    assert calibrated.family.package.score_offsets[3] == [0.25, 0.0, -0.25]
    answer = calibrated.ask(STATE, {"s": {"type": "score", "criteria": ["a", "b", "c"]}})["s"]
    assert math.isclose(sum(answer["probabilities"].values()), 1.0, abs_tol=1e-12)
    assert plain.family.package.temperature_by_type == {"choice": 1.0, "noul": 1.0, "score": 1.0}


def test_model_card_reports_what_runs(models):
    card = models("d3").card()
    assert card["family"] == "decision3" and card["profile"] == "exact" and card["engine"] == "torch"
    assert card["device"] == "cpu" and card["dtype"] == "fp32" and card["attention_mode"] == "noncausal_full_attention"
    assert len(card["model_sha256"]) == 64
    plugins = card["plugins"]  # what it runs on, and which distribution brings each
    assert {kind: row["name"] for kind, row in plugins.items()} == {"family": "decision3", "engine": "torch", "profile": "exact", "accelerator": "cpu"}
    assert {row["distribution"] for row in plugins.values()} == {"vllm-sr-runtime"}
    assert 4 * card["parameters"] <= card["weight_bytes"] <= 4 * card["parameters"] + 4096  # fp32 parameters and a few buffers


def test_load_errors_are_clear(packages):
    if parse_device("auto").kind == "cpu":
        with pytest.raises(UnsupportedDeviceError):
            vllm_sr_runtime.load(packages["d3"], device="cuda")
    with pytest.raises(InvalidRequest, match="unknown profile"):
        vllm_sr_runtime.load(packages["d3"], profile="warp_speed")
    # serve's --shared-min-tokens refuses these; the Python API took them, and a string failed only at ask()
    for bad in (-5, "10", 2.5, True):
        with pytest.raises(InvalidRequest, match="shared_min_tokens must be a whole number >= 0"):
            vllm_sr_runtime.load(packages["d3"], profile="shared_context", shared_min_tokens=bad, allow_approximate_shared_context=True)


def test_adapter_merge_matches_unmerged(packages, models):
    from vllm_sr_runtime.families.decision2.family import Decision2Family
    from vllm_sr_runtime.engines.torch import TorchEngine
    from vllm_sr_runtime.model import DecisionModel
    from vllm_sr_runtime.devices import parse_device as device

    unmerged = models("d2_lora")
    family = Decision2Family.open(unmerged.family.ref, base_path=unmerged.family.package.base.path)
    family.merge_adapter = True
    module = family.build_module(family.numerics("cpu"), device("cpu").torch_device)
    assert not any("lora_" in name for name, _ in module.named_parameters())
    merged = DecisionModel(family, TorchEngine(module, device("cpu").torch_device, family.input_names), "exact", device("cpu"), "fp32")
    questions = {"q": {"type": "choice", "criteria": {"a": "first", "b": "second", "c": "third"}}}
    left, right = unmerged.ask(STATE, questions)["q"], merged.ask(STATE, questions)["q"]
    for key in left["probabilities"]:
        assert abs(left["probabilities"][key] - right["probabilities"][key]) <= 1e-5


def test_ask_from_several_threads_answers_as_one_thread_does(models):
    """A service calls one loaded model from its request threads: each answer is the one a lone call gets (eager
    PyTorch; ONNX Runtime documents its sessions' run as safe to call concurrently)."""
    from concurrent.futures import ThreadPoolExecutor

    model = models("d3")
    questions = {
        "a": {"type": "noul", "instructions": "Is it code?"},
        "b": {"type": "choice", "instructions": "Which?", "criteria": {"x": "X", "y": None, "z": None}},
        "c": {"type": "score", "instructions": "How hard?", "criteria": ["1", "2", "3"]},
    }
    states = [f"state number {i} " * (1 + i % 7) for i in range(24)]
    alone = [model.ask(state, questions) for state in states]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda state: model.ask(state, questions), states))
    assert together == alone
