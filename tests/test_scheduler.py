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
