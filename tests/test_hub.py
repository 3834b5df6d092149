"""Hub resolution over real HTTP: huggingface_hub downloads a fixture package from a loopback Hub."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hub_server import HubServer
from runtime.errors import PackageError
from runtime.families import detect_family
from runtime.packages.resolve import resolve_package

REVISION = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture()
def hub(packages):
    with HubServer() as server:
        server.add("synthetic/d3-tiny", REVISION, packages["d3"])
        yield server


def test_download_verifies_and_offline_uses_the_cache(hub, tmp_path):
    ref = resolve_package(f"synthetic/d3-tiny@{REVISION}", cache_dir=tmp_path, endpoint=hub.endpoint)
    assert ref.source == "hub" and ref.revision == REVISION
    assert str(ref.path).startswith(str(tmp_path))
    assert any("/resolve/" in line for line in hub.requests)
    family = detect_family(ref.path).open(ref)  # the HF cache's blob symlinks stay inside the repo folder
    assert family.name == "decision3"

    seen = len(hub.requests)
    again = resolve_package(f"synthetic/d3-tiny@{REVISION}", cache_dir=tmp_path, endpoint=hub.endpoint, offline=True)
    assert again.path == ref.path
    assert len(hub.requests) == seen  # offline: not one request


def test_offline_without_cache_is_a_clear_error(hub, tmp_path):
    with pytest.raises(PackageError, match="offline"):
        resolve_package(f"synthetic/d3-tiny@{REVISION}", cache_dir=tmp_path, endpoint=hub.endpoint, offline=True)
    assert hub.requests == []


def test_unknown_revision_is_refused(hub, tmp_path):
    with pytest.raises(PackageError, match="download"):
        resolve_package(f"synthetic/d3-tiny@{'f' * 40}", cache_dir=tmp_path, endpoint=hub.endpoint)


def test_verify_cli_downloads_into_the_cache_dir_env(hub, tmp_path):
    env = {"VLLM_SR_RUNTIME_CACHE_DIR": str(tmp_path / "cache"), "HF_ENDPOINT": hub.endpoint, "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, "-m", "runtime.cli", "verify", f"synthetic/d3-tiny@{REVISION}"], capture_output=True, text=True, env=env
    )
    assert result.returncode == 0, result.stderr
    assert f"synthetic/d3-tiny@{REVISION}" in result.stdout
    assert (tmp_path / "cache" / "hub" / "models--synthetic--d3-tiny").is_dir()
