"""Parity reports: exact vs max_speed on tiny fixtures passes its gates; a perturbed candidate fails them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_sr_runtime.parity.suite import builtin_suite, short_suite


def run_parity(*args: str, perturb: float | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "vllm_sr_runtime.cli", "parity"]
    if perturb is not None:  # the candidate's readout with seeded noise (a test-only wrapper of the same command)
        command = [sys.executable, str(Path(__file__).with_name("perturbed_parity.py")), str(perturb)]
    return subprocess.run([*command, *args, "--quiet"], capture_output=True, text=True, timeout=900)


def test_builtin_suite_covers_every_kind():
    suite = builtin_suite(4096)
    questions = [q for r in suite for q in r.questions.values()]
    assert len(questions) >= 416
    counts = {len(q["criteria"]) for q in questions if q["type"] == "choice"}
    assert {2, 40, 255} <= counts
    assert {len(q["criteria"]) for q in questions if q["type"] == "score"} == set(range(2, 11))
    assert any(q["type"] == "noul" for q in questions)
    assert any(isinstance(r.state, (dict, list)) for r in suite) and any(isinstance(r.state, str) for r in suite)
    assert any(len(r.questions) > 1 for r in suite) and any(len(r.questions) == 1 for r in suite)
    assert [r.questions for r in builtin_suite(4096)] == [r.questions for r in suite]  # deterministic


def test_short_suite_is_the_builtin_suites_short_questions():
    short = short_suite(4096)
    questions = [q for r in short for q in r.questions.values()]
    assert len(questions) == 80
    assert {q["type"] for q in questions} == {"choice", "noul", "score"}
    assert max(len(q["criteria"]) for q in questions if q["type"] == "choice") <= 12
    builtin = {r.id: r for r in builtin_suite(4096)}
    for request in short:  # the same requests, never a long context, questions a subset in order
        source = builtin[request.id]
        assert request.state == source.state and "Context:" not in str(request.state)
        assert list(request.questions) == [qid for qid in source.questions if qid in request.questions]
        assert all(request.questions[qid] == source.questions[qid] for qid in request.questions)


# d3 here; Decision 2.0 max_speed parity per length and batch is test_export.py's every-length test.
@pytest.mark.parametrize("name", ["d3"])
def test_max_speed_parity_passes_its_gates(packages, default_artifact, tmp_path, name):
    artifact = default_artifact(name)
    out = tmp_path / "report"
    result = run_parity(str(packages[name]), "--artifact", str(artifact), "--out", str(out), "--max-changed-rate", "0", "--max-abs-diff", "1e-4")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "gates passed: max changed rate <= 0, max abs diff <= 0.0001" in result.stdout  # which gates held, said
    report = json.loads((out / "parity.json").read_text())
    summary = report["summary"]
    assert summary["compared"] >= 400 and summary["errors_differ"] == 0
    # Only prompts over the package's input limit (the widest Decision 2.0 choices) may be left unanswered.
    assert {q["error"] for q in report["questions"] if "error" in q} <= {"max_length_exceeded"}
    assert summary["decisions_changed"] == 0 and summary["abs_diff"]["max"] <= 1e-4
    assert set(summary["abs_diff_by_type"]) == {"choice", "noul", "score"}
    first = report["questions"][0]
    assert {"type", "options", "prompt_tokens", "reference", "candidate", "max_abs_diff", "decision_changed", "reference_margin"} <= set(first)
    page = (out / "report.html").read_text()  # what was compared, and the gates it was held to, said where it is read
    assert "max_speed (onnxruntime, fp32)" in page and "decisions changed ≤ 0% (flag); max |Δp| ≤ 0.0001 (flag)" in page


def test_perturbed_candidate_fails_naming_the_gate(packages, tmp_path):
    suite = tmp_path / "suite.jsonl"
    lines = [
        {"id": "a", "state": "Merge two sorted lists.", "questions": {"c": {"type": "choice", "criteria": {f"k{i}": None for i in range(6)}}, "n": {"type": "noul"}}},
        {"id": "b", "state": {"user": "hi"}, "questions": {"s": {"type": "score", "criteria": ["low", "mid", "high"]}}},
    ] * 10
    suite.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    out = tmp_path / "report"
    result = run_parity(str(packages["d3"]), "--profile", "exact", "--suite", str(suite), "--out", str(out), "--max-changed-rate", "0.0", "--max-abs-diff", "1e-3", perturb=0.5)
    assert result.returncode != 0
    assert "--max-abs-diff" in result.stderr and "--max-changed-rate" in result.stderr
    summary = json.loads((out / "parity.json").read_text())["summary"]
    assert summary["decisions_changed"] > 0 and summary["abs_diff"]["max"] > 1e-3
    assert summary["compared"] == 30


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def test_report_renders_in_headless_chromium(packages, tmp_path):
    browser = chromium()
    if browser is None:
        pytest.skip("chromium is not installed (.ci/run installs it)")
    suite = tmp_path / "suite.jsonl"
    suite.write_text(json.dumps({"state": "s", "questions": {"c": {"type": "choice", "criteria": {"a": None, "b": None, "c": None}}, "n": {"type": "noul"}}}) + "\n")
    out = tmp_path / "report"
    assert run_parity(str(packages["d3"]), "--profile", "exact", "--suite", str(suite), "--out", str(out), "--max-abs-diff", "1", perturb=0.1).returncode == 0
    probe = out / "probe.html"
    page = (out / "report.html").read_text()
    script = (
        "<script>window.addEventListener('load', () => { const imgs = [...document.images];"
        "document.body.setAttribute('data-loaded', imgs.filter(i => i.complete && i.naturalWidth > 0).length + '/' + imgs.length); });</script>"
    )
    probe.write_text(page.replace("</body>", script + "</body>"))
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([browser, *flags, "--virtual-time-budget=5000", "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'data-loaded="3/3"' in dom.stdout, dom.stdout[:500]
    shot = subprocess.run([browser, *flags, f"--screenshot={tmp_path / 'report.png'}", "--window-size=1200,1600", (out / "report.html").as_uri()], capture_output=True, timeout=120)
    assert shot.returncode == 0 and (tmp_path / "report.png").stat().st_size > 10_000


def test_default_gates_follow_the_candidate_dtype_and_flags_loosen_them(tmp_path, packages):
    """No flag: an fp32 candidate is held to max |dp| 1e-4 (a 0.05 perturbation fails it); a flag replaces the gate."""
    suite = tmp_path / "suite.jsonl"
    suite.write_text(json.dumps({"state": "s", "questions": {"c": {"type": "choice", "criteria": {"a": None, "b": None}}, "n": {"type": "noul"}}}) + "\n")
    strict = run_parity(str(packages["d3"]), "--profile", "exact", "--suite", str(suite), "--out", str(tmp_path / "strict"), perturb=0.05)
    assert strict.returncode == 3 and "--max-abs-diff 0.0001" in strict.stderr
    assert "max |Δp| ≤ 0.0001 (default)" in (tmp_path / "strict" / "report.html").read_text()
    meta = json.loads((tmp_path / "strict" / "parity.json").read_text())
    assert meta["gates"] == {"max_changed_rate": None, "max_abs_diff": 1e-4} and meta["gates_from_flags"] == {"max_changed_rate": False, "max_abs_diff": False}
    loose = run_parity(str(packages["d3"]), "--profile", "exact", "--suite", str(suite), "--out", str(tmp_path / "loose"), "--max-abs-diff", "1", perturb=0.05)
    assert loose.returncode == 0, loose.stderr[-2000:]


def test_default_gates_per_dtype():
    from vllm_sr_runtime.parity.compare import default_gates

    assert default_gates("fp32", approximate=False) == {"max_changed_rate": None, "max_abs_diff": 1e-4}
    for dtype in ("fp16", "bf16", "int8", "bf16+autocast-bf16"):
        assert default_gates(dtype, approximate=False) == {"max_changed_rate": 0.01, "max_abs_diff": None}
    assert default_gates("fp32", approximate=True)["max_changed_rate"] == 0.01


def test_weight_noise_of_int8_size_moves_the_eager_answers(packages, tmp_path):
    """--weight-noise int8: the candidate is exact with seeded int8-sized noise on exactly the weights int8
    quantizes, gated as int8; factor 0 answers as exact; an ONNX candidate is refused."""
    import torch

    import vllm_sr_runtime
    from vllm_sr_runtime.parity.weight_noise import perturb_like_int8

    suite = tmp_path / "suite.jsonl"
    suite.write_text(json.dumps({"state": "Merge two sorted lists.", "questions": {"c": {"type": "choice", "criteria": {f"k{i}": None for i in range(6)}}, "n": {"type": "noul"}}}) + "\n")
    noisy = run_parity(str(packages["d3"]), "--profile", "exact", "--weight-noise", "int8", "--suite", str(suite), "--out", str(tmp_path / "noisy"))
    assert noisy.returncode in (0, 3), noisy.stderr[-2000:]
    report = json.loads((tmp_path / "noisy" / "parity.json").read_text())
    model = vllm_sr_runtime.load(packages["d3"], profile="exact")
    module = model.engine.module
    quantized = {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "down_proj", "in_proj_qkv", "in_proj_z"}  # int8's MatMuls
    expected = [n for n, m in module.named_modules() if isinstance(m, torch.nn.Linear) and n.startswith("text_model.") and n.rsplit(".", 1)[-1] in quantized]
    assert report["weight_noise"] == {"form": "int8", "factor": 1.0, "seed": 0, "weights": len(expected)} and len(expected) > 0
    assert report["gates"] == {"max_changed_rate": 0.01, "max_abs_diff": None}
    quiet = run_parity(str(packages["d3"]), "--profile", "exact", "--weight-noise", "int8", "--weight-noise-factor", "0", "--suite", str(suite), "--out", str(tmp_path / "zero"))
    # Two loads of one model answer alike to fp32's last bits only: on several threads the kernels' paths may differ.
    zero = json.loads((tmp_path / "zero" / "parity.json").read_text())["summary"]["abs_diff"]["max"]
    assert quiet.returncode == 0 and zero <= 1e-5 < report["summary"]["abs_diff"]["max"], (zero, report["summary"]["abs_diff"])
    weights = {name: value.clone() for name, value in module.state_dict().items()}
    perturb_like_int8(model, 0.0)
    assert all(torch.equal(weights[name], value) for name, value in module.state_dict().items())  # factor 0 adds nothing
    onnx_candidate = run_parity(str(packages["d3"]), "--profile", "max_speed", "--weight-noise", "int8", "--suite", str(suite), "--out", str(tmp_path / "onnx"))
    assert onnx_candidate.returncode == 2 and "use it with --profile exact, not max_speed" in onnx_candidate.stderr
