"""Golden answers: recorded by `fixture` (beside the package) and `export` (in artifact.json), replayed while a
served model warms; a model that does not reproduce them fails readiness with the reason, the others serve."""

from __future__ import annotations

import json
import shutil

import pytest

import vllm_sr_runtime
from vllm_sr_runtime.export.exporter import export_package
from vllm_sr_runtime.errors import VerificationError
from vllm_sr_runtime.synthetic.writer import write_synthetic_package
from vllm_sr_runtime.golden import CROSS_NUMERICS_TOLERANCE, GOLDEN_REQUESTS, GOLDEN_SUITE, GOLDEN_TOLERANCE, golden_tolerance, replay_golden, verify_golden
from vllm_sr_runtime.packages.files import GOLDEN_FILE
from server_harness import Server


def off_by_far(value):
    """Every probability replaced by its complement: the recorded answers no longer match the model."""
    if isinstance(value, dict):
        return {key: off_by_far(item) for key, item in value.items()}
    if isinstance(value, list):
        return [off_by_far(item) for item in value]
    return 1.0 - value if isinstance(value, float) else value


@pytest.fixture(scope="module")
def golden_package(tmp_path_factory):
    root = tmp_path_factory.mktemp("golden")
    package = write_synthetic_package("decision2", root / "d2", backbone="qwen3", golden=True)[0]
    artifact = root / "artifact"
    export_package(package, artifact, progress=False)
    return package, artifact


def test_fixture_and_export_record_the_exact_answers_and_a_load_replays_both(golden_package, tmp_path):
    package, artifact = golden_package
    exact = vllm_sr_runtime.load(package)
    recorded = json.loads((package / GOLDEN_FILE).read_text())
    assert recorded["suite"] == GOLDEN_SUITE and recorded["model_sha256"] == exact.family.package.model_sha256 and recorded["numerics"] == "fp32"
    assert recorded["answers"] == [exact.ask(state, questions) for state, questions in GOLDEN_REQUESTS]
    checked = verify_golden(exact)
    assert checked["status"] == "verified" and [c["source"] for c in checked["checks"]] == ["package"]
    assert checked["checks"][0]["max_abs_diff"] <= 1e-6 and checked["checks"][0]["tolerance"] == 1e-3

    manifest = json.loads((artifact / "artifact.json").read_text())
    assert manifest["golden"]["suite"] == GOLDEN_SUITE and manifest["golden"]["numerics"] == "fp32" and len(manifest["golden"]["answers"]) == len(GOLDEN_REQUESTS)
    fast = vllm_sr_runtime.load(package, profile="max_speed", artifact=artifact)
    checked = verify_golden(fast)
    assert checked["status"] == "verified" and {c["source"] for c in checked["checks"]} == {"artifact", "package"}
    assert all(0 < c["max_abs_diff"] <= 1e-3 and c["decisions_changed"] == 0 for c in checked["checks"])  # a real replay

    copy = tmp_path / "copy"
    shutil.copytree(package, copy)
    (copy / GOLDEN_FILE).write_text(json.dumps({**recorded, "answers": off_by_far(recorded["answers"])}))
    with pytest.raises(VerificationError, match=r"golden answers \(package\) not reproduced on cpu .* decisions changed"):
        verify_golden(vllm_sr_runtime.load(copy))
    (copy / GOLDEN_FILE).write_text(json.dumps({**recorded, "model_sha256": "0" * 64}))
    with pytest.raises(VerificationError, match="recorded for package 0000"):
        verify_golden(vllm_sr_runtime.load(copy))
    (copy / GOLDEN_FILE).unlink()
    assert verify_golden(vllm_sr_runtime.load(copy))["status"] == "unverified"


def test_altered_artifact_golden_fails_that_model_while_the_other_serves(golden_package, tmp_path):
    package, artifact = golden_package
    altered = tmp_path / "altered"
    shutil.copytree(artifact, altered)
    manifest = json.loads((altered / "artifact.json").read_text())
    manifest["golden"]["answers"] = off_by_far(manifest["golden"]["answers"])
    (altered / "artifact.json").write_text(json.dumps(manifest))  # artifact.json is the manifest: its files still verify
    models = tmp_path / "models.yaml"
    models.write_text(
        f"- {{model: {package}, name: good}}\n"
        f"- {{model: {package}, name: altered, profile: max_speed, artifact: {altered}}}\n"
    )
    server = Server(["--models", str(models), "--device", "cpu", "--load-attempts", "3", "--load-retry-seconds", "0.1"], log=tmp_path / "log")
    try:
        server.wait(status=503, timeout=180)
        for _ in range(600):
            health = server.request("GET", "/health").json()
            if health["models"]["altered"]["status"] == "failed" and health["models"]["good"]["status"] == "ready":
                break
            assert health["models"]["altered"]["status"] in ("loading", "warming", "failed"), health
            __import__("time").sleep(0.2)
        assert health["status"] == "degraded", health
        failed = health["models"]["altered"]
        assert "golden answers (artifact) not reproduced" in failed["reason"] and "load_attempts" not in failed  # never retried
        assert health["models"]["good"]["golden"] == "verified"
        cards = {card["id"]: card for card in server.request("GET", "/v1/models").json()["data"]}
        assert cards["good"]["golden"] == "verified" and cards["altered"]["status"] == "failed"
        reply = server.post({"model": "good", "state": "s", "questions": {"q": {"type": "noul"}}})
        assert reply.status == 200, reply.body
        refused = server.post({"model": "altered", "state": "s", "questions": {"q": {"type": "noul"}}})
        assert refused.status == 503 and "golden" in refused.json()["error"]["message"]
    finally:
        server.stop()


def _noul_answers(p: float) -> list[dict]:
    return [{key: {"type": "noul", "noul": p} for key in questions} for _, questions in GOLDEN_REQUESTS]


def _replay(recorded_p: float, replay_p: float, device_kind: str, running: str, **record):
    recorded = {"suite": GOLDEN_SUITE, "answers": _noul_answers(recorded_p), **record}
    answers = iter(_noul_answers(replay_p))
    return replay_golden(recorded, lambda state, questions: next(answers), "package", device_kind, running)


def test_a_replay_is_held_to_the_bound_of_its_numerics_against_the_records():
    assert golden_tolerance("cpu", "fp32", "fp32") == GOLDEN_TOLERANCE["cpu"] == 1e-3
    assert golden_tolerance("cuda", "fp32", "fp32") == golden_tolerance("cuda", "bf16", "bf16") == GOLDEN_TOLERANCE["gpu"]
    assert golden_tolerance("cpu", "fp16", "fp32") == GOLDEN_TOLERANCE["gpu"]
    for running in ("bf16", "bf16+autocast-bf16", "int8"):
        assert golden_tolerance("cuda", running, "fp32") == golden_tolerance("cpu", running) == CROSS_NUMERICS_TOLERANCE

    # An FP32 record replayed in BF16 (a GPU's exact): 0.1 of rounding drift passes, the 0.45 -> 0.55 flips are
    # near-ties of that record (margin 0.1 < 0.35); the same drift fails a same-numerics replay, flips counted.
    drift = _replay(0.45, 0.55, "cuda", "bf16+autocast-bf16", numerics="fp32")
    assert drift.passed and drift.decisions_changed == 0 and abs(drift.max_abs_diff - 0.1) < 1e-9
    assert drift.numerics == "fp32 record, bf16+autocast-bf16 replay" and drift.tolerance == CROSS_NUMERICS_TOLERANCE
    strict = _replay(0.45, 0.55, "cpu", "fp32")  # a record without "numerics" was made in FP32
    assert not strict.passed and strict.decisions_changed == strict.questions == 5 and strict.numerics == "fp32 record, fp32 replay"
    assert not _replay(0.45, 0.55, "cuda", "bf16", numerics="bf16").passed
    # A confident answer turned around is a gross error whatever the numerics.
    broken = _replay(0.05, 0.95, "cuda", "bf16", numerics="fp32")
    assert not broken.passed and broken.decisions_changed == 5
