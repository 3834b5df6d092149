"""Package verification: every fixture verifies; tampering of any kind is refused, naming the file."""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import runtime
from conftest import PACKAGE_KINDS, load_kwargs
from runtime.errors import PackageError
from runtime.families import detect_family
from runtime.fixtures.writer import write_fixture
from runtime.packages.resolve import resolve_package


def open_package(path: Path, **kwargs):
    ref = resolve_package(path)
    return detect_family(ref.path).open(ref, **kwargs)


@pytest.mark.parametrize("name", sorted(PACKAGE_KINDS))
def test_every_fixture_verifies(packages, name):
    family = open_package(packages[name], **load_kwargs(name, packages[name]))
    assert family.name == PACKAGE_KINDS[name][0]
    assert len(family.package.model_sha256) == 64


def copy_package(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    base = src.parent / f"{src.name}-base"
    if base.exists():
        shutil.copytree(base, dst.parent / f"{dst.name}-base")
    return dst


def flip_byte(path: Path, offset: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    index = len(data) // 2 if offset is None else offset
    data[index] ^= 0x01
    path.write_bytes(bytes(data))


TAMPER_TARGETS = [
    ("d3", "model.safetensors"),
    ("d3", "readout.safetensors"),
    ("d3", "tokenizer.json"),
    ("d3", "tokenizer_config.json"),
    ("d3", "decision_config.json"),
    ("d3", "config.json"),
    ("d3", "chat_template.jinja"),
    ("d2_qwen3_5", "backbone/model.safetensors"),
    ("d2_qwen3_5", "decision_head.safetensors"),
    ("d2_qwen3_5", "tokenizer.json"),
    ("d2_qwen3_5", "backbone/config.json"),
    ("d2_qwen3_5", "config.json"),
    ("d2_lora", "adapter/adapter_model.safetensors"),
    ("d2_lora", "adapter/adapter_config.json"),
]


@pytest.mark.parametrize("name,rel", TAMPER_TARGETS)
def test_flipped_byte_is_refused_naming_the_file(packages, tmp_path, name, rel):
    pkg = copy_package(packages[name], tmp_path / name)
    flip_byte(pkg / rel)
    with pytest.raises(PackageError) as caught:
        open_package(pkg, **load_kwargs(name, pkg))
    assert rel in str(caught.value)
    assert "sha256" in str(caught.value)


def test_flipped_byte_in_adapter_base_is_refused(packages, tmp_path):
    pkg = copy_package(packages["d2_lora"], tmp_path / "lora")
    flip_byte(tmp_path / "lora-base" / "model.safetensors")
    with pytest.raises(PackageError, match="base:model.safetensors"):
        open_package(pkg, **load_kwargs("d2_lora", pkg))


def test_adapter_without_base_asks_for_it(packages):
    with pytest.raises(PackageError, match="base"):
        ref = resolve_package(packages["d2_lora"])
        detect_family(ref.path).open(ref, cache_dir=None, offline=True)


@pytest.mark.parametrize("name,rel", [("d3", "tokenizer.json"), ("d2_qwen3", "decision_head.safetensors"), ("d3", "modeling_d3.py")])
def test_missing_file_is_refused(packages, tmp_path, name, rel):
    pkg = copy_package(packages[name], tmp_path / name)
    (pkg / rel).unlink()
    with pytest.raises(PackageError, match="missing") as caught:
        open_package(pkg)
    assert rel in str(caught.value)


@pytest.mark.parametrize("name", ["d3", "d2_qwen3"])
def test_extra_file_is_refused(packages, tmp_path, name):
    pkg = copy_package(packages[name], tmp_path / name)
    (pkg / "backdoor.py").write_text("print('hi')\n")
    with pytest.raises(PackageError, match="not listed") as caught:
        open_package(pkg)
    assert "backdoor.py" in str(caught.value)


def test_symlink_outside_is_refused(packages, tmp_path):
    pkg = copy_package(packages["d3"], tmp_path / "d3")
    outside = tmp_path / "elsewhere.json"
    shutil.copy(pkg / "tokenizer.json", outside)
    (pkg / "tokenizer.json").unlink()
    os.symlink(outside, pkg / "tokenizer.json")
    with pytest.raises(PackageError, match="outside") as caught:
        open_package(pkg)
    assert "tokenizer.json" in str(caught.value)


def test_tampered_manifest_identity_is_refused(packages, tmp_path):
    import json

    pkg = copy_package(packages["d3"], tmp_path / "d3")
    manifest = json.loads((pkg / "MODEL_MANIFEST.json").read_text())
    manifest["identity"]["model_sha256"] = "0" * 64
    (pkg / "MODEL_MANIFEST.json").write_text(json.dumps(manifest))
    with pytest.raises(PackageError, match="identity"):
        open_package(pkg)


def test_parameter_count_mismatch_is_refused(packages, tmp_path):
    import json

    pkg = copy_package(packages["d2_qwen3"], tmp_path / "d2")
    manifest = json.loads((pkg / "MODEL_MANIFEST.json").read_text())
    manifest["parameters"]["packaged"]["backbone"] += 1
    (pkg / "MODEL_MANIFEST.json").write_text(json.dumps(manifest))
    with pytest.raises(PackageError, match="backbone/model.safetensors"):
        open_package(pkg)


@pytest.mark.parametrize("name", ["d3", "d2_lora", "d2_calibrated"])
def test_same_seed_same_bytes(tmp_path, name):
    family, options = PACKAGE_KINDS[name]
    first = write_fixture(family, tmp_path / "a", seed=3, **options)
    second = write_fixture(family, tmp_path / "b", seed=3, **options)
    for left, right in zip(first, second):
        files = sorted(p.relative_to(left) for p in left.rglob("*") if p.is_file())
        assert files == sorted(p.relative_to(right) for p in right.rglob("*") if p.is_file())
        match, mismatch, errors = filecmp.cmpfiles(left, right, [str(f) for f in files], shallow=False)
        assert not mismatch and not errors
    other = write_fixture(family, tmp_path / "c", seed=4, **options)
    assert (other[0] / "MODEL_MANIFEST.json").read_bytes() != (first[0] / "MODEL_MANIFEST.json").read_bytes()


def test_tiny_packages_are_small(packages):
    for path in packages.values():
        size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        assert size < 20 * 1024 * 1024


def test_package_python_is_never_imported(packages, models):
    """The fixtures' bundled .py files raise on import; loading and answering must not run them."""
    model = models("d3")
    model.ask("state", {"q": {"type": "noul", "instructions": "ok?"}})
    assert not any(name.startswith(("modeling_d3", "pipeline_d3", "d3_runtime", "decision2", "modeling_decision2")) for name in sys.modules)


def test_verify_cli_summary_and_failure(packages, tmp_path):
    ok = subprocess.run([sys.executable, "-m", "runtime.cli", "verify", str(packages["d3"])], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.count("\n") == 1 and ok.stdout.startswith("ok: decision3")
    pkg = copy_package(packages["d3"], tmp_path / "d3")
    flip_byte(pkg / "tokenizer.json")
    bad = subprocess.run([sys.executable, "-m", "runtime.cli", "verify", str(pkg)], capture_output=True, text=True)
    assert bad.returncode != 0
    assert "tokenizer.json" in bad.stderr


def test_verify_refuses_short_and_moving_revisions():
    for ref, message in [("vllm-sr/d3-lite", "full 40-hex"), ("vllm-sr/d3-lite@main", "40-hex"), ("vllm-sr/d3-lite@" + "f" * 40, "not the pinned release")]:
        result = subprocess.run([sys.executable, "-m", "runtime.cli", "verify", ref, "--offline"], capture_output=True, text=True)
        assert result.returncode != 0
        assert message in result.stderr, result.stderr


def test_models_lists_the_pinned_releases():
    import json

    result = subprocess.run([sys.executable, "-m", "runtime.cli", "models", "--json"], capture_output=True, text=True, check=True)
    releases = json.loads(result.stdout)
    families = [r["family"] for r in releases]
    assert families.count("decision2") == 6 and families.count("decision3") == 6
    assert all(not r["revision_is_full"] for r in releases)


def test_fixture_max_length_sets_the_prompt_limit(tmp_path):
    (root,) = write_fixture("decision3", tmp_path / "p", max_length=1024)
    model = runtime.load(root)
    assert model.family.max_input_tokens == 1024
    answers = model.ask("word " * 1500, {"q": {"type": "noul", "instructions": "ok?"}})
    assert answers["q"]["error"] == "max_length_exceeded" and "1024" in answers["q"]["message"]
    assert model.ask("word " * 500, {"q": {"type": "noul", "instructions": "ok?"}})["q"]["type"] == "noul"
    with pytest.raises(ValueError, match="--max-length must be within"):
        write_fixture("decision3", tmp_path / "q", max_length=1 << 20)
    with pytest.raises(ValueError, match="Decision 3.0 options"):
        write_fixture("decision2", tmp_path / "r", max_length=2048)
