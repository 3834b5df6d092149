"""Resolve a pinned revision known only by its prefix to the full commit, before anything is downloaded.

Offline (or whenever the cache holds it) from the snapshots already in the huggingface_hub cache; online
from the Hub's commit listing of the repo's branches. The match must be unique either way.
"""

from __future__ import annotations

import logging
from pathlib import Path

from vllm_sr_runtime.errors import DownloadError, PackageError
from vllm_sr_runtime.packages.releases import FULL_REVISION_LENGTH

log = logging.getLogger("vllm_sr_runtime.packages")


def hub_errors() -> tuple[type[BaseException], ...]:
    """What huggingface_hub raises when the Hub answers with an error or cannot be reached: its HTTP errors,
    OS errors, and the HTTP client's transport errors (httpx2 for huggingface_hub 2.x, httpx for 1.x)."""
    import importlib

    from huggingface_hub.errors import HfHubHTTPError

    errors: list[type[BaseException]] = [HfHubHTTPError, OSError]
    for client in ("httpx2", "httpx"):
        try:
            errors.append(importlib.import_module(client).HTTPError)
        except (ImportError, AttributeError):
            pass
    return tuple(errors)


def cached_commits(hub_cache: Path, repo_id: str) -> list[str]:
    """Full commits whose snapshots are in huggingface_hub's cache layout."""
    snapshots = hub_cache / f"models--{repo_id.replace('/', '--')}" / "snapshots"
    if not snapshots.is_dir():
        return []
    return sorted(p.name for p in snapshots.iterdir() if p.is_dir() and len(p.name) == FULL_REVISION_LENGTH)


def hub_commits(repo_id: str, endpoint: str | None) -> list[str]:
    """Every commit on every branch of the repo, newest first per branch (huggingface_hub's commit listing)."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=endpoint)
    branches = [ref.name for ref in api.list_repo_refs(repo_id).branches] or ["main"]
    branches.sort(key=lambda name: name != "main")
    commits: dict[str, None] = {}
    for branch in branches:
        for commit in api.list_repo_commits(repo_id, revision=branch):
            commits.setdefault(commit.commit_id, None)
    return list(commits)


def _unique(repo_id: str, prefix: str, commits: list[str], where: str) -> str | None:
    matches = sorted({c for c in commits if c.startswith(prefix)})
    if len(matches) > 1:
        raise PackageError(
            f"the pinned prefix {prefix} of {repo_id} matches {len(matches)} commits {where} ({', '.join(matches)}); "
            f"pass the full commit as {repo_id}@<40-hex>"
        )
    return matches[0] if matches else None


def resolve_commit(repo_id: str, prefix: str, *, hub_cache: Path, offline: bool, endpoint: str | None) -> str:
    """The one full commit of `repo_id` that starts with `prefix`."""
    if len(prefix) == FULL_REVISION_LENGTH:
        return prefix
    commit = _unique(repo_id, prefix, cached_commits(hub_cache, repo_id), f"in the cache {hub_cache}")
    if commit is None and offline:
        raise PackageError(
            f"{repo_id}@{prefix} is known only by its prefix and no snapshot of it is in the cache {hub_cache}; "
            f"either allow network access to the Hub (drop --offline / HF_HUB_OFFLINE) so the prefix can be resolved, "
            f"or pass the full commit as {repo_id}@<40-hex>"
        )
    if commit is None:
        try:
            commits = hub_commits(repo_id, endpoint)
        except hub_errors() as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise DownloadError(
                f"cannot resolve the pinned prefix {repo_id}@{prefix} to its commit: the Hub did not answer ({reason}) "
                f"and no snapshot of it is in the cache {hub_cache}; either allow network access to the Hub "
                f"(HF_ENDPOINT, proxy) or pass the full commit as {repo_id}@<40-hex>"
            ) from None
        commit = _unique(repo_id, prefix, commits, "on the Hub")
        if commit is None:
            raise PackageError(f"no commit of {repo_id} on the Hub starts with the pinned prefix {prefix}")
    log.info("resolved %s@%s to commit %s", repo_id, prefix, commit)
    return commit
