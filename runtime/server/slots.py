"""A served model: loading -> warming -> ready | failed, in a thread of its own so /health answers while it
loads; transient load failures are retried with back-off (`--load-attempts`, `--load-retry-seconds`)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any, Callable

from vllm_sr_runtime.profiles import profile_named
from vllm_sr_runtime.server import metrics
from vllm_sr_runtime.server.config import ModelSpec, ServeConfig
from vllm_sr_runtime.server.scheduler import Scheduler
from vllm_sr_runtime.weight_budget import WeightBudget

log = logging.getLogger("vllm_sr_runtime.server")
WARMUP_QUESTIONS = {"warmup": {"type": "noul", "instructions": "Is this a warm-up request?"}}


class ModelSlot:
    def __init__(
        self,
        spec: ModelSpec,
        config: ServeConfig,
        name: str,
        accepts_while_loading: bool = True,
        restart_worker: Callable[[], None] | None = None,
        weight_budget: WeightBudget | None = None,
    ):
        """`accepts_while_loading`: the worker answers while this model loads, so the server is not ready until it
        is; a worker that loads before it accepts counts only once it does (its siblings serve meanwhile).
        `restart_worker`: called after a device fault (the worker ends once its requests have, and gunicorn starts a
        new one, with a clean device). `weight_budget`: what the worker's models may still hold (--memory-budget),
        shared by its slots, which load one at a time."""
        self.spec = spec
        self.config = config
        self.name = name
        self.profile = spec.profile or config.profile
        self.state = "loading"
        self.reason: str | None = None
        self.model: Any = None
        self.scheduler: Scheduler | None = None
        self.profiles = [self.profile]
        self.aliases: list[str] = []  # other names requests may use (the server sets them)
        self.attempts = 0  # load tries so far
        self.restart_worker = restart_worker or (lambda: None)
        self.restarting = False  # failed by a device fault: this worker's replacement will serve it
        self.weight_budget = weight_budget
        if accepts_while_loading:
            metrics.READY.labels(model=name).set(0)

    def load(self, one_at_a_time: threading.Lock | None = None) -> None:
        """Load and warm the model, retrying transient failures with back-off; the last failure is final.
        `one_at_a_time`, shared by a worker's slots, lets one model load at a time (their peaks never add up)
        while another waits out its back-off."""
        from vllm_sr_runtime.errors import is_transient
        from vllm_sr_runtime.server.config import MAX_LOAD_RETRY_SECONDS

        attempts, wait = max(1, self.config.load_attempts), self.config.load_retry_seconds
        for attempt in range(1, attempts + 1):
            self.attempts = attempt
            try:
                with one_at_a_time or contextlib.nullcontext():
                    model = self._load_once()
            except Exception as exc:  # a failed model degrades /health, the others keep serving
                reason = f"{type(exc).__name__}: {getattr(exc, 'message', exc)}"
                if attempt < attempts and is_transient(exc):
                    self.state, self.reason = "loading", f"try {attempt} of {attempts} failed ({reason}); retrying in {wait:g} s"
                    metrics.LOAD_RETRIES.labels(model=self.name).inc()
                    log.warning("model %s: %s", self.name, self.reason)
                    time.sleep(wait)
                    wait = min(wait * 2, MAX_LOAD_RETRY_SECONDS)
                    continue
                tried = f" after {attempt} tries" if attempt > 1 else ""
                self.state, self.reason = "failed", f"{reason}{tried}"
                metrics.READY.labels(model=self.name).set(0)
                log.error("model %s failed to load: %s", self.name, self.reason)
                return
            self._serve(model)
            return

    def close_call_margin(self) -> float | str | None:
        """This model's (from --models), else the server's; none for profile exact, which is the reference."""
        if self.profile == "exact":
            return None
        return self.spec.close_call_margin if self.spec.close_call_margin is not None else self.config.close_call_margin

    def _load_once(self):
        import vllm_sr_runtime

        self.state = "loading"
        model = vllm_sr_runtime.load(
            self.spec.model,
            device=self.spec.device or self.config.device,
            profile=self.profile,
            revision=self.spec.revision,
            artifact=self.spec.artifact,
            cache_dir=self.config.cache_dir,
            offline=self.config.offline or None,
            base_path=self.spec.base_path,
            shared_min_tokens=self.config.shared_min_tokens,
            close_call_margin=self.close_call_margin(),
            allow_approximate_shared_context=self.config.allow_approximate_shared_context,
            accept_licences=(*self.config.accept_licences, *self.spec.accept_licences),
            memory_budget_bytes=self.weight_budget.remaining() if self.weight_budget else None,
        )
        model.family.allow_media_urls(tuple(self.config.media_url_allow), self.config.media_url_allow_private, self.config.media_url_timeout_s)
        self.state = "warming"
        first, second = model.ask("warm-up", WARMUP_QUESTIONS), model.ask("warm-up", WARMUP_QUESTIONS)
        if first != second or "error" in first["warmup"]:
            raise RuntimeError(f"warm-up answers are not deterministic and well-formed: {first} vs {second}")
        from vllm_sr_runtime.golden import verify_golden

        model.golden = verify_golden(model)  # a mismatch fails this model (never retried); the others serve
        if model.golden["status"] != "verified":
            log.warning("model %s: golden answers %s (%s)", self.name, model.golden["status"], model.golden["reason"])
        if self.weight_budget:  # held by a model that serves, before the next one loads
            self.weight_budget.hold(model.weight_bytes)
        return model

    def _serve(self, model) -> None:
        self.reason = None
        if self.config.result_cache_entries > 0:  # a new cache per load: nothing survives a reload
            from vllm_sr_runtime.result_cache import ResultCache

            def count(hits: int, misses: int) -> None:
                metrics.RESULT_CACHE.labels(model=self.name, outcome="hit").inc(hits)
                metrics.RESULT_CACHE.labels(model=self.name, outcome="miss").inc(misses)

            model.result_cache = ResultCache(self.config.result_cache_entries, on_record=count)
        labels = {"model": self.name, "profile": self.profile}

        profile = profile_named(self.profile)
        self.profiles = profile.served() if model.engine_plugin == profile.engine else [self.profile]
        self.scheduler = Scheduler(
            model,
            max_queue=self.config.max_queue,
            max_queued_tokens=self.config.max_queued_tokens,
            batch_window_ms=self.config.batch_window_ms,
            max_batch_tokens=self.config.max_batch_tokens,
            max_batch_requests=self.config.max_batch_requests,
            on_batch=lambda batch: self.observe_batch(batch, labels),
            on_depth=lambda depth: metrics.QUEUE_DEPTH.labels(model=self.name).set(depth),
            on_drop=lambda job: (metrics.ABANDONED if job.abandoned else metrics.DEADLINE_DROPPED).labels(**labels).inc(len(job.plan.questions)),
            on_interrupted=lambda job: metrics.INTERRUPTED.labels(**labels).inc(len(job.plan.questions)),
            on_run=lambda seconds, outcome: metrics.DEVICE_SECONDS.labels(**labels, outcome=outcome).inc(seconds),
            device_fault=model.device.spec.device_fault,
            on_device_fault=self.device_failed,
        )
        self.model = model
        card = model.card()
        revision = card.get("revision") or "local"  # a package directory has no Hub revision
        metrics.MODEL_INFO.labels(
            model=self.name, revision=revision, family=card["family"], engine=card["engine"],
            accelerator=model.device.kind, device=card["device"], profile=self.profile,
        ).set(1)  # fmt: skip
        if (weight_bytes := model.weight_bytes) is not None:
            metrics.MODEL_MEMORY.labels(model=self.name).set(weight_bytes)
        metrics.READY.labels(model=self.name).set(1)
        self.state = "ready"
        log.info("model %s ready (%s at revision %s, %s on %s)", self.name, card["family"], revision, card["engine"], card["device"])

    def observe_batch(self, batch, labels: dict) -> None:
        rows, tokens = self.model.family.pass_size(batch)
        metrics.BATCH_ROWS.labels(**labels).observe(rows)
        metrics.BATCH_TOKENS.labels(**labels).observe(tokens)
        if batch.shared:
            prefix = batch.inputs["prefix_ids"].shape[1]
            metrics.SHARED_PASSES.labels(model=self.name).inc()
            metrics.SHARED_PREFIX_TOKENS.labels(model=self.name).inc(prefix * (len(batch.items) - 1))

    def device_failed(self, error: BaseException) -> None:
        """A forward left the device unusable in this process: the model fails here (its requests are told to retry)
        and the worker restarts, its replacement loading the model on a clean device."""
        self.state, self.reason = "failed", f"device fault ({type(error).__name__}: {error}); the worker restarts"
        self.restarting = True
        metrics.READY.labels(model=self.name).set(0)
        metrics.DEVICE_FAULTS.labels(model=self.name).inc()
        log.error("model %s: %s", self.name, self.reason)
        self.restart_worker()

    def close(self, timeout: float) -> str | None:
        """As the worker exits: stops the scheduler (interrupting its run in flight), waiting up to `timeout` for the
        forward to end; what of this model may still run in torch or ONNX Runtime (None: nothing)."""
        if self.state in ("loading", "warming"):
            return f"its load ({self.state})"  # a load cannot be stopped
        if self.scheduler is not None and not self.scheduler.close(timeout):
            return f"a forward still running after {timeout:g} s"
        return None

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    def status(self) -> dict:
        status = {"status": self.state}
        if self.reason:
            status["reason"] = self.reason
        if self.attempts > 1:
            status["load_attempts"] = self.attempts
        if self.model is not None:
            status["golden"] = self.model.golden["status"]
        return status

    def card(self) -> dict:
        from vllm_sr_runtime.families.questions import MAX_LEVELS, MAX_OPTIONS, MAX_QUESTIONS, MIN_LEVELS, MIN_OPTIONS

        base = {
            "id": self.name, "object": "model", "aliases": list(self.aliases), "ready": self.ready, "status": self.state,
            "profile": self.profile, "profiles": list(self.profiles),
        }  # fmt: skip
        if self.reason:
            base["reason"] = self.reason
        if not self.ready:
            return base
        card = self.model.card()
        limits = {
            "max_input_tokens": card["max_input_tokens"], "max_questions": MAX_QUESTIONS, "min_options": MIN_OPTIONS,
            "max_options": MAX_OPTIONS, "min_levels": MIN_LEVELS, "max_levels": MAX_LEVELS,
            "max_request_bytes": self.config.max_request_bytes,
        }  # fmt: skip
        extra = {k: v for k, v in card.items() if k not in ("id", "profile", "max_input_tokens", "path")}
        return {**base, **extra, "limits": limits, "surfaces": ["systemone", "decisions"]}
