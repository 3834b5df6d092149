"""The server under generated requests (no 5xx), 64 concurrent clients (429, never a hang), and a killed worker."""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server_harness import Contract, Server, metric_total

CONTRACT = Contract()
STATE = "Merge two sorted lists."

json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=False, width=32), st.text(max_size=12))
json_value = st.recursive(json_leaf, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)), max_leaves=6)
texts = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
choice = st.fixed_dictionaries(
    {"type": st.just("choice"), "criteria": st.dictionaries(texts, st.one_of(st.none(), texts, json_value), min_size=0, max_size=8)},
    optional={"instructions": st.one_of(texts, json_value)},
)
noul = st.fixed_dictionaries({"type": st.just("noul")}, optional={"instructions": texts, "criteria": st.dictionaries(st.sampled_from(["true", "false", "maybe"]), st.one_of(st.none(), texts), max_size=3)})
score = st.fixed_dictionaries({"type": st.just("score"), "criteria": st.lists(st.one_of(texts, json_value), min_size=0, max_size=12)}, optional={"instructions": texts})
broken = st.dictionaries(st.sampled_from(["type", "criteria", "choices", "levels", "instructions", "weird"]), json_value, max_size=4)
question = st.one_of(choice, noul, score, broken, json_leaf)
# Well-formed requests (always answerable), so every run covers 200s whatever examples hypothesis's version draws.
words = st.text(alphabet="abcdefghij klmnop", min_size=1, max_size=20).filter(str.strip)
labels = st.text(alphabet="abcdefghijklmnop", min_size=1, max_size=8)
valid_question = st.one_of(
    st.fixed_dictionaries({"type": st.just("choice"), "criteria": st.dictionaries(labels, st.one_of(st.none(), words), min_size=2, max_size=5)}),
    st.fixed_dictionaries({"type": st.just("noul"), "instructions": words}),
    st.fixed_dictionaries({"type": st.just("score"), "criteria": st.lists(words, min_size=2, max_size=5, unique=True)}),
)
valid_request = st.fixed_dictionaries({"state": words, "questions": st.dictionaries(labels, valid_question, min_size=1, max_size=3)})
fuzzed_request = st.fixed_dictionaries(
    {},
    optional={
        "state": st.one_of(texts, json_value),
        "questions": st.one_of(st.dictionaries(texts, question, min_size=0, max_size=5), json_value),
        "model": st.one_of(st.just("synthetic-d3-tiny-s0"), texts),
        "options": st.one_of(st.fixed_dictionaries({}, optional={"deadline_ms": st.integers(-5, 20000), "return_meta": st.booleans(), "profile": st.sampled_from(["exact", "max_speed", "x"])}), json_value),
        "instructions": texts,
        "images": st.one_of(st.just([]), st.lists(texts, max_size=2)),
    },
)
request = st.one_of(valid_request, fuzzed_request)


@pytest.fixture(scope="module")
def server(packages, tmp_path_factory):
    log = tmp_path_factory.mktemp("load") / "server.log"
    started = Server([str(packages["d3"]), "--device", "cpu", "--threads", "16", "--max-queue", "4", "--workers", "2"], log=log)
    try:
        started.wait()
        yield started
    finally:
        started.stop()


def test_generated_requests_never_5xx_and_cover_both_outcomes(server):
    """2,000 generated requests (valid and fuzzed), none answered 5xx, each answer in the contract; the run
    itself checks that it reached both outcomes (a test of its own, not one that reads another's leftovers)."""
    seen = {"count": 0, "statuses": set()}

    @settings(max_examples=2000, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(body=request)
    def never_5xx(body):
        reply = server.post(body)
        seen["count"] += 1
        seen["statuses"].add(reply.status)
        assert reply.status < 500, (body, reply.body)
        CONTRACT.check("/v1/systemone", "POST", reply)

    never_5xx()
    assert seen["count"] >= 2000
    assert {200, 400} <= seen["statuses"]


def load(server: Server, seconds: float, clients: int, results: list, stop: threading.Event) -> list[threading.Thread]:
    body = {"state": STATE, "questions": {"a": {"type": "noul", "instructions": "Is it code?"}, "b": {"type": "score", "criteria": ["low", "high"]}}}

    def client() -> None:
        end = time.time() + seconds
        sent = 0
        while time.time() < end and not stop.is_set() and sent < 400:
            sent += 1
            try:
                reply = server.post(body, timeout=30)
                results.append((reply.status, reply.headers.get("retry-after"), reply.json() if reply.status == 200 else None))
            except (ConnectionError, OSError, http.client.HTTPException) as exc:
                results.append(("error", type(exc).__name__, None))

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    return threads


def test_64_clients_get_answers_or_429_never_5xx(server):
    def queue_refusals() -> float:
        return metric_total(server.request("GET", "/metrics").body.decode(), "vllm_sr_runtime_overloaded_requests_total", limit="queue")

    refused_before = queue_refusals()
    results: list = []
    for thread in load(server, 6.0, 64, results, threading.Event()):
        thread.join(timeout=60)
        assert not thread.is_alive(), "a request hung"
    statuses = [status for status, _, _ in results]
    assert "error" not in statuses
    assert all(status in (200, 429) for status in statuses), set(statuses)
    assert statuses.count(429) > 0 and statuses.count(200) > 0
    assert all(retry == "1" for status, retry, _ in results if status == 429)
    assert queue_refusals() - refused_before == statuses.count(429)  # /metrics says which limit refused them
    assert all(set(body["answers"]) == {"a", "b"} and "error" not in body["answers"]["a"] for status, _, body in results if status == 200)


def test_killed_worker_is_replaced_and_serving_goes_on(server):
    victims = server.workers()
    assert len(victims) == 2
    results: list = []
    stop = threading.Event()
    threads = load(server, 8.0, 8, results, stop)
    time.sleep(1.0)
    os.kill(victims[0], signal.SIGKILL)
    deadline = time.time() + 60
    while time.time() < deadline and (victims[0] in server.workers() or len(server.workers()) < 2):
        time.sleep(0.2)
    assert victims[0] not in server.workers() and len(server.workers()) == 2
    server.wait()
    for thread in threads:
        thread.join(timeout=60)
    ok_after = server.post({"state": STATE, "questions": {"a": {"type": "noul"}}})
    assert ok_after.status == 200
    statuses = [status for status, _, _ in results]
    assert statuses.count(200) > 0
    # Requests in flight on the killed worker may see a dropped connection; none may see a 5xx.
    assert not any(isinstance(status, int) and status >= 500 for status in statuses)


def test_liveness_is_answered_while_more_requests_wait_on_forwards_than_the_old_thread_count(packages, tmp_path):
    """A request waits for its forward on its own thread. With 8 threads (the old default) and 12 slow requests in
    flight, /health/live queued behind them until 5 had finished (12-15 s under real load: a liveness probe that
    restarts the pod). With the default threads it is answered before the slow requests finish."""
    server = Server([str(packages["d3"]), "--device", "cpu", "--result-cache-entries", "0"], log=tmp_path / "log")
    questions = {f"q{i}": {"type": "noul", "instructions": f"Does it mention topic {i}?"} for i in range(8)}
    sent, finished, lock = threading.Barrier(13), [], threading.Lock()

    def slow(number: int) -> None:
        conn = server.connection(timeout=300)
        body = json.dumps({"state": f"{'word ' * 500} {number}", "questions": questions})
        conn.request("POST", "/v1/systemone", body=body, headers={"Content-Type": "application/json"})
        sent.wait()
        status = conn.getresponse().status
        with lock:
            finished.append(status)
        conn.close()

    try:
        server.wait()
        clients = [threading.Thread(target=slow, args=(i,)) for i in range(12)]
        for client in clients:
            client.start()
        sent.wait()  # every slow request is written
        time.sleep(0.5)  # and read by the server
        live = server.request("GET", "/health/live", timeout=300)
        with lock:
            finished_before = len(finished)
        for client in clients:
            client.join(timeout=300)
    finally:
        server.stop()
    assert live.status == 200 and finished == [200] * 12
    assert finished_before < 4, f"/health/live waited for {finished_before} of 12 slow requests to finish"


def test_requests_whose_clients_left_are_dropped_before_their_forward(packages, tmp_path):
    """A client that closes its connection while its request waits (a router's timeout, a cancelled call) is nobody to
    answer: its queued forward is dropped (counted as abandoned, the request as 499), so the requests behind it are
    not held up by answers no one reads. Before, six abandoned requests ahead made the next one wait for six forwards."""
    server = Server([str(packages["d3"]), "--device", "cpu", "--result-cache-entries", "0"], log=tmp_path / "log")
    questions = {f"q{i}": {"type": "noul", "instructions": f"Does it mention topic {i}?"} for i in range(8)}

    def sent(number: int, path: str = "/v1/systemone"):
        conn = server.connection(timeout=300)
        request = {"state": f"{'word ' * 500} {number}", "questions": questions}
        if path == "/v1/bundle":
            request = {"tasks": [{"surface": "systemone", "body": {**request, "state": f"{request['state']} {task}"}} for task in range(2)]}
        conn.request("POST", path, body=json.dumps(request), headers={"Content-Type": "application/json"})
        return conn

    def counts() -> dict[str, float]:
        page = server.request("GET", "/metrics").body.decode()
        return {
            "abandoned": metric_total(page, "vllm_sr_runtime_abandoned_questions_total"),
            "forwards": metric_total(page, "vllm_sr_runtime_forward_duration_seconds_count"),
            "gone": metric_total(page, "vllm_sr_runtime_requests_total", status="499"),
        }

    try:
        server.wait()
        before = counts()
        first = sent(0)  # holds the device while the others queue
        left = [sent(number) for number in range(1, 6)] + [sent(6, "/v1/bundle")]
        time.sleep(0.3)  # read by the server and queued
        for conn in left:
            conn.close()
        assert first.getresponse().status == 200
        first.close()
        after_first = sent(7)
        assert after_first.getresponse().status == 200
        after_first.close()
        time.sleep(0.5)
        after = counts()
    finally:
        server.stop()
    assert after["gone"] - before["gone"] == 6, (before, after)  # five requests and the bundle
    assert after["abandoned"] - before["abandoned"] >= 8 * 5, (before, after)  # at most one had started its forward
    assert after["forwards"] - before["forwards"] <= 3, (before, after)  # the first, the last, and at most one of them


def test_a_forward_nobody_waits_for_stops_early(server):
    """A request answered deadline_exceeded, or whose client leaves mid-forward, has nobody to read its answers: its
    run stops (counted as interrupted questions) and the device goes to the requests still waiting. Before, a
    64-question request of ~2,400 tokens a row kept the tiny package's forward busy for ~16 s past its deadline,
    and the next request waited for it."""
    questions = {f"q{i}": {"type": "noul", "instructions": f"Does it mention topic {i}?"} for i in range(64)}  # 8 passes

    def body(label: str, **options) -> dict:  # a fresh state: the result cache must not answer it
        return {"state": f"{label} {time.time_ns()} " + "word " * 1200, "questions": questions, **({"options": options} if options else {})}

    def totals() -> tuple[float, float]:
        page = server.request("GET", "/metrics").body.decode()
        return metric_total(page, "vllm_sr_runtime_interrupted_questions_total"), metric_total(page, "vllm_sr_runtime_batch_rows_count")

    def device_seconds(outcome: str) -> float:
        return metric_total(server.request("GET", "/metrics").body.decode(), "vllm_sr_runtime_device_seconds_total", outcome=outcome)

    def interrupted_by(expected: float) -> bool:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if totals()[0] >= expected:
                return True
            time.sleep(0.1)
        return False

    before, _ = totals()
    cut_seconds = device_seconds("interrupted")
    reply = server.post(body("deadline", deadline_ms=3000), timeout=120)
    assert reply.status == 200
    assert {answer.get("error") for answer in reply.json()["answers"].values()} == {"deadline_exceeded"}
    assert interrupted_by(before + 64), totals()
    assert device_seconds("interrupted") - cut_seconds >= 2.0  # the device time the run spent until its deadline

    passes = totals()[1]
    conn = server.connection(timeout=120)
    conn.request("POST", "/v1/systemone", body=json.dumps(body("gone")), headers={"Content-Type": "application/json"})
    deadline = time.monotonic() + 60
    while totals()[1] == passes and time.monotonic() < deadline:  # its first pass is done: its run is in flight
        time.sleep(0.05)
    conn.close()
    assert interrupted_by(before + 128), totals()
    answered_seconds = device_seconds("answered")
    assert server.post({"state": f"{time.time_ns()} {STATE}", "questions": {"a": {"type": "noul"}}}).status == 200
    assert device_seconds("answered") > answered_seconds
