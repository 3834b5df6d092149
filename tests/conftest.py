"""Shared test fixtures: tiny synthetic packages of every family, written once per session."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest


def _one_share_of_the_cores_per_worker() -> None:
    """Under pytest-xdist each worker (and every process it starts: servers, exports) gets its own share of
    the cores, before torch or ONNX Runtime size their thread pools from the affinity: two workers each
    spinning a pool over all cores would slow both down."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker or count < 2 or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= count:
        os.sched_setaffinity(0, cores[int(worker.removeprefix("gw")) % count :: count])


_one_share_of_the_cores_per_worker()
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
# The runtime's cache (exported artifacts, ORT's optimized graphs) goes to a per-run directory, never ~/.cache,
# removed when the test process ends.
if "VLLM_SR_RUNTIME_CACHE_DIR" not in os.environ:
    os.environ["VLLM_SR_RUNTIME_CACHE_DIR"] = tempfile.mkdtemp(prefix="vsr-test-cache-")
    atexit.register(shutil.rmtree, os.environ["VLLM_SR_RUNTIME_CACHE_DIR"], ignore_errors=True)
sys.path.insert(0, str(Path(__file__).parent))

from vllm_sr_runtime.synthetic.writer import write_synthetic_package  # noqa: E402

# name -> (family, options)
PACKAGE_KINDS = {
    "d2_qwen3": ("decision2", {"backbone": "qwen3"}),
    "d2_qwen3_5": ("decision2", {"backbone": "qwen3_5"}),
    "d2_lora": ("decision2", {"backbone": "qwen3_5", "adapter": True}),
    "d2_calibrated": ("decision2", {"backbone": "qwen3_5", "calibrated": True}),
    "d3": ("decision3", {}),
    "d3_causal": ("decision3", {"attention_mode": "causal"}),
    "d3_vision": ("decision3", {"vision": True}),
    "d3_vision_causal": ("decision3", {"vision": True, "attention_mode": "causal"}),
}


@pytest.fixture(scope="session")
def packages(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("packages")
    written = {}
    for name, (family, options) in PACKAGE_KINDS.items():
        written[name] = write_synthetic_package(family, root / name, **options)[0]
    return written


def run_scratch(tmp_path_factory) -> Path:
    """A folder this test run's workers share (under pytest-xdist each worker's basetemp is a child of the run's)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def default_artifact(packages, tmp_path_factory):
    """`default_artifact(name)`: the default export (contrib, fp32, smoke parity) of a test package, with its
    shared_context graph, made once per run and shared by the workers (a trace takes 20-50 s; packages are
    deterministic, so every worker's copy of a package has the same model_sha256). Read it; copy it before changing
    it."""
    from filelock import FileLock

    from vllm_sr_runtime.export.exporter import export_package

    root = run_scratch(tmp_path_factory) / "default-artifacts"
    root.mkdir(exist_ok=True)

    def get(name: str) -> Path:
        out = root / name
        with FileLock(str(root / f"{name}.lock")):
            if not (out / "artifact.json").exists():
                export_package(packages[name], out, progress=False, shared_context=True, **load_kwargs(name, packages[name]))
        return out

    return get


def load_kwargs(name: str, path: Path) -> dict:
    return {"base_path": path.parent / f"{path.name}-base"} if name == "d2_lora" else {}


@pytest.fixture(scope="session")
def models(packages):
    """Lazily loaded exact-profile models, shared by the tests of a session."""
    import vllm_sr_runtime

    cache: dict[str, object] = {}

    def get(name: str):
        if name not in cache:
            cache[name] = vllm_sr_runtime.load(packages[name], **load_kwargs(name, packages[name]))
        return cache[name]

    return get
