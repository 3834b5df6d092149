"""Export as an operation: first use, interruption, concurrency, disk and smoke options, reduced-precision dtypes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import onnx
import pytest
import torch

import vllm_sr_runtime
from user_files import assert_untouched, user_files
from conftest import load_kwargs
from vllm_sr_runtime.artifacts import PARTIAL_MARK, atomic_directory, read_artifact
from vllm_sr_runtime.export.exporter import export_package
from vllm_sr_runtime.export.provider_checks import cuda_kernel_gaps
from vllm_sr_runtime.errors import ArtifactError, PackageError


def test_first_use_exports_into_the_cache(packages, tmp_path):
    model = vllm_sr_runtime.load(packages["d3_causal"], profile="max_speed", cache_dir=tmp_path)
    made = list((tmp_path / "artifacts").glob("*/contrib-fp32/artifact.json"))
    assert len(made) == 1
    stamp = made[0].stat().st_mtime_ns
    again = vllm_sr_runtime.load(packages["d3_causal"], profile="max_speed", cache_dir=tmp_path)
    assert made[0].stat().st_mtime_ns == stamp  # reused, not exported again
    assert again.ask("s", {"q": {"type": "noul"}}) == model.ask("s", {"q": {"type": "noul"}})


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_interrupted_export_leaves_no_artifact(packages, tmp_path, sig):
    """A signal during the write phase leaves no `out` (and, for SIGTERM, no partial folder). The tiny export's write
    phase can end between the poll that sees its partial folder and the signal: such a run must have left a complete,
    verified artifact (`out` only ever appears by rename), and the test tries again until one run is interrupted."""
    out = tmp_path / "artifact"
    for _ in range(4):
        shutil.rmtree(out, ignore_errors=True)
        process = subprocess.Popen(
            [sys.executable, "-m", "vllm_sr_runtime.cli", "export", str(packages["d2_qwen3_5"]), "--out", str(out), "--quiet"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        deadline = time.time() + 240
        while time.time() < deadline and not list(tmp_path.glob(".artifact.partial-*")):
            assert process.poll() is None, process.stderr.read().decode()[-2000:]
            time.sleep(0.05)
        assert list(tmp_path.glob(".artifact.partial-*")), "the export never reached its write phase"
        os.kill(process.pid, sig)
        if process.wait(timeout=60) != 0:
            break
        read_artifact(out)  # finished before the signal landed: whole, or this raises
        assert not list(tmp_path.glob(".artifact.partial-*"))
    else:
        pytest.fail("every export finished before its signal landed")
    assert not out.exists()
    if sig == signal.SIGTERM:
        assert not list(tmp_path.glob(".artifact.partial-*"))  # cleaned up on the way out
    else:
        export_package(packages["d2_qwen3_5"], out, progress=False)  # a later export clears the stale partial
        assert out.is_dir() and not list(tmp_path.glob(".artifact.partial-*"))


def test_a_signal_just_after_the_partial_folder_is_made_leaves_nothing(tmp_path, monkeypatch):
    """A SIGTERM (KeyboardInterrupt from the write's handler) that lands right after the partial folder is created,
    before the code that made it has handed it over, still removes it: the folder is named before it exists, under
    the handler (it once came from mkdtemp ahead of both, and the interrupted-export test above caught the window)."""
    real_mkdir = os.mkdir

    def mkdir_then_signal(path, *args, **kwargs):
        real_mkdir(path, *args, **kwargs)
        if PARTIAL_MARK in os.fspath(path):
            raise KeyboardInterrupt("signal 15")

    handler = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(os, "mkdir", mkdir_then_signal)
    with pytest.raises(KeyboardInterrupt):
        with atomic_directory(tmp_path / "artifact"):
            pytest.fail("the write began although its folder was interrupted")
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == [] and signal.getsignal(signal.SIGTERM) is handler


def test_export_prints_the_graphs_notices_not_torchs(packages, tmp_path):
    """A fresh process's export says nothing about torch itself (torchvision's skipped ops, shared dynamic dims,
    pytree's deprecation) and no untyped-value notice per Gated DeltaNet layer; its summary line stays."""
    done = subprocess.run(
        [sys.executable, "-m", "vllm_sr_runtime.cli", "export", str(packages["d2_qwen3_5"]), "--out", str(tmp_path / "a"), "--smoke", "off", "--quiet"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    for notice in ("torchvision is not installed", "will not be used", "LeafSpec", "is not known"):
        assert notice not in done.stderr and notice not in done.stdout, notice
    assert (tmp_path / "a" / "artifact.json").is_file()


def test_export_never_replaces_a_folder_that_is_not_an_artifact(packages, tmp_path):
    """An export replaces --out as a whole: the package's own folder, a folder holding it, a non-empty folder of
    something else, a file, or a folder inside a package or an artifact are refused before any work, and left as
    they were; an empty folder or an earlier artifact is replaced."""
    package = tmp_path / "models" / "d3"
    shutil.copytree(packages["d3"], package)
    before = sorted(p.name for p in package.iterdir())
    for out in (package, package.parent, tmp_path):
        with pytest.raises(ArtifactError, match="holds the package being exported"):
            export_package(package, out, progress=False, smoke="off")
    mine = user_files(tmp_path)
    for out in mine:
        with pytest.raises(ArtifactError, match="holds no artifact.json"):
            export_package(package, out, progress=False, smoke="off")
    # Inside the package (an `onnx/` folder, as many repos keep one) or inside another artifact: the artifact's files
    # would be files the package's (or that artifact's) manifest does not list, and it would fail verification.
    empty = tmp_path / "empty"
    empty.mkdir()
    export_package(package, empty, progress=False, smoke="off")
    for out, inside in ((package / "onnx", package), (package / "onnx" / "fp32", package), (empty / "nested", empty)):
        with pytest.raises(ArtifactError, match=f"is inside {inside}, {'an exported artifact' if inside == empty else 'a model package'}"):
            export_package(package, out, progress=False, smoke="off")
    assert not (package / "onnx").exists() and not (empty / "nested").exists()
    assert sorted(p.name for p in package.iterdir()) == before
    assert_untouched(mine)
    link = tmp_path / "current"
    link.symlink_to(mine[0])
    with pytest.raises(ArtifactError, match="symbolic link"):
        export_package(package, link, progress=False, smoke="off")
    export_package(package, empty, progress=False, smoke="off")  # an earlier artifact is replaced
    assert (empty / "artifact.json").is_file()


def test_unknown_dtype_is_refused_up_front(packages, tmp_path):
    with pytest.raises(ValueError, match="dtype must be one of"):
        export_package(packages["d3"], tmp_path / "fp8", dtype="fp8", progress=False)
    assert not (tmp_path / "fp8").exists()


def test_a_cache_that_cannot_be_written_serves_what_it_holds_and_says_what_to_do_otherwise(packages, tmp_path):
    """A cache baked into an image (read-only) that holds the artifact serves it without taking the first-use lock;
    one that cannot hold a new export refuses with what to do, not an OS error from deep inside."""
    from vllm_sr_runtime.engines.onnxruntime.builder import cached_artifact_dir

    model = vllm_sr_runtime.load(packages["d3_causal"], profile="max_speed", cache_dir=tmp_path / "baked")
    target = cached_artifact_dir(model.family, "contrib", "fp32", tmp_path / "baked")
    lock = target.parent / f".{target.name}.lock"
    lock.unlink()
    lock.mkdir()  # the lock cannot be opened for writing, as on a read-only filesystem
    again = vllm_sr_runtime.load(packages["d3_causal"], profile="max_speed", cache_dir=tmp_path / "baked")
    assert again.ask("s", {"q": {"type": "noul"}}) == model.ask("s", {"q": {"type": "noul"}})
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")
    with pytest.raises(ArtifactError, match="--artifact, or give a writable --cache-dir"):
        vllm_sr_runtime.load(packages["d3_causal"], profile="max_speed", cache_dir=not_a_directory)


def test_concurrent_first_uses_export_once(packages, tmp_path, monkeypatch):
    import threading

    from vllm_sr_runtime.export import exporter

    calls = []
    real = exporter.export_family

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(exporter, "export_family", counting)
    loaded, errors = [], []

    def first_use() -> None:
        try:
            loaded.append(vllm_sr_runtime.load(packages["d3_causal"], profile="max_speed", cache_dir=tmp_path))
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=first_use) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert not errors and len(loaded) == 2
    assert len(calls) == 1
    question = {"q": {"type": "noul"}}
    assert loaded[0].ask("s", question) == loaded[1].ask("s", question)


def test_smoke_off_records_it_and_the_artifact_still_answers(packages, models, tmp_path):
    out = tmp_path / "no-smoke"
    manifest = export_package(packages["d2_qwen3"], out, progress=False, smoke="off")
    assert manifest["smoke_parity"] is None
    assert manifest["smoke"]["ran"] is False and manifest["smoke"]["reason"] == "--smoke off" and manifest["smoke"]["rows"] == 0
    fast = vllm_sr_runtime.load(packages["d2_qwen3"], profile="max_speed", artifact=out)
    question = {"q": {"type": "noul", "instructions": "Code?"}}
    assert abs(fast.ask("Merge two sorted lists.", question)["q"]["noul"] - models("d2_qwen3").ask("Merge two sorted lists.", question)["q"]["noul"]) <= 1e-4


def test_too_little_disk_is_refused_before_any_work(packages, tmp_path, monkeypatch):
    from vllm_sr_runtime.export import disk_space

    monkeypatch.setattr(disk_space, "BYTES_PER_PARAMETER", {"fp32": 1e12})
    with pytest.raises(ArtifactError, match="not enough disk space"):
        export_package(packages["d3"], tmp_path / "deep" / "artifact", progress=False)
    assert not (tmp_path / "deep").exists()


def test_the_disk_refusal_states_small_sizes_in_a_unit_that_shows_them(tmp_path, monkeypatch):
    """A tiny package on a nearly full (or pseudo) file system: 'need about 4.2 MiB, 512.0 KiB free', not '0.0 GiB'."""
    from collections import namedtuple

    from vllm_sr_runtime.export import disk_space

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(disk_space.shutil, "disk_usage", lambda path: usage(2**20, 2**19, 2**19))
    with pytest.raises(ArtifactError, match=r"need about 4\.2 MiB under .*, 512\.0 KiB free"):
        disk_space.check_disk_space(tmp_path / "artifact", 1_000_000, "fp32")


def test_weights_stream_in_blocks_equal_to_the_whole_tensor(packages):
    """Blocks of a few rows (or columns, transposed) concatenate to exactly the tensor the module holds."""
    from vllm_sr_runtime.families import open_family
    from vllm_sr_runtime.packages.resolve import resolve_package

    for name in ("d3", "d2_lora"):
        family = open_family(resolve_package(packages[name]), **load_kwargs(name, packages[name]))
        if hasattr(family, "merge_adapter"):
            family.merge_adapter = True
        sources = family.weight_sources(family.numerics("cpu"))
        module = family.build_module(family.numerics("cpu"), torch.device("cpu"))
        state = module.state_dict()
        merged = 0
        for key, source in sources.items():
            whole = source.load()
            assert torch.equal(whole, state[key]), key  # the source makes what the module loads
            merged += source.lora is not None
            if whole.dim() == 2:
                blocks = list(source.chunks(max_bytes=3 * whole.shape[1] * whole.element_size()))
                assert torch.equal(torch.cat(blocks), whole)
                columns = list(source.chunks(transpose=True, max_bytes=3 * whole.shape[0] * whole.element_size()))
                assert torch.equal(torch.cat(columns), whole.t())
                assert source.lora is not None or len(blocks) == -(-whole.shape[0] // 3)
        assert merged > 0 if name == "d2_lora" else merged == 0


def test_fp16_and_bf16_exports_keep_fp32_islands_and_type_check(packages, models, tmp_path):
    """fp16: runs on ORT's CPU provider, smoke-gated against the FP32 eager model, answers like exact.
    bf16 (CUDA only): every node type-checks (onnx strict inference: no fused norm left with mixed input
    types), the policy's FP32 readout is kept, and a CPU load refuses it naming the dtypes CPU runs."""
    question = {"q": {"type": "choice", "criteria": {"a": None, "b": None, "c": None}}, "n": {"type": "noul"}}
    exact = models("d3").ask("Merge two sorted lists.", question)
    for dtype in ("fp16", "bf16"):
        out = tmp_path / dtype
        manifest = export_package(packages["d3"], out, dtype=dtype, progress=False)
        assert manifest["dtype"] == dtype
        onnx.shape_inference.infer_shapes_path(str(out / "model.onnx"), str(tmp_path / f"{dtype}-inferred.onnx"), check_type=True, strict_mode=True)
        graph = onnx.load(str(out / "model.onnx"), load_external_data=False)
        element = {"fp16": onnx.TensorProto.FLOAT16, "bf16": onnx.TensorProto.BFLOAT16}[dtype]
        matmul_weights = {t.name: t.data_type for t in graph.graph.initializer}
        typed = [matmul_weights[n.input[1]] for n in graph.graph.node if n.op_type == "MatMul" and n.input[1] in matmul_weights]
        assert typed.count(onnx.TensorProto.FLOAT) == 1 and typed.count(element) == len(typed) - 1  # the readout stays FP32
        assert {o.type.tensor_type.elem_type for o in graph.graph.output} == {onnx.TensorProto.FLOAT}
        assert cuda_kernel_gaps(graph) == [] and manifest["cuda_kernels"]["gaps"] == 0  # each typed node has a CUDA kernel
        if dtype == "fp16":
            assert manifest["smoke"]["ran"] and manifest["smoke_parity"]["decisions_changed"] == 0
            assert manifest["smoke_parity"]["max_abs_diff"] <= 1e-2
            fast = vllm_sr_runtime.load(packages["d3"], profile="max_speed", artifact=out).ask("Merge two sorted lists.", question)
            assert fast["q"]["choice"] == exact["q"]["choice"] and abs(fast["n"]["noul"] - exact["n"]["noul"]) <= 1e-2
            assert max(abs(fast["q"]["probabilities"][k] - exact["q"]["probabilities"][k]) for k in "abc") <= 1e-2
        else:
            assert not manifest["smoke"]["ran"] and "no bf16 kernels" in manifest["smoke"]["reason"]
            with pytest.raises(ArtifactError, match="is bf16; CPUExecutionProvider .* runs fp32, fp16, int8"):
                vllm_sr_runtime.load(packages["d3"], profile="max_speed", artifact=out)


def test_fp16_portable_graph_runs_on_cpu_like_exact(packages, models, tmp_path):
    out = tmp_path / "portable-fp16"
    manifest = export_package(packages["d2_qwen3_5"], out, variant="portable", dtype="fp16", progress=False)
    assert not any(key.startswith("com.microsoft::") for key in manifest["op_counts"])
    assert manifest["smoke"]["ran"] and manifest["smoke_parity"]["decisions_changed"] == 0 and manifest["smoke_parity"]["max_abs_diff"] <= 1e-2
    question = {"q": {"type": "noul", "instructions": "Code?"}}
    model = vllm_sr_runtime.load(packages["d2_qwen3_5"], profile="max_speed", artifact=out)
    fast = model.ask("Merge two sorted lists.", question)
    assert abs(fast["q"]["noul"] - models("d2_qwen3_5").ask("Merge two sorted lists.", question)["q"]["noul"]) <= 1e-2
    # the memory budget's estimate counts every length's graph, each with its own weights (on the CPU they open as
    # rows first need their length: the one question above opened one)
    from vllm_sr_runtime.engines.onnxruntime.builder import expected_weight_bytes
    from vllm_sr_runtime.profiles import profile_named

    files, graphs = manifest["files"], {graph["model_file"] for graph in manifest["buckets"]["graphs"]}
    every = sum(files[name]["bytes"] for graph in graphs for name in (graph, graph + ".data") if name in files)
    assert len(graphs) > 1 and expected_weight_bytes(model.family, model.device, profile_named("max_speed"), artifact=out) == every > model.weight_bytes
    with pytest.raises(ArtifactError, match="contrib variant"):
        export_package(packages["d2_qwen3_5"], tmp_path / "portable-bf16", variant="portable", dtype="bf16", progress=False)


def test_verify_checks_an_artifact_against_its_own_manifest(packages, default_artifact, tmp_path, capsys):
    """`verify ARTIFACT`: every file's size and sha256 against artifact.json, nothing extra (it used to verify the
    package manifest the artifact carries and report the package's README as missing)."""
    from vllm_sr_runtime.cli import main

    artifact = tmp_path / "artifact"
    shutil.copytree(default_artifact("d3"), artifact)
    with pytest.raises(PackageError, match="an exported artifact, not a model package: give the package it was exported from"):
        vllm_sr_runtime.load(artifact)  # not verified as the package whose manifest it carries
    assert main(["verify", str(artifact)]) == 0
    said = capsys.readouterr().out
    assert said.startswith(f"ok: artifact {artifact}: contrib fp32 of decision3 ") and "verification=artifact" in said
    smoke = json.loads((artifact / "artifact.json").read_text())["smoke_parity"]
    assert f"smoke parity max |dp| {smoke['max_abs_diff']:.2e}, 0/{smoke['questions']} decisions changed" in said and "int8" not in said
    (artifact / "notes.txt").write_text("mine")
    assert main(["verify", str(artifact)]) == 1
    assert "extra ['notes.txt']" in capsys.readouterr().err
    (artifact / "notes.txt").unlink()
    with open(artifact / "tokenizer.json", "a") as tokenizer:
        tokenizer.write(" ")
    assert main(["verify", str(artifact)]) == 1
    assert "tokenizer.json: size or sha256 differs from artifact.json" in capsys.readouterr().err
