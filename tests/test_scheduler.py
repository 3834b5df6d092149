"""The per-model scheduler's batching runs: queued mergeable requests are merged at most --max-batch-requests at a
time (on CPU, runs of 32 were ~20% slower than runs of 8), and none is left behind."""

from __future__ import annotations

import threading
import time

from vllm_sr_runtime.server.scheduler import Scheduler


class RecordingModel:
    """Stands in for a model's forward (the scheduling, not the answers, is under test): the first call blocks until
    released, so the queue fills behind it."""

    name = "recording"

    def __init__(self):
        self.release, self.runs = threading.Event(), []

    def execute(self, plan, on_batch=None):
        self.release.wait(30)
        self.runs.append([plan])
        return plan

    def execute_many(self, plans, max_tokens, on_batch=None):
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


def test_close_says_when_a_forward_outlasts_its_wait():
    model = RecordingModel()
    scheduler = Scheduler(model, max_queue=4, batch_window_ms=0)
    scheduler.submit("running", time.monotonic() + 60)
    time.sleep(0.2)
    assert scheduler.close(0.2) is False
    model.release.set()
    scheduler.thread.join(30)
