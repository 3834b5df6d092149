"""Built-in table of the pinned public releases (spec: decision-models.md 1.1 and 1.2).

A release (one Hub repo) has one or more pinned revisions. The first is the default for a bare repo id:
for Decision 2.0 the revision the runtime's documentation pins, for Decision 3.0 the registry's. Most
revisions are public only as a prefix of their commit; `vllm_sr_runtime.packages.revisions` resolves a prefix
to its full commit before anything is downloaded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vllm_sr_runtime.errors import PackageError

HEX = re.compile(r"^[0-9a-f]+$")
FULL_REVISION_LENGTH = 40
MIN_PREFIX_LENGTH = 8


@dataclass(frozen=True)
class PinnedRevision:
    revision: str  # 40 hex when known, else the public prefix (>= 8 hex)
    source: str  # where the pin comes from: "documented" (the runtime's user docs) or "registry" (its built-in table)
    model_sha256: str | None = None  # the package identity (or its public prefix) when known; checked after download
    golden: str | None = None  # golden answers recorded for this revision, when published

    @property
    def is_full(self) -> bool:
        return len(self.revision) == FULL_REVISION_LENGTH

    def matches(self, revision: str) -> bool:
        """Whether a full commit or a prefix given by a user names this pin."""
        return revision.startswith(self.revision) or self.revision.startswith(revision)


@dataclass(frozen=True)
class Release:
    repo_id: str
    family: str
    backbone: str
    loaded_parameters: int | None
    context_tokens: int | None
    revisions: tuple[PinnedRevision, ...]  # the first is the default

    @property
    def default(self) -> PinnedRevision:
        return self.revisions[0]

    def pin(self, revision: str | None) -> PinnedRevision:
        """The pinned revision a user's `@REV` names (None: the default); anything else is refused."""
        if revision is None:
            return self.default
        revision = revision.lower()
        pinned = ", ".join(p.revision for p in self.revisions)
        if not HEX.match(revision) or not MIN_PREFIX_LENGTH <= len(revision) <= FULL_REVISION_LENGTH:
            raise PackageError(
                f"revision must be a commit (40 hex) or a prefix of at least {MIN_PREFIX_LENGTH} hex digits, got "
                f"{revision!r} (branches and tags move); pinned revisions of {self.repo_id}: {pinned}"
            )
        matches = [p for p in self.revisions if p.matches(revision)]
        if not matches:
            raise PackageError(f"{self.repo_id}@{revision} is not a pinned release (pinned revisions: {pinned})")
        if len(matches) > 1:
            raise PackageError(f"{self.repo_id}@{revision} names several pinned revisions ({', '.join(p.revision for p in matches)}): give more digits")
        return matches[0]

    def to_json(self) -> dict:
        return {
            "repo_id": self.repo_id,
            "family": self.family,
            "backbone": self.backbone,
            "loaded_parameters": self.loaded_parameters,
            "context_tokens": self.context_tokens,
            "default_revision": self.default.revision,
            "revisions": [
                {
                    "revision": p.revision,
                    "revision_is_full": p.is_full,
                    "default": p is self.default,
                    "source": p.source,
                    "model_sha256": p.model_sha256,
                    "golden": p.golden,
                }
                for p in self.revisions
            ],
        }


def _d2(name: str, backbone: str, params: int, context: int | None, documented: str, registry: PinnedRevision) -> Release:
    return Release(
        f"vllm-sr/Decision-2.0-{name}", "decision2", backbone, params, context, (PinnedRevision(documented, "documented"), registry)
    )


def _d3(name: str, params: int | None, revision: str) -> Release:
    return Release(f"vllm-sr/{name}", "decision3", "qwen3_5", params, 32768, (PinnedRevision(revision, "registry"),))


RELEASES: tuple[Release, ...] = (
    _d2("Kai-0.6B", "qwen3", 597_103_104, 8192, "881bee413681d80ebeac86afcda8b4138dae516e", PinnedRevision("cd49ea3813fd", "registry")),
    # The Eos registry entry's identity was recomputed from its files (snapdec ADR-0010 section 8).
    _d2("Eos-0.8B", "qwen3_5_text", 753_446_208, None, "ad0aa724", PinnedRevision("3594047d69f4", "registry", model_sha256="d971279")),
    _d2("Sol-2B", "qwen3_5_text", 1_883_930_944, 16384, "4b75b521", PinnedRevision("64235bef55da", "registry")),
    _d2("Nox-4B", "qwen3_5_text", 4_208_383_488, 16384, "ce1bdc9d", PinnedRevision("25e8f67d1b48", "registry")),
    _d2("Lux-9B", "qwen3_5_text", 7_940_895_744, 16384, "214ffa43", PinnedRevision("78bf3c03d914", "registry")),
    _d2("Vega-27B", "qwen3_5_text+lora", 29_365_153_792, 32768, "9b067a95", PinnedRevision("7aec49ae11a1", "registry")),
    _d3("d3", 26_086_635_760, "dc6c41cb98"),
    _d3("d3-flash", 8_393_739_504, "581c9953d4"),
    _d3("d3-mini", 4_539_918_336, "61dbd3a320"),
    _d3("d3-nano", 2_213_763_904, "6601b4d139"),
    _d3("d3-lite", 853_247_040, "b731454b7b"),
    _d3("d3-edge", None, "18d61df7"),
)


def find_release(name: str) -> Release | None:
    """By repo id (`vllm-sr/d3-lite`) or short name (`d3-lite`, `Decision-2.0-Eos-0.8B`)."""
    for release in RELEASES:
        if name in (release.repo_id, release.repo_id.split("/", 1)[1]):
            return release
    return None
