"""An unexpected failure (a bug, not a bad request): a 500 whose message and X-Request-Id name the request, and a
log line with the same id and the traceback, so an operator finds the one from the other. In process (falcon's test
client): a real server has no failure to trigger on purpose."""

from __future__ import annotations

import logging

import pytest
from falcon import testing

from vllm_sr_runtime.server.app import create_app
from vllm_sr_runtime.server.config import ModelSpec, ServeConfig
from vllm_sr_runtime.server.slots import ModelSlot

BODY = {"state": "Merge two sorted lists.", "questions": {"a": {"type": "noul", "instructions": "Is this about code?"}}}


@pytest.fixture(scope="module")
def slot(packages):
    config = ServeConfig(models=[ModelSpec(model=str(packages["d3"]))], device="cpu", result_cache_entries=0)
    loaded = ModelSlot(config.models[0], config, "m")
    loaded.load()
    assert loaded.state == "ready", loaded.reason
    yield config, loaded
    loaded.scheduler.stop()


def broken(*args, **kwargs):
    raise ZeroDivisionError("a bug")


def logged_failures(caplog) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.getMessage().startswith("internal error")]


def test_a_500_and_its_log_line_name_the_request(slot, monkeypatch, caplog):
    config, loaded = slot
    monkeypatch.setattr(loaded.model, "execute", broken)
    client = testing.TestClient(create_app(config, [loaded]))
    with caplog.at_level(logging.ERROR, logger="vllm_sr_runtime.server"):
        reply = client.simulate_post("/v1/systemone", json=BODY, headers={"X-Request-Id": "req-7"})
        ours = client.simulate_post("/v1/systemone", json=BODY)
    assert reply.status_code == 500 and reply.headers["X-Request-Id"] == "req-7"
    assert reply.json["error"]["code"] == "internal_error" and "request req-7" in reply.json["error"]["message"]
    generated = ours.headers["X-Request-Id"]  # no id from the client: the one the server made is the one it logs
    assert ours.status_code == 500 and f"request {generated}" in ours.json["error"]["message"]
    failures = logged_failures(caplog)
    assert [record.getMessage().split(":")[0] for record in failures] == ["internal error (request req-7)", f"internal error (request {generated})"]
    assert all(record.exc_info and record.exc_info[0] is ZeroDivisionError for record in failures)


def test_a_bundle_tasks_500_names_the_request_and_the_task(slot, monkeypatch, caplog):
    config, loaded = slot
    monkeypatch.setattr(loaded.model, "execute", broken)
    client = testing.TestClient(create_app(config, [loaded]))
    tasks = [{"surface": "systemone", "body": {"state": 5, "questions": {}}}, {"surface": "decisions", "body": BODY}]
    with caplog.at_level(logging.ERROR, logger="vllm_sr_runtime.server"):
        reply = client.simulate_post("/v1/bundle", json={"tasks": tasks}, headers={"X-Request-Id": "req-8"})
    assert reply.status_code == 200
    first, second = reply.json["results"]
    assert first["status"] == 400  # a bad task is the client's error, not logged as the server's
    assert second["status"] == 500 and "request req-8 task 1" in second["body"]["error"]["message"]
    assert [record.getMessage().split(":")[0] for record in logged_failures(caplog)] == ["internal error (request req-8 task 1)"]
