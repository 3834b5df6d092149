"""Close calls answered again by exact (`close_call_margin`): which answers are replaced, on plain and shared-prefix
passes, the refusals, and the real server's meta and metrics."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import vllm_sr_runtime
from vllm_sr_runtime.close_calls import margin_for
from vllm_sr_runtime.errors import InvalidRequest
from vllm_sr_runtime.families.answers import answer_distribution, top_margin
from vllm_sr_runtime.synthetic.writer import write_synthetic_package
from server_harness import Contract, Server

STATE = "A customer writes: my invoice shows a charge twice this month and I want the second one refunded today."
QUESTIONS = {
    "domain": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "Payments", "tech": None, "sales": None, "legal": "Contracts"}},
    "urgent": {"type": "noul", "instructions": "Is it urgent?"},
    "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
    "tone": {"type": "score", "instructions": "How upset is the customer?", "criteria": ["calm", "annoyed", "angry", "furious"]},
    "lang": {"type": "choice", "instructions": "Which language?", "criteria": {"en": None, "de": None, "fr": None}},
    "human": {"type": "noul", "instructions": "Should a human answer?"},
}


def same(a: dict, b: dict) -> bool:
    return np.allclose(answer_distribution(a), answer_distribution(b), atol=1e-5)


@pytest.fixture(scope="module")
def other_seed(tmp_path_factory):
    """Another seed's weights: a reference that answers differently from the candidate, so a replaced answer shows."""
    return vllm_sr_runtime.load(write_synthetic_package("decision3", tmp_path_factory.mktemp("other") / "d3-s5", seed=5)[0])


@pytest.mark.parametrize("profile", ["batching", "shared_context"])
def test_exactly_the_answers_below_the_margin_come_from_the_reference(packages, other_seed, profile):
    package = packages["d3_causal" if profile == "shared_context" else "d3"]
    candidate = vllm_sr_runtime.load(package, profile=profile, shared_min_tokens=0)
    own = candidate.ask(STATE, QUESTIONS)
    theirs = other_seed.ask(STATE, QUESTIONS)
    margins = {qid: top_margin(answer_distribution(answer)) for qid, answer in own.items()}
    assert all(not same(own[qid], theirs[qid]) for qid in QUESTIONS)
    margin = float(np.median(list(margins.values())))
    candidate.confirm_close_calls(margin, other_seed.engine, other_seed.dtype)
    before = candidate.shared_questions
    response = candidate.respond(STATE, QUESTIONS)
    if profile == "shared_context":
        assert candidate.shared_questions == before + len(QUESTIONS)  # the request still ran as one shared pass
    close = {qid for qid, m in margins.items() if m < margin}
    assert 0 < len(close) < len(QUESTIONS)
    for qid, answer in response.answers.items():
        assert same(answer, theirs[qid] if qid in close else own[qid]), qid
    assert response.reanswered == len(close)
    assert candidate.reanswered_questions == len(close) and candidate.answered_questions == 2 * len(QUESTIONS)


def test_no_decision_changes_outside_the_margin_twice_the_largest_move():
    """Random reference/candidate pairs: a changed decision always has a candidate margin below margin_for(max |dp|),
    and the bound is tight (pairs close to it occur)."""
    rng = np.random.default_rng(0)
    closest = 0.0
    for _ in range(20_000):
        options = int(rng.integers(2, 6))
        exact = rng.dirichlet(np.ones(options))
        candidate = np.clip(exact + rng.normal(0, rng.choice([0.002, 0.02, 0.1]), options), 1e-6, None)
        candidate /= candidate.sum()
        moved = float(np.abs(candidate - exact).max())
        if candidate.argmax() != exact.argmax():
            assert top_margin(candidate.tolist()) < margin_for(moved)
            closest = max(closest, top_margin(candidate.tolist()) / margin_for(moved))
    assert closest > 0.5
    assert margin_for(0.0) is None and margin_for(0.8) == 1.0


def test_margins_outside_the_range_and_profile_exact_are_refused(packages):
    with pytest.raises(InvalidRequest, match="applies to the other profiles"):
        vllm_sr_runtime.load(packages["d3"], profile="exact", close_call_margin=0.1)
    model = vllm_sr_runtime.load(packages["d3"], profile="batching")
    for margin in (0.0, -0.1, 1.5):
        with pytest.raises(InvalidRequest, match=r"must be in \(0, 1\]"):
            model.confirm_close_calls(margin, model.engine, model.dtype)
    done = subprocess.run(
        [sys.executable, "-m", "vllm_sr_runtime.cli", "serve", str(packages["d3"]), "--profile", "exact", "--close-call-margin", "0.1"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and "--close-call-margin" in done.stderr and "another profile" in done.stderr


def test_the_server_reports_the_close_calls_it_answered_again(packages, models, tmp_path):
    """A served batching model with margin 1: every answer is a close call, so exact gives each again; meta and
    /metrics count them and the answers are exact's."""
    server = Server([str(packages["d3"]), "--profile", "batching", "--device", "cpu", "--close-call-margin", "1.0"], log=tmp_path / "log")
    try:
        server.wait()
        reply = server.post({"state": STATE, "questions": QUESTIONS, "options": {"return_meta": True}})
        Contract().check("/v1/systemone", "POST", reply)
        body = reply.json()
        assert reply.status == 200 and body["meta"]["reanswered_questions"] == len(QUESTIONS)
        exact = models("d3").ask(STATE, QUESTIONS)
        assert all(same(body["answers"][qid], exact[qid]) for qid in QUESTIONS)
        metrics = server.request("GET", "/metrics").body.decode()
        counted = [line for line in metrics.splitlines() if line.startswith("vllm_sr_runtime_close_call_reanswers_total{")]
        assert len(counted) == 1 and float(counted[0].rsplit(" ", 1)[1]) == len(QUESTIONS)
        card = json.loads(server.request("GET", "/v1/models").body)["data"][0]
        assert card["close_calls"] == {"margin": 1.0, "reference": "exact (fp32)"}
    finally:
        server.stop()
