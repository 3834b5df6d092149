"""Per-model scheduler: one thread owns the device; request threads submit rendered plans and wait.

The queue is bounded (a full queue refuses at once with 429) and every job carries a deadline. The queue is
deadline-ordered: the job whose deadline comes first runs first (jobs with equal deadlines in the order they came),
so a request that must be answered soon is not held behind ones that may wait. A job
whose deadline has passed when the worker picks it up is dropped, and a waiting request returns at its
deadline whatever the device is doing, so a request never hangs. A job whose client went away is dropped
the same way: nobody would read its answers. Once nobody waits for any job of the run in flight (their clients left,
their waiters returned at their deadlines), the run is interrupted: no further pass starts, and the engine ends the
pass in flight where it can, so the device goes to the requests still waiting.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from vllm_sr_runtime.defaults import DEFAULT_BATCH_REQUESTS, DEFAULT_BATCH_TOKENS
from vllm_sr_runtime.errors import NotReady, Overloaded
from vllm_sr_runtime.families.base import Plan
from vllm_sr_runtime.interrupts import Interrupt, Interrupted
from vllm_sr_runtime.model import DecisionModel, Response


@dataclass
class Job:
    plan: Plan
    deadline: float  # time.monotonic() seconds
    mergeable: bool = False  # profile `batching`: may share passes with other queued requests
    abandoned: bool = False  # its client closed the connection while it waited
    given_up: bool = False  # its waiter returned at its deadline without the answers
    enqueued: float = field(default_factory=time.monotonic)
    tokens: int = 0  # its input tokens, counted against the scheduler's queued-token bound while it waits
    started: float | None = None
    finished: float | None = None
    response: Response | None = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)  # answered, failed, dropped, or abandoned
    interrupted: bool = False  # its run stopped early: nobody waited for it any more
    on_unwanted: Callable[[], None] | None = None  # set by the scheduler while its run is in flight

    def abandon(self) -> None:
        """Its client has left: the scheduler drops it (or stops its run), and its waiter wakes now."""
        self.abandoned = True
        self.done.set()
        self._tell()

    def give_up(self) -> None:
        """Its waiter answered at the deadline without it: its run, if in flight, may stop."""
        self.given_up = True
        self._tell()

    @property
    def wanted(self) -> bool:
        return not (self.abandoned or self.given_up)

    def _tell(self) -> None:
        hook = self.on_unwanted
        if hook is not None:
            hook()

    @property
    def queue_seconds(self) -> float:
        return ((self.started or time.monotonic()) - self.enqueued)

    @property
    def forward_seconds(self) -> float:
        if self.started is None:
            return 0.0
        return (self.finished or time.monotonic()) - self.started


class Scheduler:
    def __init__(
        self,
        model: DecisionModel,
        *,
        max_queue: int,
        max_queued_tokens: int | None = None,
        batch_window_ms: float = 2.0,
        max_batch_tokens: int = DEFAULT_BATCH_TOKENS,
        max_batch_requests: int = DEFAULT_BATCH_REQUESTS,
        on_batch: Callable[[Any], None] | None = None,
        on_depth: Callable[[int], None] | None = None,
        on_drop: Callable[[Job], None] | None = None,
        on_interrupted: Callable[[Job], None] | None = None,
        on_run: Callable[[float, str], None] | None = None,
        device_fault: Callable[[BaseException], bool] | None = None,
        on_device_fault: Callable[[BaseException], None] | None = None,
    ):
        self.model = model
        self.batch_window = batch_window_ms / 1000
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_requests = max_batch_requests
        # (deadline, arrival, job); the stop marker (job None) sorts first
        self.queue: queue.PriorityQueue[tuple[float, int, Job | None]] = queue.PriorityQueue(maxsize=max_queue)
        self.arrivals = itertools.count()
        self.max_queued_tokens = max_queued_tokens  # None: no bound
        self.queued_tokens = 0  # the input tokens of the jobs waiting (not of the run in flight)
        self.tokens_lock = threading.Lock()
        self.on_batch = on_batch
        self.on_depth = on_depth or (lambda depth: None)
        self.on_drop = on_drop or (lambda job: None)
        self.on_interrupted = on_interrupted or (lambda job: None)
        self.on_run = on_run or (lambda seconds, outcome: None)  # each run's device seconds and how it ended
        # whether a run's error left the device unusable (the device's plugin says), and who is told when one did
        self.device_fault = device_fault or (lambda error: False)
        self.on_device_fault = on_device_fault or (lambda error: None)
        self.stopped = False
        # what a request still waiting once the scheduler has stopped is told: retry (on another worker)
        self.stop_error = NotReady(f"the worker serving model {model.name} is exiting; retry", retry_after_s=1)
        self.running: Interrupt | None = None  # the interrupt of the run in flight
        self.thread = threading.Thread(target=self._run, name=f"scheduler-{model.name}", daemon=True)
        self.thread.start()

    def submit(self, plan: Plan, deadline: float, mergeable: bool = False) -> Job:
        if self.stopped:
            raise self.stop_error
        job = Job(plan=plan, deadline=deadline, mergeable=mergeable)
        with self.tokens_lock:
            if self.max_queued_tokens is not None:
                job.tokens = plan.input_tokens
                # a request alone in the queue is always taken, however long
                if self.queued_tokens and self.queued_tokens + job.tokens > self.max_queued_tokens:
                    raise Overloaded(
                        f"the queue of model {self.model.name} holds {self.queued_tokens} input tokens; {job.tokens} more would pass "
                        f"--max-queued-tokens {self.max_queued_tokens}; retry later", "queued_tokens",
                    )  # fmt: skip
            try:
                self.queue.put_nowait((deadline, next(self.arrivals), job))
            except queue.Full:
                raise Overloaded(f"the queue of model {self.model.name} is full ({self.queue.maxsize} requests); retry later", "queue") from None
            self.queued_tokens += job.tokens
        self.on_depth(self.queue.qsize())
        return job

    def _take(self, block: bool) -> Job | None:
        """The queued job whose deadline comes first (None: the stop marker); its tokens leave the queue's count."""
        job = (self.queue.get() if block else self.queue.get_nowait())[2]
        if job is not None and job.tokens:
            with self.tokens_lock:
                self.queued_tokens -= job.tokens
        return job

    def _drain(self, jobs: list[Job], alone: list[Job]) -> bool:
        """Moves what is already queued into `jobs` (mergeable) or `alone`, up to `max_batch_requests` in all (the
        rest waits for the next run); False once the stop marker is seen."""
        while len(jobs) + len(alone) < self.max_batch_requests:
            try:
                job = self._take(block=False)
            except queue.Empty:
                return True
            if job is None:
                return False
            (jobs if job.mergeable else alone).append(job)
        return True

    def _run(self) -> None:
        running = True
        while running and not self.stopped:
            first = self._take(block=True)
            if first is None:
                break
            merged, alone = ([first], []) if first.mergeable else ([], [first])
            if first.mergeable:
                # Only requests already waiting are merged: a lone request on an idle device never waits. When
                # others are queued, a short window lets their concurrent siblings join the same passes.
                running = self._drain(merged, alone)
                if len(merged) > 1 and self.batch_window > 0 and running:
                    time.sleep(self.batch_window)
                    running = self._drain(merged, alone)
            self.on_depth(self.queue.qsize())
            live = [job for job in merged if not self._expired(job)]
            if len(live) > 1:
                self._run_merged(live)
            elif live:
                self._run_alone(live[0])
            for job in alone:
                if not self._expired(job):
                    self._run_alone(job)
        while not self.queue.empty():  # stopped: what is left is dropped
            if (job := self._take(block=False)) is not None:
                self._expired(job)

    def _expired(self, job: Job) -> bool:
        if self.stopped:
            job.error = self.stop_error
            job.done.set()
            return True
        if not job.abandoned and time.monotonic() < job.deadline:
            return False
        self.on_drop(job)
        job.done.set()
        return True

    @contextmanager
    def _watched(self, jobs: list[Job]) -> Iterator[Interrupt]:
        """The run's interrupt while inside, set once no job of it is wanted any more (or the scheduler stops); the
        hooks are cleared as the run ends, so a finished run's plans are not kept. The run's device time is reported
        with how it ended (answered, interrupted, failed), whoever still waited for it."""
        interrupt = Interrupt()

        def look() -> None:
            if self.stopped or not any(job.wanted for job in jobs):
                interrupt.set()

        for job in jobs:
            job.on_unwanted = look
        self.running = interrupt
        started, outcome = time.monotonic(), "failed"
        try:
            look()  # one that went (or a stop that came) before its hook was in place
            yield interrupt
            outcome = "answered"
        except Interrupted:
            outcome = "interrupted"
            raise
        finally:
            self.running = None
            for job in jobs:
                job.on_unwanted = None
            self.on_run(time.monotonic() - started, outcome)

    def _interrupted(self, jobs: list[Job], exc: Exception) -> None:
        finished = time.monotonic()
        if self.stopped:  # a request still waiting (past the graceful timeout) is told to go to another worker
            exc = self.stop_error
        for job in jobs:
            job.error, job.interrupted, job.finished = exc, True, finished
            self.on_interrupted(job)
            job.done.set()

    def _run_alone(self, job: Job) -> None:
        job.started = time.monotonic()
        try:
            with self._watched([job]) as interrupt:
                job.response = self.model.execute(job.plan, on_batch=self.on_batch, interrupt=interrupt)
        except Interrupted as exc:
            return self._interrupted([job], exc)
        except BaseException as exc:  # reported to the waiting request, never kills the thread
            if self._device_failed([job], exc):
                return
            job.error = exc
        job.finished = time.monotonic()
        job.done.set()

    def _run_merged(self, jobs: list[Job]) -> None:
        started = time.monotonic()
        for job in jobs:
            job.started = started
        try:
            with self._watched(jobs) as interrupt:
                responses = self.model.execute_many([job.plan for job in jobs], self.max_batch_tokens, on_batch=self.on_batch, interrupt=interrupt)
        except Interrupted as exc:
            return self._interrupted(jobs, exc)
        except BaseException as exc:
            if self._device_failed(jobs, exc):
                return
            for job in jobs:  # one request's failure must not fail the others: retry each alone
                self._run_alone(job)
            return
        finished = time.monotonic()
        for job, response in zip(jobs, responses):
            job.response, job.finished = response, finished
            job.done.set()

    def _device_failed(self, jobs: list[Job], exc: BaseException) -> bool:
        """Whether a run's error is a device fault. If so, nothing more runs on this device: `on_device_fault` is
        told (serve restarts the worker for a clean device), and the run's requests and those queued are told to
        retry, on another worker or on this one's replacement."""
        if not self.device_fault(exc):
            return False
        self.stop_error = NotReady(
            f"the device of model {self.model.name} failed ({type(exc).__name__}: {exc}); the worker restarts; retry", retry_after_s=1
        )
        self.stop()
        self.on_device_fault(exc)
        finished = time.monotonic()
        for job in jobs:
            job.error, job.finished = self.stop_error, finished
            job.done.set()
        return True

    def stop(self) -> None:
        """Takes no more work: the run in flight is interrupted (its requests were answered or left: the worker
        exits after its requests), and what is queued is told to retry (503 with Retry-After)."""
        self.stopped = True
        if (running := self.running) is not None:
            running.set()
        try:
            self.queue.put_nowait((float("-inf"), next(self.arrivals), None))  # wakes an idle thread
        except queue.Full:
            pass  # a busy one sees `stopped` after its forward

    def close(self, timeout: float) -> bool:
        """Stops, and waits up to `timeout` seconds for a running forward to end (an engine that cannot stop its pass
        in flight finishes it); whether the thread has ended."""
        self.stop()
        self.thread.join(timeout)
        return not self.thread.is_alive()
