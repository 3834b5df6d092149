"""Per-model scheduler: one thread owns the device; request threads submit rendered plans and wait.

The queue is bounded (a full queue refuses at once with 429) and every job carries a deadline: a job
whose deadline has passed when the worker picks it up is dropped, and a waiting request returns at its
deadline whatever the device is doing, so a request never hangs.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from runtime.errors import Overloaded
from runtime.families.base import Plan
from runtime.model import DecisionModel, Response


@dataclass
class Job:
    plan: Plan
    deadline: float  # time.monotonic() seconds
    enqueued: float = field(default_factory=time.monotonic)
    started: float | None = None
    finished: float | None = None
    response: Response | None = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)

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
        on_batch: Callable[[Any], None] | None = None,
        on_depth: Callable[[int], None] | None = None,
        on_drop: Callable[[Job], None] | None = None,
    ):
        self.model = model
        self.queue: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self.on_batch = on_batch
        self.on_depth = on_depth or (lambda depth: None)
        self.on_drop = on_drop or (lambda job: None)
        self.thread = threading.Thread(target=self._run, name=f"scheduler-{model.name}", daemon=True)
        self.thread.start()

    def submit(self, plan: Plan, deadline: float) -> Job:
        job = Job(plan=plan, deadline=deadline)
        try:
            self.queue.put_nowait(job)
        except queue.Full:
            raise Overloaded(f"the queue of model {self.model.name} is full ({self.queue.maxsize} requests); retry later") from None
        self.on_depth(self.queue.qsize())
        return job

    def _run(self) -> None:
        while True:
            job = self.queue.get()
            self.on_depth(self.queue.qsize())
            if job is None:
                return
            if time.monotonic() >= job.deadline:
                self.on_drop(job)
                job.done.set()
                continue
            job.started = time.monotonic()
            try:
                job.response = self.model.execute(job.plan, on_batch=self.on_batch)
            except BaseException as exc:  # reported to the waiting request, never kills the thread
                job.error = exc
            job.finished = time.monotonic()
            job.done.set()

    def stop(self) -> None:
        self.queue.put(None)
