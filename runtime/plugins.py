"""Plugins: model families, engines, accelerators and profiles, found through entry points.

The built-ins register in pyproject.toml exactly as a third party would (one entry point each), so a new
family is one folder plus one registration. A plugin that fails to import is reported and skipped; two
plugins claiming one name are refused, both distributions named.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from vllm_sr_runtime.errors import RuntimeServiceError

log = logging.getLogger("vllm_sr_runtime.plugins")
GROUPS = {
    "family": "vllm_sr_runtime.families",
    "engine": "vllm_sr_runtime.engines",
    "accelerator": "vllm_sr_runtime.accelerators",
    "profile": "vllm_sr_runtime.profiles",
    "command": "vllm_sr_runtime.commands",  # CLI subcommands: a callable that registers on the subparsers
}


class PluginConflict(RuntimeServiceError):
    """Two installed plugins claim the same name: which one runs would depend on install order."""


@dataclass(frozen=True)
class PluginDescriptor:
    name: str
    kind: str  # family | engine | accelerator | profile
    distribution: str  # the installed distribution that registers it
    version: str
    target: str  # module:attribute

    def as_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "distribution": self.distribution, "version": self.version, "target": self.target}


@dataclass(frozen=True)
class PluginFailure:
    descriptor: PluginDescriptor
    error: str

    def as_dict(self) -> dict:
        return {**self.descriptor.as_dict(), "error": self.error}


@dataclass
class Plugins:
    """The loaded plugins of one kind, by name, and the ones that failed to load."""

    kind: str
    loaded: dict[str, tuple[PluginDescriptor, Any]]
    failed: list[PluginFailure]

    def get(self, name: str) -> Any:
        return self.loaded[name][1]

    def names(self) -> list[str]:
        return list(self.loaded)

    def objects(self) -> dict[str, Any]:
        """name -> the loaded object (a family class, an engine builder, an Accelerator, a Profile, ...)."""
        return {name: plugin for name, (_, plugin) in self.loaded.items()}

    def descriptor(self, name: str) -> PluginDescriptor:
        return self.loaded[name][0]


def describe(entry: importlib.metadata.EntryPoint, kind: str) -> PluginDescriptor:
    dist = entry.dist
    return PluginDescriptor(entry.name, kind, dist.name if dist else "unknown", dist.version if dist else "unknown", entry.value)


def load_plugins(kind: str, entries: Iterable[importlib.metadata.EntryPoint] | None = None) -> Plugins:
    """Every plugin of `kind` (entry point group GROUPS[kind]) imported; failures kept aside, conflicts refused."""
    if entries is None:
        entries = importlib.metadata.entry_points(group=GROUPS[kind])
    entries = list(entries)
    refuse_conflicts(describe(entry, kind) for entry in entries)
    loaded: dict[str, tuple[PluginDescriptor, Any]] = {}
    failed: list[PluginFailure] = []
    for entry in entries:
        descriptor = describe(entry, kind)
        try:
            loaded[entry.name] = (descriptor, entry.load())
        except Exception as exc:  # a broken plugin must not take the others down
            failure = PluginFailure(descriptor, f"{type(exc).__name__}: {exc}")
            failed.append(failure)
            log.warning("%s plugin %s from %s %s did not load and is skipped: %s", kind, entry.name, descriptor.distribution, descriptor.version, failure.error)
    return Plugins(kind, loaded, failed)


def refuse_conflicts(descriptors: Iterable[PluginDescriptor]) -> None:
    seen: dict[str, PluginDescriptor] = {}
    for descriptor in descriptors:
        other = seen.get(descriptor.name)
        if other is not None and (other.distribution, other.target) != (descriptor.distribution, descriptor.target):
            raise PluginConflict(
                f"{descriptor.kind} plugin name {descriptor.name!r} is claimed by {other.distribution} {other.version} "
                f"({other.target}) and by {descriptor.distribution} {descriptor.version} ({descriptor.target}); uninstall one"
            )
        seen[descriptor.name] = descriptor


def registered_names(kind: str) -> list[str]:
    """The names the installed plugins of `kind` register, read from their entry points without importing any."""
    return sorted({entry.name for entry in importlib.metadata.entry_points(group=GROUPS[kind])})


@functools.cache
def installed(kind: str) -> Plugins:
    """The installed plugins of `kind`, loaded once per process."""
    return load_plugins(kind)


def plugin(kind: str, name: str, what: Callable[[], str] | None = None) -> Any:
    """One plugin by name, or a clear error naming the installed ones (and any that failed to load)."""
    plugins = installed(kind)
    if name in plugins.loaded:
        return plugins.get(name)
    failed = [f for f in plugins.failed if f.descriptor.name == name]
    if failed:
        raise RuntimeServiceError(f"{kind} plugin {name!r} is installed but failed to load: {failed[0].error}")
    raise RuntimeServiceError(f"no {kind} plugin named {name!r} (installed: {', '.join(plugins.names()) or 'none'})")
