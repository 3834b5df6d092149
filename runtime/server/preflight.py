"""What `serve` refuses before it starts a worker: each model's mistakes that need no torch, network or device
(a missing path, an artifact folder given as the model, an unpinned revision, under --offline a Hub package that
is not in the cache, an unknown profile, a misspelt device, an artifact or base checkpoint that is not there). A
worker would only report them as a model that never gets ready; the master names them all and exits."""

from __future__ import annotations

from pathlib import Path

from vllm_sr_runtime.artifacts import check_artifact_folder
from vllm_sr_runtime.device_names import split_device_name
from vllm_sr_runtime.errors import InvalidRequest, PackageError, RuntimeServiceError
from vllm_sr_runtime.packages.resolve import HubPin, locate_package, resolve_package
from vllm_sr_runtime.plugins import registered_names
from vllm_sr_runtime.profiles import installed_profiles, unused_artifact
from vllm_sr_runtime.server.config import ModelSpec, ServeConfig


def package_problem(spec: ModelSpec, config: ServeConfig) -> str | None:
    """Why the spec's MODEL[@REV] names no package, or None. Under --offline a Hub package must be in the cache
    already, and looking there reaches no network either."""
    try:
        located = locate_package(spec.model, spec.revision)
        if config.offline and isinstance(located, HubPin):
            resolve_package(spec.model, spec.revision, cache_dir=config.cache_dir, offline=True)
    except PackageError as exc:
        return exc.message.removeprefix(f"{exc.path}: ") if exc.path else exc.message
    return None


def setting_problems(spec: ModelSpec, config: ServeConfig) -> list[str]:
    """What is wrong with the spec's profile, device, artifact and base checkpoint."""
    problems = []
    profiles = installed_profiles()
    profile = spec.profile or config.profile
    if profile not in profiles:
        problems.append(f"unknown profile {profile!r} (one of {', '.join(profiles)})")
    elif spec.artifact and (reason := unused_artifact(profiles[profile])):
        problems.append(f"artifact {spec.artifact}: {reason}")
    try:
        split_device_name(spec.device or config.device, registered_names("accelerator"))
    except RuntimeServiceError as exc:
        problems.append(exc.message)
    if spec.artifact:
        try:
            check_artifact_folder(Path(spec.artifact).expanduser())
        except RuntimeServiceError as exc:
            problems.append(f"artifact: {exc.message}")
    if spec.base_path and not Path(spec.base_path).expanduser().is_dir():
        problems.append(f"base checkpoint {spec.base_path}: no such directory")
    return problems


def check_models(config: ServeConfig) -> None:
    """Every model's problems, one line each, or nothing."""
    lines = []
    for spec in config.models:
        problems = [package_problem(spec, config), *setting_problems(spec, config)]
        lines.extend(f"model {spec.model}: {problem}" for problem in problems if problem)
    if lines:
        raise InvalidRequest(lines[0] if len(lines) == 1 else "\n  ".join(["serve refuses to start:", *lines]))
