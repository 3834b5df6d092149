"""`vllm-sr-runtime selftest`: one command that validates a host end to end.

Devices found; `exact` vs `max_speed` parity for each artifact dtype the device runs, on tiny fixtures of
every family (a Decision 3.0 one with a vision tower also asked about images and videos, through the artifact's
media graphs) and, on a GPU, a real-dimension Decision 3.0 nano fixture, each gated; on a GPU also the
device's own `exact` numerics (BF16) against FP32 `exact` on the CPU; forward latency of both profiles at a
few prompt lengths; requests/s at a few client counts against a real `serve` (of the fastest artifact, or of
`exact` where the host's ONNX Runtime lacks the device's provider). Writes selftest.json; a failed gate makes
the command exit non-zero.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_sr_runtime.cpu_threads import cpu_affinity
from vllm_sr_runtime.errors import InvalidRequest
from vllm_sr_runtime.report_folders import prepare_report_folder, write_report_file
from vllm_sr_runtime.server.config import checked_uds_path

FIXTURES = {  # name -> `fixture` options; confident readouts, so a changed decision means something
    "d2-qwen3": {"family": "decision2", "backbone": "qwen3"},
    "d2-qwen3_5": {"family": "decision2", "backbone": "qwen3_5"},
    "d2-lora": {"family": "decision2", "backbone": "qwen3_5", "adapter": True},
    "d3-vision": {"family": "decision3", "vision": True},  # the released Decision 3.0 layout: its media graphs checked too
    "d3": {"family": "decision3"},  # last: the fixture measured for latency and serving
}
REAL_DIMENSION = {"d3-nano": {"family": "decision3", "size": "nano"}}
READOUT_SCALE = 8.0
# The artifact dtype served for the throughput check: the device's fastest that is expected to pass parity.
SERVE_PREFERENCE = {"cpu": ("fp32", "fp16", "int8"), "cuda": ("bf16", "fp16", "fp32"), "rocm": ("fp16", "fp32")}
FP32_MAX_ABS_DIFF = 1e-4
LOW_PRECISION_MAX_CHANGED_RATE = 0.01


@dataclass
class SelftestOptions:
    device: str = "auto"
    out: Path = Path("selftest")
    fixtures: list[str] = field(default_factory=lambda: list(FIXTURES))
    dtypes: list[str] | None = None  # default: every dtype the device's provider runs
    real_dimension: bool | None = None  # default: on a GPU only
    lengths: list[int] = field(default_factory=lambda: [128, 512, 2048])
    clients: list[int] = field(default_factory=lambda: [1, 8, 64])
    http_seconds: float = 10.0
    questions: int = 40  # parity questions per fixture and dtype (the short suite's first ones)
    repeats: int = 3
    progress: bool = True


def gate_for(dtype: str) -> dict:
    """fp32 answers like exact to 1e-4; lower precision may move probabilities but not decisions (<= 1%)."""
    if dtype == "fp32":
        return {"max_abs_diff": FP32_MAX_ABS_DIFF, "max_changed_rate": 0.0}
    return {"max_abs_diff": None, "max_changed_rate": LOW_PRECISION_MAX_CHANGED_RATE}


def devices_found() -> dict:
    import onnxruntime as ort
    import torch

    from vllm_sr_runtime.devices import parse_device

    gpus = []
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            gpus.append({"index": index, "name": props.name, "memory_gib": round(props.total_memory / 2**30, 1)})
    auto = parse_device("auto")
    return {
        "host": platform.node(),
        "cpu_threads": cpu_affinity(),
        "torch": torch.__version__,
        "torch_gpu": "rocm" if getattr(torch.version, "hip", None) else ("cuda" if torch.cuda.is_available() else None),
        "gpus": gpus,
        "onnxruntime": ort.__version__,
        "ort_providers": ort.get_available_providers(),
        "auto": auto.name,
    }


def _fixture(name: str, spec: dict, root: Path) -> tuple[Path, Path | None]:
    from vllm_sr_runtime.synthetic.writer import write_synthetic_package

    out = root / name
    written = write_synthetic_package(spec["family"], out, backbone=spec.get("backbone"), size=spec.get("size", "tiny"), adapter=spec.get("adapter", False), vision=spec.get("vision", False), readout_scale=READOUT_SCALE)  # fmt: skip
    return out, (written[1] if len(written) > 1 else None)


def _compared(reference: Any, candidate: Any, questions: int) -> tuple[list[dict], dict]:
    """`parity`'s rows and summary of the candidate against the reference on the short suite's first questions, and,
    for a model that reads media, the built-in suite's image and video requests."""
    from vllm_sr_runtime.parity.compare import compare, summarize
    from vllm_sr_runtime.parity.suite import builtin_suite, short_suite

    limit = reference.family.max_input_tokens
    suite = short_suite(limit, questions=questions)
    if reference.reads_media:
        suite += [request for request in builtin_suite(limit, media=True) if request.images or request.videos]
    rows = compare(reference, candidate, suite, progress=False)
    return rows, summarize(rows)


def _row(summary: dict, gate: dict, failed: list[str]) -> dict:
    return {
        "questions": summary["compared"], "decisions_changed": summary["decisions_changed"], "changed_rate": summary["changed_rate"],
        "max_abs_diff": summary["abs_diff"]["max"], "median_abs_diff": summary["abs_diff"]["median"], "inputs": sorted(summary["abs_diff_by_media"]),
        "gate": gate, "failed": failed,
    }  # fmt: skip


def _parity(exact: Any, fast: Any, questions: int) -> dict:
    from vllm_sr_runtime.parity.compare import gates

    _, summary = _compared(exact, fast, questions)
    gate = gate_for(fast.dtype)
    return _row(summary, gate, gates(summary, gate["max_changed_rate"], gate["max_abs_diff"]))


def device_numerics_parity(reference: Any, device_exact: Any, questions: int) -> dict:
    """A device's own `exact` numerics (a GPU's BF16) against FP32 `exact` on the CPU. BF16 rounding alone moved
    answers by up to 0.25 on an H200 (`golden.CROSS_NUMERICS_TOLERANCE`), and the tiny packages hold many close calls, so
    the gate counts the decisions that changed where the reference decided by at least that much (<= 1%): a
    broken kernel or load turns clear decisions around; rounding turns close ones."""
    from vllm_sr_runtime.golden import CROSS_NUMERICS_TOLERANCE
    from vllm_sr_runtime.parity.compare import gates

    rows, summary = _compared(reference, device_exact, questions)
    clear = sum(1 for row in rows if row.get("decision_changed") and row["reference_margin"] >= CROSS_NUMERICS_TOLERANCE)
    gate = {"max_clear_changed_rate": LOW_PRECISION_MAX_CHANGED_RATE, "clear_margin": CROSS_NUMERICS_TOLERANCE}
    failed = gates(summary, None, None)  # questions that errored differently
    if summary["compared"] and clear / summary["compared"] > gate["max_clear_changed_rate"]:
        failed.insert(0, f"{clear}/{summary['compared']} decisions the reference made by >= {CROSS_NUMERICS_TOLERANCE} changed")
    return _row(summary, gate, failed) | {"clear_decisions_changed": clear}


def provider_missing(device_kind: str) -> str | None:
    """Why this host's ONNX Runtime cannot run `max_speed` on the device (None: its provider is installed)."""
    import onnxruntime as ort

    from vllm_sr_runtime.engines.onnxruntime.providers import select_provider
    from vllm_sr_runtime.errors import UnsupportedDeviceError

    try:
        select_provider(device_kind, ort.get_available_providers())
    except UnsupportedDeviceError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def stop_server(process: subprocess.Popen, grace_s: float = 90.0) -> None:
    """SIGTERM to gunicorn's master alone, which stops its workers and then removes its metrics folder; the whole
    group is killed only if it has not exited after `grace_s` (longer than serve's 60 s graceful timeout). A TERM to
    the group reached the workers too, and a master that saw a worker exit before its own TERM could start a new one."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        process.wait()


def _serve_rps(package: Path, profile: str, artifact: Path | None, device: str, clients: list[int], seconds: float, base_path: Path | None, log_path: Path) -> list[dict]:
    """Requests/s of a real `serve` (gunicorn, Unix socket) of the package under a profile; its log goes to log_path.

    The socket lives in a private temporary folder (a socket path must stay short), removed afterwards.
    """
    from vllm_sr_runtime.bench.http_load import UnixConnection, run_http

    folder = Path(tempfile.mkdtemp(prefix="vsr-selftest-"))
    try:
        checked_uds_path(str(folder / "serve.sock"))  # serve's own rule: the kernel binds no longer path
    except InvalidRequest:  # a long TMPDIR
        folder.rmdir()
        folder = Path(tempfile.mkdtemp(prefix="vsr-selftest-", dir="/tmp"))
    os.chmod(folder, 0o700)
    uds = str(folder / "serve.sock")
    command = [sys.executable, "-m", "vllm_sr_runtime.cli", "serve", str(package), "--profile", profile] + (["--artifact", str(artifact)] if artifact else [])
    command += ["--device", device, "--uds", uds, "--log-level", "warning"] + (["--base-path", str(base_path)] if base_path else [])
    log = open(log_path, "wb")
    process = subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True)
    try:
        deadline = time.time() + 600
        while True:  # until serve answers at all; run_http then waits while its model loads, and refuses a failed one
            if process.poll() is not None:
                raise RuntimeError(f"serve exited with {process.returncode} (log: {log_path}): {log_path.read_text()[-2000:]}")
            try:
                conn = UnixConnection(uds, timeout=5)
                conn.request("GET", "/health/live")
                conn.getresponse().read()
                break
            except OSError:
                pass
            if time.time() > deadline:
                raise RuntimeError("serve did not become ready in 600 s")
            time.sleep(0.3)
        return run_http(None, uds, clients, seconds, lambda: None, settle_timeout_s=max(1.0, deadline - time.time()))
    finally:
        stop_server(process)
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


def run_selftest(options: SelftestOptions) -> dict:
    import vllm_sr_runtime
    from vllm_sr_runtime.cpu_features import FULL_WEIGHT_BITS, widest_int8_weight_bits
    from vllm_sr_runtime.export.export_options import MEDIA_VARIANTS
    from vllm_sr_runtime.export.exporter import export_package
    from vllm_sr_runtime.bench.forward import run_forward
    from vllm_sr_runtime.devices import parse_device

    started = time.time()
    out = prepare_report_folder(Path(options.out), "selftest")
    device = parse_device(options.device)
    variant = device.spec.variant or "contrib"
    dtypes = options.dtypes or list(device.spec.artifact_dtypes)
    real_dimension = device.kind != "cpu" if options.real_dimension is None else options.real_dimension
    chosen = {name: FIXTURES[name] for name in options.fixtures} | (REAL_DIMENSION if real_dimension else {})
    # a vision fixture where the device's variant writes no media graphs: skipped and said, not failed
    skipped = {name: f"the {variant} variant has no media graphs" for name, spec in chosen.items() if spec.get("vision") and variant not in MEDIA_VARIANTS}
    chosen = {name: spec for name, spec in chosen.items() if name not in skipped}
    report: dict = {"devices": devices_found(), "device": device.name, "variant": variant, "dtypes": dtypes, "skipped": skipped, "parity": [], "latency": [], "http": []}

    def log(message: str) -> None:
        if options.progress:
            print(f"[selftest {time.time() - started:6.0f} s] {message}", file=sys.stderr, flush=True)

    missing = provider_missing(device.kind)
    main: tuple | None = None
    for name, spec in chosen.items():
        package, base = _fixture(name, spec, out / "fixtures")
        common = {"device": device.name, "base_path": base}
        exact = vllm_sr_runtime.load(package, profile="exact", **common)
        if device.kind != "cpu":
            # The device's own numerics (a GPU runs BF16) against the FP32 reference on the CPU.
            reference = vllm_sr_runtime.load(package, profile="exact", device="cpu", base_path=base)
            row = {"fixture": name, "profile": "exact", "dtype": exact.dtype, "against": "exact on cpu", **device_numerics_parity(reference, exact, options.questions)}
            report["parity"].append(row)
            log(f"{name} exact {exact.dtype} vs cpu: " + ("ok" if not row["failed"] else "; ".join(row["failed"])))
            del reference
        fast_models = {}
        for dtype in dtypes:
            row = {"fixture": name, "profile": "max_speed", "dtype": dtype, "against": "exact"}
            if missing:  # nothing to export for a provider this host lacks
                report["parity"].append(row | {"failed": [missing]})
                continue
            artifact = out / "artifacts" / f"{name}-{variant}-{dtype}"
            log(f"{name}: export {variant}/{dtype}")
            # int8 on a CPU whose integer products saturate on 8-bit weights: the 7-bit form this host can serve
            widest = widest_int8_weight_bits() if dtype == "int8" and device.kind == "cpu" else FULL_WEIGHT_BITS
            bits = {"int8_weight_bits": widest} if widest < FULL_WEIGHT_BITS else {}
            row |= bits
            try:
                export_package(package, artifact, variant=variant, dtype=dtype, base_path=base, progress=False, smoke="off", **bits)
                fast = vllm_sr_runtime.load(package, profile="max_speed", artifact=artifact, **common)
                row |= _parity(exact, fast, options.questions)
                fast_models[dtype] = (fast, artifact)
            except Exception as exc:  # one dtype that cannot export or load fails its row, not the run
                row["failed"] = [f"{type(exc).__name__}: {exc}"]
            report["parity"].append(row)
            log(f"{name} {dtype}: " + ("ok" if not row["failed"] else "; ".join(row["failed"])))
        main = (name, package, base, exact, fast_models)  # the last fixture (the largest) is measured below
    if main:
        name, package, base, exact, fast_models = main
        best = next((dtype for dtype in SERVE_PREFERENCE[device.kind] if dtype in fast_models), None)
        models = {"exact": exact} | {f"max_speed-{dtype}": model for dtype, (model, _) in fast_models.items()}
        log(f"{name}: forward latency at {options.lengths} tokens")
        report["latency"] = [
            {k: row[k] for k in ("profile", "length", "target_length", "median_ms", "p90_ms", "ratio_to_exact")}
            for row in run_forward(models, options.lengths, [1], options.repeats, 1.0, lambda: None)
        ]
        # The fastest artifact that passed its export; with none (no provider), the device's eager profile.
        served = ("max_speed", best, fast_models[best][1]) if best else ("exact", exact.dtype, None)
        log(f"{name}: serve {served[0]} ({served[1]}), {options.clients} clients")
        report["http"] = [
            {"profile": served[0], "dtype": served[1], "clients": row["concurrency"], "rps": row["rps"], "median_ms": row["median_ms"], "p99_ms": row["p99_ms"], "statuses": row["statuses"]}
            for row in _serve_rps(package, served[0], served[2], device.name, options.clients, options.http_seconds, base, out / "serve.log")
        ]
        report["http_fixture"] = report["latency_fixture"] = name
    report["failed"] = [f"{row['fixture']} {row['profile']} {row['dtype']}: {failure}" for row in report["parity"] for failure in row["failed"]]
    report["seconds"] = round(time.time() - started, 1)
    write_report_file(out / "selftest.json", json.dumps(report, indent=2) + "\n")
    return report


def print_report(report: dict) -> None:
    found = report["devices"]
    gpus = ", ".join(f"{g['name']} ({g['memory_gib']} GiB)" for g in found["gpus"]) or "none"
    print(f"devices: GPUs {gpus}; ORT providers {', '.join(found['ort_providers'])}; auto -> {found['auto']}; ran on {report['device']} ({report['variant']})")
    print(f"{'check':44} {'dtype':18} {'result':>42}")
    for row in report["parity"]:
        if "max_abs_diff" in row:
            clear = f" ({row['clear_decisions_changed']} clear)" if "clear_decisions_changed" in row else ""
            result = f"{row['decisions_changed']}/{row['questions']} changed{clear}, median |dp| {row['median_abs_diff']:.1e}, max {row['max_abs_diff']:.1e}"
        else:
            result = "did not run"
        status = "FAIL" if row["failed"] else "ok"
        check = f"parity {row['fixture']} {row['profile']} vs {row['against']}"
        print(f"{check:44} {row['dtype']:18} {result:>37} {status:>4}")
    for row in report["latency"]:
        ratio = f"  x{row['ratio_to_exact']:.2f} vs exact" if row["ratio_to_exact"] and row["profile"] != "exact" else ""
        print(f"{'forward ' + row['profile'] + ' @' + str(row['length']) + ' tok':44} {'':18} {row['median_ms']:>34.1f} ms{ratio}")
    for row in report["http"]:
        print(f"{'serve ' + row['profile'] + ', ' + str(row['clients']) + ' clients':44} {row['dtype']:18} {row['rps']:>32.1f} req/s")
    for name, why in report["skipped"].items():
        print(f"skipped {name}: {why}")
    for failure in report["failed"]:
        print(f"FAILED {failure}", file=sys.stderr)
    print(f"selftest: {'FAILED' if report['failed'] else 'passed'} in {report['seconds']:.0f} s")
