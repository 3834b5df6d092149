"""The result cache: a repeated request is answered from it (counted in /metrics and meta), identically; an
answer never crosses profiles, models or engines."""

from __future__ import annotations

import re

import vllm_sr_runtime
from vllm_sr_runtime.result_cache import ResultCache

QUESTIONS = {
    "domain": {"type": "choice", "instructions": "Domain?", "criteria": {"code": "Programming", "math": None, "law": None}},
    "hard": {"type": "noul", "instructions": "Hard?"},
}


def test_a_repeated_request_is_answered_from_the_cache_identically(packages):
    model = vllm_sr_runtime.load(packages["d3"])
    model.result_cache = ResultCache(64)
    first = model.respond("Merge two sorted lists.", QUESTIONS)
    second = model.respond("Merge two sorted lists.", QUESTIONS)
    assert (first.cache_hits, first.cache_misses) == (0, 2) and (second.cache_hits, second.cache_misses) == (2, 0)
    assert second.answers == first.answers
    second.answers["hard"]["noul"] = -1.0  # a caller changing its answers does not change the cache's
    assert model.respond("Merge two sorted lists.", QUESTIONS).answers == first.answers
    other_state = model.respond("Prove the triangle inequality.", QUESTIONS)
    assert other_state.cache_hits == 0 and other_state.answers != first.answers
    batching = model.execute(model.plan("Merge two sorted lists.", QUESTIONS, profile="batching"))
    assert batching.cache_hits == 0 and batching.cache_misses == 2  # another profile: its own entries


def test_no_answer_crosses_models_even_through_one_cache(packages):
    shared = ResultCache(64)
    d3, d2 = vllm_sr_runtime.load(packages["d3"]), vllm_sr_runtime.load(packages["d2_qwen3_5"])
    d3.result_cache = d2.result_cache = shared
    d3.respond("Merge two sorted lists.", {"q": QUESTIONS["hard"]})
    crossed = d2.respond("Merge two sorted lists.", {"q": QUESTIONS["hard"]})
    assert crossed.cache_hits == 0 and len(shared) == 2


def test_the_cache_is_bounded_least_recently_used_first(packages):
    model = vllm_sr_runtime.load(packages["d3"])
    model.result_cache = ResultCache(2)
    for state in ("one", "two", "one", "three"):  # "two" is the least recently used when "three" comes
        model.respond(state, {"q": QUESTIONS["hard"]})
    assert len(model.result_cache) == 2
    assert model.respond("one", {"q": QUESTIONS["hard"]}).cache_hits == 1
    assert model.respond("two", {"q": QUESTIONS["hard"]}).cache_hits == 0


def hits(server) -> float:
    text = server.request("GET", "/metrics").body.decode()
    return sum(float(v) for v in re.findall(r'result_cache_questions_total\{[^}]*outcome="hit"[^}]*\} ([0-9.e+]+)', text))


def test_server_counts_cache_hits_and_keeps_profiles_apart(packages, tmp_path):
    from server_harness import Server

    server = Server([str(packages["d3"]), "--profile", "batching", "--device", "cpu"], log=tmp_path / "log")
    try:
        server.wait()
        body = {"state": "Merge two sorted lists.", "questions": QUESTIONS, "options": {"return_meta": True}}
        first, second = server.post(body).json(), server.post(body).json()
        assert first["meta"]["cached_questions"] == 0 and second["meta"]["cached_questions"] == 2
        assert second["answers"] == first["answers"] and hits(server) == 2
        exact = server.post({**body, "options": {"return_meta": True, "profile": "exact"}}).json()
        assert exact["meta"]["cached_questions"] == 0 and hits(server) == 2
    finally:
        server.stop()
    off = Server([str(packages["d3"]), "--device", "cpu", "--result-cache-entries", "0"], log=tmp_path / "log-off")
    try:
        off.wait()
        body = {"state": "Merge two sorted lists.", "questions": QUESTIONS, "options": {"return_meta": True}}
        assert [off.post(body).json()["meta"]["cached_questions"] for _ in range(2)] == [0, 0] and hits(off) == 0
    finally:
        off.stop()
