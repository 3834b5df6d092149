"""Resolve MODEL[@REV] to a local package directory: a local path, or a pinned Hub snapshot."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from vllm_sr_runtime.errors import DownloadError, PackageError
from vllm_sr_runtime.packages.files import ARTIFACT_FILE
from vllm_sr_runtime.packages.releases import PinnedRevision, find_release
from vllm_sr_runtime.packages.revisions import hub_errors, resolve_commit

FULL_REVISION = re.compile(r"^[0-9a-f]{40}$")
CACHE_ENV = "VLLM_SR_RUNTIME_CACHE_DIR"


@dataclass(frozen=True)
class PackageRef:
    """Where a package came from, kept for the model card."""

    path: Path
    repo_id: str | None
    revision: str | None  # the full commit, never a branch or a prefix
    source: str  # "local" or "hub"
    pinned: PinnedRevision | None = None  # the built-in table's entry, when the package is a pinned release


def default_cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "vllm-sr-runtime"


def parse_model_ref(text: str) -> tuple[str, str | None]:
    """`repo@rev` -> (repo, rev). A local path containing '@' is taken whole when it exists."""
    if Path(text).exists() or "@" not in text:
        return text, None
    name, _, revision = text.rpartition("@")
    return name, revision or None


@dataclass(frozen=True)
class HubPin:
    """A Hub package named by MODEL[@REV], checked against the pin table but not yet resolved or downloaded."""

    repo_id: str
    revision: str  # a full commit, or a pinned release's prefix (the longer of the user's and the table's)
    pinned: PinnedRevision | None


def locate_package(model: str | os.PathLike, revision: str | None = None) -> PackageRef | HubPin:
    """What MODEL[@REV] names, checked without network or cache: a local package directory, or a pinned Hub
    revision. Every mistake that needs neither (a missing path, an artifact folder, an unpinned revision) is
    refused here, so `serve` can refuse it before it starts a worker."""
    text = os.fspath(model)
    name, ref_revision = parse_model_ref(text)
    if revision and ref_revision and revision != ref_revision:
        raise PackageError(f"two revisions given for {name}: {ref_revision} and {revision}")
    revision = revision or ref_revision
    local = Path(name).expanduser()
    if local.exists():
        if revision:
            raise PackageError("a local package directory takes no @revision", str(local))
        if not local.is_dir():
            raise PackageError("not a package directory", str(local))
        if (local / ARTIFACT_FILE).is_file():
            raise PackageError(
                f"an exported artifact, not a model package: give the package it was exported from, and this folder "
                f"as its artifact (--artifact {local}, or load(..., artifact=...), with profile max_speed)",
                str(local),
            )
        return PackageRef(path=local.resolve(), repo_id=None, revision=None, source="local")
    if name.startswith((".", "/", "~")) or name.count("/") != 1:
        raise PackageError(f"no such local package directory, and not a Hub repo id (owner/name): {name}")
    release = find_release(name)
    if release is not None:
        pinned = release.pin(revision)
        # A user's prefix may be longer than the table's: resolve the longer of the two.
        return HubPin(name, max(pinned.revision, (revision or "").lower(), key=len), pinned)
    if revision is None:
        raise PackageError(f"{name} is not a built-in release: pin it with {name}@<40-hex revision>")
    if not FULL_REVISION.match(revision.lower()):
        raise PackageError(f"revision must be a 40-hex commit, got {revision.lower()!r} (branches and tags move)")
    return HubPin(name, revision.lower(), None)


def resolve_package(
    model: str | os.PathLike,
    revision: str | None = None,
    *,
    cache_dir: str | os.PathLike | None = None,
    offline: bool | None = None,
    endpoint: str | None = None,
) -> PackageRef:
    located = locate_package(model, revision)
    if isinstance(located, PackageRef):
        return located
    return _download(located, cache_dir=cache_dir, offline=offline, endpoint=endpoint)


def _download(
    pin: HubPin,
    *,
    cache_dir: str | os.PathLike | None,
    offline: bool | None,
    endpoint: str | None,
) -> PackageRef:
    repo_id, revision = pin.repo_id, pin.revision
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    if offline is None:
        offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0", "false", "False")
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    endpoint = endpoint or os.environ.get("HF_ENDPOINT") or None
    revision = resolve_commit(repo_id, revision, hub_cache=cache / "hub", offline=offline, endpoint=endpoint)
    try:
        path = snapshot_download(
            repo_id=repo_id, revision=revision, cache_dir=str(cache / "hub"), local_files_only=offline, endpoint=endpoint
        )
    except LocalEntryNotFoundError as exc:
        if offline:
            raise PackageError(
                f"{repo_id}@{revision} is not in the cache {cache} and --offline is set: allow network access to download it"
            ) from None
        # Online, huggingface_hub raises this same error when the Hub cannot be reached and the cache lacks the files.
        reason = str(exc.__cause__ or "").strip().splitlines()[0] if exc.__cause__ else "no answer"
        raise DownloadError(
            f"download of {repo_id}@{revision} failed: the Hub ({endpoint or constants.ENDPOINT}) could not be "
            f"reached ({reason}) and the cache {cache} does not hold it"
        ) from None
    except hub_errors() as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DownloadError(f"download of {repo_id}@{revision} failed: {reason}") from None
    return PackageRef(path=Path(path), repo_id=repo_id, revision=revision, source="hub", pinned=pin.pinned)
