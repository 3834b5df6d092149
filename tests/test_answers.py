"""Answer rules on hand-computed values: softmax, ties, renormalization, confidence, legend, offsets."""

from __future__ import annotations

import math

import pytest

from vllm_sr_runtime.families.answers import confidence, softmax
from vllm_sr_runtime.families.decision2.readout import answer_from_logits
from vllm_sr_runtime.families.decision3.readout import answer_from_probabilities
from vllm_sr_runtime.families.questions import parse_questions

UNIT = {"choice": 1.0, "noul": 1.0, "score": 1.0}


def one(body):
    return parse_questions({"q": body})[0]


def test_softmax_hand_computed():
    probs = softmax([0.0, math.log(3.0)])
    assert probs == pytest.approx([0.25, 0.75], abs=1e-15)
    assert softmax([1000.0, 1000.0, float("-inf")]) == [0.5, 0.5, 0.0]


def test_confidence_is_one_minus_normalized_entropy():
    assert confidence([0.5, 0.5]) == pytest.approx(0.0, abs=1e-15)
    assert confidence([1.0, 0.0, 0.0]) == 1.0
    p = [0.7, 0.2, 0.1]
    entropy = -(0.7 * math.log(0.7) + 0.2 * math.log(0.2) + 0.1 * math.log(0.1))
    assert confidence(p) == pytest.approx(1 - entropy / math.log(3), abs=1e-15)


def test_d2_choice_ties_resolve_to_first_within_1e_8():
    question = one({"type": "choice", "instructions": "x", "criteria": {"a": None, "b": None, "c": None}})
    near = math.log(1 + 2e-8)  # b ahead of a by ~2e-8 relative: still a tie at 1e-8 absolute? p diff ~ 6.7e-9
    answer = answer_from_logits(question, [0.0, near, -5.0], temperature_by_type=UNIT, score_offsets={})
    assert answer["choice"] == "a"
    answer = answer_from_logits(question, [0.0, 0.01, -5.0], temperature_by_type=UNIT, score_offsets={})
    assert answer["choice"] == "b"
    assert list(answer) == ["type", "choice", "probabilities", "confidence"]


def test_d2_score_offsets_then_temperature():
    question = one({"type": "score", "instructions": "x", "criteria": ["lo", "mid", {"hi": 1}]})
    logits = [0.0, 1.0, 2.0]
    offsets = {3: [0.5, 0.0, -0.5]}
    answer = answer_from_logits(question, logits, temperature_by_type={**UNIT, "score": 2.0}, score_offsets=offsets)
    expected = softmax([(0.0 + 0.5) / 2, 1.0 / 2, (2.0 - 0.5) / 2])
    assert [answer["probabilities"][k] for k in ("0", "1", "2")] == pytest.approx(expected, abs=1e-15)
    assert answer["score"] == pytest.approx(expected[1] + 2 * expected[2], abs=1e-15)
    assert answer["legend"] == {"0": "lo", "1": "mid", "2": '{"hi":1}'}
    assert list(answer) == ["type", "score", "probabilities", "confidence", "legend"]
    other = one({"type": "score", "instructions": "x", "criteria": ["a", "b"]})
    plain = answer_from_logits(other, [0.0, 1.0], temperature_by_type=UNIT, score_offsets=offsets)
    assert plain["probabilities"]["1"] == pytest.approx(softmax([0.0, 1.0])[1], abs=1e-15)


def test_d2_noul_is_p_true_with_temperature():
    question = one({"type": "noul", "instructions": "x"})
    answer = answer_from_logits(question, [0.0, 1.0], temperature_by_type={**UNIT, "noul": 0.5}, score_offsets={})
    assert answer == {"type": "noul", "noul": pytest.approx(1 / (1 + math.exp(-2.0)), abs=1e-15)}


def test_d3_renormalizes_kept_probabilities_and_first_on_exact_ties():
    question = one({"type": "choice", "instructions": "x", "criteria": {"a": None, "b": None}})
    answer = answer_from_probabilities(question, [0.3, 0.3, 0.4])  # 0.4 belongs to an unused code
    assert answer["probabilities"] == {"a": 0.5, "b": 0.5} and answer["choice"] == "a"
    answer = answer_from_probabilities(question, [0.2, 0.2000001])
    assert answer["choice"] == "b"  # no tolerance in Decision 3.0
    score = one({"type": "score", "instructions": "x", "criteria": ["a", "b", "c"]})
    answer = answer_from_probabilities(score, [0.1, 0.1, 0.2])
    assert answer["score"] == pytest.approx(0.25 + 2 * 0.5, abs=1e-15)
