"""Prometheus metrics, multiprocess-safe across gunicorn workers (PROMETHEUS_MULTIPROC_DIR is set by serve)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric

PREFIX = "vllm_sr_runtime"
LATENCY_BUCKETS = tuple(0.001 * 2**i for i in range(13))  # 1 ms .. 4.096 s, doubling
ROW_BUCKETS = tuple(2**i for i in range(9))  # 1 .. 256
TOKEN_BUCKETS = tuple(64 * 2**i for i in range(13))  # 64 .. 262,144

BUNDLE_TASK_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

REQUESTS = Counter(f"{PREFIX}_requests", "HTTP requests", ["endpoint", "status"])
QUESTIONS = Counter(f"{PREFIX}_questions", "Questions answered, by type and outcome", ["model", "profile", "type", "outcome"])
INPUT_TOKENS = Counter(f"{PREFIX}_input_tokens", "Input tokens of answered questions", ["model", "profile"])
DEADLINE_DROPPED = Counter(f"{PREFIX}_deadline_dropped_questions", "Questions dropped at their deadline", ["model", "profile"])
ABANDONED = Counter(f"{PREFIX}_abandoned_questions", "Questions dropped before their forward: their client had closed the connection", ["model", "profile"])
INTERRUPTED = Counter(
    f"{PREFIX}_interrupted_questions", "Questions whose forward stopped early: their clients had left or their deadlines passed", ["model", "profile"]
)
DEVICE_SECONDS = Counter(
    f"{PREFIX}_device_seconds",
    "Device time of the model's runs (a run: one request's passes, or several requests' merged), by how the run ended: "
    "answered, interrupted (nobody waited for it any more) or failed; its rate is the device's busy share",
    ["model", "profile", "outcome"],
)
DEVICE_FAULTS = Counter(
    f"{PREFIX}_device_faults", "Forwards that left the device unusable (a sticky CUDA or HIP error); each restarts its worker", ["model"]
)
REQUEST_SECONDS = Histogram(f"{PREFIX}_request_duration_seconds", "Request latency", ["endpoint"], buckets=LATENCY_BUCKETS)
QUEUE_SECONDS = Histogram(f"{PREFIX}_queue_duration_seconds", "Time in the model queue", ["model", "profile"], buckets=LATENCY_BUCKETS)
FORWARD_SECONDS = Histogram(f"{PREFIX}_forward_duration_seconds", "Device time per request", ["model", "profile"], buckets=LATENCY_BUCKETS)
BATCH_ROWS = Histogram(f"{PREFIX}_batch_rows", "Rows per forward pass", ["model", "profile"], buckets=ROW_BUCKETS)
BATCH_TOKENS = Histogram(f"{PREFIX}_batch_tokens", "Padded tokens per forward pass", ["model", "profile"], buckets=TOKEN_BUCKETS)
SHARED_PASSES = Counter(f"{PREFIX}_shared_passes", "shared_context passes (one prefix, many question rows)", ["model"])
SHARED_PREFIX_TOKENS = Counter(f"{PREFIX}_shared_prefix_tokens", "Prefix tokens run once instead of once per question", ["model"])
OVERLOADED = Counter(f"{PREFIX}_overloaded_requests", "Requests answered 429, by the limit that refused them", ["limit"])
INFLIGHT_BODY_BYTES = Gauge(
    f"{PREFIX}_inflight_request_bytes", "Request-body bytes held by requests in flight (--max-inflight-request-bytes per worker)", multiprocess_mode="livesum"
)
MEDIA_SLOTS_HELD = Gauge(f"{PREFIX}_media_slots_held", "Media slots held by requests with images or videos (--media-slots per worker)", multiprocess_mode="livesum")
QUEUE_DEPTH = Gauge(f"{PREFIX}_queue_depth", "Jobs waiting per model", ["model"], multiprocess_mode="livesum")
BUNDLE_TASKS = Histogram(f"{PREFIX}_bundle_tasks", "Tasks per POST /v1/bundle", buckets=BUNDLE_TASK_BUCKETS)
RESULT_CACHE = Counter(f"{PREFIX}_result_cache_questions", "Question rows looked up in the result cache", ["model", "outcome"])
CLOSE_CALLS = Counter(
    f"{PREFIX}_close_call_reanswers", "Questions whose close call the reference (exact) answered again (--close-call-margin)", ["model", "profile"]
)
LOAD_RETRIES = Counter(f"{PREFIX}_load_retries", "Model loads tried again after a transient failure", ["model"])
READY = Gauge(f"{PREFIX}_ready", "1 when the model is ready in every live worker", ["model"], multiprocess_mode="livemin")
MODEL_MEMORY = Gauge(
    f"{PREFIX}_model_memory_bytes", "Bytes of the weights a model's engine holds, summed over the workers (each holds its own)", ["model"],
    multiprocess_mode="livesum",
)
MODEL_INFO = Gauge(
    f"{PREFIX}_model_info", "Loaded model", ["model", "revision", "family", "engine", "accelerator", "device", "profile"], multiprocess_mode="livemax"
)


def ready_in_every_worker() -> dict[str, bool] | None:
    """Per model, whether every live worker that answers for it has it ready (READY's minimum over the workers'
    files); None outside serve's multiprocess mode, where this process is the only one."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return None
    for metric in every_worker().collect():
        if metric.name == f"{PREFIX}_ready":
            return {sample.labels["model"]: sample.value >= 1 for sample in metric.samples}
    return {}


class SettledWorkerFiles:
    """The workers' files in the multiprocess folder merged, like prometheus_client's MultiProcessCollector, but
    without the files still being created. A worker's file is empty between its open and its sizing; the stock
    collector fails on such a file, so a worker stopped or killed in that moment would fail every scrape and every
    /health of its siblings. Such a worker has written nothing yet, so it is left out, as before its file existed."""

    HEADER_BYTES = 8  # the used-bytes word and its padding

    def __init__(self, folder: Path):
        self.folder = folder

    def settled(self) -> list[str]:
        files = []
        for path in self.folder.glob("*.db"):
            try:
                if path.stat().st_size >= self.HEADER_BYTES:
                    files.append(str(path))
            except FileNotFoundError:  # a dead worker's live gauges go between the glob and the stat
                continue
        return sorted(files)

    def collect(self) -> Iterable[Metric]:
        return multiprocess.MultiProcessCollector.merge(self.settled(), accumulate=True)


def every_worker() -> CollectorRegistry:
    """The workers' metrics merged from the multiprocess folder."""
    registry = CollectorRegistry()
    registry.register(SettledWorkerFiles(Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])))
    return registry


def render() -> tuple[bytes, str]:
    return generate_latest(every_worker()), CONTENT_TYPE_LATEST
