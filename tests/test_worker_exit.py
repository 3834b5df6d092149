"""A worker exits cleanly while a forward still runs: a request answered deadline_exceeded leaves its forward running,
and a thread inside torch when the interpreter finalizes aborted the worker (SIGABRT at every such shutdown)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from server_harness import Server
from vllm_sr_runtime.server import gunicorn_app

# 64 questions of ~2,400-token rows: 8 passes, seconds on any host (8 short rows took under its 300 ms deadline on an idle one)
QUESTIONS = {f"q{i}": {"type": "noul", "instructions": f"Is this about topic {i}?"} for i in range(64)}


def test_sigterm_while_a_forward_runs_past_its_requests_deadline_exits_cleanly(packages, tmp_path: Path):
    log = tmp_path / "log"
    server = Server([str(packages["d3"]), "--device", "cpu", "--result-cache-entries", "0"], log=log, log_level="info")
    try:
        server.wait()
        reply = server.post({"state": "word " * 1200, "questions": QUESTIONS, "options": {"deadline_ms": 300}})
        assert reply.status == 200 and reply.json()["answers"]["q0"]["error"] == "deadline_exceeded", reply.body[:300]
        forward_ms = float(re.search(r"forward;dur=([0-9.]+)", reply.headers["server-timing"]).group(1))
        assert forward_ms > 0, reply.headers["server-timing"]  # its forward had started and not ended: it runs on
    finally:
        server.stop()
    text = log.read_text(errors="replace")
    assert server.process.returncode == 0, text[-2000:]
    assert "terminate called" not in text and "SIGABRT" not in text, text[-2000:]
    assert "Worker exiting" in text


class Slot:
    def __init__(self, name: str, running: str | None):
        self.name, self.running, self.timeouts = name, running, []

    def close(self, timeout: float) -> str | None:
        self.timeouts.append(timeout)
        return self.running


def test_a_worker_with_work_it_cannot_wait_for_exits_without_finalizing(monkeypatch, caplog):
    exits = []
    monkeypatch.setattr(gunicorn_app.os, "_exit", exits.append)
    done = [Slot("a", None), Slot("b", None)]
    gunicorn_app.end_native_work(done, 5.0)
    assert exits == [] and all(0 < slot.timeouts[0] <= 5.0 for slot in done)
    gunicorn_app.end_native_work([Slot("a", None), Slot("b", "its load (loading)")], 5.0)
    assert exits == [0]
    assert "model b: its load (loading)" in caplog.text and "model a" not in caplog.text


@pytest.mark.parametrize("state", ["loading", "warming"])
def test_a_model_still_loading_says_so_as_the_worker_exits(state):
    from vllm_sr_runtime.server.config import ModelSpec, ServeConfig
    from vllm_sr_runtime.server.slots import ModelSlot

    spec = ModelSpec(model="pkg")
    slot = ModelSlot(spec, ServeConfig(models=[spec]), "pkg")
    slot.state = state
    assert slot.close(1.0) == f"its load ({state})"
