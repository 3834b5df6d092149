"""The CPU engine's cache of ONNX Runtime's optimized graphs: bounded by what can still open, never by luck."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from vllm_sr_runtime.engines.onnxruntime import open_session
from vllm_sr_runtime.engines.onnxruntime.optimized_cache import ENTRY_FILE, OPTIMIZED_FILE, STAGING_ABANDONED_S, UNUSED_S

WEEK_AND_A_DAY = UNUSED_S + 24 * 3600


def write_model(path: Path, scale: float) -> None:
    """A graph with external weights, as artifacts are written."""
    weight = numpy_helper.from_array(np.full((64, 64), scale, np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 64])], [weight],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path), save_as_external_data=True, location=path.name + ".data", size_threshold=0)


def answer(session) -> float:
    return float(session.run(None, {"x": np.ones((1, 64), np.float32)})[0][0, 0])


def entries(cache: Path) -> set[str]:
    return {p.name for p in cache.iterdir()}


def age(path: Path, seconds: float) -> None:
    past = time.time() - seconds
    os.utime(path, (past, past))


def test_a_reexported_artifacts_old_entry_is_removed_when_the_new_one_is_stored(tmp_path):
    cache, model = tmp_path / "cache", tmp_path / "artifact" / "model.onnx"
    write_model(model, 1.0)
    session, use = open_session(model, "cpu", None, cache)
    assert use == "stored" and answer(session) == 64.0
    (first,) = entries(cache)
    assert (cache / first / ENTRY_FILE).is_file()
    assert open_session(model, "cpu", None, cache)[1] == "hit"
    write_model(model, 2.0)  # exported again to the same place
    session, use = open_session(model, "cpu", None, cache)
    assert use == "stored" and answer(session) == 128.0
    (second,) = entries(cache)  # the first entry could never open again
    assert second != first


def test_entries_unused_for_a_week_and_abandoned_staging_go_with_the_next_store(tmp_path):
    cache = tmp_path / "cache"
    models = {name: tmp_path / name / "model.onnx" for name in ("used", "idle", "new")}
    for scale, model in enumerate(models.values(), 1):
        write_model(model, float(scale))
    open_session(models["used"], "cpu", None, cache)
    used = entries(cache)
    open_session(models["idle"], "cpu", None, cache)
    idle = entries(cache) - used
    legacy = cache / "0123456789abcdef01234567"  # an entry of an earlier version: no record of its artifact
    legacy.mkdir()
    (legacy / OPTIMIZED_FILE).write_bytes(b"")
    abandoned, storing = (cache / f".{name}-x" for name in ("abandoned", "storing"))
    for directory in (abandoned, storing):
        directory.mkdir()
    for path in (*(cache / name for name in used | idle), legacy):
        age(path, WEEK_AND_A_DAY)
    age(abandoned, STAGING_ABANDONED_S + 60)
    assert open_session(models["used"], "cpu", None, cache)[1] == "hit"  # marks the entry used
    assert open_session(models["new"], "cpu", None, cache)[1] == "stored"
    left = entries(cache)
    assert used <= left and storing.name in left
    assert not (idle | {legacy.name, abandoned.name}) & left
    assert len(left - used - {storing.name}) == 1  # the new entry
    assert open_session(models["used"], "cpu", None, cache)[1] == "hit"


def test_a_cache_that_cannot_take_the_graph_does_not_stop_the_model(tmp_path, monkeypatch, caplog):
    """The cache is where a platform cannot write (not a directory here; a read-only or full disk alike), or ONNX
    Runtime's own save fails: the session opens without the cache, answers the same, and says why; a graph that
    cannot open at all still fails."""
    import logging

    import pytest

    from vllm_sr_runtime.engines.onnxruntime import optimized_cache
    from vllm_sr_runtime.errors import ArtifactError

    model = tmp_path / "artifact" / "model.onnx"
    write_model(model, 1.0)
    not_a_directory = tmp_path / "cache"
    not_a_directory.write_text("")
    with caplog.at_level(logging.WARNING):
        session, use = open_session(model, "cpu", None, not_a_directory)
    assert use == "unavailable" and answer(session) == 64.0
    assert any("could not be stored" in record.getMessage() and str(not_a_directory) in record.getMessage() for record in caplog.records)
    cache = tmp_path / "writable"
    monkeypatch.setattr(optimized_cache, "OPTIMIZED_FILE", "missing/optimized.onnx")  # ORT's save itself fails
    session, use = open_session(model, "cpu", None, cache)
    assert use == "unavailable" and answer(session) == 64.0
    assert [p.name for p in cache.iterdir()] == []  # its staging removed
    broken = tmp_path / "broken" / "model.onnx"
    broken.parent.mkdir()
    broken.write_bytes(b"not a graph")
    with pytest.raises(ArtifactError, match="cannot open"):
        open_session(broken, "cpu", None, cache)
