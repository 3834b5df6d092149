"""Plugins: the built-in families register through entry points like any third party; a name claimed twice is
refused with both distributions named; a plugin that fails to import is reported and skipped."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys

import pytest

from vllm_sr_runtime.plugins import GROUPS, PluginConflict, load_plugins


def fake_distribution(root, name: str, entries: dict[str, str]) -> importlib.metadata.Distribution:
    """An installed distribution on disk (dist-info with METADATA and entry_points.txt), found the public way."""
    info = root / f"{name.replace('-', '_')}-1.2.3.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.2.3\n")
    lines = [f"[{GROUPS['family']}]", *(f"{key} = {value}" for key, value in entries.items())]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    (distribution,) = importlib.metadata.distributions(path=[str(root)])
    return distribution


def builtin_entries() -> list[importlib.metadata.EntryPoint]:
    return list(importlib.metadata.entry_points(group=GROUPS["family"]))


def test_plugins_command_lists_the_builtin_families_from_their_distribution():
    done = subprocess.run([sys.executable, "-m", "vllm_sr_runtime.cli", "plugins", "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    families = {row["name"]: row for row in report["plugins"] if row["kind"] == "family"}
    assert set(families) == {"decision2", "decision3"} and report["failed"] == []
    assert {row["distribution"] for row in families.values()} == {"vllm-sr-runtime"}
    assert families["decision3"]["target"] == "vllm_sr_runtime.families.decision3.family:Decision3Family"


def test_a_second_plugin_claiming_a_builtin_name_is_refused_naming_both(tmp_path):
    rival = fake_distribution(tmp_path, "rival-family", {"decision3": "rival_family:Decision3"})
    with pytest.raises(PluginConflict, match=r"'decision3' is claimed by vllm-sr-runtime 0\.1\.0 .* and by rival-family 1\.2\.3"):
        load_plugins("family", [*builtin_entries(), *rival.entry_points])


def test_a_plugin_that_fails_to_import_is_reported_and_the_others_load(tmp_path):
    broken = fake_distribution(tmp_path, "broken-family", {"broken": "no_such_module_anywhere:Family"})
    plugins = load_plugins("family", [*builtin_entries(), *broken.entry_points])
    assert plugins.names() == ["decision2", "decision3"]
    (failure,) = plugins.failed
    assert failure.descriptor.name == "broken" and failure.descriptor.distribution == "broken-family"
    assert "ModuleNotFoundError" in failure.error
