"""A reload (SIGHUP to serve's master): the --models file is read again, the old workers serve until the new ones
have loaded, and a file that cannot be used keeps the models served before."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from hub_server import PINNED_REVISION, HubServer
from server_harness import Server, metric_total

STATE = "Merge two sorted lists."
QUESTION = {"a": {"type": "noul", "instructions": "Is this about code?"}}
REVISION = PINNED_REVISION


def served(server: Server) -> list[str]:
    return [model["id"] for model in server.request("GET", "/v1/models").json()["data"]]


def until_replaced(server: Server, old: list[int], timeout: float = 120) -> list[int]:
    """Statuses of requests for model `first` and of readiness probes (/health), sent while the reload's new workers
    load, until every old worker is gone (a new worker counts toward readiness only once it answers)."""
    statuses, deadline = [], time.time() + timeout
    while time.time() < deadline and set(old) & set(server.workers()):
        statuses.append(server.post({"model": "first", "state": STATE, "questions": QUESTION}).status)
        statuses.append(server.request("GET", "/health").status)
        time.sleep(0.2)
    assert not set(old) & set(server.workers()), f"the old workers {old} still run: {server.tail()}"
    return statuses


def test_a_reload_reads_the_models_file_again_while_the_old_worker_serves(packages, tmp_path: Path):
    models = tmp_path / "models.yaml"
    first = f"models:\n  - model: {packages['d3']}\n    name: first\n"
    models.write_text(first)
    with HubServer() as hub:
        # the added model comes from a loopback Hub whose listings answer after 5 s: a load long enough to be seen
        hub.add("synthetic/d2-tiny", REVISION, packages["d2_qwen3"])
        hub.listing_delay_s = 5.0
        server = Server(
            ["--models", str(models), "--device", "cpu", "--workers", "1", "--cache-dir", str(tmp_path / "cache")],
            env={"HF_ENDPOINT": hub.endpoint}, log=tmp_path / "log",
        )  # fmt: skip
        try:
            server.wait()
            assert served(server) == ["first"]
            old = server.workers()
            models.write_text(first + f"  - model: synthetic/d2-tiny\n    revision: \"{REVISION}\"\n    name: second\n")
            os.kill(server.process.pid, signal.SIGHUP)
            statuses = until_replaced(server, old)
            # the old worker answered every request while the new one loaded: no 503 "loading", no refused connection
            assert len(statuses) >= 10 and set(statuses) == {200}, statuses
            server.wait()
            assert served(server) == ["first", "second"]
            reply = server.post({"model": "second", "state": STATE, "questions": QUESTION})
            assert reply.status == 200 and "noul" in reply.json()["answers"]["a"]

            # a file that cannot be read, or names a model that is not there: the master keeps what it served
            for broken in ("models: [\n", f"models:\n  - model: {tmp_path / 'nothing-here'}\n"):
                models.write_text(broken)
                old = server.workers()
                os.kill(server.process.pid, signal.SIGHUP)
                assert set(until_replaced(server, old)) <= {200}
                server.wait()
                assert server.process.poll() is None and served(server) == ["first", "second"]
            assert server.tail().count("keeping the models served before") == 2
        finally:
            server.stop()


def test_a_reload_keeps_serving_on_its_unix_socket(packages, tmp_path: Path):
    folder = tmp_path / "sock"
    folder.mkdir(mode=0o700)
    server = Server([str(packages["d3"]), "--device", "cpu"], uds=str(folder / "serve.sock"), log=tmp_path / "log")
    try:
        server.wait()
        old = server.workers()
        os.kill(server.process.pid, signal.SIGHUP)
        deadline = time.time() + 120
        while time.time() < deadline and set(old) & set(server.workers()):
            time.sleep(0.2)
        assert (folder / "serve.sock").is_socket()
        server.wait()
        assert server.post({"state": STATE, "questions": QUESTION}).status == 200
    finally:
        server.stop()


def answered_total(server: Server) -> float:
    return metric_total(server.request("GET", "/metrics").body.decode(), "vllm_sr_runtime_requests_total", endpoint="/v1/systemone", status="200")


def new_master(server: Server, workers: int = 1, timeout: float = 60) -> int:
    """The master a binary upgrade (USR2) started: the old master's child that has children (its workers), once it
    has `workers` of them."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for pid in server.workers():
            if len(Path(f"/proc/{pid}/task/{pid}/children").read_text().split()) >= workers:
                return pid
        time.sleep(0.2)
    raise TimeoutError(f"no new master after USR2: {server.tail()}")


@pytest.mark.parametrize("workers", [1, 2])
def test_a_binary_upgrade_keeps_its_unix_socket_and_never_answers_loading(packages, tmp_path: Path, workers: int):
    """USR2 starts a new master on the old one's listeners. Before, the new master unlinked the socket the two share
    (the server was unreachable once the old one stopped), and its worker answered 503 "loading" beside the old
    master's, which still served. A second server given the same socket is refused instead of taking it over."""
    folder = tmp_path / "sock"
    folder.mkdir(mode=0o700)
    socket_path = folder / "serve.sock"
    models = tmp_path / "models.yaml"
    first = f"models:\n  - model: {packages['d3']}\n    name: first\n"
    models.write_text(first)
    with HubServer() as hub:
        hub.add("synthetic/d2-tiny", REVISION, packages["d2_qwen3"])
        hub.listing_delay_s = 5.0  # the new master's worker loads a model from a slow Hub: its load is seen
        args = ["--models", str(models), "--device", "cpu", "--workers", str(workers), "--cache-dir", str(tmp_path / "cache")]
        scratch = tmp_path / "tmp"  # the masters' metrics and settled folders: none may be left behind
        scratch.mkdir()
        server = Server(args, uds=str(socket_path), env={"HF_ENDPOINT": hub.endpoint, "TMPDIR": str(scratch)}, log=tmp_path / "log")
        try:
            server.wait()
            rival = Server(args, uds=str(socket_path), env={"TMPDIR": str(scratch)}, log=tmp_path / "rival-log")
            assert rival.process.wait(timeout=120) == 1 and "another server is listening on this socket" in rival.tail()
            assert server.post({"model": "first", "state": STATE, "questions": QUESTION}).status == 200

            old_workers = server.workers()
            assert len(old_workers) == workers
            answered_before = answered_total(server)
            models.write_text(first + f"  - model: synthetic/d2-tiny\n    revision: \"{REVISION}\"\n    name: second\n")
            os.kill(server.process.pid, signal.SIGUSR2)
            upgraded = new_master(server, workers)
            new_workers = [int(pid) for pid in Path(f"/proc/{upgraded}/task/{upgraded}/children").read_text().split()]
            statuses, until = [], time.time() + 15  # longer than the new worker's load
            while time.time() < until:
                statuses.append(server.post({"model": "first", "state": STATE, "questions": QUESTION}).status)
                time.sleep(0.1)
            assert set(statuses) == {200}, statuses
            # both masters' workers count into one metrics folder: whichever answers /metrics counts every request
            counts = [answered_total(server) for _ in range(6)]
            assert min(counts) >= answered_before + len(statuses), (answered_before, len(statuses), counts)
            server.process.terminate()  # the operator stops the old master once the new one serves
            server.process.wait(timeout=60)
            assert socket_path.is_socket()
            assert Path(f"/proc/{upgraded}").exists()
            # the old master's exit did not take the socket, nor the metrics: the new master answers on it, counting on
            assert served(server) == ["first", "second"]
            assert answered_total(server) >= max(counts)
            assert server.post({"model": "second", "state": STATE, "questions": QUESTION}).status == 200
            # each worker's log lines take gunicorn's shape with the worker's pid: the old and the new worker are told apart
            pattern = r"^\[[^\]]+\] \[(\d+)\] \[WARNING\] vllm_sr_runtime\.server: model first: golden answers unverified"
            writers = set(re.findall(pattern, (tmp_path / "log").read_text(), flags=re.MULTILINE))
            assert writers == {str(pid) for pid in [*old_workers, *new_workers]}, (writers, server.tail())
        finally:
            server.stop()
            try:
                os.killpg(server.process.pid, signal.SIGTERM)  # the new master and its worker, in the old one's group
            except ProcessLookupError:
                pass
    deadline = time.time() + 30
    while time.time() < deadline and any(scratch.iterdir()):
        time.sleep(0.2)
    assert not any(scratch.iterdir()), sorted(scratch.iterdir())
