"""Profiles: a policy over engine, dtype and scheduling. Each builds the engine a loaded model runs on."""

from __future__ import annotations

from typing import Callable

from vllm_sr_runtime.devices import Device
from vllm_sr_runtime.engines.torch import TorchEngine
from vllm_sr_runtime.errors import InvalidRequest
from vllm_sr_runtime.families.base import Family
from vllm_sr_runtime.numerics import numerics_for

EngineFactory = Callable[..., object]


def _exact(family: Family, device: Device, **_: object):
    numerics = numerics_for(family.name, device.device_class)
    module = family.build_module(numerics, device.torch_device)
    return TorchEngine(module, device.torch_device, family.input_names, family.shared_input_names), numerics.label


def _max_speed(family: Family, device: Device, **options: object):
    from vllm_sr_runtime.engines.onnxruntime.profile import max_speed_engine

    return max_speed_engine(family, device, **options)


def _batching(family: Family, device: Device, *, artifact=None, **options: object):
    """Cross-request batching is a scheduling policy: the exact engine, or an artifact's when one is given."""
    if artifact is not None:
        return _max_speed(family, device, artifact=artifact, **options)
    return _exact(family, device)


def _shared_context(family: Family, device: Device, *, artifact=None, **options: object):
    """Sharing a request's prefix is a way of running an engine: the exact one (its module's forward_shared),
    or an artifact's, when one is given (its shared_context graph)."""
    if artifact is not None:
        return _max_speed(family, device, artifact=artifact, shared_context=True, **options)
    return _exact(family, device)


PROFILES: dict[str, EngineFactory] = {"exact": _exact, "max_speed": _max_speed, "batching": _batching, "shared_context": _shared_context}
# Profiles a model loaded under a given profile can also serve per request (same engine and numerics).
ALSO_SERVES = {"batching": ("exact",), "shared_context": ("exact",)}


def served_profiles(profile: str) -> list[str]:
    return [profile, *ALSO_SERVES.get(profile, ())]
KNOWN_PROFILES = ("exact", "shared_context", "batching", "max_speed")


def register_profile(name: str, factory: EngineFactory) -> None:
    if name in PROFILES:
        raise ValueError(f"profile {name} is already registered")
    PROFILES[name] = factory


def build_engine(profile: str, family: Family, device: Device, **options: object):
    if profile not in PROFILES:
        if profile in KNOWN_PROFILES:
            raise InvalidRequest(f"profile {profile!r} is not available in this build (available: {', '.join(PROFILES)})")
        raise InvalidRequest(f"unknown profile {profile!r} (one of {', '.join(KNOWN_PROFILES)})")
    return PROFILES[profile](family, device, **options)
