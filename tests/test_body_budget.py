"""The request-body bytes a worker's requests in flight hold are bounded (--max-inflight-request-bytes): with a
thread for every request the queues take, a burst of large bodies would otherwise be held all at once."""

from __future__ import annotations

import json
import time

import pytest

from server_harness import Contract, Server
from vllm_sr_runtime.errors import Overloaded
from vllm_sr_runtime.server.body_budget import BodyBudget

CONTRACT = Contract()
QUESTIONS = {"a": {"type": "noul", "instructions": "Is this about code?"}}


def body_of(size: int) -> bytes:
    """A valid request of exactly `size` bytes (its state too long for the tiny model: answered, not forwarded)."""
    frame = json.dumps({"state": "", "questions": QUESTIONS}).encode()
    return json.dumps({"state": "x" * (size - len(frame)), "questions": QUESTIONS}).encode()


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
        slow = server.connection(timeout=120)  # holds 900 kB of the budget while its body arrives
        body = body_of(900_000)
        slow.putrequest("POST", "/v1/systemone")
        slow.putheader("Content-Type", "application/json")
        slow.putheader("Content-Length", str(len(body)))
        slow.endheaders()
        slow.send(body[:1000])
        time.sleep(1.0)  # the server reads its headers and starts on the body
        refused = server.request("POST", "/v1/systemone", raw=body_of(900_000))
        small = server.post({"state": "short", "questions": QUESTIONS})
        slow.send(body[1000:])
        answered = slow.getresponse()
        answered_body = json.loads(answered.read())
        slow.close()
        again = server.request("POST", "/v1/systemone", raw=body_of(900_000))
    finally:
        server.stop()
    CONTRACT.check("/v1/systemone", "POST", refused)
    assert refused.status == 429 and refused.json()["error"]["code"] == "overloaded", refused.body[:300]
    assert "--max-inflight-request-bytes 1500000" in refused.json()["error"]["message"] and refused.headers["retry-after"] == "1"
    assert small.status == 200  # what fits beside it is taken
    assert answered.status == 200 and answered_body["answers"]["a"]["error"] == "max_length_exceeded"
    assert again.status == 200  # the slow request's bytes went back to the budget when it ended
