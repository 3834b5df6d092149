"""The batching profile: rows of concurrent requests share passes without changing anyone's answers."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest

import vllm_sr_runtime
from server_harness import Contract, Server

CONTRACT = Contract()
STATE = "Write a Python function that merges two sorted lists."


def requests_for_test(count: int = 8) -> list[tuple[str, dict]]:
    made = []
    for index in range(count):
        questions = {
            "choice": {"type": "choice", "instructions": "Which label?", "criteria": {f"k{j}": f"label {j}" for j in range(2 + index)}},
            "noul": {"type": "noul", "instructions": "Is it about code?" + " really" * index},
        }
        if index == 3:
            questions["broken"] = {"type": "score", "criteria": ["same", "same"]}
        made.append((f"{STATE} (variant {index})" + " more context" * (3 * index), questions))
    return made


def distributions(answers: dict) -> dict[str, list[float]]:
    out = {}
    for key, answer in answers.items():
        if "error" in answer:
            out[key] = answer
        elif answer["type"] == "noul":
            out[key] = [answer["noul"]]
        else:
            out[key] = list(answer["probabilities"].values())
    return out


def assert_close(left: dict, right: dict, tolerance: float) -> None:
    a, b = distributions(left), distributions(right)
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], dict):
            assert a[key] == b[key]
        else:
            assert max(abs(x - y) for x, y in zip(a[key], b[key])) <= tolerance, key


@pytest.mark.parametrize("name", ["d2_qwen3_5", "d3"])
def test_shared_passes_change_nothing_beyond_1e_5(models, packages, name):
    exact = models(name)
    batching = vllm_sr_runtime.load(packages[name], profile="batching")
    reqs = requests_for_test()
    together = batching.ask_many(reqs, budget_tokens=4096)
    assert len(batching.family.pack([i for s, q in reqs for b in batching.plan(s, q).batches for i in b.items], 4096)) >= 2
    for (state, questions), answers in zip(reqs, together):
        assert_close(exact.ask(state, questions), answers, 1e-5)
    assert together[3]["broken"]["error"] == "invalid_question"


def test_ask_many_takes_dicts_like_tuples_and_names_a_malformed_request(models):
    """A request that was not a 2-4 tuple failed in an IndexError or KeyError; a dict now reads as the tuple."""
    from vllm_sr_runtime.errors import InvalidRequest

    model = models("d3")
    state, questions = requests_for_test(1)[0]
    as_tuple = model.ask_many([(state, questions)])
    assert model.ask_many([{"state": state, "questions": questions}]) == as_tuple == [model.ask(state, questions)]
    for requests, says in (
        ([(state,)], r"requests\[0\] must be \(state, questions.*not a tuple of 1"),
        ([(state, questions), "text"], r"requests\[1\] must be .*not a str"),
        ([{"state": state}], r"requests\[0\]: missing questions"),
        ([{"state": state, "questions": questions, "image": []}], r"requests\[0\]: unknown key\(s\) image"),
    ):
        with pytest.raises(InvalidRequest, match=says):
            model.ask_many(requests)


def test_parity_batching_profile(packages, tmp_path):
    suite = tmp_path / "suite.jsonl"
    suite.write_text("\n".join(json.dumps({"state": state, "questions": questions}) for state, questions in requests_for_test(16)) + "\n")
    out = tmp_path / "report"
    result = subprocess.run(
        [sys.executable, "-m", "vllm_sr_runtime.cli", "parity", str(packages["d3"]), "--profile", "batching", "--suite", str(suite), "--out", str(out), "--max-abs-diff", "1e-5", "--max-changed-rate", "0", "--quiet"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((out / "parity.json").read_text())["summary"]
    assert summary["compared"] == 32 and summary["decisions_changed"] == 0


def test_concurrent_requests_with_an_invalid_question_through_the_server(models, packages, tmp_path):
    server = Server([str(packages["d3"]), "--profile", "batching", "--device", "cpu", "--batch-window-ms", "20"], log=tmp_path / "log")
    try:
        server.wait()
        card = server.request("GET", "/v1/models").json()["data"][0]
        assert card["profiles"] == ["batching", "exact"] and card["profile"] == "batching"
        reqs = requests_for_test()
        alone = [server.post({"state": s, "questions": q, "options": {"profile": "exact"}}).json()["answers"] for s, q in reqs]
        replies: list = [None] * len(reqs)
        barrier = threading.Barrier(len(reqs))

        def send(index: int) -> None:
            barrier.wait()
            replies[index] = server.post({"state": reqs[index][0], "questions": reqs[index][1]})

        for _ in range(3):  # a few rounds so that requests really meet in the queue
            threads = [threading.Thread(target=send, args=(i,)) for i in range(len(reqs))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=120)
            for index, reply in enumerate(replies):
                CONTRACT.check("/v1/systemone", "POST", reply)
                assert reply.status == 200
                assert_close(alone[index], reply.json()["answers"], 1e-5)
        metrics = server.request("GET", "/metrics").body.decode()
        assert 'profile="batching"' in metrics and 'profile="exact"' in metrics
        rows = [line for line in metrics.splitlines() if line.startswith("vllm_sr_runtime_batch_rows_bucket") and 'profile="batching"' in line]
        assert rows
        # A request alone has at most 3 rows: a pass of more than 4 rows held several requests.
        small = sum(float(line.rsplit(" ", 1)[1]) for line in rows if 'le="4.0"' in line)
        total = sum(float(line.rsplit(" ", 1)[1]) for line in rows if 'le="+Inf"' in line)
        assert total > small, "no pass held rows of several requests"
    finally:
        server.stop()
