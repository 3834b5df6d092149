"""Built-in table of the pinned public releases (spec: decision-models.md 1.1 and 1.2).

Only short revision prefixes are public for these releases. A table entry whose revision is short
cannot be downloaded by itself: the user must pass the full 40-hex commit (MODEL@REV), which is
checked against the prefix.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Release:
    repo_id: str
    family: str
    revision: str  # 40 hex when known, else the public prefix
    backbone: str
    loaded_parameters: int | None
    context_tokens: int | None = None

    @property
    def revision_is_full(self) -> bool:
        return len(self.revision) == 40

    def to_json(self) -> dict:
        return {
            "repo_id": self.repo_id,
            "family": self.family,
            "revision": self.revision,
            "revision_is_full": self.revision_is_full,
            "backbone": self.backbone,
            "loaded_parameters": self.loaded_parameters,
            "context_tokens": self.context_tokens,
        }


RELEASES: tuple[Release, ...] = (
    Release("vllm-sr/Decision-2.0-Kai-0.6B", "decision2", "cd49ea3813fd", "qwen3", 597_103_104, 8192),
    Release("vllm-sr/Decision-2.0-Eos-0.8B", "decision2", "3594047d69f4", "qwen3_5_text", 753_446_208),
    Release("vllm-sr/Decision-2.0-Sol-2B", "decision2", "64235bef55da", "qwen3_5_text", 1_883_930_944, 16384),
    Release("vllm-sr/Decision-2.0-Nox-4B", "decision2", "25e8f67d1b48", "qwen3_5_text", 4_208_383_488, 16384),
    Release("vllm-sr/Decision-2.0-Lux-9B", "decision2", "78bf3c03d914", "qwen3_5_text", 7_940_895_744, 16384),
    Release(
        "vllm-sr/Decision-2.0-Vega-27B", "decision2", "7aec49ae11a1", "qwen3_5_text+lora", 29_365_153_792, 32768
    ),
    Release("vllm-sr/d3", "decision3", "dc6c41cb98", "qwen3_5", 26_086_635_760, 32768),
    Release("vllm-sr/d3-flash", "decision3", "581c9953d4", "qwen3_5", 8_393_739_504, 32768),
    Release("vllm-sr/d3-mini", "decision3", "61dbd3a320", "qwen3_5", 4_539_918_336, 32768),
    Release("vllm-sr/d3-nano", "decision3", "6601b4d139", "qwen3_5", 2_213_763_904, 32768),
    Release("vllm-sr/d3-lite", "decision3", "b731454b7b", "qwen3_5", 853_247_040, 32768),
    Release("vllm-sr/d3-edge", "decision3", "18d61df7", "qwen3_5", None, 32768),
)


def find_release(name: str) -> Release | None:
    """By repo id (`vllm-sr/d3-lite`) or short name (`d3-lite`, `Decision-2.0-Eos-0.8B`)."""
    for release in RELEASES:
        if name in (release.repo_id, release.repo_id.split("/", 1)[1]):
            return release
    return None
