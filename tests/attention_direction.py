"""Helpers for the tests that must be able to tell causal from non-causal attention (Decision 3.0)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

TOLERANCE = 1e-4  # the most the tests allow between two engines or profiles of one model
FAR = 10 * TOLERANCE  # a causal reading of a non-causal package must move answers by more than this
STATES = ["Write a Python function that merges two sorted lists.", {"user": "hi", "history": [1, 2, 3]}]
QUESTIONS = {
    "domain": {"type": "choice", "instructions": "Which domain?", "criteria": {"code": "Programming", "math": "Mathematics", "law": None}},
    "reasoning": {"type": "noul", "instructions": "Does it need multi-step reasoning?"},
    "difficulty": {"type": "score", "instructions": "How hard is it?", "criteria": ["easy", "medium", "hard", "expert"]},
}


def probabilities(answers: dict) -> np.ndarray:
    values: list[float] = []
    for answer in answers.values():
        values += list(answer["probabilities"].values()) if "probabilities" in answer else [answer["noul"]]
    return np.array(values)


def max_difference(left, right, **ask) -> float:
    """The largest |dp| between two models over the same requests."""
    return max(float(np.abs(probabilities(left.ask(state, QUESTIONS, **ask)) - probabilities(right.ask(state, QUESTIONS, **ask))).max()) for state in STATES)


def full_attention_layers(package: Path) -> list[int]:
    config = json.loads((Path(package) / "config.json").read_text())["text_config"]
    return [index for index, kind in enumerate(config["layer_types"]) if kind == "full_attention"]
