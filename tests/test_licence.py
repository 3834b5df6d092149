"""Licence policy: a package whose licence (or a component's) allows only non-commercial or research use is refused
unless the operator accepts that licence by its SPDX id; a served refusal fails that model only."""

from __future__ import annotations

from pathlib import Path

import pytest

import vllm_sr_runtime
from server_harness import Server
from vllm_sr_runtime.errors import LicenceRefused, PackageError
from vllm_sr_runtime.packages.licence import check_licence, needed_acceptances
from vllm_sr_runtime.synthetic.writer import write_synthetic_package

NOTHING: frozenset[str] = frozenset()


@pytest.mark.parametrize(
    ("expression", "needs"),
    [
        ("Apache-2.0", set()),
        ("NCSA", set()),  # the University of Illinois licence: "NC" inside a word is not the Creative Commons NC
        ("CC-BY-4.0", set()),
        ("GPL-2.0+ WITH Classpath-exception-2.0", set()),
        ("CC-BY-NC-4.0", {"CC-BY-NC-4.0"}),
        ("cc-by-nc-sa-4.0", {"cc-by-nc-sa-4.0"}),
        ("qwen-research", {"qwen-research"}),
        ("LicenseRef-Research-Only", {"LicenseRef-Research-Only"}),
        ("MIT OR CC-BY-NC-4.0", set()),  # an unrestricted alternative may be chosen
        ("Apache-2.0 AND CC-BY-NC-ND-4.0", {"CC-BY-NC-ND-4.0"}),  # every part of an AND applies
        ("(MIT AND LicenseRef-noncommercial) OR (CC-BY-NC-4.0 AND apple-amlr)", {"LicenseRef-noncommercial"}),
        ("Apache-2.0 and (CC-BY-NC-4.0 or MIT)", set()),
    ],
)
def test_which_licences_need_an_acceptance(expression: str, needs: set[str]):
    assert needed_acceptances(expression, NOTHING) == needs
    # accepting them (in any case) leaves nothing needed
    assert needed_acceptances(expression, frozenset(item.lower() for item in needs)) == NOTHING


@pytest.mark.parametrize("expression", ["", "MIT AND", "(MIT", "MIT)", "AND MIT", "MIT Apache-2.0", "MIT WITH"])
def test_an_expression_that_does_not_parse_is_an_error(expression: str):
    with pytest.raises(ValueError, match="licence expression"):
        needed_acceptances(expression, NOTHING)


def test_a_component_needs_its_own_acceptance_and_the_message_says_which():
    licence = {"spdx": "Apache-2.0", "components": [{"name": "adapter", "spdx": "Apache-2.0"}, {"name": "base", "spdx": "CC-BY-NC-4.0"}]}
    with pytest.raises(LicenceRefused) as refused:
        check_licence(licence, [], "pkg")
    assert refused.value.needs == ["CC-BY-NC-4.0"]
    assert "CC-BY-NC-4.0: base" in refused.value.message and "--accept-licence CC-BY-NC-4.0" in refused.value.message
    assert check_licence(licence, ["cc-by-nc-4.0", "qwen-research"], "pkg") == ["CC-BY-NC-4.0"]  # what its use rests on
    assert check_licence(licence, "CC-BY-NC-4.0", "pkg") == ["CC-BY-NC-4.0"]  # one id as a string is one id, not its letters
    assert check_licence({"spdx": "MIT OR CC-BY-NC-4.0"}, ["CC-BY-NC-4.0"], "pkg") == []  # the free alternative is taken
    # of an OR, the alternative the acceptances cover is the one its use rests on, not the one that would need fewest
    either = {"spdx": "CC-BY-NC-4.0 OR (qwen-research AND apple-amlr)"}
    assert check_licence(either, ["qwen-research", "apple-amlr"], "pkg") == ["apple-amlr", "qwen-research"]
    assert check_licence(either, ["CC-BY-NC-4.0"], "pkg") == ["CC-BY-NC-4.0"]
    assert check_licence(None, [], "pkg") == []  # a package that states no licence is not judged


@pytest.mark.parametrize(
    "licence",
    ["Apache-2.0", {"components": []}, {"spdx": "MIT", "components": {"name": "x"}}, {"spdx": "MIT", "components": [{"name": "x"}]}, {"spdx": "MIT AND"}],
)
def test_a_malformed_licence_is_a_package_error(licence):
    with pytest.raises(PackageError, match="licence"):
        check_licence(licence, ["MIT"], "pkg")


@pytest.fixture(scope="module")
def restricted(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("licences")
    return {
        spdx: write_synthetic_package("decision3", root / spdx, seed=seed, licence=spdx)[0]
        for seed, spdx in enumerate(["CC-BY-NC-4.0", "qwen-research"])
    }


def test_load_refuses_a_restricted_package_until_its_licence_is_accepted(restricted):
    with pytest.raises(LicenceRefused, match="--accept-licence CC-BY-NC-4.0"):
        vllm_sr_runtime.load(restricted["CC-BY-NC-4.0"])
    model = vllm_sr_runtime.load(restricted["CC-BY-NC-4.0"], accept_licences=["CC-BY-NC-4.0"])
    answer = model.ask("Merge two sorted lists.", {"a": {"type": "noul", "instructions": "Is this about code?"}})["a"]
    assert 0.0 < answer["noul"] < 1.0, answer
    with pytest.raises(LicenceRefused, match="qwen-research"):  # accepting one licence accepts only that one
        vllm_sr_runtime.load(restricted["qwen-research"], accept_licences=["CC-BY-NC-4.0"])


def test_serve_loads_the_accepted_licences_and_fails_only_the_other_model(restricted, tmp_path: Path):
    models = tmp_path / "models.yaml"
    nc, research = restricted["CC-BY-NC-4.0"], restricted["qwen-research"]
    models.write_text(
        f"models:\n  - model: {nc}\n    name: accepted\n  - model: {research}\n    name: refused\n"
        f"  - model: {research}\n    name: accepted_here\n    accept_licences: [qwen-research]\n"  # for this model alone
    )
    server = Server(["--models", str(models), "--device", "cpu", "--accept-licence", "CC-BY-NC-4.0"], log=tmp_path / "log")
    try:
        server.wait(503)
        health = server.request("GET", "/health").json()
        assert health["status"] == "degraded", health
        assert health["models"]["accepted"]["status"] == "ready" and health["models"]["accepted_here"]["status"] == "ready", health
        refused = health["models"]["refused"]
        assert refused["status"] == "failed" and "--accept-licence qwen-research" in refused["reason"], refused
        assert "after" not in refused["reason"], refused  # a refusal is not retried
        cards = {card["id"]: card for card in server.request("GET", "/v1/models").json()["data"]}
        assert cards["accepted"]["licence"]["spdx"] == "CC-BY-NC-4.0" and cards["accepted"]["ready"], cards["accepted"]
        # a router sees which restricted licences the operator accepted for each model
        assert cards["accepted"]["licence_accepted"] == ["CC-BY-NC-4.0"] and cards["accepted_here"]["licence_accepted"] == ["qwen-research"]
        body = {"state": "Merge two sorted lists.", "questions": {"a": {"type": "noul", "instructions": "Is this about code?"}}}
        assert server.post({**body, "model": "accepted"}).status == 200
        reply = server.post({**body, "model": "refused"})
        assert reply.status == 503 and "qwen-research" in reply.json()["error"]["message"], reply.body
    finally:
        server.stop()


def test_parity_needs_the_same_acceptance(restricted, tmp_path: Path):
    import subprocess
    import sys

    command = [sys.executable, "-m", "vllm_sr_runtime.cli", "parity", str(restricted["CC-BY-NC-4.0"]), "--suite", "short", "--profile", "batching", "--quiet"]
    refused = subprocess.run([*command, "--out", str(tmp_path / "refused")], capture_output=True, text=True)
    assert refused.returncode != 0 and "--accept-licence CC-BY-NC-4.0" in refused.stderr, refused.stderr
    accepted = subprocess.run([*command, "--out", str(tmp_path / "accepted"), "--accept-licence", "CC-BY-NC-4.0"], capture_output=True, text=True)
    assert accepted.returncode == 0, accepted.stderr
    assert (tmp_path / "accepted" / "report.html").is_file()


def test_a_fixture_refuses_a_licence_that_does_not_parse_before_writing(tmp_path: Path):
    with pytest.raises(ValueError, match="licence expression"):
        write_synthetic_package("decision3", tmp_path / "pkg", licence="CC-BY-NC-4.0 AND")
    assert not (tmp_path / "pkg").exists()
