"""The per-model scheduler's batching runs: queued mergeable requests are merged at most --max-batch-requests at a
time (on CPU, runs of 32 were ~20% slower than runs of 8), and none is left behind."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from vllm_sr_runtime.accelerators import gpu_device_fault
from vllm_sr_runtime.errors import NotReady, Overloaded
from vllm_sr_runtime.interrupts import Interrupted
from vllm_sr_runtime.server.scheduler import Scheduler


class RecordingModel:
    """Stands in for a model's forward (the scheduling, not the answers, is under test): the first call blocks until
    released, so the queue fills behind it."""

    name = "recording"

    def __init__(self):
        self.release, self.runs = threading.Event(), []

    def execute(self, plan, on_batch=None, interrupt=None):
        self.release.wait(30)
        self.runs.append([plan])
        return plan

    def execute_many(self, plans, max_tokens, on_batch=None, interrupt=None):
        self.runs.append(list(plans))
        return list(plans)


def test_a_batching_run_merges_at_most_max_batch_requests():
    model = RecordingModel()
    scheduler = Scheduler(model, max_queue=64, batch_window_ms=0, max_batch_requests=8)
    deadline = time.monotonic() + 60
    try:
        first = scheduler.submit("blocker", deadline)
        time.sleep(0.2)  # the scheduler thread is inside the blocker's forward
        jobs = [scheduler.submit(f"plan{i}", deadline, mergeable=True) for i in range(20)]
        model.release.set()
        for job in [first, *jobs]:
            assert job.done.wait(30)
    finally:
        scheduler.stop()
    assert model.runs[0] == ["blocker"]
    merged = model.runs[1:]
    assert [len(run) for run in merged] == [8, 8, 4]
    assert [plan for run in merged for plan in run] == [f"plan{i}" for i in range(20)]
    assert [job.response for job in jobs] == [f"plan{i}" for i in range(20)]


def test_the_queue_runs_the_earliest_deadline_first():
    """A request that must be answered soon is not held behind queued ones that may wait; equal deadlines keep their
    order of arrival."""
    model = RecordingModel()
    scheduler = Scheduler(model, max_queue=16, batch_window_ms=0)
    now = time.monotonic()
    try:
        running = scheduler.submit("running", now + 60)
        time.sleep(0.2)  # inside its forward: the rest queue behind it
        queued = [scheduler.submit(plan, now + seconds) for plan, seconds in [("late", 50), ("soon", 20), ("first-of-two", 30), ("second-of-two", 30), ("sooner", 10)]]
        model.release.set()
        assert all(job.done.wait(30) for job in [running, *queued])
        assert [run[0] for run in model.runs] == ["running", "sooner", "soon", "first-of-two", "second-of-two", "late"]
    finally:
        model.release.set()
        scheduler.stop()


class Tokens(str):
    """A plan that says its input tokens (its name is what the stand-in model records)."""

    def __new__(cls, name: str, tokens: int):
        plan = super().__new__(cls, name)
        plan.input_tokens = tokens
        return plan


def test_the_queue_refuses_what_would_pass_its_token_bound_and_never_a_request_alone():
    model = RecordingModel()
    scheduler = Scheduler(model, max_queue=16, max_queued_tokens=1000, batch_window_ms=0)
    deadline = time.monotonic() + 60
    try:
        running = scheduler.submit(Tokens("running", 5000), deadline)  # alone in the queue: taken however long
        time.sleep(0.2)  # inside its forward: its tokens left the queue
        first, second = scheduler.submit(Tokens("a", 600), deadline), scheduler.submit(Tokens("b", 300), deadline)
        assert scheduler.queued_tokens == 900
        with pytest.raises(Overloaded, match="--max-queued-tokens 1000") as refused:
            scheduler.submit(Tokens("c", 200), deadline)
        assert refused.value.limit == "queued_tokens" and scheduler.queued_tokens == 900
        last = scheduler.submit(Tokens("d", 100), deadline)  # exactly at the bound
        model.release.set()
        assert all(job.done.wait(30) for job in [running, first, second, last])
        assert [run[0] for run in model.runs] == ["running", "a", "b", "d"] and scheduler.queued_tokens == 0
        assert scheduler.submit(Tokens("long", 5000), deadline).done.wait(30)  # an empty queue takes it again
    finally:
        model.release.set()
        scheduler.stop()


def test_close_lets_the_running_forward_end_and_drops_what_is_queued_even_from_a_full_queue():
    """As a worker exits: a thread still inside a forward when the interpreter finalizes aborts the worker."""
    model = RecordingModel()
    scheduler = Scheduler(model, max_queue=4, batch_window_ms=0)
    deadline = time.monotonic() + 60
    running = scheduler.submit("running", deadline)
    time.sleep(0.2)  # inside its forward
    queued = [scheduler.submit(f"queued{i}", deadline) for i in range(4)]  # the queue is full: stop() must not block
    closing = threading.Thread(target=lambda: closed.append(scheduler.close(30)))
    closed: list[bool] = []
    closing.start()
    time.sleep(0.3)
    assert closed == [] and scheduler.thread.is_alive()  # it waits for the forward
    model.release.set()
    closing.join(30)
    assert closed == [True] and not scheduler.thread.is_alive()
    assert running.response == "running"
    assert model.runs == [["running"]]  # nothing queued ran
    assert all(job.done.is_set() and job.response is None for job in queued)
    # told to retry (on another worker), not answered as past their deadlines
    assert all(isinstance(job.error, NotReady) and job.error.retry_after_s == 1 for job in queued)
    with pytest.raises(NotReady):
        scheduler.submit("late", deadline)


def test_close_says_when_a_forward_outlasts_its_wait():
    model = RecordingModel()
    scheduler = Scheduler(model, max_queue=4, batch_window_ms=0)
    scheduler.submit("running", time.monotonic() + 60)
    time.sleep(0.2)
    assert scheduler.close(0.2) is False
    model.release.set()
    scheduler.thread.join(30)


class StoppableModel:
    """A forward that runs until released or until its run's interrupt is set (as the engines' passes do)."""

    name = "stoppable"

    def __init__(self):
        self.release, self.started = threading.Event(), threading.Event()

    def execute(self, plan, on_batch=None, interrupt=None):
        return self.execute_many([plan], 0, on_batch, interrupt=interrupt)[0]

    def execute_many(self, plans, max_tokens, on_batch=None, interrupt=None):
        self.started.set()
        while not self.release.wait(0.01):
            interrupt.check()
        if "fail" in plans:
            raise ValueError("a failing forward")
        return list(plans)


def test_a_run_is_interrupted_once_nobody_waits_for_any_of_its_requests():
    model, interrupted = StoppableModel(), []
    scheduler = Scheduler(model, max_queue=8, batch_window_ms=50, on_interrupted=interrupted.append)
    deadline = time.monotonic() + 60
    try:
        alone = scheduler.submit("alone", deadline)
        assert model.started.wait(30)
        merged = [scheduler.submit(f"merged{i}", deadline, mergeable=True) for i in range(2)]
        alone.give_up()  # its waiter answered deadline_exceeded
        assert alone.done.wait(30) and alone.interrupted and isinstance(alone.error, Interrupted)
        assert interrupted == [alone]
        model.started.clear()
        assert model.started.wait(30)  # the two merged requests' run
        merged[0].abandon()  # one client left: the other still waits, so the run goes on
        time.sleep(0.2)
        assert not merged[1].done.is_set() and interrupted == [alone]
        merged[1].give_up()
        assert merged[1].done.wait(30)
        assert all(job.interrupted for job in merged) and interrupted == [alone, *merged]
        model.release.set()
        last = scheduler.submit("last", deadline)
        assert last.done.wait(30) and last.response == "last" and not last.interrupted  # the device went on
        assert all(job.on_unwanted is None for job in [alone, *merged, last])
    finally:
        model.release.set()
        scheduler.stop()


def test_each_run_reports_its_device_time_once_with_how_it_ended():
    """The device's busy time: an interrupted run counts what it spent, a merged run counts once."""
    model, runs = StoppableModel(), []
    scheduler = Scheduler(model, max_queue=8, batch_window_ms=50, on_run=lambda seconds, outcome: runs.append((seconds, outcome)))
    deadline = time.monotonic() + 60
    try:
        cut = scheduler.submit("cut", deadline)
        assert model.started.wait(30)
        time.sleep(0.3)
        cut.give_up()
        assert cut.done.wait(30) and cut.interrupted
        held = scheduler.submit("held", deadline)
        model.started.clear()
        assert model.started.wait(30)
        merged = [scheduler.submit(f"merged{i}", deadline, mergeable=True) for i in range(3)]
        time.sleep(0.2)
        model.release.set()
        assert all(job.done.wait(30) and job.response == job.plan for job in [held, *merged])
        failed = scheduler.submit("fail", deadline)
        assert failed.done.wait(30) and isinstance(failed.error, ValueError)
        assert [outcome for _, outcome in runs] == ["interrupted", "answered", "answered", "failed"]
        assert runs[0][0] >= 0.3 and runs[1][0] >= 0.2  # the cut run's time, the held run's until released
    finally:
        model.release.set()
        scheduler.stop()


def test_close_interrupts_the_run_in_flight_and_tells_a_request_still_waiting_to_retry():
    """As a worker exits after its graceful timeout: its run in flight stops instead of holding the exit."""
    model, interrupted = StoppableModel(), []
    scheduler = Scheduler(model, max_queue=4, batch_window_ms=0, on_interrupted=interrupted.append)
    try:
        job = scheduler.submit("running", time.monotonic() + 60)
        assert model.started.wait(30)
        assert scheduler.close(10) is True  # the forward never ends on its own (never released)
        assert job.done.is_set() and isinstance(job.error, NotReady) and job.error.retry_after_s == 1
        assert interrupted == [job]
    finally:
        model.release.set()


class FaultingModel(RecordingModel):
    """A forward that raises a sticky CUDA error (as torch raises one) for the plan "fault", and a plain error for
    the plan "bad"; the first call blocks until released."""

    name = "faulting"

    def execute(self, plan, on_batch=None, interrupt=None):
        return self.execute_many([plan], 0)[0]

    def execute_many(self, plans, max_tokens, on_batch=None, interrupt=None):
        self.release.wait(30)
        self.runs.append(list(plans))
        if "fault" in plans:
            raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered")
        if "bad" in plans:
            raise ValueError("a request's own failure")
        return list(plans)


@pytest.mark.parametrize("merged", [False, True])
def test_a_device_fault_stops_the_device_and_tells_every_waiting_request_to_retry(merged):
    """After a sticky device error every later call on the device would fail the same way: nothing more runs, the
    run's requests and those queued get 503 with Retry-After (a new worker has a clean device), and the worker is
    told. A request's own error stops nothing."""
    model, faults = FaultingModel(), []
    scheduler = Scheduler(model, max_queue=8, batch_window_ms=0, device_fault=gpu_device_fault, on_device_fault=faults.append)
    deadline = time.monotonic() + 60
    try:
        model.release.set()
        bad = scheduler.submit("bad", deadline)
        assert bad.done.wait(30) and isinstance(bad.error, ValueError) and faults == []
        model.release.clear()
        first = scheduler.submit("first", deadline)
        time.sleep(0.2)  # inside its forward
        faulting = [scheduler.submit(plan, deadline, mergeable=merged) for plan in (["fault", "beside"] if merged else ["fault"])]
        queued = scheduler.submit("queued", deadline)
        model.release.set()
        for job in [first, *faulting, queued]:
            assert job.done.wait(30)
        assert first.response == "first"
        assert len(faults) == 1 and isinstance(faults[0], torch.AcceleratorError)
        assert all(isinstance(job.error, NotReady) and job.error.retry_after_s == 1 and "restarts" in job.error.message for job in [*faulting, queued])
        scheduler.thread.join(30)
        assert not scheduler.thread.is_alive()
        # nothing ran after the fault: neither the queued request nor, for a merged run, its requests one by one
        assert model.runs == [["bad"], ["first"], ["fault", "beside"] if merged else ["fault"]]
        with pytest.raises(NotReady, match="restarts"):
            scheduler.submit("later", deadline)
    finally:
        model.release.set()
        scheduler.stop()
