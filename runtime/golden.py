"""Golden answers: a fixed suite of requests whose `exact` answers are recorded (by `export` in artifact.json,
by `fixture` next to a package) and replayed while a served model warms, so a model that answers wrongly on
this device (a kernel, a provider, a damaged artifact) fails readiness instead of serving."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from vllm_sr_runtime.errors import VerificationError
from vllm_sr_runtime.families.answers import answer_distribution, top_margin
from vllm_sr_runtime.packages.files import GOLDEN_FILE, sha256_file

GOLDEN_SUITE = "golden-v1"
GOLDEN_REQUESTS: tuple[tuple[Any, dict], ...] = (
    (
        "Write a Python function that merges two sorted lists and explain its running time.",
        {
            "domain": {"type": "choice", "instructions": "Which domain?", "criteria": {"code": "Programming", "math": None, "law": "Legal"}},
            "reasoning": {"type": "noul", "instructions": "Does it need multi-step reasoning?"},
            "difficulty": {"type": "score", "instructions": "How hard is it?", "criteria": ["easy", "medium", "hard"]},
        },
    ),
    (
        {"user": "Prove that the square root of two is irrational.", "history": ["hi", "hello"]},
        {"math": {"type": "noul", "instructions": "Is this mathematics?"}},
    ),
    (
        "Tell me a short joke about databases.",
        {"tone": {"type": "choice", "criteria": {"serious": None, "playful": "light-hearted", "hostile": None, "neutral": None}}},
    ),
)
# Largest |dp| a replay may differ from the recorded exact answers. In the numerics the record was made in: fp32
# on CPU follows exact closely; a GPU's kernels (TF32 off, other reduction orders) are held to the looser bound.
GOLDEN_TOLERANCE = {"cpu": 1e-3, "gpu": 2e-2}
# A record made in other numerics than the replay's (the FP32 answers `fixture` and `export` record on a CPU,
# replayed by a GPU's BF16 `exact` or an int8 artifact) can only catch a gross error: on an H200, BF16 `exact`
# moved the golden answers of tiny synthetic packages by up to 0.251 (Decision 2.0 Qwen3.5; Decision 3.0 0.049,
# Decision 2.0 Qwen3 0.035); CPU-emulated BF16 over eight packages (three seeds of D3 and D2 Qwen3.5, two of D2
# Qwen3) by up to 0.28, the same D2 Qwen3.5 answer (its Gated DeltaNet layers' BF16 projections: in FP32 it moves
# 0.02), flipping only a near-tie (margin 0.001). fp16 keeps 10 mantissa bits and is held to the GPU bound.
CROSS_NUMERICS_TOLERANCE = 0.35
RECORD_NUMERICS = "fp32"  # what a record without a "numerics" field was made in (every writer's, before it said)


def golden_tolerance(device_kind: str, running: str, recorded: str = RECORD_NUMERICS) -> float:
    """The |dp| bound for a replay in `running` numerics (a model's dtype label) of a record made in `recorded`."""
    if running == recorded:
        return GOLDEN_TOLERANCE["cpu"] if device_kind == "cpu" else GOLDEN_TOLERANCE["gpu"]
    if running in ("fp32", "fp16"):
        return GOLDEN_TOLERANCE["gpu"]
    return CROSS_NUMERICS_TOLERANCE


def record_golden(ask: Callable[[Any, dict], dict], numerics: str) -> dict:
    """The suite's answers from `ask(state, questions)` (an exact model in `numerics`, its dtype label), as
    artifact.json and packages keep them."""
    answers = [ask(state, questions) for state, questions in GOLDEN_REQUESTS]
    return {"suite": GOLDEN_SUITE, "profile": "exact", "numerics": numerics, "answers": answers}


@dataclass(frozen=True)
class GoldenCheck:
    source: str  # "artifact" or "package"
    questions: int
    max_abs_diff: float
    decisions_changed: int  # beyond near-ties: where the recorded margin was at least the tolerance
    tolerance: float
    numerics: str = ""  # "<recorded> record, <running> replay"

    @property
    def passed(self) -> bool:
        return self.decisions_changed == 0 and self.max_abs_diff <= self.tolerance

    def as_dict(self) -> dict:
        return {
            "source": self.source, "questions": self.questions, "max_abs_diff": self.max_abs_diff,
            "decisions_changed": self.decisions_changed, "tolerance": self.tolerance, "numerics": self.numerics, "passed": self.passed,
        }  # fmt: skip


def replay_golden(recorded: dict, ask: Callable[[Any, dict], dict], source: str, device_kind: str, running: str) -> GoldenCheck:
    """Ask the suite again and compare with `recorded` answer by answer, within the tolerance for a replay in
    `running` numerics on `device_kind` of a record made in the record's numerics. A decision that changes
    where the record's own top-two margin is below that tolerance is a near-tie the allowed |dp| can close."""
    made_in = recorded.get("numerics", RECORD_NUMERICS)
    tolerance = golden_tolerance(device_kind, running, made_in)
    if recorded.get("suite") != GOLDEN_SUITE or len(recorded.get("answers", ())) != len(GOLDEN_REQUESTS):
        raise VerificationError(f"{source} golden answers are of suite {recorded.get('suite')!r}; this runtime replays {GOLDEN_SUITE}")
    worst, changed, count = 0.0, 0, 0
    for (state, questions), expected in zip(GOLDEN_REQUESTS, recorded["answers"]):
        got = ask(state, questions)
        for key, answer in expected.items():
            count += 1
            now = got.get(key, {"error": "missing"})
            if "error" in answer or "error" in now or answer.get("probabilities", {}).keys() != now.get("probabilities", {}).keys():
                changed += int(answer != now)
                continue
            if "probabilities" in answer:  # JSON files may hold the options in another order (sorted keys)
                answer = {**answer, "probabilities": {option: answer["probabilities"][option] for option in now["probabilities"]}}
            a, b = np.array(answer_distribution(answer)), np.array(answer_distribution(now))
            worst = max(worst, float(np.max(np.abs(a - b))))
            changed += int(np.argmax(a) != np.argmax(b) and top_margin(a) >= tolerance)
    return GoldenCheck(source, count, worst, changed, tolerance, f"{made_in} record, {running} replay")


def package_golden(root: Path, model_sha256: str, pinned_sha256: str | None = None) -> dict | None:
    """A package's golden answers (`golden_answers.json` beside its files), only when they were recorded for
    this package's identity (and, when its pinned release publishes their hash, only that file)."""
    path = Path(root) / GOLDEN_FILE
    if not path.is_file():
        return None
    if pinned_sha256:
        if not sha256_file(path).startswith(pinned_sha256):
            raise VerificationError(f"{path} is not the golden answers file published for this release (sha256 {pinned_sha256})")
    recorded = json.loads(path.read_text())
    if recorded.get("model_sha256") != model_sha256:
        raise VerificationError(f"{path} was recorded for package {recorded.get('model_sha256')}, not this one ({model_sha256})")
    return recorded


def verify_golden(model) -> dict:
    """Replay every golden record the model has (its artifact's, its package's) on its own device and profile;
    returns what the model card shows, raises VerificationError when an answer is off."""
    ref = model.family.ref
    records = []
    if model.engine.golden:
        records.append(("artifact", model.engine.golden))
    package = package_golden(ref.path, model.family.package.model_sha256, ref.pinned.golden if ref.pinned else None)
    if package:
        records.append(("package", package))
    if not records:
        return {"status": "unverified", "reason": "neither the package nor the artifact carries golden answers"}
    if model.approximate_by_design:
        return {"status": "skipped", "reason": "shared_context is approximate for this model: it is not held to exact's answers"}
    checks = [replay_golden(recorded, model.ask, source, model.device.kind, model.dtype) for source, recorded in records]
    for check in checks:
        if not check.passed:
            raise VerificationError(
                f"golden answers ({check.source}) not reproduced on {model.device.name} with profile {model.profile}: "
                f"max |dp| {check.max_abs_diff:.3g} (tolerance {check.tolerance:g}), {check.decisions_changed} of "
                f"{check.questions} decisions changed"
            )
    return {"status": "verified", "checks": [check.as_dict() for check in checks]}


def write_package_golden(root: Path, ask: Callable[[Any, dict], dict], numerics: str, model_sha256: str) -> Path:
    """Record the suite's exact answers beside a package (`fixture` does, for every package it writes)."""
    path = Path(root) / GOLDEN_FILE
    path.write_text(json.dumps({**record_golden(ask, numerics), "model_sha256": model_sha256}, indent=1, sort_keys=True) + "\n")
    return path
