"""Runs a suite through two profiles of one model (same rows) and measures how far the answers move."""

from __future__ import annotations

from typing import Any

import numpy as np
from tqdm import tqdm

from vllm_sr_runtime.request_files import SuiteRequest
from vllm_sr_runtime.families.answers import NEAR_TIE_MARGIN, answer_distribution, top_margin
LENGTH_BUCKETS = ((0, 128), (128, 512), (512, 2048), (2048, 8192), (8192, 1 << 30))


def prompt_lengths(model: Any, request: SuiteRequest) -> dict[str, int]:
    plan = model.plan(request.state, request.questions, images=request.images, videos=request.videos)
    return {item.question.id: len(item.token_ids) for batch in plan.batches for item in batch.items}


CONCURRENT_REQUESTS = 8  # the batching profile answers the suite this many requests at a time, as concurrent clients


def _candidate_answers(candidate: Any, suite: list[SuiteRequest]):
    if candidate.profile != "batching":
        for request in suite:
            yield candidate.ask(request.state, request.questions, request.images, request.videos)
        return
    for start in range(0, len(suite), CONCURRENT_REQUESTS):
        chunk = suite[start : start + CONCURRENT_REQUESTS]
        yield from candidate.ask_many([(r.state, r.questions, r.images, r.videos) for r in chunk])


def compare(reference: Any, candidate: Any, suite: list[SuiteRequest], progress: bool = True) -> list[dict]:
    rows = []
    candidates = _candidate_answers(candidate, suite)
    for request in tqdm(suite, desc="parity", unit="request", disable=not progress):
        left = reference.ask(request.state, request.questions, request.images, request.videos)
        right = next(candidates)
        lengths = prompt_lengths(reference, request)
        for qid, answer in left.items():
            ref, cand = answer_distribution(answer), answer_distribution(right[qid])
            row = {"request": request.id, "question": qid, "type": answer["type"], "prompt_tokens": lengths.get(qid), "media": _media_kind(request)}
            if ref is None or cand is None:
                row.update(error=answer.get("error") or right[qid].get("error"), same_error=answer == right[qid])
                rows.append(row)
                continue
            row.update(
                options=len(ref),
                reference=ref,
                candidate=cand,
                max_abs_diff=float(np.max(np.abs(np.array(ref) - np.array(cand)))),
                decision_changed=int(np.argmax(ref)) != int(np.argmax(cand)),
                reference_margin=top_margin(ref),
            )
            rows.append(row)
    return rows


def _media_kind(request: SuiteRequest) -> str:
    kinds = [name for name, present in (("image", request.images), ("video", request.videos)) if present]
    return "+".join(kinds) or "text"


def _stats(values: list[float]) -> dict:
    if not values:
        return {"count": 0, "median": None, "p99": None, "max": None}
    array = np.array(values)
    return {"count": len(values), "median": float(np.median(array)), "p99": float(np.quantile(array, 0.99)), "max": float(array.max())}


def bucket(tokens: int) -> str:
    for low, high in LENGTH_BUCKETS:
        if low <= tokens < high:
            return f"{low}-{high}" if high < 1 << 30 else f">={low}"
    return "unknown"


def summarize(rows: list[dict]) -> dict:
    scored = [r for r in rows if "max_abs_diff" in r]
    changed = [r for r in scored if r["decision_changed"]]
    by_type = {kind: _stats([r["max_abs_diff"] for r in scored if r["type"] == kind]) for kind in ("choice", "noul", "score")}
    buckets: dict[str, list[float]] = {}
    for row in scored:
        buckets.setdefault(bucket(row["prompt_tokens"] or 0), []).append(row["max_abs_diff"])
    margins = [r["reference_margin"] for r in scored]
    return {
        "questions": len(rows),
        "compared": len(scored),
        "errors": len(rows) - len(scored),
        "errors_differ": sum(1 for r in rows if "error" in r and not r["same_error"]),
        "decisions_changed": len(changed),
        "changed_rate": len(changed) / len(scored) if scored else 0.0,
        "near_ties_changed": sum(1 for r in changed if r["reference_margin"] < NEAR_TIE_MARGIN),
        "near_tie_threshold": NEAR_TIE_MARGIN,
        "abs_diff": _stats([r["max_abs_diff"] for r in scored]),
        "abs_diff_by_type": by_type,
        "abs_diff_by_media": {
            kind: _stats([r["max_abs_diff"] for r in scored if r.get("media", "text") == kind])
            for kind in sorted({r.get("media", "text") for r in scored})
        },
        "abs_diff_by_length": {key: _stats(values) for key, values in sorted(buckets.items(), key=lambda kv: int(kv[0].lstrip(">=").split("-")[0]))},
        "reference_confidence": {"median_margin": float(np.median(margins)) if margins else None},
        "option_counts": sorted({r["options"] for r in scored}),
        "max_prompt_tokens": max((r["prompt_tokens"] or 0 for r in scored), default=0),
    }


# The gates `parity` applies when no flag sets them: fp32 within 1e-4 of the reference; lower precision (and a
# profile approximate by design) at most 1% of decisions changed. A flag replaces its gate (e.g. to loosen it).
FP32_MAX_ABS_DIFF = 1e-4
LOWER_PRECISION_MAX_CHANGED_RATE = 0.01


def default_gates(candidate_dtype: str, approximate: bool) -> dict[str, float | None]:
    if candidate_dtype == "fp32" and not approximate:
        return {"max_changed_rate": None, "max_abs_diff": FP32_MAX_ABS_DIFF}
    return {"max_changed_rate": LOWER_PRECISION_MAX_CHANGED_RATE, "max_abs_diff": None}


def gates(summary: dict, max_changed_rate: float | None, max_abs_diff: float | None) -> list[str]:
    failed = []
    if max_changed_rate is not None and summary["changed_rate"] > max_changed_rate:
        failed.append(f"--max-changed-rate {max_changed_rate}: {summary['decisions_changed']}/{summary['compared']} decisions changed ({summary['changed_rate']:.4f})")
    worst = summary["abs_diff"]["max"]
    if max_abs_diff is not None and worst is not None and worst > max_abs_diff:
        failed.append(f"--max-abs-diff {max_abs_diff}: largest |dp| is {worst:.3g}")
    if summary["errors_differ"]:
        failed.append(f"{summary['errors_differ']} question(s) errored differently between the profiles")
    return failed
