"""Package verification: every fixture verifies; tampering of any kind is refused, naming the file."""

from __future__ import annotations

import filecmp
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import vllm_sr_runtime
from user_files import assert_untouched, user_files
from conftest import PACKAGE_KINDS, load_kwargs
from vllm_sr_runtime.errors import PackageError
from vllm_sr_runtime.families import detect_family
from vllm_sr_runtime.synthetic.writer import write_synthetic_package
from vllm_sr_runtime.packages.resolve import resolve_package


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


@pytest.mark.parametrize("name", ["d3", "d2_qwen3"])
def test_a_base_checkpoint_given_to_a_package_without_an_adapter_is_refused(packages, name):
    """It was silently unused: a user who meant another package, or an adapter, got this one without a word."""
    from vllm_sr_runtime.families import open_family

    base = load_kwargs("d2_lora", packages["d2_lora"])["base_path"]
    with pytest.raises(PackageError, match="is not an adapter package: drop base_path"):
        open_family(resolve_package(packages[name]), base_path=base)
    assert open_family(resolve_package(packages["d2_lora"]), base_path=base).reads_base_checkpoint


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
    first = write_synthetic_package(family, tmp_path / "a", seed=3, **options)
    second = write_synthetic_package(family, tmp_path / "b", seed=3, **options)
    for left, right in zip(first, second):
        files = sorted(p.relative_to(left) for p in left.rglob("*") if p.is_file())
        assert files == sorted(p.relative_to(right) for p in right.rglob("*") if p.is_file())
        match, mismatch, errors = filecmp.cmpfiles(left, right, [str(f) for f in files], shallow=False)
        assert not mismatch and not errors
    other = write_synthetic_package(family, tmp_path / "c", seed=4, **options)
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
    ok = subprocess.run([sys.executable, "-m", "vllm_sr_runtime.cli", "verify", str(packages["d3"])], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.count("\n") == 1 and ok.stdout.startswith("ok: decision3")
    # what the eager weights take per device class, for --memory-budget: the card's weight_bytes on the CPU
    held = vllm_sr_runtime.load(packages["d3"]).card()
    assert f"parameters={held['parameters']} " in ok.stdout, ok.stdout
    cpu = int(re.search(r"cpu fp32 [0-9.]+ GiB \(([0-9,]+) bytes\)", ok.stdout).group(1).replace(",", ""))
    gpu = int(re.search(r"gpu bf16 [0-9.]+ GiB \(([0-9,]+) bytes\)", ok.stdout).group(1).replace(",", ""))
    assert abs(cpu - held["weight_bytes"]) <= 0.02 * held["weight_bytes"] and gpu * 2 == cpu, ok.stdout
    pkg = copy_package(packages["d3"], tmp_path / "d3")
    flip_byte(pkg / "tokenizer.json")
    bad = subprocess.run([sys.executable, "-m", "vllm_sr_runtime.cli", "verify", str(pkg)], capture_output=True, text=True)
    assert bad.returncode != 0
    assert "tokenizer.json" in bad.stderr


def test_verify_refuses_moving_short_and_unpinned_revisions(tmp_path):
    env = {**os.environ, "VLLM_SR_RUNTIME_CACHE_DIR": str(tmp_path)}
    for ref, message in [
        ("vllm-sr/d3-lite@main", "prefix of at least 8 hex"),
        ("vllm-sr/d3-lite@b731454", "prefix of at least 8 hex"),
        ("vllm-sr/d3-lite@" + "f" * 40, "is not a pinned release"),
        ("vllm-sr/Decision-2.0-Kai-0.6B@881bee41" + "0" * 32, "is not a pinned release"),
        ("someone/model", "not a built-in release"),
        ("someone/model@abcdef12", "40-hex"),
    ]:
        result = subprocess.run([sys.executable, "-m", "vllm_sr_runtime.cli", "verify", ref, "--offline"], capture_output=True, text=True, env=env)
        assert result.returncode != 0
        assert message in result.stderr, (ref, result.stderr)


def test_models_lists_every_pinned_revision_and_marks_the_default():
    import json

    from vllm_sr_runtime.packages.releases import find_release

    result = subprocess.run([sys.executable, "-m", "vllm_sr_runtime.cli", "models", "--json"], capture_output=True, text=True, check=True)
    releases = {r["repo_id"]: r for r in json.loads(result.stdout)}
    families = [r["family"] for r in releases.values()]
    assert families.count("decision2") == 6 and families.count("decision3") == 6
    documented = {"Kai-0.6B": "881bee413681d80ebeac86afcda8b4138dae516e", "Eos-0.8B": "ad0aa724", "Sol-2B": "4b75b521", "Nox-4B": "ce1bdc9d", "Lux-9B": "214ffa43", "Vega-27B": "9b067a95"}
    for name, revision in documented.items():
        release = releases[f"vllm-sr/Decision-2.0-{name}"]
        assert release["default_revision"] == revision
        assert [r["default"] for r in release["revisions"]] == [True, False]  # the documented pin, then the registry's
        assert [r["source"] for r in release["revisions"]] == ["documented", "registry"]
    assert releases["vllm-sr/Decision-2.0-Kai-0.6B"]["revisions"][0]["revision_is_full"]
    assert releases["vllm-sr/Decision-2.0-Kai-0.6B"]["revisions"][1]["revision"] == "cd49ea3813fd"
    assert releases["vllm-sr/d3-nano"]["default_revision"] == "6601b4d139"
    assert find_release("d3-nano") is find_release("vllm-sr/d3-nano")
    text = subprocess.run([sys.executable, "-m", "vllm_sr_runtime.cli", "models"], capture_output=True, text=True, check=True).stdout
    assert "documented, default" in text and "3594047d69f4" in text


def test_a_pin_accepts_full_commits_and_prefixes_of_its_revisions():
    from vllm_sr_runtime.packages.releases import find_release

    kai = find_release("vllm-sr/Decision-2.0-Kai-0.6B")
    assert kai.pin(None).revision.startswith("881bee41")
    assert kai.pin("881bee41").source == "documented"
    assert kai.pin("881BEE413681D80EBEAC86AFCDA8B4138DAE516E").source == "documented"
    assert kai.pin("cd49ea38").source == "registry"  # shorter than the table's prefix, at least 8 digits
    assert kai.pin("cd49ea3813fd" + "a" * 28).source == "registry"  # a full commit extending the prefix
    with pytest.raises(PackageError, match="not a pinned release"):
        kai.pin("cd49ea3813fe")


def test_fixture_max_length_sets_the_prompt_limit(tmp_path):
    (root,) = write_synthetic_package("decision3", tmp_path / "p", max_length=1024)
    model = vllm_sr_runtime.load(root)
    assert model.family.max_input_tokens == 1024
    answers = model.ask("word " * 1500, {"q": {"type": "noul", "instructions": "ok?"}})
    assert answers["q"]["error"] == "max_length_exceeded" and "1024" in answers["q"]["message"]
    assert model.ask("word " * 500, {"q": {"type": "noul", "instructions": "ok?"}})["q"]["type"] == "noul"
    with pytest.raises(ValueError, match="--max-length must be within"):
        write_synthetic_package("decision3", tmp_path / "q", max_length=1 << 20)
    for decision3_only in ({"max_length": 2048}, {"attention_mode": "causal"}, {"vision": True}):
        with pytest.raises(ValueError, match="Decision 3.0 options"):  # never written and silently ignored
            write_synthetic_package("decision2", tmp_path / "r", **decision3_only)
    assert not (tmp_path / "r").exists()


def test_a_fixture_replaces_only_what_a_fixture_wrote(tmp_path):
    """`fixture --out` replaces its folder as a whole: a synthetic package (or an adapter's synthetic base) written
    earlier, or an empty folder, is replaced; the user's folder, a real model's or a file is refused and kept, and so
    is a folder inside a package."""
    package = tmp_path / "pkg"
    (root, base) = write_synthetic_package("decision2", package, adapter=True)
    (root, base) = write_synthetic_package("decision2", package, adapter=True, seed=1)  # both replaced
    assert detect_family(root) and (base / "model.safetensors").is_file()
    mine = user_files(tmp_path)
    for out in mine:
        with pytest.raises(ValueError, match="not what a fixture wrote there"):
            write_synthetic_package("decision3", out)
    assert_untouched(mine)
    real_base = tmp_path / "vega-base"  # a real checkpoint beside where an adapter fixture's base would go
    real_base.mkdir()
    for name in ("config.json", "model-00001-of-00002.safetensors", "tokenizer.json"):
        (real_base / name).write_text("real")
    with pytest.raises(ValueError, match="not what a fixture wrote there"):
        write_synthetic_package("decision2", tmp_path / "vega", adapter=True)
    assert sorted(p.name for p in real_base.iterdir()) == ["config.json", "model-00001-of-00002.safetensors", "tokenizer.json"]
    assert not (tmp_path / "vega").exists()  # refused before the package folder was written either
    listed = sorted(p.name for p in package.iterdir())
    with pytest.raises(ValueError, match=f"is inside {package}, a model package"):  # it would fail verification
        write_synthetic_package("decision3", package / "nested")
    assert sorted(p.name for p in package.iterdir()) == listed
    empty = tmp_path / "empty"
    empty.mkdir()
    (written,) = write_synthetic_package("decision3", empty)
    assert detect_family(written)


def test_a_fixtures_weights_get_the_mode_of_its_other_files(tmp_path):
    """safetensors writes through a private (0600) temporary file: another user serving the package (a service
    account, OpenShift's arbitrary uid sharing a cache) must still read the weights, as it reads the rest."""
    import os
    import stat

    from vllm_sr_runtime.synthetic.writer import write_synthetic_package

    previous = os.umask(0o022)
    try:
        package = write_synthetic_package("decision3", tmp_path / "pkg")[0]
    finally:
        os.umask(previous)
    modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in package.iterdir() if path.is_file()}
    assert {name for name in modes if name.endswith(".safetensors")} and set(modes.values()) == {0o644}, modes
