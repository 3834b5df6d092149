"""serve shares the CPUs among its workers: the environment it sets before fork reaches torch's pool and ONNX
Runtime's sessions in a process that starts torch afterwards, and what the user set stays."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vllm_sr_runtime.cpu_threads import cpu_affinity

PROBE = (
    "import json, sys\n"
    "from vllm_sr_runtime.cpu_threads import cpu_threads, share_among_workers\n"
    "chosen = share_among_workers(int(sys.argv[1]))\n"
    "import torch\n"
    "print(json.dumps({'chosen': chosen, 'torch': torch.get_num_threads(), 'onnxruntime': cpu_threads()}))\n"
)


def probe(workers: int, **env: str) -> dict:
    clean = {key: value for key, value in os.environ.items() if not key.startswith("OMP_")}
    done = subprocess.run([sys.executable, "-c", PROBE, str(workers)], capture_output=True, text=True, env={**clean, **env}, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_several_workers_share_the_cpus_and_wait_passively():
    share = max(1, cpu_affinity() // 2)
    seen = probe(2)
    assert seen["chosen"] == {"OMP_NUM_THREADS": str(share), "OMP_WAIT_POLICY": "PASSIVE"}
    assert seen["torch"] == share and seen["onnxruntime"] == share


def test_one_worker_keeps_every_cpu_and_the_users_setting_stays():
    assert probe(1) == {"chosen": {}, "torch": cpu_affinity(), "onnxruntime": cpu_affinity()}
    seen = probe(2, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="ACTIVE")
    assert seen["chosen"] == {} and seen["torch"] == 1 and seen["onnxruntime"] == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/PID/maps")
def test_serves_master_never_loads_torch(packages, tmp_path):
    """The master forks the workers: torch (and its OpenMP runtime, which reads OMP_* once, when it loads) must
    first start in each worker, or the workers inherit the master's pool and settings."""
    from server_harness import Server

    server = Server([str(packages["d3"]), "--device", "cpu", "--workers", "2"], log=tmp_path / "log")
    try:
        server.wait()
        workers = server.workers()
        maps = {pid: open(f"/proc/{pid}/maps").read() for pid in [server.process.pid, *workers]}
    finally:
        server.stop()
    assert len(workers) == 2 and all("libtorch_cpu" in maps[pid] for pid in workers)
    assert "libtorch_cpu" not in maps[server.process.pid] and "libgomp" not in maps[server.process.pid]


def worker_threads_logged(log: Path, count: int, timeout: float = 180) -> list[int]:
    """The CPU threads each worker said it computes on, once `count` workers have said so."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        said = [int(n) for n in re.findall(r"this worker computes on (\d+) CPU thread", log.read_text(errors="replace"))]
        if len(said) >= count:
            return said
        time.sleep(0.2)
    raise TimeoutError(f"{count} workers did not start: {log.read_text(errors='replace')[-2000:]}")


def server_on_every_cpu(args: list[str], log: Path):
    """A server started on every CPU of the machine (pytest-xdist gives this test process a share of them)."""
    from server_harness import Server

    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, range(os.cpu_count() or 1))
    try:
        if cpu_affinity() < 2:
            pytest.skip("one CPU: every share is one thread")
        return Server(args, log=log, log_level="info"), cpu_affinity()
    finally:
        os.sched_setaffinity(0, mine)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="sets the CPU affinity")
def test_a_worker_added_by_ttin_gets_the_share_of_the_count_then(packages, tmp_path):
    """gunicorn's TTIN adds a worker and TTOU removes one: a worker forked after either computes on the share of the
    workers there are then (the one added beside a lone worker took every CPU, as the lone one had)."""
    log = tmp_path / "log"
    server, cpus = server_on_every_cpu([str(packages["d3"]), "--device", "cpu", "--workers", "1"], log)
    try:
        server.wait()
        assert worker_threads_logged(log, 1) == [cpus]
        os.kill(server.process.pid, signal.SIGTTIN)
        assert worker_threads_logged(log, 2)[1] == max(1, cpus // 2)
        server.wait()
        assert len(server.workers()) == 2
    finally:
        server.stop()
