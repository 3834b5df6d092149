"""Hub resolution over real HTTP: huggingface_hub downloads a fixture package from a loopback Hub."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hub_server import PINNED_REVISION, HubServer
from vllm_sr_runtime.errors import PackageError
from vllm_sr_runtime.families import detect_family, open_family
from vllm_sr_runtime.packages.releases import RELEASES
from vllm_sr_runtime.packages.resolve import resolve_package

REVISION = PINNED_REVISION


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
        [sys.executable, "-m", "vllm_sr_runtime.cli", "verify", f"synthetic/d3-tiny@{REVISION}"], capture_output=True, text=True, env=env
    )
    assert result.returncode == 0, result.stderr
    assert f"synthetic/d3-tiny@{REVISION}" in result.stdout
    assert (tmp_path / "cache" / "hub" / "models--synthetic--d3-tiny").is_dir()


# -- pinned releases: a bare repo id, prefixes resolved to full commits ------------------------------------------

NANO_COMMIT = "6601b4d139" + "0f" * 15  # a commit whose hash starts with the table's prefix for vllm-sr/d3-nano
OTHER_COMMIT = "1234abcd" * 5


def test_bare_release_id_resolves_the_prefix_downloads_and_serves_then_works_offline(packages, tmp_path):
    from server_harness import Server

    with HubServer() as hub:
        hub.add("vllm-sr/d3-nano", OTHER_COMMIT, packages["d2_qwen3"])  # a later commit on main, not the pinned one
        hub.add("vllm-sr/d3-nano", NANO_COMMIT, packages["d3"])
        env = {"VLLM_SR_RUNTIME_CACHE_DIR": str(tmp_path / "cache"), "HF_ENDPOINT": hub.endpoint}
        for extra in ([], ["--offline"]):
            server = Server(["vllm-sr/d3-nano", *extra], env=env, log=tmp_path / f"serve{len(extra)}.log")
            try:
                server.wait()
                card = server.request("GET", "/v1/models").json()["data"][0]
                assert card["id"] == "vllm-sr/d3-nano" and card["revision"] == NANO_COMMIT
                reply = server.post({"state": "Merge two sorted lists.", "questions": {"code": {"type": "noul", "instructions": "Code?"}}})
                assert reply.status == 200, reply.body
                answer = reply.json()["answers"]["code"]
                assert answer["type"] == "noul" and 0 < answer["noul"] < 1
                if not extra:
                    downloaded = len(hub.requests)
                    assert any("/commits/" in line for line in hub.requests)  # resolved through the commit listing
                    assert any(f"/resolve/{NANO_COMMIT}/" in line for line in hub.requests)
                    assert not any(f"/resolve/{OTHER_COMMIT}/" in line for line in hub.requests)
                else:
                    assert len(hub.requests) == downloaded  # offline: the cache's snapshot resolves the prefix
            finally:
                server.stop()


def test_two_commits_sharing_the_pinned_prefix_is_a_clear_error(packages, tmp_path):
    with HubServer() as hub:
        hub.add("vllm-sr/d3-nano", NANO_COMMIT, packages["d3"])
        hub.add("vllm-sr/d3-nano", "6601b4d139" + "a" * 30, packages["d3"])
        with pytest.raises(PackageError, match="matches 2 commits on the Hub"):
            resolve_package("vllm-sr/d3-nano", cache_dir=tmp_path, endpoint=hub.endpoint)
        assert not any("/resolve/" in line for line in hub.requests)  # nothing downloaded


def test_no_commit_with_the_prefix_is_refused(packages, tmp_path):
    with HubServer() as hub:
        hub.add("vllm-sr/d3-nano", OTHER_COMMIT, packages["d3"])
        with pytest.raises(PackageError, match="no commit of vllm-sr/d3-nano on the Hub starts with"):
            resolve_package("vllm-sr/d3-nano", cache_dir=tmp_path, endpoint=hub.endpoint)


def test_unreachable_hub_with_empty_cache_names_both_ways_out(tmp_path):
    from server_harness import free_port

    with pytest.raises(PackageError) as info:
        resolve_package("vllm-sr/d3-nano", cache_dir=tmp_path, endpoint=f"http://127.0.0.1:{free_port()}")
    assert "network access" in info.value.message and "vllm-sr/d3-nano@<40-hex>" in info.value.message
    assert getattr(info.value, "transient", False)  # a download problem, worth a retry (unlike verification)


def test_an_adapter_whose_base_the_hub_cannot_give_names_the_network_and_base_path(packages, tmp_path, monkeypatch):
    """Online, an unreachable Hub used to be reported as "--offline is set", a flag nobody gave, and the adapter's
    error did not say that a local copy of the base would do; it was not marked worth a retry either."""
    from server_harness import free_port

    from vllm_sr_runtime.errors import DownloadError

    endpoint = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    with pytest.raises(DownloadError) as info:
        open_family(resolve_package(packages["d2_lora"]), cache_dir=tmp_path)
    message = info.value.message
    assert "--offline" not in message
    assert f"the Hub ({endpoint}) could not be reached" in message and str(tmp_path) in message
    assert "base checkpoint" in message and "--base-path" in message
    assert info.value.transient


def test_documented_kai_configuration_with_its_full_commit_is_accepted(packages, tmp_path):
    kai = "881bee413681d80ebeac86afcda8b4138dae516e"
    with HubServer() as hub:
        hub.add("vllm-sr/Decision-2.0-Kai-0.6B", kai, packages["d2_qwen3"])
        env = {"VLLM_SR_RUNTIME_CACHE_DIR": str(tmp_path / "cache"), "HF_ENDPOINT": hub.endpoint, "PATH": "/usr/bin:/bin"}
        for ref in (f"vllm-sr/Decision-2.0-Kai-0.6B@{kai}", "vllm-sr/Decision-2.0-Kai-0.6B@881bee41", "vllm-sr/Decision-2.0-Kai-0.6B"):
            result = subprocess.run([sys.executable, "-m", "vllm_sr_runtime.cli", "verify", ref], capture_output=True, text=True, env=env)
            assert result.returncode == 0, result.stderr
            assert f"vllm-sr/Decision-2.0-Kai-0.6B@{kai}" in result.stdout
        assert not any("/commits/" in line for line in hub.requests)  # a full commit needs no listing


def test_known_identity_of_a_pinned_revision_is_checked(packages, tmp_path, caplog):
    """Eos's registry revision has a published identity prefix; a package with another identity is refused."""
    commit = "3594047d69f4" + "b" * 28
    with HubServer() as hub:
        hub.add("vllm-sr/Decision-2.0-Eos-0.8B", commit, packages["d2_qwen3_5"])
        with caplog.at_level("INFO", logger="vllm_sr_runtime.packages"):
            ref = resolve_package("vllm-sr/Decision-2.0-Eos-0.8B@3594047d", cache_dir=tmp_path, endpoint=hub.endpoint)
        assert f"to commit {commit}" in caplog.text  # the full commit is logged
        assert ref.revision == commit and ref.pinned.model_sha256 == "d971279"
        with pytest.raises(PackageError, match="is not the pinned release's"):
            open_family(ref)


@pytest.mark.parametrize("repo, revision", [(r.repo_id, r.default.revision) for r in RELEASES if r.family == "decision2"])
def test_verify_of_each_documented_revision_offline_names_the_missing_download(repo, revision, tmp_path):
    env = {**os.environ, "VLLM_SR_RUNTIME_CACHE_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-m", "vllm_sr_runtime.cli", "verify", f"{repo}@{revision}", "--offline"], capture_output=True, text=True, env=env)
    assert result.returncode == 1
    assert "not a pinned release" not in result.stderr and "not the pinned" not in result.stderr
    assert f"{repo}@{revision}" in result.stderr and "cache" in result.stderr, result.stderr


def test_serve_offline_checks_the_cache_before_any_worker_starts(hub, tmp_path):
    """serve --offline with a Hub package that is not in the cache started a server whose model never got ready;
    now the master refuses it, reaching no network, and lets the same package through once it is cached."""
    from vllm_sr_runtime.cli import build_parser
    from vllm_sr_runtime.commands.serve_cmd import build_config
    from vllm_sr_runtime.errors import InvalidRequest
    from vllm_sr_runtime.server.preflight import check_models

    argv = ["serve", f"synthetic/d3-tiny@{REVISION}", "--offline", "--cache-dir", str(tmp_path)]
    config = build_config(build_parser().parse_args(argv))
    with pytest.raises(InvalidRequest, match=f"model synthetic/d3-tiny@{REVISION}: .*is not in the cache .* and --offline is set"):
        check_models(config)
    assert hub.requests == []
    resolve_package(f"synthetic/d3-tiny@{REVISION}", cache_dir=tmp_path, endpoint=hub.endpoint)
    seen = len(hub.requests)
    check_models(config)
    assert len(hub.requests) == seen
