"""The workers' metrics folder as /health and /metrics read it: a worker's file that is still being created (empty
between its open and its sizing, where a worker stopped or killed in that moment leaves it) is left out instead of
failing every sibling's /health and /metrics."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.mmap_dict import MmapedDict, mmap_key

from vllm_sr_runtime.server import metrics

READY = f"{metrics.PREFIX}_ready"


def worker_says_ready(folder: Path, pid: int, model: str, value: float) -> None:
    """What a worker's READY gauge writes: its own livemin file with the model's sample."""
    values = MmapedDict(str(folder / f"gauge_livemin_{pid}.db"))
    values.write_value(mmap_key(READY, READY, ["model"], [model], "ready"), value, 0.0)
    values.close()


@pytest.fixture
def folder(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    return tmp_path


def test_a_worker_file_still_being_created_is_left_out_of_readiness_and_metrics(folder: Path):
    worker_says_ready(folder, 101, "hub", 1.0)
    worker_says_ready(folder, 102, "hub", 1.0)
    (folder / "gauge_livemin_103.db").touch()  # a third worker stopped between its file's open and its sizing
    (folder / "counter_103.db").touch()

    assert metrics.ready_in_every_worker() == {"hub": True}
    text = metrics.render()[0].decode()
    assert f'{READY}{{model="hub"}} 1.0' in text, text


def test_a_worker_still_loading_keeps_the_model_not_ready_everywhere(folder: Path):
    worker_says_ready(folder, 101, "hub", 1.0)
    worker_says_ready(folder, 102, "hub", 0.0)
    (folder / "gauge_livemin_103.db").touch()

    assert metrics.ready_in_every_worker() == {"hub": False}
    (folder / "gauge_livemin_102.db").unlink()  # the loading worker died: its live gauges go with it
    assert metrics.ready_in_every_worker() == {"hub": True}
