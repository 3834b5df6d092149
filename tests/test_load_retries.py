"""Model loads that fail for a transient reason are tried again with back-off; verification failures never are."""

from __future__ import annotations

import pytest

import vllm_sr_runtime
from vllm_sr_runtime.errors import ArtifactError, DownloadError, PackageError, is_transient
from vllm_sr_runtime.server import slots
from vllm_sr_runtime.server.config import ModelSpec, ServeConfig
from vllm_sr_runtime.server.slots import ModelSlot


def test_transient_failures_are_told_from_final_ones():
    assert is_transient(DownloadError("download of x@y failed: 503"))
    assert is_transient(RuntimeError("CUDA error: out of memory"))  # torch.cuda.OutOfMemoryError is a RuntimeError
    assert is_transient(RuntimeError("CUDA error: all CUDA-capable devices are busy or unavailable"))
    assert not is_transient(PackageError("sha256 of model.safetensors differs from MODEL_MANIFEST.json"))
    assert not is_transient(ArtifactError("artifact was exported from another model"))
    assert not is_transient(ValueError("out of memory"))  # only runtime/memory errors speak for the device


@pytest.fixture()
def flaky_load(monkeypatch, models):
    """vllm_sr_runtime.load failing with the given errors first, then returning the real tiny d3 model; sleeps recorded."""
    sleeps: list[float] = []
    monkeypatch.setattr(slots.time, "sleep", sleeps.append)

    def install(*errors: Exception):
        queue, real = list(errors), models("d3")  # loaded before vllm_sr_runtime.load is replaced

        def load(*args, **kwargs):
            if queue:
                raise queue.pop(0)
            return real

        monkeypatch.setattr(vllm_sr_runtime, "load", load)
        return sleeps

    return install


def slot(packages, **config) -> ModelSlot:
    spec = ModelSpec(model=str(packages["d3"]))
    return ModelSlot(spec, ServeConfig(models=[spec], device="cpu", **config), "d3")


def test_a_load_that_fails_twice_then_succeeds_ends_ready_after_two_retries(packages, flaky_load):
    sleeps = flaky_load(DownloadError("hub answered 503"), RuntimeError("CUDA error: out of memory"))
    model = slot(packages, load_retry_seconds=5.0)
    model.load()
    assert model.state == "ready" and model.attempts == 3 and sleeps == [5.0, 10.0]  # back-off doubles
    assert model.status() == {"status": "ready", "load_attempts": 3, "golden": "unverified"}  # the test packages carry none


def test_back_off_is_capped_and_the_last_transient_failure_is_final(packages, flaky_load):
    sleeps = flaky_load(*[DownloadError("hub answered 503")] * 9)
    model = slot(packages, load_attempts=8, load_retry_seconds=50.0)
    model.load()
    assert model.state == "failed" and model.attempts == 8
    assert sleeps == [50.0, 100.0, 200.0, 300.0, 300.0, 300.0, 300.0]
    assert model.status()["reason"].endswith("after 8 tries") and "503" in model.status()["reason"]


def test_a_verification_failure_is_never_retried(packages, flaky_load):
    sleeps = flaky_load(PackageError("sha256 of model.safetensors differs", "model.safetensors"))
    model = slot(packages)
    model.load()
    assert model.state == "failed" and model.attempts == 1 and sleeps == []
    assert "sha256" in model.status()["reason"] and "load_attempts" not in model.status()
