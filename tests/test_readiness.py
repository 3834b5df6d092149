"""/health and /v1/models with several workers: a readiness probe reaches one worker, so they answer ready only once
every worker that answers requests has its models ready (a sibling still loading answers them 503)."""

from __future__ import annotations

import os
import signal
import struct
import time
from pathlib import Path

from hub_server import PINNED_REVISION, HubServer
from prometheus_client.mmap_dict import MmapedDict
from server_harness import Server

STATE = "Merge two sorted lists."
QUESTION = {"a": {"type": "noul", "instructions": "Is this about code?"}}


def has_said_ready(path: Path) -> bool:
    """Whether a worker's livemin file holds its READY sample yet (it is empty, then holds nothing, while it is
    being created: a worker stopped before the sample is written never says it answers)."""
    try:
        return any('"vllm_sr_runtime_ready"' in key for key, *_ in MmapedDict.read_all_values_from_file(str(path)))
    except (struct.error, OSError):  # still being created, or gone with its worker
        return False


def answering_workers(scratch: Path, workers: list[int]) -> list[int]:
    """The workers that answer while their models load: each has said so in the metrics folder (READY 0)."""
    return [pid for pid in workers if any(map(has_said_ready, scratch.glob(f"vllm-sr-runtime-metrics-*/gauge_livemin_{pid}.db")))]


def test_health_is_ready_only_once_every_answering_worker_is(packages, tmp_path: Path):
    models = tmp_path / "models.yaml"
    models.write_text(f"models:\n  - model: synthetic/d2-tiny\n    revision: \"{PINNED_REVISION}\"\n    name: hub\n")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    with HubServer() as hub:
        hub.add("synthetic/d2-tiny", PINNED_REVISION, packages["d2_qwen3"])
        hub.listing_delay_s = 4.0  # both workers load for a while: one is stopped in the middle of it
        server = Server(
            ["--models", str(models), "--device", "cpu", "--workers", "2", "--cache-dir", str(tmp_path / "cache")],
            env={"HF_ENDPOINT": hub.endpoint, "TMPDIR": str(scratch)}, log=tmp_path / "log",
        )  # fmt: skip
        stopped = None
        try:
            deadline = time.time() + 60
            while time.time() < deadline and stopped is None:
                found = answering_workers(scratch, server.workers())
                if found:
                    stopped = found[0]
                    os.kill(stopped, signal.SIGSTOP)  # it stays "loading": it never gets to read its model
                time.sleep(0.02)
            assert stopped is not None, server.tail()
            # the other worker loads and answers every probe (the stopped one accepts none)
            seen, deadline = [], time.time() + 90
            while time.time() < deadline:
                reply = server.request("GET", "/health", timeout=10)
                seen.append((reply.status, reply.json()))
                assert "models" in seen[-1][1], (seen[-3:], server.tail())
                if seen[-1][1]["models"]["hub"]["status"] == "ready":
                    break
                time.sleep(0.2)
            assert seen[-1][1]["models"]["hub"]["status"] == "ready", (seen[-3:], server.tail())
            assert all(status == 503 for status, _ in seen), seen[-3:]
            last = seen[-1][1]
            assert last["status"] == "loading" and last["models"]["hub"]["every_worker"] is False, last
            # a router that polls /v1/models rather than /health is told the same
            [card] = server.request("GET", "/v1/models", timeout=10).json()["data"]
            assert (card["status"], card["ready"], card["every_worker"]) == ("ready", False, False), card
            os.kill(stopped, signal.SIGCONT)
            stopped = None
            server.wait()  # once the other worker has loaded too
            [card] = server.request("GET", "/v1/models").json()["data"]
            assert card["ready"] is True and "every_worker" not in card, card
            assert server.post({"state": STATE, "questions": QUESTION}).status == 200
        finally:
            if stopped is not None:
                os.kill(stopped, signal.SIGCONT)
            server.stop()
