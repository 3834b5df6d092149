"""A loaded decision model: one request path (validate, render, forward, answer) for every profile."""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from vllm_sr_runtime.close_calls import RECORDED, CloseCallCheck, check_margin, engine_outputs, resolve_margin
from vllm_sr_runtime.defaults import DEFAULT_BATCH_TOKENS, DEFAULT_MIN_SAVED_TOKENS
from vllm_sr_runtime.devices import Device, parse_device
from vllm_sr_runtime.errors import InvalidRequest
from vllm_sr_runtime.families import open_family
from vllm_sr_runtime.families.answers import error_answer
from vllm_sr_runtime.families.base import Family, Plan
from vllm_sr_runtime.families.questions import check_state
from vllm_sr_runtime.interrupts import Interrupt
from vllm_sr_runtime.packages.licence import check_licence
from vllm_sr_runtime.packages.resolve import resolve_package
from vllm_sr_runtime.profiles import build_engine, profile_named, runs_exact_engine
from vllm_sr_runtime.weight_budget import check_weight_budget, estimate_weight_bytes


@dataclass
class Response:
    answers: dict[str, dict]
    input_tokens: int
    cache_hits: int = 0  # questions answered from the result cache
    cache_misses: int = 0  # questions computed while the cache was on
    reanswered: int = 0  # close calls the reference answered again (a model loaded with close_call_margin)


def approximate_by_design(profile: str, family: Family) -> bool:
    """Whether the profile shares a prefix the family's attention reads both ways: answers differ from exact by design."""
    return profile_named(profile).shares_prefix and not family.shared_context_exact


class DecisionModel:
    def __init__(
        self, family: Family, engine: Any, profile: str, device: Device, dtype: str, *, shared_min_tokens: int = DEFAULT_MIN_SAVED_TOKENS,
        engine_plugin: str | None = None,
    ):  # fmt: skip
        self.family = family
        self.engine = engine
        self.engine_plugin = engine_plugin or engine.name  # the engine plugin that built `engine`
        self.profile = profile
        self.device = device
        self.dtype = dtype
        self.shared_min_tokens = shared_min_tokens  # shared_context: (questions - 1) x prefix tokens it must save
        self.shared_questions = 0  # questions answered through a shared pass (parity and metrics report it)
        self.result_cache = None  # a ResultCache (the server sets one per loaded model; None: every row is computed)
        self.golden: dict = {"status": "unchecked"}  # what replaying the golden answers found (vllm_sr_runtime.golden.verify_golden)
        self.close_calls: CloseCallCheck | None = None  # answers with a top-two margin below its margin come from the reference
        self.licence_accepted: list[str] = []  # the restricted licences (SPDX ids) its use rests on, which the caller accepted
        self.answered_questions = 0  # rows computed (not from the result cache)
        self.reanswered_questions = 0  # of those, close calls the reference answered again

    @property
    def profile_spec(self):
        """The Profile object this model was loaded under."""
        return profile_named(self.profile)

    @property
    def approximate_by_design(self) -> bool:
        return approximate_by_design(self.profile, self.family)

    @property
    def reads_media(self) -> bool:
        return bool(getattr(self.engine, "reads_media", False))

    @property
    def name(self) -> str:
        return self.family.model_name

    def ask(self, state: Any, questions: Any, images: list[str] | None = None, videos: list[str] | None = None) -> dict[str, dict]:
        """Answers keyed by question id in request order (per-question errors in place). Decision 3.0 models
        with a vision tower also read `images` and `videos` (base64 data URLs)."""
        return self.respond(state, questions, images, videos).answers

    def respond(self, state: Any, questions: Any, images: Any = None, videos: Any = None) -> Response:
        return self.execute(self.plan(state, questions, images=images, videos=videos))

    def plan(self, state: Any, questions: Any, profile: str | None = None, images: Any = None, videos: Any = None) -> Plan:
        """Validate, decode media and render (request thread): raises InvalidRequest / RequestTooLarge for
        request-level errors. Under shared_context the request's questions share one prefix pass when that
        saves enough work."""
        if (images or videos) and self.family.reads_media and not self.reads_media:
            raise InvalidRequest(
                f"profile {self.profile} of model {self.name} runs on an {self.engine.name} artifact without a vision graph, so it "
                "cannot read images or videos; re-export the artifact with this version (it adds vision.onnx), or send media to profile exact"
            )
        check_state(state)
        plan = self.family.plan(state, questions, images=images, videos=videos)
        plan.profile = profile or self.profile
        if profile_named(plan.profile).shares_prefix:
            chosen = plan.profile
            plan = self.family.share(plan, self.shared_min_tokens)
            plan.profile = chosen
        return plan

    def execute(self, plan: Plan, on_batch=None, interrupt: Interrupt | None = None) -> Response:
        """Run the plan's passes on the engine (the device owner's thread) and assemble the answers."""
        return self.execute_many([plan], on_batch=on_batch, merge=False, interrupt=interrupt)[0]

    def execute_many(
        self, plans: list[Plan], budget_tokens: int = DEFAULT_BATCH_TOKENS, on_batch=None, merge: bool = True, interrupt: Interrupt | None = None
    ) -> list[Response]:  # fmt: skip
        """Each plan's passes; with `merge` (profile `batching`) the rows of several requests share passes,
        sorted by length and packed under a padded-token budget. Each request gets its own answers back.
        Once `interrupt` is set (from another thread), raises Interrupted: no further pass starts, and an engine
        that can ends the pass in flight."""
        owners = {id(item): index for index, plan in enumerate(plans) for batch in plan.batches for item in batch.items}
        if merge:
            items = [item for plan in plans for batch in plan.batches if not batch.media for item in batch.items]
            own = [batch for plan in plans for batch in plan.batches if batch.media]  # media rows never mix requests
            batches = own + (self.family.pack(items, budget_tokens) if items else [])
        else:
            batches = [batch for plan in plans for batch in plan.batches]
        produced = [dict(plan.errors) for plan in plans]
        hits, misses, reanswered = [0] * len(plans), [0] * len(plans), [0] * len(plans)
        profile = (plans[0].profile if plans else None) or self.profile
        for item, answer, cached, by_reference in self._run_passes(batches, on_batch, profile, interrupt):
            owner = owners[id(item)]
            produced[owner][item.question.id] = answer
            if cached is not None:
                (hits if cached else misses)[owner] += 1
            reanswered[owner] += by_reference
        return [
            Response(
                answers={q.id: produced[index][q.id] for q in plan.questions}, input_tokens=plan.input_tokens,
                cache_hits=hits[index], cache_misses=misses[index], reanswered=reanswered[index],
            )  # fmt: skip
            for index, plan in enumerate(plans)
        ]

    def _run_passes(self, batches, on_batch, profile: str, interrupt: Interrupt | None):
        """(item, answer, from the cache: True | False | None when no cache applies, answered again by the
        reference) for every row. With a
        result cache, a pass whose rows are all cached is not run; a pass with any new row runs whole, so every
        computed answer comes from the pass it would have had anyway."""
        cache = self.result_cache
        for batch in batches:
            keys = None
            if cache is not None and not batch.media:
                keys = [cache.key(self, profile, item) for item in batch.items]
                cached = [cache.get(key) for key in keys]
                if all(answer is not None for answer in cached):
                    cache.record(hits=len(cached))
                    for item, answer in zip(batch.items, cached):
                        yield item, answer, True, False
                    continue
                cache.record(misses=len(keys))
            for index, (item, answer, by_reference) in enumerate(self._run_pass(batch, on_batch, interrupt)):
                if keys is not None:
                    cache.put(keys[index], answer)
                yield item, answer, (False if keys is not None else None), by_reference

    def _run_pass(self, batch, on_batch, interrupt: Interrupt | None) -> list[tuple[Any, dict, bool]]:
        outputs = engine_outputs(self.engine, batch, interrupt)
        if batch.shared:
            self.shared_questions += len(batch.items)
        answered = [(item, self._answer(item, row)) for item, row in zip(batch.items, outputs)]
        confirmed = [(item, answer, False) for item, answer in answered]
        if self.close_calls is not None:
            confirmed = self.close_calls.confirm(self.family, batch, answered, self._answer, interrupt)
            self.reanswered_questions += sum(by_reference for _, _, by_reference in confirmed)
        self.answered_questions += len(confirmed)
        if on_batch is not None:
            on_batch(batch)
        return confirmed

    def ask_many(self, requests: list[tuple], budget_tokens: int = DEFAULT_BATCH_TOKENS) -> list[dict[str, dict]]:
        """Several requests answered together, as concurrent requests are under `batching` (rows that read media
        stay with their own request). Each is a tuple (state, questions[, images[, videos]]) or a dict with those
        keys."""
        plans = [self.plan(**request_fields(index, request)) for index, request in enumerate(requests)]
        return [response.answers for response in self.execute_many(plans, budget_tokens)]

    def _answer(self, item: Any, row: np.ndarray) -> dict:
        question = item.question
        if np.isnan(row[: len(question.options)]).any():
            return error_answer(question.type, "invalid_model_output", "the model produced NaN scores")
        try:
            answer = self.family.answer(item, row)
        except ValueError as exc:
            return error_answer(question.type, "invalid_model_output", str(exc))
        if any(isinstance(v, float) and not math.isfinite(v) for v in _floats(answer)):
            return error_answer(question.type, "invalid_model_output", "the model produced a non-finite probability")
        return answer

    def card(self) -> dict:
        ref = self.family.ref
        card = {
            "id": self.name,
            "repo": ref.repo_id,
            "revision": ref.revision,
            "source": ref.source,
            "path": str(ref.path),
            "profile": self.profile,
            "engine": self.engine.name,
            "accelerator": self.device.kind,
            "licence_accepted": self.licence_accepted,
            "device": self.device.name,
            "dtype": self.dtype,
            "golden": self.golden["status"],
            "weight_bytes": self.weight_bytes,
            "close_calls": self.close_calls.describe() if self.close_calls else None,
            "plugins": self.plugins(),
        }
        card.update(self.family.card())
        return card

    @functools.cached_property
    def weight_bytes(self) -> int | None:
        """What its engines say their weights take once loaded: the profile's, and a close-call check's reference
        (None where the profile's engine does not say); measured once, since card() runs for every request that asks
        for its meta."""
        engines = [self.engine, *([self.close_calls.reference] if self.close_calls and self.close_calls.reference is not self.engine else [])]
        reports = [getattr(engine, "weight_bytes", None) for engine in engines]
        if reports[0] is None:
            return None
        return sum(report() for report in reports if report is not None)

    def close_call_margin(self, margin: float | str) -> float | None:
        """The margin `confirm_close_calls` would serve with: `margin` itself, or for "artifact" the one this
        model's artifact recorded (None: its int8 graph moved no calibration answer, so there is nothing to confirm)."""
        check_margin(margin, self.profile)
        return resolve_margin(margin, self.engine, self.profile)

    def confirm_close_calls(self, margin: float | str, reference: Callable[[], tuple[Any, str]]) -> None:
        """From now on, every answer whose top-two margin is below `margin` is answered again by the engine
        `reference()` returns with its numerics label (an engine of the `exact` profile for this model's family and
        device; called only once the margin is known to need it, so a refused margin loads nothing). `margin`
        "artifact": the margin the artifact's int8 export measured (see close_calls.resolve_margin)."""
        value = self.close_call_margin(margin)
        if value is not None:
            engine, label = reference()
            self.close_calls = CloseCallCheck(value, engine, label, DEFAULT_BATCH_TOKENS, RECORDED if margin == RECORDED else "given")

    def plugins(self) -> dict[str, dict]:
        """The plugins this model runs on, each with the distribution that registers it."""
        from vllm_sr_runtime.plugins import installed

        used = {"family": self.family.name, "engine": self.engine_plugin, "profile": self.profile, "accelerator": self.device.kind}
        found = {}
        for kind, name in used.items():
            plugins = installed(kind)
            found[kind] = plugins.descriptor(name).as_dict() if name in plugins.loaded else {"name": name, "kind": kind, "distribution": None}
        return found


def _floats(answer: dict):
    for value in answer.values():
        if isinstance(value, dict):
            yield from value.values()
        else:
            yield value


REQUEST_FIELDS = ("state", "questions", "images", "videos")


def request_fields(index: int, request: Any) -> dict[str, Any]:
    """One ask_many request as plan()'s keyword arguments."""
    if isinstance(request, dict):
        unknown = sorted(set(request) - set(REQUEST_FIELDS))
        missing = [name for name in REQUEST_FIELDS[:2] if name not in request]
        problems = ([f"unknown key(s) {', '.join(map(str, unknown))}"] if unknown else []) + ([f"missing {', '.join(missing)}"] if missing else [])
        if problems:
            raise InvalidRequest(f"requests[{index}]: {'; '.join(problems)} (keys: {', '.join(REQUEST_FIELDS)})")
        return dict(request)
    if isinstance(request, (tuple, list)) and 2 <= len(request) <= len(REQUEST_FIELDS):
        return dict(zip(REQUEST_FIELDS, request))
    given = f"a {type(request).__name__} of {len(request)}" if isinstance(request, (tuple, list)) else f"a {type(request).__name__}"
    raise InvalidRequest(f"requests[{index}] must be (state, questions[, images[, videos]]) or a dict with those keys, not {given}")


def load(
    package: str | os.PathLike,
    device: str = "cpu",
    profile: str = "exact",
    *,
    revision: str | None = None,
    artifact: str | os.PathLike | None = None,
    cache_dir: str | os.PathLike | None = None,
    offline: bool | None = None,
    base_path: str | os.PathLike | None = None,
    shared_min_tokens: int = DEFAULT_MIN_SAVED_TOKENS,
    close_call_margin: float | str | None = None,
    allow_approximate_shared_context: bool = False,
    accept_licences: Iterable[str] = (),
    memory_budget_bytes: int | None = None,
) -> DecisionModel:
    """Resolve and verify a package, build the profile's engine, return a model with `ask(state, questions)`.

    `close_call_margin` (profiles other than exact): every answer whose top-two probability margin is below it is
    answered again by the `exact` profile's engine, loaded beside the profile's (its memory too; a profile that runs
    exact's own eager engine, without an artifact, answers them on that engine instead); "artifact" takes the
    margin the artifact's int8 export measured on its calibration questions (refused where it recorded none).
    `allow_approximate_shared_context`: load profile shared_context for a family whose attention reads the prompt
    both ways (Decision 3.0's non-causal packages), whose answers then differ from exact by design; refused otherwise.
    `accept_licences`: SPDX ids of non-commercial or research licences the caller may use; a package whose
    licence (or a component's) is one of those and not accepted is refused (LicenceRefused).
    `memory_budget_bytes`: the most its weights may take; refused (MemoryBudgetExceeded) before they load when the
    engine plugin's estimate passes it, and released when what the built engine holds does."""
    if close_call_margin is not None:
        check_margin(close_call_margin, profile)  # before anything loads
    if isinstance(shared_min_tokens, bool) or not isinstance(shared_min_tokens, int) or shared_min_tokens < 0:
        raise InvalidRequest(f"shared_min_tokens must be a whole number >= 0, not {shared_min_tokens!r}")
    target = parse_device(device)
    ref = resolve_package(package, revision, cache_dir=cache_dir, offline=offline)
    family = open_family(ref, base_path=Path(base_path) if base_path else None, cache_dir=cache_dir, offline=offline)
    licence_accepted = check_licence(family.licence, accept_licences, str(ref.path))
    if approximate_by_design(profile, family) and not allow_approximate_shared_context:
        raise InvalidRequest(
            f"profile {profile} is approximate for {family.model_name}: its full-attention layers read the prompt both ways, "
            "and running the prefix once drops the prefix-to-question direction (answers differ from exact; see "
            "`vllm-sr-runtime parity --profile shared_context`); allow it (serve --allow-approximate-shared-context, "
            "load(..., allow_approximate_shared_context=True)), or use exact, batching or max_speed"
        )
    own_reference = close_call_margin is not None and runs_exact_engine(profile, family, artifact)
    if memory_budget_bytes is not None:
        needed = estimate_weight_bytes(profile, family, target, artifact=artifact, cache_dir=cache_dir)
        if close_call_margin is not None and needed is not None and not own_reference:  # the exact engine loads beside it
            reference_needs = estimate_weight_bytes("exact", family, target, cache_dir=cache_dir)
            needed = None if reference_needs is None else needed + reference_needs
        check_weight_budget(needed, memory_budget_bytes, family.model_name, measured=False)
    engine, dtype, engine_plugin = build_engine(profile, family, target, artifact=artifact, cache_dir=cache_dir)
    model = DecisionModel(family, engine, profile, target, dtype, shared_min_tokens=shared_min_tokens, engine_plugin=engine_plugin)
    model.licence_accepted = licence_accepted
    if close_call_margin is not None:
        reference = (lambda: (engine, dtype)) if own_reference else (lambda: build_engine("exact", family, target, cache_dir=cache_dir)[:2])
        model.confirm_close_calls(close_call_margin, reference)
    check_weight_budget(model.weight_bytes, memory_budget_bytes, family.model_name, measured=True)
    return model
