"""serve shares the CPUs among its workers: the environment it sets before fork reaches torch's pool and ONNX
Runtime's sessions in a process that starts torch afterwards, and what the user set stays."""

from __future__ import annotations

import json
import os
import subprocess
import sys

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
