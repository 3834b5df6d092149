"""`selftest --device cpu` on a tiny fixture: the real command end to end (export, parity, latency, serve)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import onnxruntime as ort
import pytest

import vllm_sr_runtime
from vllm_sr_runtime.parity.selftest import device_numerics_parity, gate_for, provider_missing
from vllm_sr_runtime.synthetic.writer import write_synthetic_package


def test_gates_per_dtype():
    assert gate_for("fp32") == {"max_abs_diff": 1e-4, "max_changed_rate": 0.0}
    for dtype in ("fp16", "bf16", "int8"):
        assert gate_for(dtype) == {"max_abs_diff": None, "max_changed_rate": 0.01}


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="this onnxruntime has the CUDA provider")
def test_a_device_whose_provider_this_onnxruntime_lacks_is_named_with_the_package_to_install():
    assert provider_missing("cpu") is None
    why = provider_missing("cuda")
    assert why.startswith("UnsupportedDeviceError") and "CUDAExecutionProvider" in why and "onnxruntime-gpu" in why


def test_a_device_numerics_row_passes_rounding_and_fails_a_model_that_decides_otherwise(models, tmp_path):
    """The GPU row's gate on CPU models: the same model passes; another seed's weights (a wrong load) turn clear
    decisions around and fail it."""
    reference = models("d3")
    same = device_numerics_parity(reference, reference, questions=16)
    assert same["failed"] == [] and same["decisions_changed"] == same["clear_decisions_changed"] == 0 and same["max_abs_diff"] == 0
    other = vllm_sr_runtime.load(write_synthetic_package("decision3", tmp_path / "other", seed=5)[0])
    wrong = device_numerics_parity(reference, other, questions=16)
    assert wrong["clear_decisions_changed"] > 0 and wrong["failed"] and "decisions the reference made by >= 0.35 changed" in wrong["failed"][0]
    assert wrong["decisions_changed"] >= wrong["clear_decisions_changed"]


def test_selftest_on_cpu_reports_every_check_and_fails_on_a_dtype_the_device_cannot_run(tmp_path):
    out = tmp_path / "selftest"
    command = [
        sys.executable, "-m", "vllm_sr_runtime.cli", "selftest", "--device", "cpu", "--out", str(out), "--fixtures", "d3",
        "--dtypes", "fp32,bf16", "--lengths", "128", "--clients", "1,4", "--http-seconds", "1", "--questions", "12",
        "--repeats", "1", "--quiet",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 1, done.stderr[-3000:]  # bf16 has no CPU kernels: that row fails, so the run does
    report = json.loads((out / "selftest.json").read_text())
    assert report["device"] == "cpu" and report["variant"] == "contrib" and "CPUExecutionProvider" in report["devices"]["ort_providers"]
    fp32, bf16 = report["parity"]  # on the CPU, exact is the reference itself: no device-vs-cpu row
    assert {fp32["profile"], bf16["profile"]} == {"max_speed"} and fp32["against"] == "exact"
    assert fp32["fixture"] == "d3" and fp32["dtype"] == "fp32" and fp32["questions"] == 12 and fp32["failed"] == []
    assert fp32["decisions_changed"] == 0 and fp32["max_abs_diff"] <= 1e-4
    assert bf16["dtype"] == "bf16" and "CPUExecutionProvider" in bf16["failed"][0]
    assert report["failed"] and report["failed"][0].startswith("d3 max_speed bf16")
    assert {row["profile"] for row in report["latency"]} == {"exact", "max_speed-fp32"}
    assert all(row["median_ms"] > 0 for row in report["latency"])
    assert [row["clients"] for row in report["http"]] == [1, 4]
    assert all(row["profile"] == "max_speed" and row["dtype"] == "fp32" and row["rps"] > 0 and set(row["statuses"]) == {"200"} for row in report["http"])
    assert "parity d3 max_speed vs exact" in done.stdout and "selftest: FAILED" in done.stdout


def test_selftest_serves_exact_when_no_artifact_runs(tmp_path):
    """Every artifact dtype failed (bf16 has no CPU kernels): latency and throughput fall back to the eager profile.
    The served model's log is kept in --out; none of its folders is left in the temporary folder (the socket's is removed),
    and a temporary folder whose path is too long for a socket moves the socket to /tmp."""
    # A TMPDIR too long to bind a socket in (it failed with "AF_UNIX path too long" wherever pytest's own path was long)
    out, temporary = tmp_path / "selftest", tmp_path / ("t" * 80)
    temporary.mkdir()
    command = [
        sys.executable, "-m", "vllm_sr_runtime.cli", "selftest", "--device", "cpu", "--out", str(out), "--fixtures", "d3",
        "--dtypes", "bf16", "--lengths", "128", "--clients", "1", "--http-seconds", "1", "--questions", "4", "--repeats", "1", "--quiet",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=os.environ | {"TMPDIR": str(temporary)})
    assert [p.name for p in temporary.iterdir() if p.name.startswith(("vsr-", "vllm-sr-runtime"))] == []  # (torch and ORT keep caches there)
    assert (out / "serve.log").is_file()
    assert done.returncode == 1 and (out / "selftest.json").is_file(), done.stderr[-3000:] + (out / "serve.log").read_text()[-3000:]
    report = json.loads((out / "selftest.json").read_text())
    assert [row["dtype"] for row in report["parity"]] == ["bf16"] and report["parity"][0]["failed"]
    assert [row["profile"] for row in report["latency"]] == ["exact"]
    assert [(row["profile"], row["dtype"]) for row in report["http"]] == [("exact", "fp32")]
    assert report["http"][0]["rps"] > 0 and set(report["http"][0]["statuses"]) == {"200"}


def _quick_selftest(tmp_path, fixture: str, dtype: str) -> dict:
    """run_selftest on one CPU fixture and dtype, its latency, serving and parity cut to a few seconds."""
    from vllm_sr_runtime.parity.selftest import SelftestOptions, run_selftest

    options = SelftestOptions(
        device="cpu", out=tmp_path / "selftest", fixtures=[fixture], dtypes=[dtype], real_dimension=False, lengths=[64],
        clients=[1], http_seconds=0.5, questions=4, repeats=1, progress=False,
    )  # fmt: skip
    return run_selftest(options)


def test_selftest_exports_int8_at_the_weight_width_a_saturating_cpu_serves(tmp_path, monkeypatch):
    """On a CPU whose u8 x s8 products saturate (no VNNI; the detection patched here), selftest exports its int8 row
    with 7-bit weights: the engine refuses 8-bit ones there, so an 8-bit export would fail the row at load."""
    from vllm_sr_runtime import cpu_features

    monkeypatch.setattr(cpu_features, "int8_products_saturate", lambda: True)
    report = _quick_selftest(tmp_path, "d3", "int8")
    (row,) = report["parity"]
    assert row["dtype"] == "int8" and row["int8_weight_bits"] == 7 and row["failed"] == [], row
    manifest = json.loads((tmp_path / "selftest" / "artifacts" / "d3-contrib-int8" / "artifact.json").read_text())
    assert manifest["int8"]["weight_bits"] == 7
    assert [(entry["profile"], entry["dtype"]) for entry in report["http"]] == [("max_speed", "int8")]


def test_selftest_asks_a_vision_fixture_about_images_and_videos_through_the_artifact(tmp_path):
    """The released Decision 3.0 layout has a vision tower: its fixture's parity rows add the built-in suite's image
    and video requests, answered by the artifact's media graphs against exact's eager tower (fp32: within 1e-4)."""
    from vllm_sr_runtime.parity.suite import builtin_suite

    report = _quick_selftest(tmp_path, "d3-vision", "fp32")
    (row,) = report["parity"]
    media = [request for request in builtin_suite(4096, media=True) if request.images or request.videos]
    assert row["fixture"] == "d3-vision" and row["failed"] == [], row
    assert row["inputs"] == ["image", "image+video", "text", "video"] and row["questions"] == 4 + sum(len(r.questions) for r in media)
    assert row["max_abs_diff"] <= 1e-4
    manifest = json.loads((tmp_path / "selftest" / "artifacts" / "d3-vision-contrib-fp32" / "artifact.json").read_text())
    assert manifest["media"]["vision"]["model_file"] == "vision.onnx"


def test_a_vision_fixture_is_skipped_and_said_where_the_devices_variant_writes_no_media_graphs(tmp_path, monkeypatch, capsys):
    """ROCm's portable variant has no media graphs (its export refuses a vision tower): the vision fixture is reported
    as skipped with the reason, not as a failed parity row, and the run does not fail for it."""
    from types import SimpleNamespace

    from vllm_sr_runtime import devices
    from vllm_sr_runtime.parity.selftest import SelftestOptions, print_report, run_selftest

    portable = SimpleNamespace(kind="cpu", name="cpu", spec=SimpleNamespace(variant="portable", artifact_dtypes=("fp32",)))
    monkeypatch.setattr(devices, "parse_device", lambda _: portable)
    options = SelftestOptions(device="cpu", out=tmp_path / "selftest", fixtures=["d3-vision"], dtypes=["fp32"], real_dimension=False, progress=False)
    report = run_selftest(options)
    assert report["skipped"] == {"d3-vision": "the portable variant has no media graphs"}
    assert report["parity"] == [] and report["failed"] == [] and not (tmp_path / "selftest" / "fixtures" / "d3-vision").exists()
    print_report(report)
    assert "skipped d3-vision: the portable variant has no media graphs" in capsys.readouterr().out


MASTER_AND_WORKER = """
import os, signal, sys, time
log, mode = sys.argv[1], sys.argv[2]
worker = os.fork()
if worker == 0:
    signal.signal(signal.SIGTERM, lambda *_: (open(log, "a").write("worker TERM\\n"), os._exit(0)))
    while True:
        time.sleep(0.05)
def stop(*_):
    open(log, "a").write("master TERM\\n")
    time.sleep(0.5)  # a TERM sent to the whole group reaches the worker meanwhile
    os.kill(worker, signal.SIGKILL)  # the master stops its worker its own way, as gunicorn's does
    os.waitpid(worker, 0)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop if mode == "stops" else signal.SIG_IGN)
open(log, "a").write("ready\\n")
while True:
    time.sleep(0.05)
"""


@pytest.mark.parametrize("mode", ["stops", "ignores"])
def test_selftest_stops_its_server_with_a_term_to_the_master_alone(tmp_path, mode):
    """A TERM to the whole process group reached gunicorn's workers too, and a master that saw a worker exit before
    its own TERM could start a new one. Only the master is signalled; a master that does not stop within the grace
    time is killed with its group."""
    import time

    from vllm_sr_runtime.parity.selftest import stop_server

    log = tmp_path / "signals"
    process = subprocess.Popen([sys.executable, "-c", MASTER_AND_WORKER, str(log), mode], start_new_session=True)
    deadline = time.monotonic() + 60
    while not (log.exists() and "ready" in log.read_text()):
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.05)
    started = time.monotonic()
    stop_server(process, grace_s=2.0)
    assert process.poll() is not None
    if mode == "stops":
        assert log.read_text().splitlines() == ["ready", "master TERM"] and process.returncode == 0
    else:  # TERM ignored: after the grace time the group is killed
        assert time.monotonic() - started >= 2.0 and process.returncode == -9
        assert "worker TERM" not in log.read_text()
