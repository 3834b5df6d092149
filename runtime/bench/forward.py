"""Forward mode: every profile on the same requests in one process, profiles and lengths alternating so drift hits all alike."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from vllm_sr_runtime.bench.flops import GemmCeilings, batches_flops, ceiling_for, computes_readout_rows_only

FILLER = "The user asks about merging sorted lists, running time, and tests for edge cases. "


def request_of_length(model: Any, length: int, questions: int, images: Any = None, videos: Any = None) -> tuple[Any, dict, int]:
    """A state padded so each question's prompt is about `length` tokens (visual tokens included);
    returns (state, questions, tokens)."""
    # Distinct questions, as a real multi-question request has (identical ones would flatter shared_context).
    qs = {
        f"q{i}": {"type": "choice", "instructions": f"Which domain fits? Judge aspect {i} of the request.", "criteria": {"code": "Programming", "math": "Math", "other": None}}
        for i in range(questions)
    }
    words = FILLER.split()
    low, high = 0, length * 2

    def measure(state: str) -> int:
        plan = model.plan(state, {"q0": qs["q0"]}, images=images, videos=videos)
        return len(plan.batches[0].items[0].token_ids) if plan.batches else length + 1

    best = ("", qs, measure(""))  # the shortest prompt this template allows, when `length` is below it
    while low <= high:
        middle = (low + high) // 2
        state = " ".join(words[i % len(words)] for i in range(middle))
        tokens = measure(state)
        if tokens <= length:
            best = (state, qs, tokens)
            low = middle + 1
        else:
            high = middle - 1
    return best


def run_forward(
    models: dict[str, Any], lengths: list[int], questions: list[int], repeats: int, limits: GemmCeilings | dict[str, float] | float | None, progress, media: str = "none"
) -> list[dict]:
    """With `media`, every request also carries a synthetic image and/or video; its rows' FLOPs count the
    text tower only (the vision tower's work is on top). Each row's fraction is of the ceiling its dtype
    runs against (`limit`): `limits` as a `GemmCeilings` is sampled once per round of repeats, after the models, and
    every row is judged against the fastest sample of the whole run; fixed numbers ({"fp32": GFLOP/s, "int8":
    GOP/s}, or one number: fp32 for every row) are used as they are; None (no ceiling measured for the rows'
    device): `limit` and `fraction_of_limit` are None, and `ceiling` still names the one the row's dtype would take."""
    sampler = limits if isinstance(limits, GemmCeilings) else None
    one_number = isinstance(limits, (int, float))
    fixed = {"fp32": float(limits)} if one_number else (limits if isinstance(limits, dict) else {})
    from vllm_sr_runtime.bench.media import synthetic_media

    images, videos = synthetic_media(media)
    reference = next(iter(models.values()))
    # (length, question count, state, questions, tokens, padded tokens, FLOPs by model) of every row group
    shapes = []
    for length in lengths:
        for count in questions:
            state, qs, tokens = request_of_length(reference, length, count, images, videos)
            plan = reference.plan(state, qs, images=images, videos=videos)
            padded = sum(int(b.inputs["input_ids"].shape[0]) * int(b.inputs["input_ids"].shape[1]) for b in plan.batches)
            flops = {name: batches_flops(reference.family, plan.batches, computes_readout_rows_only(model)) for name, model in models.items()}
            shapes.append((length, count, state, qs, tokens, padded, flops))
    for _, _, state, qs, *_ in shapes:  # warm-up
        for model in models.values():
            model.ask(state, qs, images, videos)
    # Every round runs every shape on every model, so a host whose speed drifts over minutes moves the lengths'
    # costs (the per-token curve) alike, not only the profiles of one length.
    samples: dict[tuple[int, str], list[float]] = {(index, name): [] for index in range(len(shapes)) for name in models}
    for _ in range(repeats):
        for index, (_, _, state, qs, *_) in enumerate(shapes):
            for name, model in models.items():
                start = time.perf_counter()
                model.ask(state, qs, images, videos)
                samples[index, name].append(time.perf_counter() - start)
            if sampler:
                sampler.sample()
            progress()
    rows = []
    for index, (length, count, _, _, tokens, padded, flops) in enumerate(shapes):
        exact_median = float(np.median(samples[index, "exact"])) if "exact" in models else None
        for name in models:
            values = samples[index, name]
            median = float(np.median(values))
            rows.append(
                {
                    "profile": name, "media": media, "length": tokens, "target_length": length, "questions": count, "concurrency": 1,
                    "median_ms": median * 1000, "p90_ms": float(np.quantile(values, 0.9)) * 1000,
                    "min_ms": min(values) * 1000, "max_ms": max(values) * 1000, "per_question_ms": median * 1000 / count,
                    "rps": 1.0 / median, "ratio_to_exact": (exact_median / median) if exact_median else None,
                    "padded_tokens": padded, "gflop": flops[name] / 1e9, "gflops": flops[name] / median / 1e9,
                    "ceiling": ceiling_for(getattr(models[name], "dtype", "fp32") or "fp32"), "runs": len(values),
                }
            )  # fmt: skip
    limits = sampler.best() if sampler else fixed
    for row in rows:
        if one_number:  # the fp32 ceiling for every row; otherwise the label stays its dtype's, measured or not
            row["ceiling"] = "fp32"
        row["limit"] = limits.get(row["ceiling"])
        row["fraction_of_limit"] = row["gflops"] / row["limit"] if row["limit"] else None
    return rows
