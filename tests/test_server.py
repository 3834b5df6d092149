"""The real server (gunicorn + Falcon) over TCP and a Unix socket: answers, errors, contract, metrics."""

from __future__ import annotations

import json
import os
import re
import time

import pytest

import vllm_sr_runtime
from conftest import load_kwargs
from hub_server import PINNED_REVISION, HubServer
from server_harness import Contract, Server, free_port, metric_total, unloadable_copy

CONTRACT = Contract()
STATE = "Write a Python function that merges two sorted lists and explain its running time."
QUESTIONS = {
    "domain": {"type": "choice", "instructions": "Which domain?", "criteria": {"code": "Programming", "math": None, "law": "Legal"}},
    "reasoning": {"type": "noul", "instructions": "Does it need reasoning?"},
    "difficulty": {"type": "score", "instructions": "How hard?", "criteria": ["easy", "medium", "hard"]},
}


def checked(server: Server, method: str, path: str, body=None, **kwargs):
    reply = server.request(method, path, body, **kwargs)
    CONTRACT.check(path, method, reply)
    return reply


@pytest.fixture(scope="module")
def artifacts(default_artifact):
    return {name: default_artifact(name) for name in ("d3", "d2_qwen3_5")}


SERVERS = [("d3", "exact", "tcp"), ("d2_qwen3_5", "exact", "uds"), ("d3", "max_speed", "uds"), ("d2_qwen3_5", "max_speed", "tcp")]


@pytest.fixture(scope="module")
def servers(packages, artifacts, tmp_path_factory):
    root = tmp_path_factory.mktemp("servers")
    os.chmod(root, 0o700)
    started = {}
    for name, profile, transport in SERVERS:
        args = [str(packages[name]), "--profile", profile, "--device", "cpu", "--max-request-bytes", "65536"]
        if profile == "max_speed":
            args += ["--artifact", str(artifacts[name])]
        uds = str(root / "sockets" / f"{name}-{profile}.sock") if transport == "uds" else None
        started[(name, profile)] = Server(args, uds=uds, log=root / f"{name}-{profile}.log")
    try:
        for server in started.values():
            server.wait()
        yield started
    finally:
        for server in started.values():
            server.stop()


@pytest.mark.parametrize("name,profile,transport", SERVERS)
def test_answers_match_the_in_process_api(servers, packages, artifacts, name, profile, transport):
    server = servers[(name, profile)]
    model = vllm_sr_runtime.load(packages[name], profile=profile, artifact=artifacts[name] if profile == "max_speed" else None)
    for path in ("/v1/systemone", "/v1/decisions"):
        reply = checked(server, "POST", path, {"state": STATE, "questions": QUESTIONS})
        assert reply.status == 200, reply.body
        body = reply.json()
        assert body["answers"] == model.ask(STATE, QUESTIONS)
        assert list(body["answers"]) == list(QUESTIONS)
        assert body["usage"]["input_tokens"] == model.respond(STATE, QUESTIONS).input_tokens > 0
        assert body["usage"]["output_tokens"] == 0
        timing = reply.headers["server-timing"]
        assert all(f"{phase};dur=" in timing for phase in ("parse", "queue", "forward", "serialize"))


def test_uds_socket_lives_in_a_private_directory(servers):
    server = servers[("d2_qwen3_5", "exact")]
    assert oct(os.stat(os.path.dirname(server.uds)).st_mode & 0o777) == "0o700"


def test_meta_and_profiles(servers):
    server = servers[("d3", "max_speed")]
    reply = checked(server, "POST", "/v1/decisions", {"state": STATE, "questions": QUESTIONS, "options": {"return_meta": True, "profile": "max_speed", "deadline_ms": 5000}})
    meta = reply.json()["meta"]
    assert meta["engine"] == "onnxruntime" and meta["profile"] == "max_speed" and meta["device"] == "cpu" and meta["accelerator"] == "cpu"
    reply = checked(server, "POST", "/v1/decisions", {"state": STATE, "questions": QUESTIONS, "options": {"profile": "exact"}})
    assert reply.status == 400 and "not enabled" in reply.json()["error"]["message"]


def test_models_card_and_health(servers):
    reply = checked(servers[("d3", "exact")], "GET", "/v1/models")
    card = reply.json()["data"][0]
    assert card["family"] == "decision3" and card["ready"] and card["engine"] == "torch" and card["dtype"] == "fp32"
    assert card["limits"]["max_options"] == 255 and card["limits"]["max_levels"] == 10 and card["profiles"] == ["exact"]
    assert len(card["model_sha256"]) == 64
    # the spec's card fields a router checks before it publishes a binding: where it runs, and under what licence
    assert card["accelerator"] == "cpu" and card["licence"] == {"spdx": "Apache-2.0", "components": [{"name": "synthetic weights", "spdx": "Apache-2.0"}]}
    assert card["licence_accepted"] == []  # an Apache-2.0 package rests on no acceptance
    health = checked(servers[("d3", "exact")], "GET", "/health")
    assert health.status == 200 and health.json()["status"] == "ready"
    assert checked(servers[("d3", "exact")], "GET", "/health/live").json() == {"status": "alive"}
    openapi = checked(servers[("d3", "exact")], "GET", "/openapi.yaml")
    assert b"openapi: 3.1.0" in openapi.body


BAD_REQUESTS = [
    ({"state": STATE, "questions": QUESTIONS, "instructions": "top-level"}, "instructions"),
    ({"state": STATE, "questions": {f"q{i}": {"type": "noul"} for i in range(65)}}, "at most 64"),
    ({"state": STATE, "questions": {"q": {"type": "choice", "criteria": {"only": None}}}}, "2..255"),
    ({"state": STATE, "questions": {"q": {"type": "choice", "criteria": {f"k{i}": None for i in range(256)}}}}, "2..255"),
    ({"state": STATE, "questions": {"q": {"type": "score", "criteria": [str(i) for i in range(11)]}}}, "2..10"),
    ({"state": STATE, "questions": {"q": {"type": "score", "criteria": ["one"]}}}, "2..10"),
    ({"state": STATE, "questions": QUESTIONS, "temperature": 0}, "unknown field"),
    ({"state": STATE, "questions": {"q": {"type": "noul", "extra": True}}}, "unknown field"),
    ({"state": 3, "questions": QUESTIONS}, "state"),
    ({"questions": QUESTIONS}, "state"),
    ({"state": STATE, "questions": {}}, "non-empty"),
    ({"state": STATE, "questions": QUESTIONS, "options": {"deadline_ms": 0}}, "deadline_ms"),
    ({"state": STATE, "questions": QUESTIONS, "options": {"speed": "max"}}, "unknown option"),
    ({"state": STATE, "questions": QUESTIONS, "images": ["data:image/png;base64,AAAA"]}, "images"),
]


@pytest.mark.parametrize("body,message", BAD_REQUESTS)
def test_request_errors_are_400(servers, body, message):
    reply = checked(servers[("d3", "exact")], "POST", "/v1/systemone", body)
    assert reply.status == 400 and reply.json()["error"]["code"] == "invalid_request"
    assert message in reply.json()["error"]["message"]


def test_other_error_codes(servers):
    server = servers[("d3", "exact")]
    for raw in (b"{not json", b"[1, 2]", b"NaN"):
        reply = server.request("POST", "/v1/systemone", raw=raw)
        CONTRACT.check("/v1/systemone", "POST", reply)
        assert reply.status == 400
    reply = checked(server, "POST", "/v1/systemone", {"model": "no-such-model", "state": STATE, "questions": QUESTIONS})
    assert reply.status == 404 and reply.json()["error"]["code"] == "model_not_found"
    reply = checked(server, "POST", "/v1/systemone", {"state": "x" * 70000, "questions": QUESTIONS})
    assert reply.status == 413 and reply.json()["error"]["code"] == "request_too_large"
    reply = checked(server, "POST", "/v1/systemone", {"state": "word " * 6000, "questions": {"q": {"type": "noul"}}})
    assert reply.status == 200 and reply.json()["answers"]["q"]["error"] == "max_length_exceeded"
    assert server.request("GET", "/v1/nothing").status == 404


def test_head_and_a_wrong_path_or_method_are_answered_usefully(servers):
    """HEAD (what load balancers' health checks send) was a 405; a 404 or 405 said only its title."""
    server = servers[("d3", "exact")]
    for path in ("/health", "/health/live", "/v1/models", "/metrics", "/openapi.yaml"):
        get, head = server.request("GET", path), server.request("HEAD", path)
        assert head.status == get.status == 200, path
        assert head.body == b"" and int(head.headers["content-length"]) > 0, path
        if path != "/metrics":  # its counters move between the two requests
            assert int(head.headers["content-length"]) == len(get.body), path
        assert head.headers["content-type"] == get.headers["content-type"], path
    missing = server.request("GET", "/v1/decision")
    assert missing.status == 404 and missing.json()["error"]["code"] == "not_found"
    assert "/v1/decision (paths: " in missing.json()["error"]["message"] and "/v1/decisions" in missing.json()["error"]["message"]
    wrong = server.request("GET", "/v1/decisions")
    assert wrong.status == 405 and wrong.json()["error"]["code"] == "method_not_allowed"
    assert "GET /v1/decisions (allowed: POST" in wrong.json()["error"]["message"] and "POST" in wrong.headers["allow"]


def test_a_compressed_body_is_answered_as_the_plain_one(servers):
    """Content-Encoding gzip/deflate bodies were read as JSON bytes ("not valid UTF-8"). Now they are decompressed,
    no further than --max-request-bytes (65,536 here): a 70 kB state in a 200-byte gzip body is still a 413."""
    import gzip
    import zlib

    server = servers[("d3", "exact")]
    body = {"state": STATE, "questions": QUESTIONS}
    plain = checked(server, "POST", "/v1/systemone", body).json()
    data = json.dumps(body).encode()
    for encoding, packed in (("gzip", gzip.compress(data)), ("deflate", zlib.compress(data)), ("identity", data)):
        reply = server.request("POST", "/v1/systemone", raw=packed, headers={"Content-Encoding": encoding})
        CONTRACT.check("/v1/systemone", "POST", reply)
        assert reply.status == 200 and reply.json()["answers"] == plain["answers"], (encoding, reply.body[:300])
    bomb = gzip.compress(json.dumps({"state": "x" * 70000, "questions": QUESTIONS}).encode())
    assert len(bomb) < 1000
    for raw, encoding, status, says in (
        (bomb, "gzip", 413, "over the limit of 65536 bytes once decompressed"),
        (gzip.compress(data)[:-20], "gzip", 400, "truncated gzip stream"),
        (data, "gzip", 400, "not valid gzip"),
        (data, "br", 400, "Content-Encoding br is not supported"),
    ):
        reply = server.request("POST", "/v1/systemone", raw=raw, headers={"Content-Encoding": encoding})
        CONTRACT.check("/v1/systemone", "POST", reply)
        assert reply.status == status and says in reply.json()["error"]["message"], (encoding, reply.body[:300])


def test_a_chunked_body_is_read_to_its_end(servers):
    """A chunked body (no Content-Length: what Go's and Envoy's streaming clients send) was read as empty, and
    answered 400 "not valid JSON"; it is now read to its end, with the same limit and decoding as any other."""
    import gzip

    server = servers[("d3", "exact")]
    body = {"state": STATE, "questions": QUESTIONS}
    plain = checked(server, "POST", "/v1/systemone", body).json()
    data = json.dumps(body).encode()
    assert len(data) > 300  # several chunks
    for raw, headers in ((data, {}), (gzip.compress(data), {"Content-Encoding": "gzip"})):
        reply = server.request("POST", "/v1/systemone", raw=raw, headers=headers, chunked=True)
        CONTRACT.check("/v1/systemone", "POST", reply)
        assert reply.status == 200 and reply.json()["answers"] == plain["answers"], reply.body[:300]
    big = json.dumps({"state": "x" * 70000, "questions": QUESTIONS}).encode()
    reply = server.request("POST", "/v1/systemone", raw=big, chunked=True)
    CONTRACT.check("/v1/systemone", "POST", reply)
    assert reply.status == 413 and "over the limit of 65536 bytes" in reply.json()["error"]["message"]
    assert checked(server, "POST", "/v1/decisions", body, chunked=True).status == 200


def test_per_question_errors_keep_siblings(servers):
    server = servers[("d2_qwen3_5", "exact")]
    alone = checked(server, "POST", "/v1/systemone", {"state": STATE, "questions": {"r": QUESTIONS["reasoning"]}}).json()["answers"]["r"]
    reply = checked(server, "POST", "/v1/systemone", {"state": STATE, "questions": {"bad": {"type": "score", "criteria": ["a", "a"]}, "r": QUESTIONS["reasoning"]}})
    answers = reply.json()["answers"]
    assert answers["bad"]["error"] == "invalid_question"
    assert abs(answers["r"]["noul"] - alone["noul"]) <= 1e-6


def test_expired_deadline_answers_deadline_exceeded(servers):
    questions = {f"q{i}": {"type": "choice", "instructions": "long " * 20, "criteria": {f"k{j}": "d" * 20 for j in range(30)}} for i in range(16)}
    reply = checked(servers[("d3", "exact")], "POST", "/v1/systemone", {"state": STATE * 5, "questions": questions, "options": {"deadline_ms": 1}})
    assert reply.status == 200
    assert {a.get("error") for a in reply.json()["answers"].values()} == {"deadline_exceeded"}


def test_metrics_move(servers):
    server = servers[("d3", "exact")]

    before = server.request("GET", "/metrics").body.decode()
    checked(server, "POST", "/v1/systemone", {"state": STATE, "questions": QUESTIONS})
    after = checked(server, "GET", "/metrics").body.decode()
    ok = {"endpoint": "/v1/systemone", "status": "200"}
    assert metric_total(after, "vllm_sr_runtime_requests_total", **ok) == metric_total(before, "vllm_sr_runtime_requests_total", **ok) + 1
    assert metric_total(after, "vllm_sr_runtime_questions_total") >= metric_total(before, "vllm_sr_runtime_questions_total") + 3
    assert metric_total(after, "vllm_sr_runtime_forward_duration_seconds_count") > metric_total(before, "vllm_sr_runtime_forward_duration_seconds_count")
    assert 'vllm_sr_runtime_ready{model="synthetic-d3-tiny-s0"} 1.0' in after
    # a package directory has no Hub revision: "local", as the log says (not Python's "None")
    assert re.search(r'vllm_sr_runtime_model_info\{[^}]*model="synthetic-d3-tiny-s0"[^}]*revision="local"', after), after
    assert re.search(r'vllm_sr_runtime_model_info\{[^}]*accelerator="cpu"[^}]*device="cpu"', after), after  # the plugin and the device
    # what the model's weights take, for capacity planning: its card's figure (one worker here)
    [card] = server.request("GET", "/v1/models").json()["data"]
    assert card["weight_bytes"] >= 4 * card["parameters"]  # fp32 parameters, and buffers
    assert metric_total(after, "vllm_sr_runtime_model_memory_bytes", model="synthetic-d3-tiny-s0") == card["weight_bytes"]


def test_failed_model_is_503_not_ready(packages, tmp_path):
    broken = unloadable_copy(packages["d3"], tmp_path / "broken")
    server = Server([str(broken), "--device", "cpu"], log=tmp_path / "log")
    try:
        server.wait(status=503)
        health = checked(server, "GET", "/health")
        assert health.status == 503 and health.json()["status"] == "failed"
        assert "tokenizer.json" in json.dumps(health.json())
        reply = checked(server, "POST", "/v1/systemone", {"state": STATE, "questions": QUESTIONS})
        assert reply.status == 503 and reply.json()["error"]["code"] == "not_ready"
        assert "retry-after" not in reply.headers  # failed for good: retrying cannot help
    finally:
        server.stop()


def test_the_first_start_answers_while_its_models_load(packages, tmp_path):
    """A worker of the first start used to load before it accepted a connection: every probe and request hung
    until every model had loaded, and /health could never show a load being retried. Now it answers while
    loading: /health/live 200, /health 503 "loading" until every model has settled, with each model's state and
    a retried load's last failed try; a request to a loading model 503 with Retry-After, to a failed one 503
    without (retrying cannot help). One model here loads from a Hub that does not answer, so it stays loading
    while its download is tried again; the other fails at once."""
    broken = unloadable_copy(packages["d3"], tmp_path / "broken")
    broken_name = json.loads((broken / "MODEL_MANIFEST.json").read_text())["model_name"]
    hub_model = f"synthetic/d3-tiny@{PINNED_REVISION}"
    server = Server(
        [hub_model, str(broken), "--device", "cpu", "--load-attempts", "3", "--load-retry-seconds", "30", "--cache-dir", str(tmp_path / "cache")],
        env={"HF_ENDPOINT": f"http://127.0.0.1:{free_port()}"}, log=tmp_path / "log",
    )  # fmt: skip
    try:
        server.wait(status=503, settled=False)
        assert server.request("GET", "/health/live").status == 200
        body = {"state": STATE, "questions": QUESTIONS, "options": {"profile": "batching"}}
        loading = checked(server, "POST", "/v1/systemone", {**body, "model": "synthetic/d3-tiny"})
        assert loading.status == 503 and loading.json()["error"]["code"] == "not_ready" and "is loading" in loading.json()["error"]["message"]
        assert int(loading.headers["retry-after"]) > 0
        deadline = time.time() + 120
        while True:
            health = checked(server, "GET", "/health").json()
            models = health["models"]
            if models[broken_name]["status"] == "failed" and "try 1 of 3 failed" in models["synthetic/d3-tiny"].get("reason", ""):
                break
            assert time.time() < deadline, health
            time.sleep(0.5)
        assert health["status"] == "loading" and models["synthetic/d3-tiny"]["status"] == "loading"  # one failed, one not settled
        assert "could not be reached" in models["synthetic/d3-tiny"]["reason"] and "retrying in 30 s" in models["synthetic/d3-tiny"]["reason"]
        failed = checked(server, "POST", "/v1/systemone", {**body, "model": broken_name})
        assert failed.status == 503 and "is failed" in failed.json()["error"]["message"] and "retry-after" not in failed.headers
    finally:
        server.stop()


def test_a_lone_workers_replacement_answers_while_it_loads(packages, tmp_path):
    """With one worker there is no sibling to serve while a replacement loads: it answers 503 "loading" (not
    connections that hang until it is ready), then serves. Its model comes from a slow loopback Hub (every
    listing answers after 10 s), so the replacement's load is long enough to be seen."""
    import signal

    revision = PINNED_REVISION
    with HubServer() as hub:
        hub.add("synthetic/d3-tiny", revision, packages["d3"])
        hub.listing_delay_s = 10.0
        server = Server(
            [f"synthetic/d3-tiny@{revision}", "--device", "cpu", "--workers", "1", "--cache-dir", str(tmp_path / "cache")],
            env={"HF_ENDPOINT": hub.endpoint}, log=tmp_path / "log",
        )  # fmt: skip
        try:
            server.wait()
            (worker,) = server.workers()
            os.kill(worker, signal.SIGKILL)
            deadline, seen = time.time() + 120, []
            while time.time() < deadline:
                try:
                    reply = server.request("GET", "/health", timeout=5)
                except (OSError, ConnectionError):
                    continue
                seen.append(reply.json()["status"])
                if reply.status == 200 and server.workers() != [worker]:
                    break
                time.sleep(0.3)
            assert "loading" in seen and seen[-1] == "ready", seen
            assert server.post({"state": STATE, "questions": QUESTIONS}).status == 200
        finally:
            server.stop()


def test_serve_without_a_model_uses_a_cached_synthetic_package(tmp_path):
    server = Server(["--device", "cpu", "--cache-dir", str(tmp_path / "cache")], log=tmp_path / "log")
    try:
        server.wait()
        reply = checked(server, "POST", "/v1/systemone", {"state": STATE, "questions": QUESTIONS})
        assert reply.status == 200 and reply.json()["model"] == "synthetic-d3-tiny-s0"
        assert (tmp_path / "cache" / "fixtures" / "synthetic-d3-tiny" / "MODEL_MANIFEST.json").is_file()
    finally:
        server.stop()


def test_several_models_by_name(packages, tmp_path):
    models_file = tmp_path / "models.yaml"
    models_file.write_text(
        f"- model: {packages['d3']}\n  name: d3\n- model: {packages['d2_lora']}\n  name: vega\n  base_path: {load_kwargs('d2_lora', packages['d2_lora'])['base_path']}\n"
    )
    server = Server(["--models", str(models_file), "--device", "cpu", "--access-log"], log=tmp_path / "log")
    try:
        server.wait()
        assert [c["id"] for c in checked(server, "GET", "/v1/models").json()["data"]] == ["d3", "vega"]
        reply = checked(server, "POST", "/v1/systemone", {"model": "vega", "state": STATE, "questions": QUESTIONS}, headers={"X-Request-Id": "trace-42"})
        assert reply.status == 200 and reply.json()["model"] == "vega"
        reply = checked(server, "POST", "/v1/systemone", {"state": STATE, "questions": QUESTIONS})
        assert reply.status == 400 and "required" in reply.json()["error"]["message"]
    finally:
        server.stop()
    # --access-log: one line per request, with its status and the request id the response carried
    lines = (tmp_path / "log").read_text().splitlines()
    assert any('"POST /v1/systemone HTTP/1.1" 200 ' in line and line.endswith("request_id=trace-42") for line in lines), lines[-5:]
    assert any('"POST /v1/systemone HTTP/1.1" 400 ' in line and re.search(r"request_id=[0-9a-f]{32}$", line) for line in lines), lines[-5:]


def test_system_one_alias_and_repeated_served_model_names(packages, tmp_path):
    """System One superset: `model` may be omitted with one model served, `jev-latest` names the default
    model, and each extra --served-model-name is an alias; other names are still 404s."""
    server = Server(
        [str(packages["d3"]), "--served-model-name", "tiny", "--served-model-name", "tiny-alias", "--device", "cpu", "--keepalive", "1"],
        log=tmp_path / "log",
    )  # fmt: skip
    try:
        server.wait()
        kept = server.connection(timeout=10)  # --keepalive 1: an idle kept-alive connection is closed after a second
        kept.request("GET", "/health/live")
        assert kept.getresponse().read() and kept.sock is not None
        kept.sock.settimeout(10)
        idle = time.monotonic()
        assert kept.sock.recv(1) == b"" and 0.5 < time.monotonic() - idle < 3.5  # closed by the server (the default is 5 s)
        card = checked(server, "GET", "/v1/models").json()["data"][0]
        assert card["id"] == "tiny" and card["aliases"] == ["jev-latest", "tiny-alias"]
        answers = []
        for model in (None, "tiny", "tiny-alias", "jev-latest"):
            body = {"state": STATE, "questions": QUESTIONS} | ({"model": model} if model else {})
            for path in ("/v1/systemone", "/v1/decisions"):
                reply = checked(server, "POST", path, body)
                assert reply.status == 200, (model, path, reply.body)
                assert reply.json()["model"] == "tiny"
                answers.append(reply.json()["answers"])
        assert all(a == answers[0] for a in answers)
        missing = checked(server, "POST", "/v1/systemone", {"model": "jev-other", "state": STATE, "questions": QUESTIONS})
        assert missing.status == 404 and missing.json()["error"]["code"] == "model_not_found"
    finally:
        server.stop()


def test_the_system_one_alias_cannot_name_a_model():
    from vllm_sr_runtime.errors import InvalidRequest
    from vllm_sr_runtime.server.config import ModelSpec, check_names

    with pytest.raises(InvalidRequest, match="jev-latest"):
        check_names([ModelSpec(model="a", name="jev-latest")])
    with pytest.raises(InvalidRequest, match="duplicate"):
        check_names([ModelSpec(model="a", name="x"), ModelSpec(model="b", name="y", aliases=("x",))])


def test_over_limit_body_gets_413_on_tcp_and_unix_socket(packages, tmp_path):
    """A client that writes its whole 2 MiB body before reading (http.client) reads the 413 envelope on both
    transports, not a broken pipe."""
    body = json.dumps({"state": "x" * (2 * 1024 * 1024), "questions": QUESTIONS}).encode()
    socket_dir = tmp_path / "sock"
    socket_dir.mkdir(mode=0o700)
    for uds in (None, str(socket_dir / "serve.sock")):
        server = Server([str(packages["d3"]), "--max-request-bytes", "1000000", "--device", "cpu"], uds=uds, log=tmp_path / "log")
        try:
            server.wait()
            for _ in range(2):  # and the connection's next request is not confused by the rest of the body
                reply = server.request("POST", "/v1/systemone", raw=body)
                CONTRACT.check("/v1/systemone", "POST", reply)
                assert reply.status == 413 and reply.json()["error"]["code"] == "request_too_large", (uds, reply.status)
            assert server.post({"state": STATE, "questions": QUESTIONS}).status == 200
        finally:
            server.stop()


def test_a_unix_socket_and_tcp_together(packages, tmp_path):
    """--uds with --port (or --host) listens on both: a router on the socket, Prometheus on TCP. Before, --uds
    dropped TCP without a word, whatever --port said. --uds alone still listens on the socket only."""
    import http.client

    from server_harness import free_port
    from vllm_sr_runtime.cli import build_parser
    from vllm_sr_runtime.commands.serve_cmd import build_config

    def listeners(*argv):
        config = build_config(build_parser().parse_args(["serve", str(packages["d3"]), *argv]))
        return config.uds, config.host, config.port

    assert listeners("--uds", "s.sock") == ("s.sock", "127.0.0.1", None)
    assert listeners("--uds", "s.sock", "--host", "0.0.0.0") == ("s.sock", "0.0.0.0", 8100)
    assert listeners() == (None, "127.0.0.1", 8100)

    root = tmp_path / "sockets"
    port = free_port()
    server = Server([str(packages["d3"]), "--device", "cpu", "--port", str(port)], uds=str(root / "s.sock"), log=tmp_path / "log")
    try:
        server.wait()
        assert checked(server, "POST", "/v1/systemone", {"state": STATE, "questions": QUESTIONS}).status == 200
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            conn.request("GET", "/metrics")
            response = conn.getresponse()
            assert response.status == 200 and b'endpoint="/v1/systemone"' in response.read()  # the socket's request, seen over TCP
        finally:
            conn.close()
    finally:
        server.stop()


def test_a_server_that_cannot_bind_leaves_no_metrics_folder(packages, tmp_path):
    """gunicorn exits without its on_exit hook when the address is taken: the Prometheus folder it had made was left
    in the temporary folder, one per failed start."""
    import socket
    import subprocess
    import sys

    temporary = tmp_path / "tmp"
    temporary.mkdir()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "vllm_sr_runtime.cli", "serve", str(packages["d3"]), "--device", "cpu", "--port", str(port)],
            capture_output=True, text=True, timeout=120, env=os.environ | {"TMPDIR": str(temporary)},
        )  # fmt: skip
    assert done.returncode != 0 and "Address already in use" in done.stderr, done.stderr[-2000:]
    assert [p.name for p in temporary.iterdir() if p.name.startswith("vllm-sr-runtime")] == []
