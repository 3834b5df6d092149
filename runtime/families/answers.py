"""Answer objects from per-option probabilities: written once, used by every family and engine."""

from __future__ import annotations

import math
from typing import Any, Sequence

from vllm_sr_runtime.families.questions import Question
from vllm_sr_runtime.packages.files import canonical_text


def softmax(values: Sequence[float]) -> list[float]:
    """Max-subtracted softmax in double precision; -inf entries get probability 0."""
    top = max(values)
    exps = [math.exp(v - top) if v != -math.inf else 0.0 for v in values]
    total = sum(exps)
    return [e / total for e in exps]


def renormalize(values: Sequence[float]) -> list[float]:
    total = float(sum(values))
    if not total > 0 or not math.isfinite(total):
        raise ValueError("probabilities do not sum to a positive finite value")
    return [float(v) / total for v in values]


def confidence(probabilities: Sequence[float]) -> float:
    """1 - normalized entropy (natural log), clipped to [0, 1]; 1.0 for a single option."""
    count = len(probabilities)
    if count <= 1:
        return 1.0
    entropy = -sum(p * math.log(p) for p in probabilities if p > 0)
    return min(1.0, max(0.0, 1.0 - entropy / math.log(count)))


def argmax_first(probabilities: Sequence[float], tie_tolerance: float) -> int:
    """Index of the largest value; values within `tie_tolerance` of it resolve to the first."""
    top = max(probabilities)
    for index, value in enumerate(probabilities):
        if value >= top - tie_tolerance:
            return index
    raise AssertionError("unreachable")


def legend_text(level: Any) -> str:
    return level if isinstance(level, str) else canonical_text(level)


def build_answer(question: Question, probabilities: Sequence[float], *, tie_tolerance: float) -> dict:
    probs = [float(p) for p in probabilities]
    if len(probs) != len(question.options) or not all(math.isfinite(p) and p >= 0 for p in probs):
        raise ValueError("model output does not fit the question's options")
    if question.type == "noul":
        return {"type": "noul", "noul": probs[1]}
    if question.type == "choice":
        return {
            "type": "choice",
            "choice": question.keys[argmax_first(probs, tie_tolerance)],
            "probabilities": dict(zip(question.keys, probs)),
            "confidence": confidence(probs),
        }
    return {
        "type": "score",
        "score": sum(index * p for index, p in enumerate(probs)),
        "probabilities": {str(index): p for index, p in enumerate(probs)},
        "confidence": confidence(probs),
        "legend": {str(index): legend_text(level) for index, level in enumerate(question.levels)},
    }


def answer_distribution(answer: dict) -> list[float] | None:
    """An answer's probabilities in option order ([no, yes] for noul); None for a per-question error."""
    if "error" in answer:
        return None
    if answer["type"] == "noul":
        return [1.0 - answer["noul"], answer["noul"]]
    return list(answer["probabilities"].values())


# A changed decision whose reference top-two margin is below this is a near-tie: the reference itself barely chose.
NEAR_TIE_MARGIN = 0.01


def top_margin(distribution: Sequence[float]) -> float:
    """The gap between the two most probable options (1.0 for a single option)."""
    ordered = sorted(distribution, reverse=True)
    return ordered[0] - ordered[1] if len(ordered) > 1 else 1.0


def error_answer(question_type: str, error: str, message: str) -> dict:
    return {"type": question_type, "error": error, "message": message}
