"""The OpenAPI document says exactly what the server accepts: requests generated from the served schema
(hypothesis-jsonschema, a bounded number) are all answered 200, never refused and never a server error."""

from __future__ import annotations

import json

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis_jsonschema import from_schema

from server_harness import Contract, Server

EXAMPLES = 40


@pytest.fixture(scope="module")
def server(packages, tmp_path_factory):
    log = tmp_path_factory.mktemp("fuzz") / "log"
    models = log.parent / "models.yaml"
    models.write_text(f"- {{model: {packages['d2_qwen3']}, name: kai, aliases: [kai-latest]}}\n- {{model: {packages['d3']}, name: d3}}\n")
    served = Server(["--models", str(models), "--profile", "batching", "--device", "cpu"], log=log)
    try:
        served.wait()
        yield served
    finally:
        served.stop()


@pytest.fixture(scope="module")
def document(server):
    reply = server.request("GET", "/openapi.yaml")
    assert reply.status == 200
    return yaml.safe_load(reply.body)


def test_served_document_names_this_deployment(server, document):
    cards = server.request("GET", "/v1/models").json()["data"]
    request = document["components"]["schemas"]["DecisionRequest"]
    assert request["properties"]["model"]["enum"] == ["d3", "jev-latest", "kai", "kai-latest"]
    assert "model" in request["required"]  # two models: none is implicit
    assert request["properties"]["options"]["properties"]["profile"]["enum"] == sorted({p for card in cards for p in card["profiles"]})
    assert request["properties"]["images"]["maxItems"] == 0  # no served model reads media


def test_schema_valid_requests_are_accepted(server, document):
    schema = {"$ref": "#/components/schemas/DecisionRequest", "components": {"schemas": document["components"]["schemas"]}}
    contract = Contract()
    refused = []

    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(from_schema(schema))
    def accepted(body):
        reply = server.post(body, path="/v1/decisions", timeout=120)
        contract.check("/v1/decisions", "POST", reply)
        if reply.status != 200:
            refused.append((json.dumps(body)[:500], reply.status, reply.body[:300]))
        assert reply.status == 200, refused[-1]

    accepted()
