"""The out-of-tree example plugin (tests/example_plugin: a `keywords` family with its own package format, on
a `counting` engine) is pip-installed from its folder, listed by `plugins --json`, and served next to a
Decision 3.0 fixture in one real `serve`, answering over HTTP; a plugin claiming a built-in name is refused."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from server_harness import Contract, Server

PLUGIN = Path(__file__).parent / "example_plugin"
CONTRACT = Contract()


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory) -> Path:
    """The plugin installed with pip from (a copy of) its folder into a site directory of its own."""
    root = tmp_path_factory.mktemp("plugin")
    source = shutil.copytree(PLUGIN, root / "source", ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    site = root / "site"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index", "--target", str(site), str(source)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert list(site.glob("vllm_sr_keywords-0.1.0.dist-info"))
    return site


def with_site(*sites: Path) -> dict:
    return {"PYTHONPATH": os.pathsep.join([*map(str, sites), os.environ.get("PYTHONPATH", "")])}


def cli(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vllm_sr_runtime.cli", *args], capture_output=True, text=True, timeout=120, env={**os.environ, **env})


def test_the_installed_plugin_is_listed_with_its_distribution(plugin_site):
    done = cli(["plugins", "--json"], with_site(plugin_site))
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    rows = {(row["kind"], row["name"]): row for row in report["plugins"]}
    assert rows[("family", "keywords")]["distribution"] == "vllm-sr-keywords" and rows[("family", "keywords")]["version"] == "0.1.0"
    assert rows[("engine", "counting")]["target"] == "vllm_sr_keywords.engine:build"
    assert rows[("family", "decision3")]["distribution"] == "vllm-sr-runtime" and report["failed"] == []
    assert ("family", "keywords") not in {(row["kind"], row["name"]) for row in json.loads(cli(["plugins", "--json"], {}).stdout)["plugins"]}


def write_keywords_package(site: Path, root: Path) -> Path:
    code = f"import sys; sys.path.insert(0, {str(site)!r}); from pathlib import Path; from vllm_sr_keywords.family import write_package; write_package(Path({str(root)!r}))"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    return root


def expected(counts: list[int], sharpness: float = 1.5) -> list[float]:
    top = max(counts)
    exps = [math.exp(sharpness * (c - top)) for c in counts]
    return [e / sum(exps) for e in exps]


def test_the_plugin_family_is_served_next_to_a_decision3_fixture(plugin_site, packages, tmp_path):
    keywords = write_keywords_package(plugin_site, tmp_path / "keywords")
    models = tmp_path / "models.yaml"
    models.write_text(yaml.safe_dump([
        {"model": str(packages["d3"]), "name": "d3"},
        {"model": str(keywords), "name": "keywords", "profile": "batching"},
    ]))  # fmt: skip
    server = Server(["--models", str(models), "--profile", "exact"], env=with_site(plugin_site), log=tmp_path / "server.log")
    try:
        server.wait()
        listed = server.request("GET", "/v1/models")
        CONTRACT.check("/v1/models", "GET", listed)
        cards = {card["id"]: card for card in listed.json()["data"]}
        assert set(cards) == {"d3", "keywords"} and all(card["status"] == "ready" for card in cards.values())
        plugins = cards["keywords"]["plugins"]
        assert (plugins["family"]["name"], plugins["family"]["distribution"]) == ("keywords", "vllm-sr-keywords")
        assert (plugins["engine"]["name"], plugins["engine"]["distribution"]) == ("counting", "vllm-sr-keywords")
        assert plugins["profile"]["name"] == "batching" and cards["keywords"]["engine"] == "counting"
        assert cards["d3"]["plugins"]["engine"]["name"] == "torch" and cards["d3"]["plugins"]["family"]["distribution"] == "vllm-sr-runtime"

        state = {"message": "My refund for the double billing charge never arrived", "tier": "gold"}
        questions = {
            "topic": {"type": "choice", "criteria": {"billing": "billing charge invoice refund", "bug": "crash error stack trace", "other": "weather"}},
            "urgent": {"type": "noul", "instructions": "refund never arrived"},
        }
        reply = server.post({"model": "keywords", "state": state, "questions": questions})
        CONTRACT.check("/v1/systemone", "POST", reply)
        assert reply.status == 200, reply.body
        answers = reply.json()["answers"]
        # billing: billing, charge, refund found (3); bug: none; other: none
        assert answers["topic"]["choice"] == "billing"
        assert list(answers["topic"]["probabilities"].values()) == pytest.approx(expected([3, 0, 0]), abs=1e-9)
        assert answers["urgent"]["noul"] == pytest.approx(expected([0, 3])[1], abs=1e-9)  # refund, never, arrived

        other = server.post({"model": "d3", "state": state, "questions": questions})
        assert other.status == 200 and set(other.json()["answers"]) == {"topic", "urgent"}
        refused = server.post({"model": "keywords", "state": state, "questions": questions, "options": {"profile": "max_speed"}})
        assert refused.status == 400, refused.body
    finally:
        server.stop()


def test_a_plugin_claiming_a_builtin_name_is_refused_naming_both(plugin_site, tmp_path):
    rival = tmp_path / "rival"
    info = rival / "rival_family-2.0.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rival-family\nVersion: 2.0.0\n")
    (info / "entry_points.txt").write_text("[vllm_sr_runtime.families]\ndecision3 = vllm_sr_keywords.family:KeywordFamily\n")
    done = cli(["plugins"], with_site(plugin_site, rival))
    assert done.returncode == 1
    assert "'decision3' is claimed by" in done.stderr and "vllm-sr-runtime 0.1.0" in done.stderr and "rival-family 2.0.0" in done.stderr
    served = cli(["verify", str(tmp_path)], with_site(plugin_site, rival))
    assert served.returncode == 1 and "rival-family" in served.stderr


def test_the_guide_lists_every_file_of_the_example():
    """The guide's file table is the example's whole folder: one folder plus one registration."""
    text = (PLUGIN / "README.md").read_text()
    listed = {line.split("`")[1] for line in text.splitlines() if line.startswith("| `")}
    present = {str(path.relative_to(PLUGIN)) for path in PLUGIN.rglob("*") if path.is_file() and "__pycache__" not in path.parts and ".egg-info" not in str(path)}
    assert listed == present
