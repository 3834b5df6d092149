"""Close calls answered again by exact (`close_call_margin`): which answers are replaced, on plain and shared-prefix
passes, the refusals, and the real server's meta and metrics."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

import vllm_sr_runtime
from vllm_sr_runtime.close_calls import margin_for, resolve_margin
from vllm_sr_runtime.errors import ArtifactError, InvalidRequest
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
    candidate.confirm_close_calls(margin, lambda: (other_seed.engine, other_seed.dtype))
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
    loads = []

    def reference():
        loads.append(1)
        return model.engine, model.dtype

    for margin in (0.0, -0.1, 1.5):
        with pytest.raises(InvalidRequest, match=r"must be in \(0, 1\]"):
            model.confirm_close_calls(margin, reference)
    with pytest.raises(InvalidRequest, match="runs no artifact"):
        model.confirm_close_calls("artifact", reference)
    assert not loads and model.close_calls is None  # a refused margin loads no reference
    model.confirm_close_calls(0.25, reference)
    assert len(loads) == 1 and model.close_calls.margin == 0.25 and model.close_calls.reference is model.engine
    done = subprocess.run(
        [sys.executable, "-m", "vllm_sr_runtime.cli", "serve", str(packages["d3"]), "--profile", "exact", "--close-call-margin", "0.1"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and "--close-call-margin" in done.stderr and "another profile" in done.stderr


def test_a_profile_on_exacts_own_engine_answers_close_calls_on_it(packages, models):
    """batching without an artifact runs exact's eager engine: its close calls are answered again on that engine,
    with no second copy of the model, so the weight budget and the weights it reports count the model once."""
    weights = vllm_sr_runtime.load(packages["d3"], profile="batching").weight_bytes
    checked = vllm_sr_runtime.load(packages["d3"], profile="batching", close_call_margin=1.0, memory_budget_bytes=int(weights * 1.5))
    assert checked.close_calls.reference is checked.engine and checked.weight_bytes == weights
    response = checked.respond(STATE, QUESTIONS)
    exact = models("d3").ask(STATE, QUESTIONS)
    assert response.reanswered == len(QUESTIONS) and all(same(response.answers[qid], exact[qid]) for qid in QUESTIONS)


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
        assert card["close_calls"] == {"margin": 1.0, "margin_from": "given", "reference": "exact (fp32)"}
    finally:
        server.stop()


def int8_manifest(measured: dict | None, dtype: str = "int8") -> dict:
    return {"dtype": dtype, "int8": {"measured": measured} if dtype == "int8" else None}


def test_the_artifact_margin_is_the_one_its_int8_export_measured_and_refused_where_none_was():
    """close_call_margin "artifact": the calibration parity's recorded margin; refused, with why and what to do,
    for an fp32 artifact, the fixed rule (nothing measured), an export that ran no session, and an eager engine."""
    measured = {"calibration_parity": {"max_abs_diff": 0.021, "close_call_margin": 0.042}}
    assert resolve_margin("artifact", SimpleNamespace(artifact=int8_manifest(measured)), "max_speed") == 0.042
    assert resolve_margin(0.2, SimpleNamespace(artifact=int8_manifest(measured)), "max_speed") == 0.2  # a number wins
    still = {"calibration_parity": {"max_abs_diff": 0.0, "close_call_margin": None}}
    assert resolve_margin("artifact", SimpleNamespace(artifact=int8_manifest(still)), "max_speed") is None  # moved nothing
    for manifest, why in (
        (int8_manifest(None, dtype="fp32"), "it is fp32"),
        (int8_manifest(None), "--int8-fp32 rule"),
        (int8_manifest({"calibration_parity": None}), "ran no ONNX Runtime session"),
    ):
        with pytest.raises(ArtifactError, match="records no measured close-call margin") as refused:
            resolve_margin("artifact", SimpleNamespace(artifact=manifest), "max_speed")
        assert why in str(refused.value) and "give the margin as a number" in str(refused.value)
    with pytest.raises(InvalidRequest, match="profile batching runs no artifact"):
        resolve_margin("artifact", SimpleNamespace(), "batching")


def test_a_models_file_sets_each_models_margin_and_an_artifact_without_one_fails_that_model(packages, default_artifact, tmp_path):
    """--models close_call_margin: a number for one model (every answer of margin 1 is a close call), none for
    another, and "artifact" on an fp32 artifact fails that model alone, not retried, saying why."""
    models = tmp_path / "models.yaml"
    models.write_text(
        f"models:\n  - model: {packages['d3']}\n    name: checked\n    profile: batching\n    close_call_margin: 1\n"
        f"  - model: {packages['d3']}\n    name: plain\n    profile: batching\n"
        f"  - model: {packages['d3']}\n    name: fp32\n    profile: max_speed\n    artifact: {default_artifact('d3')}\n    close_call_margin: artifact\n"
    )
    server = Server(["--models", str(models), "--device", "cpu"], log=tmp_path / "log")
    try:
        server.wait(503)
        health = server.request("GET", "/health").json()
        refused = health["models"]["fp32"]
        assert refused["status"] == "failed" and "records no measured close-call margin (it is fp32)" in refused["reason"], refused
        assert "after" not in refused["reason"], refused  # not retried
        cards = {card["id"]: card for card in server.request("GET", "/v1/models").json()["data"]}
        assert cards["checked"]["close_calls"] == {"margin": 1.0, "margin_from": "given", "reference": "exact (fp32)"}
        assert cards["plain"]["close_calls"] is None
        for name, again in (("checked", len(QUESTIONS)), ("plain", 0)):
            reply = server.post({"model": name, "state": STATE, "questions": QUESTIONS, "options": {"return_meta": True}})
            assert reply.status == 200 and reply.json()["meta"]["reanswered_questions"] == again, (name, reply.body)
    finally:
        server.stop()
    bad = tmp_path / "bad.yaml"
    for value, said in (("2", "not '2'"), ("yes", "not 'True'"), ("somewhere", "not 'somewhere'")):
        bad.write_text(f"models:\n  - model: {packages['d3']}\n    profile: batching\n    close_call_margin: {value}\n")
        done = subprocess.run([sys.executable, "-m", "vllm_sr_runtime.cli", "serve", "--models", str(bad)], capture_output=True, text=True, timeout=120)
        assert done.returncode != 0 and "close_call_margin" in done.stderr and said in done.stderr, done.stderr
    bad.write_text(f"models:\n  - model: {packages['d3']}\n    profile: exact\n    close_call_margin: 0.1\n")
    done = subprocess.run([sys.executable, "-m", "vllm_sr_runtime.cli", "serve", "--models", str(bad)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "profile exact" in done.stderr, done.stderr
