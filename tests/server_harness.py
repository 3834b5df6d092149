"""Starts the real `vllm-sr-runtime serve` (gunicorn) and talks HTTP to it over TCP or a Unix socket."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path

import jsonschema
import yaml

from vllm_sr_runtime.bench.http_load import UnixConnection


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Reply:
    def __init__(self, status: int, headers: dict[str, str], body: bytes):
        self.status, self.headers, self.body = status, headers, body

    def json(self):
        return json.loads(self.body)


def unloadable_copy(package: Path, out: Path) -> Path:
    """A copy of the package whose tokenizer cannot be read: a model that fails to load at once, and is never
    retried (a verification failure)."""
    shutil.copytree(package, out)
    (out / "tokenizer.json").write_text("{}")
    return out


def metric_total(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of `name` in a Prometheus text page whose labels include `labels`."""
    wanted = [f'{key}="{value}"' for key, value in labels.items()]
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith((name + "{", name + " ")) and all(label in line for label in wanted)
    )


class Server:
    def __init__(
        self, args: list[str], *, uds: str | None = None, env: dict | None = None, log: Path | None = None, log_level: str = "warning"
    ):
        self.uds = uds
        self.port = None if uds else free_port()
        bind = ["--uds", uds] if uds else ["--port", str(self.port)]
        self.log_path = log
        self.log = open(log, "wb") if log else subprocess.DEVNULL
        self.process = subprocess.Popen(
            [sys.executable, "-m", "vllm_sr_runtime.cli", "serve", *args, *bind, "--log-level", log_level],
            stdout=self.log, stderr=self.log, env={**os.environ, **(env or {})}, start_new_session=True,
        )  # fmt: skip

    def connection(self, timeout: float = 60) -> http.client.HTTPConnection:
        if self.uds:
            return UnixConnection(self.uds, timeout=timeout)
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(
        self, method: str, path: str, body=None, *, raw: bytes | None = None, headers: dict | None = None, timeout: float = 60, chunked: bool = False
    ) -> Reply:
        """`chunked` sends the body with Transfer-Encoding: chunked, in 100-byte chunks and no Content-Length."""
        conn = self.connection(timeout)
        try:
            data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
            headers = {"Content-Type": "application/json", **(headers or {})}
            if chunked and data is not None:
                chunks = [data[i : i + 100] for i in range(0, len(data), 100)]
                conn.request(method, path, body=iter(chunks), headers={**headers, "Transfer-Encoding": "chunked"}, encode_chunked=True)
            else:
                conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
        finally:
            conn.close()

    def post(self, body, path: str = "/v1/systemone", **kwargs) -> Reply:
        return self.request("POST", path, body, **kwargs)

    def wait(self, status: int = 200, timeout: float = 180, settled: bool = True) -> None:
        """Until /health answers `status`. A 503 counts once the server has settled (its models no longer loading)
        unless `settled` is False: the first start's workers answer 503 "loading" while they load."""
        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}: {self.tail()}")
            try:
                last = self.request("GET", "/health", timeout=5)
                if last.status == status and (status != 503 or not settled or last.json()["status"] not in ("loading",)):
                    return
                if status == 200 and last.status == 503 and last.json()["status"] in ("failed",):
                    raise RuntimeError(f"model failed: {last.body!r}")
            except (ConnectionError, OSError, http.client.HTTPException):
                pass
            time.sleep(0.2)
        raise TimeoutError(f"server not at /health {status} in {timeout}s (last {last and last.body!r}): {self.tail()}")

    def tail(self) -> str:
        if self.log_path and Path(self.log_path).exists():
            return Path(self.log_path).read_text(errors="replace")[-3000:]
        return ""

    def workers(self) -> list[int]:
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text().split()
        return [int(pid) for pid in children]

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        if self.log not in (None, subprocess.DEVNULL):
            self.log.close()


class Contract:
    """Validates responses against the served OpenAPI document."""

    def __init__(self):
        self.document = yaml.safe_load(resources.files("vllm_sr_runtime.server").joinpath("openapi.yaml").read_text())

    def check(self, path: str, method: str, reply: Reply) -> None:
        operation = self.document["paths"][path][method.lower()]
        spec = operation["responses"].get(str(reply.status))
        assert spec is not None, f"{method} {path} answered {reply.status}, which the contract does not list"
        if "$ref" in spec:
            spec = self.document["components"]["responses"][spec["$ref"].rsplit("/", 1)[-1]]
        for name, header in spec.get("headers", {}).items():
            value = reply.headers.get(name.lower())
            assert value is not None or not header.get("required"), f"{method} {path} {reply.status}: no {name} header"
            if value is not None and header["schema"].get("type") == "integer":
                assert value.isdigit() and int(value) >= header["schema"].get("minimum", 0), f"{method} {path} {reply.status}: {name}: {value}"
        content_type = reply.headers.get("content-type", "").split(";")[0]
        media = spec["content"].get(content_type)
        assert media is not None, f"{method} {path} {reply.status}: content type {content_type} not in the contract"
        if content_type == "application/json":
            schema = {**self.document, **media["schema"]}
            jsonschema.Draft202012Validator(schema).validate(reply.json())
