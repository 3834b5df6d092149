"""A forward that leaves the device unusable (a sticky CUDA or HIP error: every later call on the process's device
context fails the same way) restarts the serving worker: its requests are told to retry (503, Retry-After), and
gunicorn's replacement loads the model on a clean device and serves. Before, the worker stayed `ready` and answered
500 to every request from then on. The fault is injected on the CPU (tests/fault_injection: the GPU classifier, and
a torch forward that raises the error an illegal memory access raises)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from server_harness import Contract, Server, metric_total

FAULTS = Path(__file__).parent / "fault_injection"
BODY = {"state": "Merge two sorted lists.", "questions": {"code": {"type": "noul", "instructions": "Is this about code?"}}}


def test_a_device_fault_restarts_the_worker_and_its_replacement_serves(packages, tmp_path):
    flag = tmp_path / "fault"
    env = {"PYTHONPATH": os.pathsep.join([str(FAULTS), os.environ.get("PYTHONPATH", "")]), "VLLM_SR_TEST_FAULT": str(flag)}
    server = Server([str(packages["d2_qwen3"]), "--device", "cpu", "--result-cache-entries", "0"], env=env, log=tmp_path / "log", log_level="info")
    contract = Contract()
    try:
        server.wait()
        first = server.workers()
        assert server.post(BODY).status == 200
        flag.touch()
        reply = server.post(BODY)
        contract.check("/v1/systemone", "post", reply)
        error = reply.json()["error"]
        assert reply.status == 503 and error["code"] == "not_ready" and reply.headers["retry-after"] == "1", reply.body
        assert "AcceleratorError" in error["message"] and "restarts" in error["message"]
        deadline = time.monotonic() + 60
        while set(first) & set(server.workers()) and time.monotonic() < deadline:  # the faulted worker ends
            time.sleep(0.2)
        assert not set(first) & set(server.workers()), server.tail()
        server.wait()  # its replacement loads the model and is ready
        assert server.workers() and not set(server.workers()) & set(first)
        assert server.post(BODY).status == 200
        assert metric_total(server.request("GET", "/metrics").body.decode(), "vllm_sr_runtime_device_faults_total") == 1
    finally:
        server.stop()
    assert "device fault (AcceleratorError: CUDA error: an illegal memory access was encountered); the worker restarts" in (tmp_path / "log").read_text()
