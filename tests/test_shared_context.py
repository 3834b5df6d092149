"""The shared_context profile: a request's common prefix runs once and every question continues from it."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

import vllm_sr_runtime
from conftest import load_kwargs
from server_harness import Contract, Server
from test_batching import assert_close

CONTRACT = Contract()
STATE = {"user": "Write a Python function that merges two sorted lists.", "history": ["explain its running time"] * 12}


def questions(count: int = 6) -> dict:
    made = {
        f"choice{i}": {"type": "choice", "instructions": f"Which domain fits, take {i}?", "criteria": {"code": "Programming", "math": None, f"extra{i}": "other"}}
        for i in range(count - 3)
    }
    made["same"] = dict(made["choice0"])  # identical to another question: the prefix reaches its last token
    made["noul"] = {"type": "noul", "instructions": "Does it need multi-step reasoning?"}
    made["score"] = {"type": "score", "instructions": "How hard is it?", "criteria": ["easy", "medium", "hard", "expert"]}
    return made


@pytest.mark.parametrize("name", ["d2_qwen3", "d2_qwen3_5", "d2_lora", "d3_causal"])
def test_shared_prefix_answers_like_exact(models, packages, name):
    exact = models(name)
    shared = vllm_sr_runtime.load(packages[name], profile="shared_context", shared_min_tokens=1, **load_kwargs(name, packages[name]), allow_approximate_shared_context=True)
    qs = questions()
    plan = shared.plan(STATE, qs)
    assert len(plan.batches) == 1 and plan.batches[0].shared
    prefix = plan.batches[0].inputs["prefix_ids"].shape[1]
    assert prefix > 50  # the state is in the prefix, run once
    assert plan.batches[0].inputs["input_ids"].shape[0] == len(qs)
    assert plan.input_tokens == exact.plan(STATE, qs).input_tokens  # usage counts every question's full prompt
    answers = shared.ask(STATE, qs)
    assert list(answers) == list(qs) and shared.shared_questions == len(qs)
    # Causal models compute exactly what the full rows compute (non-causal Decision 3.0 does not:
    # tests/test_attention_direction.py).
    assert_close(exact.ask(STATE, qs), answers, 1e-4)


def test_break_even_keeps_plain_rows(packages, models):
    shared = vllm_sr_runtime.load(packages["d2_qwen3_5"], profile="shared_context")  # default threshold
    exact = models("d2_qwen3_5")
    one = {"noul": questions()["noul"]}
    assert not any(b.shared for b in shared.plan(STATE, one).batches)  # one question: nothing to share
    short = {"a": {"type": "noul", "instructions": "Code?"}, "b": {"type": "noul", "instructions": "Math?"}}
    plan = shared.plan("hi", short)  # (2 - 1) x a few prefix tokens is below the break-even
    assert not any(b.shared for b in plan.batches)
    assert shared.ask("hi", short) == exact.ask("hi", short)  # the plain rows: bit-identical to exact
    assert any(b.shared for b in shared.plan(STATE, questions()).batches)  # well above it: shared
    assert exact.plan(STATE, questions()).batches[0].shared is False  # exact never shares


def test_invalid_questions_stay_in_place(packages):
    shared = vllm_sr_runtime.load(packages["d3"], profile="shared_context", shared_min_tokens=1, allow_approximate_shared_context=True)
    qs = questions()
    qs["broken"] = {"type": "score", "criteria": ["same", "same"]}
    answers = shared.ask(STATE, qs)
    assert answers["broken"]["error"] == "invalid_question"
    assert all("error" not in answers[key] for key in qs if key != "broken")


def test_parity_shared_context(packages, tmp_path):
    suite = tmp_path / "suite.jsonl"
    lines = [json.dumps({"state": {**STATE, "n": index}, "questions": questions(4 + index % 3)}) for index in range(4)]
    suite.write_text("\n".join(lines) + "\n")
    for name, gate in (("d2_qwen3_5", ["--max-abs-diff", "1e-4", "--max-changed-rate", "0"]), ("d3", ["--max-changed-rate", "1"])):  # approximate by design: the default 1% gate loosened
        out = tmp_path / name
        result = subprocess.run(
            [sys.executable, "-m", "vllm_sr_runtime.cli", "parity", str(packages[name]), "--profile", "shared_context", "--suite", str(suite),
             "--shared-min-tokens", "1", "--out", str(out), "--quiet", *gate],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-2000:]
        report = json.loads((out / "parity.json").read_text())
        assert report["summary"]["compared"] == 4 + 5 + 6 + 4
        assert report["shared_questions"] == report["summary"]["compared"]
        assert "ran from a shared prefix" in result.stdout


def test_server_serves_shared_context_and_exact(packages, tmp_path):
    server = Server([str(packages["d2_qwen3_5"]), "--profile", "shared_context", "--shared-min-tokens", "1", "--device", "cpu"], log=tmp_path / "log")
    try:
        server.wait()
        card = server.request("GET", "/v1/models").json()["data"][0]
        assert card["profiles"] == ["shared_context", "exact"] and card["profile"] == "shared_context"
        qs = questions()
        shared = server.post({"state": STATE, "questions": qs, "options": {"return_meta": True}})
        exact = server.post({"state": STATE, "questions": qs, "options": {"profile": "exact", "return_meta": True}})
        for reply in (shared, exact):
            CONTRACT.check("/v1/systemone", "POST", reply)
            assert reply.status == 200
        assert shared.json()["meta"]["profile"] == "shared_context" and exact.json()["meta"]["profile"] == "exact"
        assert shared.json()["usage"] == exact.json()["usage"]
        assert_close(exact.json()["answers"], shared.json()["answers"], 1e-4)
        metrics = server.request("GET", "/metrics").body.decode()
        passes = [line for line in metrics.splitlines() if line.startswith("vllm_sr_runtime_shared_passes_total")]
        assert passes and float(passes[0].rsplit(" ", 1)[1]) == 1.0  # the exact request did not share
    finally:
        server.stop()


def test_load_refuses_approximate_shared_context_unless_asked(packages):
    """serve refused it, but load(d3, profile="shared_context") answered, approximately, without a word."""
    from vllm_sr_runtime.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="allow_approximate_shared_context=True"):
        vllm_sr_runtime.load(packages["d3"], profile="shared_context")
    causal = vllm_sr_runtime.load(packages["d3_causal"], profile="shared_context")  # exact by design: nothing to allow
    assert not causal.approximate_by_design


def test_serve_refuses_approximate_shared_context_unless_asked(packages, tmp_path):
    refused = Server([str(packages["d3"]), "--profile", "shared_context", "--device", "cpu"], log=tmp_path / "refused.log")
    try:
        refused.wait(status=503)
        deadline = time.time() + 120
        while (card := refused.request("GET", "/v1/models").json()["data"][0])["status"] == "loading" and time.time() < deadline:
            time.sleep(0.2)
        assert card["status"] == "failed" and "--allow-approximate-shared-context" in card["reason"], card
        assert refused.request("GET", "/health").status == 503
    finally:
        refused.stop()
    allowed = Server([str(packages["d3"]), "--profile", "shared_context", "--allow-approximate-shared-context", "--device", "cpu"], log=tmp_path / "allowed.log")
    try:
        allowed.wait()
        reply = allowed.request("GET", "/v1/models")
        CONTRACT.check("/v1/models", "GET", reply)
        card = reply.json()["data"][0]
        assert card["status"] == "ready" and card["shared_context"] == "approximate" and card["profile"] == "shared_context"
    finally:
        allowed.stop()
