"""Close calls answered again by the reference: a fast engine's answer whose top-two margin is below a threshold is
replaced by the reference engine's (profile `exact`) answer for the same row.

Why it holds: a lower-precision graph can only turn a decision around where its own top-two margin is at most the
sum of what it moved the two options; every answer it gives with a margin of at least `margin` keeps exact's choice
wherever its error is below margin / 2, and every closer one comes from the reference itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from vllm_sr_runtime.errors import ArtifactError, InvalidRequest
from vllm_sr_runtime.families.answers import answer_distribution, top_margin
from vllm_sr_runtime.families.base import Batch, Family
from vllm_sr_runtime.interrupts import Interrupt


RECORDED = "artifact"  # a close_call_margin that says: the margin the artifact's int8 export measured


def check_margin(margin: float | str, profile: str) -> None:
    """Refuses a margin outside (0, 1] (or other than RECORDED) and profile exact (whose answers are the reference's
    already)."""
    if margin != RECORDED and (isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0.0 < margin <= 1.0):
        raise InvalidRequest(f"close_call_margin must be in (0, 1] or {RECORDED!r}, not {margin!r}")
    if profile == "exact":
        raise InvalidRequest("close_call_margin answers close calls again with profile exact: it applies to the other profiles")


def resolve_margin(margin: float | str, engine: Any, profile: str) -> float | None:
    """The margin to serve with: a number as given; RECORDED: the one the engine's artifact recorded when its int8
    export ran the finished graph on its calibration questions (2 x the largest probability it moved there,
    `int8.measured.calibration_parity.close_call_margin`; None when it moved none: nothing to answer again).
    Refused (ArtifactError) where the engine runs no artifact or its export measured no margin."""
    if margin != RECORDED:
        return float(margin)
    manifest = getattr(engine, "artifact", None)
    if manifest is None:
        raise InvalidRequest(
            f"close_call_margin {RECORDED!r} reads the margin an int8 artifact's export measured, and profile {profile} runs no "
            "artifact here: give the margin as a number"
        )
    measured = (manifest.get("int8") or {}).get("measured")
    checked = measured.get("calibration_parity") if measured else None
    if not checked:
        why = (
            f"it is {manifest.get('dtype')}" if manifest.get("dtype") != "int8"
            else "its export kept the fixed rule (--int8-fp32 rule) and measured nothing" if not measured
            else "its export ran no ONNX Runtime session on its calibration questions (smoke parity off or no room)"
        )
        raise ArtifactError(
            f"close_call_margin {RECORDED!r}: this artifact records no measured close-call margin ({why}); export it with "
            "--dtype int8 (the measured default, with its smoke phase) or give the margin as a number (`parity` on your "
            "own suite reports the largest move: 2 x its max |dp|)"
        )
    return checked["close_call_margin"]


def margin_for(max_abs_diff: float) -> float | None:
    """The margin below which every answer must come from the reference for no decision to change, given the
    largest probability move a candidate makes (None: it moves nothing). A changed decision needs the candidate's
    choice i over exact's j: p_c[i] - p_c[j] = (p_c[i] - p_e[i]) + (p_e[i] - p_e[j]) + (p_e[j] - p_c[j]) <= 2 x max |dp|,
    and the candidate's top-two margin is at most that."""
    return min(1.0, 2.0 * max_abs_diff) if max_abs_diff > 0 else None


def engine_outputs(engine: Any, batch: Batch, interrupt: Interrupt | None = None) -> np.ndarray:
    """The engine's output rows for a batch (the pass the batch's kind asks for). With `interrupt`: raises
    Interrupted instead of starting the pass once it is set, and an engine that offers `interruptible` (see
    vllm_sr_runtime.engines.Engine) also ends the pass in flight."""
    if interrupt is None:
        return pass_outputs(engine, batch)
    interrupt.check()
    watch = getattr(engine, "interruptible", None)
    if watch is None:
        return pass_outputs(engine, batch)
    with watch(interrupt):
        return pass_outputs(engine, batch)


def pass_outputs(engine: Any, batch: Batch) -> np.ndarray:
    if batch.media:
        return engine.forward_media(batch.inputs)
    if batch.shared:
        return engine.forward_shared(batch.inputs)
    return engine.forward(batch.inputs)


@dataclass
class CloseCallCheck:
    margin: float  # answers whose top-two probability margin is below this are answered again
    reference: Any  # the reference engine (the `exact` profile's, same family and device)
    reference_label: str  # its numerics (e.g. fp32)
    budget_tokens: int  # padded tokens per reference pass when close rows are packed anew
    margin_from: str = "given"  # "given", or RECORDED: what the artifact's export measured

    def is_close(self, answer: dict) -> bool:
        """A close call, or an answer the fast engine could not give (non-finite scores): the reference answers it."""
        if "error" in answer:
            return answer["error"] == "invalid_model_output"
        distribution = answer_distribution(answer)
        return distribution is not None and top_margin(distribution) < self.margin

    def confirm(
        self, family: Family, batch: Batch, answered: list[tuple[Any, dict]], answer: Callable[[Any, np.ndarray], dict], interrupt: Interrupt | None = None
    ) -> list[tuple[Any, dict, bool]]:  # fmt: skip
        """(item, answer, answered by the reference) for every row of a pass the fast engine answered (the reference's
        passes stop as the run's do once `interrupt` is set).

        Close rows are packed into full-prompt passes of their own (rows of a shared-prefix pass too: the reference
        reads each whole prompt); a media pass (one request's rows with its images or videos) is run again whole and
        only its close rows take the new answers."""
        close = [index for index, (_, given) in enumerate(answered) if self.is_close(given)]
        if not close:
            return [(item, given, False) for item, given in answered]
        again: dict[int, dict] = {}
        if batch.media:
            rows = engine_outputs(self.reference, batch, interrupt)
            again = {index: answer(answered[index][0], rows[index]) for index in close}
        else:
            position = {id(answered[index][0]): index for index in close}
            for sub in family.pack([answered[index][0] for index in close], self.budget_tokens):
                for item, row in zip(sub.items, engine_outputs(self.reference, sub, interrupt)):
                    again[position[id(item)]] = answer(item, row)
        return [(item, again.get(index, given), index in again) for index, (item, given) in enumerate(answered)]

    def describe(self) -> dict:
        return {"margin": self.margin, "margin_from": self.margin_from, "reference": f"exact ({self.reference_label})"}
