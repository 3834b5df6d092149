"""The request-body bytes a worker's requests in flight hold are bounded (--max-inflight-request-bytes): with a
thread for every request the queues take, a burst of large bodies would otherwise be held all at once. A model's
queue is bounded by its requests' input tokens too (--max-queued-tokens)."""

from __future__ import annotations

import json
import threading
import time

import pytest

from server_harness import Contract, Server, metric_total
from vllm_sr_runtime.errors import ClientGone, Overloaded
from vllm_sr_runtime.server.body_budget import BodyBudget
from vllm_sr_runtime.server.client_connection import Client

CONTRACT = Contract()
QUESTIONS = {"a": {"type": "noul", "instructions": "Is this about code?"}}


def body_of(size: int) -> bytes:
    """A valid request of exactly `size` bytes (its state too long for the tiny model: answered, not forwarded)."""
    frame = json.dumps({"state": "", "questions": QUESTIONS}).encode()
    return json.dumps({"state": "x" * (size - len(frame)), "questions": QUESTIONS}).encode()


def slow_request(server: Server, size: int):
    """A request whose headers and first 1,000 bytes are sent, the rest left for the caller to send."""
    connection, body = server.connection(timeout=120), body_of(size)
    connection.putrequest("POST", "/v1/systemone")
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Content-Length", str(len(body)))
    connection.endheaders()
    connection.send(body[:1000])
    time.sleep(1.0)  # the server reads its headers and starts on the body
    return connection, body


def test_the_budget_refuses_what_would_pass_it_and_never_a_request_alone():
    budget = BodyBudget(1000)
    alone = budget.reserve(5000)  # larger than the budget, but nothing else is in flight
    with pytest.raises(Overloaded, match="--max-inflight-request-bytes 1000"):
        budget.reserve(1)
    alone.release()
    first = budget.reserve(1000)  # a body of unknown length reserves the limit...
    first.settle(300)  # ...and holds what it read
    second = budget.reserve(700)
    with pytest.raises(Overloaded):
        budget.reserve(1)
    first.release()
    second.release()
    assert budget.held == 0


def test_a_server_answers_429_to_a_body_beyond_the_budget_and_takes_it_once_one_ends(packages, tmp_path):
    server = Server(
        [str(packages["d3"]), "--device", "cpu", "--max-request-bytes", "1000000", "--max-inflight-request-bytes", "1500000"], log=tmp_path / "log"
    )  # fmt: skip
    try:
        server.wait()
        slow, body = slow_request(server, 900_000)  # holds its size of the budget while its body arrives
        held = metric_total(server.request("GET", "/metrics").body.decode(), "vllm_sr_runtime_inflight_request_bytes")
        refused = server.request("POST", "/v1/systemone", raw=body_of(900_000))
        small = server.post({"state": "short", "questions": QUESTIONS})
        slow.send(body[1000:])
        answered = slow.getresponse()
        answered_body = json.loads(answered.read())
        slow.close()
        again = server.request("POST", "/v1/systemone", raw=body_of(900_000))
        page = server.request("GET", "/metrics").body.decode()
    finally:
        server.stop()
    CONTRACT.check("/v1/systemone", "POST", refused)
    assert refused.status == 429 and refused.json()["error"]["code"] == "overloaded", refused.body[:300]
    assert "--max-inflight-request-bytes 1500000" in refused.json()["error"]["message"] and refused.headers["retry-after"] == "1"
    assert small.status == 200  # what fits beside it is taken
    assert answered.status == 200 and answered_body["answers"]["a"]["error"] == "max_length_exceeded"
    assert again.status == 200  # the slow request's bytes went back to the budget when it ended
    # an operator sees what the budget holds and which limit refused
    assert held == 900_000
    assert metric_total(page, "vllm_sr_runtime_overloaded_requests_total", limit="inflight_bytes") == 1
    assert metric_total(page, "vllm_sr_runtime_inflight_request_bytes") == 0


def test_requests_with_media_wait_for_one_of_the_workers_media_slots():
    """A request with images or videos holds a media slot from before its decode until it is answered (its decoded
    pixels live that long); with every slot held, the next one waits up to its deadline and is then refused."""
    import threading
    from contextlib import ExitStack

    from vllm_sr_runtime.server.app import Server as App
    from vllm_sr_runtime.server.config import ServeConfig

    app = App(ServeConfig(models=[], media_slots=3), [])
    image = {"state": "a picture", "images": ["data:image/png;base64,AAAA"]}
    from prometheus_client import REGISTRY

    def slots_held() -> float:
        return REGISTRY.get_sample_value("vllm_sr_runtime_media_slots_held") or 0.0

    before = slots_held()
    with ExitStack() as held:
        first = held.enter_context(ExitStack())
        first.enter_context(app.media_slot([image], 30_000, time.perf_counter(), Client()))
        for _ in range(2):
            held.enter_context(app.media_slot([image], 30_000, time.perf_counter(), Client()))
        assert slots_held() == before + 3
        with app.media_slot([{"state": "text only", "images": []}], 30_000, time.perf_counter(), Client()):
            pass  # text never waits
        waited = time.monotonic()
        with pytest.raises(Overloaded, match="--media-slots 3") as refused, app.media_slot([image], 300, time.perf_counter(), Client()):
            pass
        assert refused.value.limit == "media_slots"
        assert time.monotonic() - waited >= 0.3
        waited = time.monotonic()
        with pytest.raises(Overloaded), app.media_slot([{"state": "text"}, image], 2_000, time.perf_counter() - 10, Client()):  # a bundle with one
            pass
        assert time.monotonic() - waited < 1.5  # its deadline was spent before it asked (reading its body, say): no wait
        waited, leaving = time.monotonic(), Client()
        threading.Timer(0.5, leaving.leave).start()
        with pytest.raises(ClientGone), app.media_slot([image], 30_000, time.perf_counter(), leaving):
            pass
        assert time.monotonic() - waited < 5  # its client left: it stopped waiting then, not at its 30 s deadline
        waited = time.monotonic()
        threading.Timer(0.5, first.close).start()  # a slot freed while one waits: it is taken then
        with app.media_slot([image], 30_000, time.perf_counter(), Client()):
            assert 0.4 < time.monotonic() - waited < 5
    with app.media_slot([image], 30_000, time.perf_counter(), Client()):
        pass  # released when the requests were answered
    assert slots_held() == before


def test_a_queue_holding_long_requests_refuses_by_their_tokens(packages, tmp_path):
    """Behind a forward in flight, a queued request of ~8,300 input tokens leaves no room under --max-queued-tokens
    12000 for another: it gets 429 `queued_tokens` at once, where --max-queue (256) would have taken it."""
    server = Server([str(packages["d3"]), "--device", "cpu", "--result-cache-entries", "0", "--max-queued-tokens", "12000"], log=tmp_path / "log")

    def body(label: str, questions: int, words: int, deadline_ms: int = 60000) -> dict:
        topics = {f"q{i}": {"type": "noul", "instructions": f"Topic {i}?"} for i in range(questions)}
        return {"state": f"{label} " + "word " * words, "questions": topics, "options": {"deadline_ms": deadline_ms, "return_meta": True}}

    replies: dict = {}

    def send(name: str, request: dict) -> threading.Thread:
        thread = threading.Thread(target=lambda: replies.__setitem__(name, server.post(request, timeout=120)))
        thread.start()
        return thread

    def refusals() -> float:
        return metric_total(server.request("GET", "/metrics").body.decode(), "vllm_sr_runtime_overloaded_requests_total", limit="queued_tokens")

    try:
        server.wait()
        long = send("long", body("long", 64, 1200, deadline_ms=4000))  # 8 passes of ~2,400-token rows: seconds
        time.sleep(1.0)
        queued = send("queued", body("queued", 8, 280))
        time.sleep(0.5)
        refused = server.post(body("refused", 8, 280))
        CONTRACT.check("/v1/systemone", "POST", refused)
        assert refused.status == 429 and refused.json()["error"]["code"] == "overloaded" and refused.headers["retry-after"] == "1", refused.body
        assert "--max-queued-tokens 12000" in refused.json()["error"]["message"] and refusals() == 1
        for thread in (long, queued):
            thread.join(120)
        assert replies["queued"].status == 200 and 6000 < replies["queued"].json()["usage"]["input_tokens"] <= 12000
        assert server.post(body("again", 8, 280)).status == 200  # the queue emptied: the same request is taken
    finally:
        server.stop()
