"""The export's smoke parity: the eager FP32 module and the fresh graph on a few fixed requests, gated per dtype."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch

from vllm_sr_runtime.export.phases import available_memory_bytes
from vllm_sr_runtime.accelerators import CPU
from vllm_sr_runtime.errors import ArtifactError
from vllm_sr_runtime.families.answers import NEAR_TIE_MARGIN, answer_distribution, top_margin
from vllm_sr_runtime.families.base import Family

# The export opens a CPU session and runs the smoke parity only for dtypes ORT's CPU provider runs.
CPU_SESSION_DTYPES = CPU.artifact_dtypes
# Per dtype: the largest |dp| allowed (None: not gated), and no decision changed where the reference chose by more
# than a near-tie (NEAR_TIE_MARGIN); fp32 and fp16 allow no changed decision at all.
SMOKE_TOLERANCE = {"fp32": 1e-4, "fp16": 1e-2, "int8": None}
SMOKE_MODES = ("auto", "on", "off")
# What an ORT CPU session holds beyond its weights file (arena, optimized graph), relative to that file.
SESSION_MEMORY_FACTOR = 1.25
SMOKE_STATE = "Write a Python function that merges two sorted lists and explain its running time."
SMOKE_QUESTIONS = {
    "domain": {"type": "choice", "instructions": "Which domain?", "criteria": {"code": "Programming", "math": "Mathematics", "law": None}},
    "reasoning": {"type": "noul", "instructions": "Does it need multi-step reasoning?"},
    "difficulty": {"type": "score", "instructions": "How hard is it?", "criteria": ["easy", "medium", "hard", "expert"]},
    "wide": {"type": "choice", "instructions": "Pick a label.", "criteria": {f"label{i}": f"description {i}" for i in range(40)}},
}

# One request of every question type (a padded batch of rows, a JSON state) and one single-row request (a text state).
SMOKE_REQUESTS = (({"user": "hi", "history": [1, 2, 3]}, SMOKE_QUESTIONS), (SMOKE_STATE, {"reasoning": SMOKE_QUESTIONS["reasoning"]}))


def plan_smoke(mode: str, family: Family, weights_file: Path, dtype: str = "fp32") -> dict:
    """Whether the smoke parity runs, and the memory it needs: the eager model in FP32 plus one ORT session
    over the artifact's weights (the export itself holds neither)."""
    eager = 4 * int(family.card().get("parameters") or 0)
    session = int(weights_file.stat().st_size * SESSION_MEMORY_FACTOR) if weights_file.exists() else 0
    available = available_memory_bytes()
    plan = {"mode": mode, "memory_needed_bytes": eager + session, "memory_available_bytes": available}
    if mode == "off":
        return {**plan, "ran": False, "reason": "--smoke off"}
    if dtype not in CPU_SESSION_DTYPES:
        return {**plan, "ran": False, "reason": f"ONNX Runtime's CPU provider has no {dtype} kernels; run `parity` on a CUDA device"}
    if mode == "auto" and available is not None and eager + session > available:
        needed = (eager + session) / 2**30
        return {**plan, "ran": False, "reason": f"the eager model and an ORT session need about {needed:.1f} GiB, {available / 2**30:.1f} GiB free"}
    return {**plan, "ran": True, "reason": "--smoke on" if mode == "on" else "fits in free memory"}


def check_smoke(smoke: dict, dtype: str, what: str = "smoke parity") -> None:
    if dtype not in SMOKE_TOLERANCE:
        return
    tolerance = SMOKE_TOLERANCE[dtype]
    changed = smoke["decisions_changed"] if tolerance is not None else smoke.get("decisions_changed_beyond_near_ties", smoke["decisions_changed"])
    if changed or (tolerance is not None and smoke["max_abs_diff"] > tolerance):
        limit = f"limit {tolerance}" if tolerance is not None else "not gated"
        raise ArtifactError(
            f"{what} failed: max |dp| {smoke['max_abs_diff']:.3g} ({limit}), {changed} decision(s) changed"
            + ("" if tolerance is not None else f" where exact chose by a margin of {NEAR_TIE_MARGIN} or more")
        )


def smoke_parity(family: Family, module: torch.nn.Module, engine: Any, profile: str = "exact", media: Any = None) -> dict:
    """Eager module vs the graph on the smoke questions: one request of every question type (a padded batch
    of rows, a JSON state) and one single-row request (a text state): max |dp| and decisions changed. Under
    shared_context both sides share the multi-question request's prefix; with `media` (prepared
    images/videos) every request reads them."""
    eager, graph = eager_model(family, module, profile), cpu_model(family, engine, profile)
    pairs = []
    for state, questions in SMOKE_REQUESTS:
        if media is None:
            left, right = eager.ask(state, questions), graph.ask(state, questions)
        else:
            left, right = (model.execute(family.plan(state, questions, media=media)).answers for model in (eager, graph))
        pairs += [(answer_distribution(answer), answer_distribution(right[key])) for key, answer in left.items()]
    return compare_answers(pairs)


def graph_parity(
    family: Family, engine: Any, requests: tuple[tuple[Any, dict], ...], reference: list[list[float] | None], media_requests: Iterable[tuple[Any, dict, Any]] = ()
) -> dict:  # fmt: skip
    """The graph vs answers the eager model already gave (`reference`: one per question, in the requests' order, then
    the `media_requests`' (state, questions, prepared media)), without running the eager model again."""
    graph = cpu_model(family, engine)
    # one plan at a time: a plan holds its request's prepared pixels
    plans = itertools.chain((family.plan(state, questions) for state, questions in requests), (family.plan(state, questions, media=media) for state, questions, media in media_requests))
    answers = [answer_distribution(answer) for plan in plans for answer in graph.execute(plan).answers.values()]
    if len(answers) != len(reference):
        raise ValueError(f"{len(reference)} reference answers for {len(answers)} questions")
    return compare_answers(zip(reference, answers))


def compare_answers(pairs: Iterable[tuple[list[float], list[float]]]) -> dict:
    """(reference, candidate) probability lists per question: the largest |dp|, decisions changed, and those
    changed where the reference chose by more than a near-tie."""
    worst, changed, beyond_ties, count = 0.0, 0, 0, 0
    for a, b in pairs:
        count += 1
        worst = max(worst, float(np.max(np.abs(np.array(a) - np.array(b)))))
        flipped = int(np.argmax(a) != np.argmax(b))
        changed += flipped
        beyond_ties += flipped and top_margin(a) >= NEAR_TIE_MARGIN
    return {"questions": count, "max_abs_diff": worst, "decisions_changed": changed, "decisions_changed_beyond_near_ties": beyond_ties}


def cpu_model(family: Family, engine: Any, profile: str = "exact"):
    """An engine (the fresh graph's session, or the eager module's) as a model that answers requests on CPU."""
    from vllm_sr_runtime.devices import parse_device
    from vllm_sr_runtime.model import DecisionModel

    return DecisionModel(family, engine, profile, parse_device("cpu"), "", shared_min_tokens=0)


def eager_model(family: Family, module: torch.nn.Module, profile: str = "exact"):
    """The eager FP32 module as a model that answers requests on CPU (the smoke parity's and golden answers' reference)."""
    from vllm_sr_runtime.devices import parse_device
    from vllm_sr_runtime.engines.torch import TorchEngine

    engine = TorchEngine(module, parse_device("cpu").torch_device, family.input_names, family.shared_input_names, family.media_modalities if family.reads_media else ())
    return cpu_model(family, engine, profile)


def golden_answers(family: Family, module: torch.nn.Module) -> dict:
    """The golden suite's exact answers, recorded in artifact.json and replayed while a server warms the artifact."""
    from vllm_sr_runtime.golden import record_golden

    return record_golden(eager_model(family, module).ask, "fp32")  # the exporter's reference is the FP32 module
