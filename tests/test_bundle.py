"""POST /v1/bundle on the real server: each task answered exactly as it would be alone, in order, over two models."""

from __future__ import annotations

import pytest

from server_harness import Contract, Server

CONTRACT = Contract()
LIMIT = 200_000  # --max-request-bytes of the server under test
QUESTIONS = {
    "domain": {"type": "choice", "instructions": "Which domain?", "criteria": {"code": "Programming", "math": None, "law": "Legal"}},
    "reasoning": {"type": "noul", "instructions": "Does it need reasoning?"},
    "difficulty": {"type": "score", "instructions": "How hard?", "criteria": ["easy", "medium", "hard"]},
}


@pytest.fixture(scope="module")
def server(packages, tmp_path_factory):
    log = tmp_path_factory.mktemp("bundle") / "log"
    models = log.parent / "models.yaml"
    models.write_text(f"- {{model: {packages['d3']}, name: d3}}\n- {{model: {packages['d2_qwen3_5']}, name: d2}}\n")
    served = Server(
        ["--models", str(models), "--profile", "batching", "--device", "cpu", "--max-request-bytes", str(LIMIT), "--result-cache-entries", "0"],
        log=log,
    )  # fmt: skip
    try:
        served.wait()
        yield served
    finally:
        served.stop()


def mixed_tasks(max_input_tokens: int) -> list[dict]:
    """64 tasks over both models and both surfaces: good ones in two profiles, and each kind of bad one."""
    tasks = []
    for index in range(56):
        body = {
            "model": ("d3", "d2")[index % 2],
            "state": f"Request {index % 7}: merge two sorted lists and explain the running time.",
            "questions": {key: QUESTIONS[key] for key in list(QUESTIONS)[: 1 + index % 3]},
        }
        if index % 4 == 1:
            body["options"] = {"profile": "exact"}
        tasks.append({"surface": ("decisions", "systemone")[index % 3 == 0], "body": body})
    bad = [
        {"model": "no-such-model", "state": "s", "questions": {"q": {"type": "noul"}}},  # 404
        {"model": "d3", "state": "s", "questions": {"q": {"type": "noul", "criteria": {"maybe": "x"}}, "n": {"type": "noul"}}},  # per question
        {"model": "d2", "state": "s", "questions": {"long": {"type": "noul", "instructions": "word " * (max_input_tokens + 50)}, "n": {"type": "noul"}}},
        {"model": "d3", "state": "x" * (LIMIT + 1000), "questions": {"q": {"type": "noul"}}},  # 413 for this task only
        {"model": "d3", "state": "s", "questions": {"q": {"type": "noul"}}, "options": {"profile": "max_speed"}},  # profile not enabled
        {"model": "d2", "questions": {"q": {"type": "noul"}}},  # no state
        {"model": "d3", "state": "s", "questions": {"": {"type": "score"}}},
        {"model": "d2", "state": "s", "questions": {"q": {"type": "noul"}}, "extra": 1},
    ]
    for offset, body in enumerate(bad):
        tasks.insert(3 + offset * 7, {"surface": "decisions", "body": body})
    assert len(tasks) == 64
    return tasks


def same_answer(bundled: dict, alone: dict) -> bool:
    """Equal, with probabilities allowed float noise (a merged batch pads rows differently from a request alone)."""
    if bundled.keys() != alone.keys():
        return False
    for key, value in bundled.items():
        other = alone[key]
        if isinstance(value, dict) and isinstance(other, dict):
            if not same_answer(value, other):
                return False
        elif isinstance(value, float) and isinstance(other, float):
            if abs(value - other) > 1e-5:
                return False
        elif value != other:
            return False
    return True


def test_a_64_task_bundle_answers_each_task_as_it_would_be_answered_alone(server):
    card = {c["id"]: c for c in server.request("GET", "/v1/models").json()["data"]}
    tasks = mixed_tasks(max(c["limits"]["max_input_tokens"] for c in card.values()))
    reply = server.post({"tasks": tasks}, path="/v1/bundle", timeout=300)
    CONTRACT.check("/v1/bundle", "POST", reply)
    assert reply.status == 200, reply.body[:2000]
    results = reply.json()["results"]
    assert len(results) == len(tasks)
    statuses = []
    for index, (task, result) in enumerate(zip(tasks, results)):
        alone = server.post(task["body"], path=f"/v1/{task['surface']}")
        CONTRACT.check(f"/v1/{task['surface']}", "POST", alone)
        assert result["status"] == alone.status, (index, result, alone.body[:500])
        if result["status"] == 413:  # the message counts the body's bytes, which the bundle holds re-encoded
            assert result["body"]["error"]["code"] == alone.json()["error"]["code"] == "request_too_large"
        else:
            assert same_answer(result["body"], alone.json()), (index, result["body"], alone.json())
        statuses.append(result["status"])
    assert statuses.count(200) == 58 and sorted(set(statuses)) == [200, 400, 404, 413], [(i, s) for i, s in enumerate(statuses) if s != 200]
    by_error = {a["error"] for r in results if r["status"] == 200 for a in r["body"]["answers"].values() if "error" in a}
    assert {"invalid_question", "max_length_exceeded"} <= by_error  # per-question errors in place, siblings answered
    assert {r["body"]["model"] for r in results if r["status"] == 200} == {"d3", "d2"}


def test_bundle_level_errors_and_metrics(server):
    one = {"surface": "decisions", "body": {"model": "d3", "state": "s", "questions": {"q": {"type": "noul"}}}}
    too_many = server.post({"tasks": [one] * 65}, path="/v1/bundle")
    assert too_many.status == 400 and "at most 64 tasks" in too_many.json()["error"]["message"]
    for bad in ({"tasks": []}, {"tasks": [{"surface": "chat", "body": {}}]}, {"tasks": [one], "options": {"deadline_ms": 0}}, {"tasks": [one], "other": 1}):
        reply = server.post(bad, path="/v1/bundle")
        CONTRACT.check("/v1/bundle", "POST", reply)
        assert reply.status == 400 and reply.json()["error"]["code"] == "invalid_request", (bad, reply.body)
    ok = server.post({"tasks": [one, one], "options": {"deadline_ms": 60_000}}, path="/v1/bundle").json()["results"]
    assert [r["status"] for r in ok] == [200, 200] and same_answer(ok[0]["body"], ok[1]["body"])
    metrics = server.request("GET", "/metrics").body.decode()
    counts = [line for line in metrics.splitlines() if line.startswith("vllm_sr_runtime_bundle_tasks_count")]
    assert counts and float(counts[0].split()[-1]) >= 1
    assert 'vllm_sr_runtime_requests_total{endpoint="bundle:decisions",status="200"}' in metrics
