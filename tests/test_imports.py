"""The house's imports run one way: the runtime (every module of it) loads without export or parity, and the
three packages' import graph, lazy imports included, has no circle."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# folder -> the import name it installs as (one namespace over the fixed layout)
PACKAGES = {"runtime": "vllm_sr_runtime", "export": "vllm_sr_runtime.export", "parity": "vllm_sr_runtime.parity"}


def test_importing_every_runtime_module_loads_no_export_or_parity_module():
    code = (
        "import importlib, pkgutil, sys, vllm_sr_runtime\n"
        "for info in pkgutil.walk_packages(vllm_sr_runtime.__path__, 'vllm_sr_runtime.'):\n"
        "    importlib.import_module(info.name)\n"
        "print(sorted(m for m in sys.modules if m.startswith(('vllm_sr_runtime.export', 'vllm_sr_runtime.parity'))))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('runtime', 'export', 'parity')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["[]", "[]"]  # and nothing under the folders' own (generic) names


def test_every_package_folder_installs_under_the_one_namespace():
    import tomllib

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["package-dir"] == {name: folder for folder, name in PACKAGES.items()}
    found = sorted(
        ".".join([name, *init.parent.relative_to(ROOT / folder).parts]) for folder, name in PACKAGES.items() for init in (ROOT / folder).rglob("__init__.py")
    )
    assert sorted(setuptools["packages"]) == found


def module_imports() -> dict[str, set[str]]:
    """module -> the package modules it imports anywhere in its source (function-level imports too)."""
    modules = {}
    for folder, name in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [name, *path.relative_to(ROOT / folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            found.update(target for target in targets if target in modules and target != name)
        graph[name] = found
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_the_import_graph_has_no_circle():
    graph = module_imports()
    assert len(graph) > 80 and "vllm_sr_runtime.export.exporter" in graph["vllm_sr_runtime.export.command"]  # the walk sees lazy imports
    assert circles(graph) == []
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # the check can fail


def importers(graph: dict[str, set[str]], source: str, target: str) -> dict[str, list[str]]:
    """Modules under `source` that import (anywhere, lazily too) a module under `target`."""
    inside = lambda name, package: name == package or name.startswith(package + ".")
    found = {name: sorted(t for t in targets if inside(t, target)) for name, targets in graph.items() if inside(name, source)}
    return {name: targets for name, targets in found.items() if targets}


def test_the_runtime_never_imports_export_or_parity_even_lazily():
    graph = module_imports()
    own = ("vllm_sr_runtime.export", "vllm_sr_runtime.parity")
    runtime = {name: targets for name, targets in graph.items() if not name.startswith(own)}
    assert {name: sorted(t for t in targets if t.startswith(own)) for name, targets in runtime.items() if any(t.startswith(own) for t in targets)} == {}
    assert importers({"vllm_sr_runtime.x": {"vllm_sr_runtime.export.exporter"}}, "vllm_sr_runtime.x", "vllm_sr_runtime.export")  # can fail


def test_engines_know_no_family_and_families_no_engine():
    graph = module_imports()
    assert importers(graph, "vllm_sr_runtime.engines", "vllm_sr_runtime.families") == {}
    assert importers(graph, "vllm_sr_runtime.families", "vllm_sr_runtime.engines") == {}
    assert "vllm_sr_runtime.engines.torch" in graph and "vllm_sr_runtime.families.decision3.family" in graph  # both walked
