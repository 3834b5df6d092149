"""Profiles: a policy over engine, numerics and scheduling, as objects registered through the
`vllm_sr_runtime.profiles` entry point group (the four built-ins exactly as a third party's would be)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_sr_runtime.errors import InvalidRequest


@dataclass(frozen=True)
class Profile:
    name: str
    engine: str  # the engine plugin it runs on
    summary: str
    artifact_engine: str | None = None  # given an artifact, the engine plugin that runs it instead
    merges_requests: bool = False  # rows of concurrent requests share passes (cross-request batching)
    shares_prefix: bool = False  # a request's questions share one prefix pass when that saves enough work
    also_serves: tuple[str, ...] = ()  # profiles a model loaded under this one can also answer per request

    def engine_for(self, family: Any, artifact: Any = None) -> str:
        """The engine plugin that runs this profile for `family`: its own, the artifact's, or the one the
        family names for this profile (a family with its own engine)."""
        if self.name in family.engines:
            return family.engines[self.name]
        if artifact is not None and self.artifact_engine:
            return self.artifact_engine
        return self.engine

    @property
    def takes_artifact(self) -> bool:
        return self.artifact_engine is not None

    def served(self) -> list[str]:
        return [self.name, *self.also_serves]

    def as_dict(self) -> dict:
        return {
            "name": self.name, "engine": self.engine, "artifact_engine": self.artifact_engine, "merges_requests": self.merges_requests,
            "shares_prefix": self.shares_prefix, "also_serves": list(self.also_serves), "summary": self.summary,
        }  # fmt: skip


EXACT = Profile("exact", "torch", "eager PyTorch: the reference numerics")
SHARED_CONTEXT = Profile(
    "shared_context", "torch", "a request's questions share one prefix pass (exact's engine, or an artifact's shared graph)",
    artifact_engine="onnxruntime", shares_prefix=True, also_serves=("exact",),
)  # fmt: skip
BATCHING = Profile(
    "batching", "torch", "rows of concurrent requests packed into shared passes (exact's engine, or an artifact's)",
    artifact_engine="onnxruntime", merges_requests=True, also_serves=("exact",),
)  # fmt: skip
MAX_SPEED = Profile(
    "max_speed", "onnxruntime", "an exported ONNX artifact on ONNX Runtime (exported into the cache on first use)", artifact_engine="onnxruntime",
)  # fmt: skip
BUILTIN = (EXACT, SHARED_CONTEXT, BATCHING, MAX_SPEED)


def installed_profiles() -> dict[str, Profile]:
    from vllm_sr_runtime.plugins import installed

    return installed("profile").objects()


def profile_named(name: str) -> Profile:
    profiles = installed_profiles()
    if name not in profiles:
        raise InvalidRequest(f"unknown profile {name!r} (one of {', '.join(profiles)})")
    return profiles[name]


def unused_artifact(profile: Profile) -> str | None:
    """Why an artifact given with `profile` would be ignored, or None when the profile runs it."""
    if profile.takes_artifact:
        return None
    takers = [name for name, other in installed_profiles().items() if other.takes_artifact]
    return f"profile {profile.name} runs no artifact (it runs {profile.engine}): use it with profile {' | '.join(takers)}"


def engine_plugin_for(profile_name: str, family: Any, artifact: Any = None) -> str:
    """The engine plugin a profile runs `family` on, checked: a family's own profiles, an artifact the profile runs."""
    profile = profile_named(profile_name)
    if family.profiles is not None and profile.name not in family.profiles:
        raise InvalidRequest(f"family {family.name} runs profiles {', '.join(family.profiles)}, not {profile.name}")
    if artifact is not None and (reason := unused_artifact(profile)):
        raise InvalidRequest(reason)
    return profile.engine_for(family, artifact)


def build_engine(profile_name: str, family: Any, device: Any, **options: Any) -> tuple[Any, str, str]:
    """(engine, numerics label, engine plugin name) for a family under a profile on a device."""
    from vllm_sr_runtime.plugins import plugin

    engine_name = engine_plugin_for(profile_name, family, options.get("artifact"))
    engine, label = plugin("engine", engine_name)(family, device, profile_named(profile_name), **options)
    return engine, label, engine_name


def runs_exact_engine(profile_name: str, family: Any, artifact: Any = None) -> bool:
    """Whether a profile runs `family` without an artifact on the engine plugin that `exact` runs it on: the same
    eager engine, which then answers exact's passes too (a close-call reference needs no second copy of the model)."""
    return artifact is None and engine_plugin_for(profile_name, family) == engine_plugin_for(EXACT.name, family)
