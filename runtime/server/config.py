"""What `serve` runs: the models (CLI positionals or a --models YAML file) and the server's limits."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path

from vllm_sr_runtime.cli_values import close_call_margin
from vllm_sr_runtime.defaults import DEFAULT_BATCH_REQUESTS, DEFAULT_BATCH_TOKENS, DEFAULT_MIN_SAVED_TOKENS
from vllm_sr_runtime.errors import InvalidRequest
from vllm_sr_runtime.packages.resolve import parse_model_ref

SYSTEM_ONE_ALIAS = "jev-latest"  # the System One name of "the default model": the first one served
DEFAULT_MAX_REQUEST_BYTES = 48 * 1024 * 1024  # a realistic video as a base64 data URL (the reference runtime's limit)
DEFAULT_DEADLINE_MS = 30_000
MAX_DEADLINE_MS = 600_000
MAX_UDS_PATH_BYTES = 107  # Linux's sun_path holds 108 bytes with the closing NUL


def checked_uds_path(path: str) -> Path:
    """The socket's absolute path, refused when the kernel cannot bind it (gunicorn retried five times, then
    stopped with "AF_UNIX path too long")."""
    socket_path = Path(path).absolute()
    size = len(os.fsencode(socket_path))
    if size > MAX_UDS_PATH_BYTES:
        raise InvalidRequest(f"--uds {socket_path} is {size} bytes; a Unix socket path may be at most {MAX_UDS_PATH_BYTES}: use a shorter one")
    return socket_path


@dataclass
class ModelSpec:
    model: str
    revision: str | None = None
    name: str | None = None
    device: str | None = None
    profile: str | None = None
    artifact: str | None = None
    base_path: str | None = None
    aliases: tuple[str, ...] = ()  # more names requests may use for this model
    accept_licences: tuple[str, ...] = ()  # this model's restricted licences the operator accepts (beside --accept-licence)
    close_call_margin: float | str | None = None  # this model's (a number or "artifact"), instead of --close-call-margin

    def served_name(self) -> str:
        """The name requests use: the spec's name, else the package's model_name (local), else the repo id."""
        if self.name:
            return self.name
        path = Path(self.model)
        manifest = path / "MODEL_MANIFEST.json"
        if manifest.is_file():
            try:
                name = json.loads(manifest.read_text(encoding="utf-8")).get("model_name")
            except (OSError, json.JSONDecodeError):
                name = None
            if name:
                return str(name)
        return parse_model_ref(self.model)[0] if not path.exists() else path.name


MAX_LOAD_RETRY_SECONDS = 300.0
RESERVED_REQUEST_THREADS = 8  # request threads beyond the model queues': /health, /metrics, /v1/models, 429s


@dataclass
class ServeConfig:
    models: list[ModelSpec]
    device: str = "auto"
    profile: str = "exact"
    host: str = "127.0.0.1"
    port: int | None = 8100  # None: no TCP listener (--uds alone)
    uds: str | None = None
    workers: int = 1
    threads: int | None = None  # request threads per worker; None: request_threads()
    max_queue: int = 256
    max_queued_tokens: int = 4_194_304  # input tokens of the requests a model's queue holds, per worker
    memory_budget_gib: float | None = None  # the weights every worker's models may hold together; None: no budget
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_inflight_request_bytes: int | None = None  # bodies a worker's requests in flight hold; None: inflight_request_bytes()
    max_bundle_tasks: int = 64  # tasks per POST /v1/bundle
    media_slots: int = 8  # requests with images or videos a worker holds decoded at once (what its 8 request threads held)
    default_deadline_ms: int = DEFAULT_DEADLINE_MS
    batch_window_ms: float = 2.0
    max_batch_tokens: int = DEFAULT_BATCH_TOKENS
    max_batch_requests: int = DEFAULT_BATCH_REQUESTS
    shared_min_tokens: int = DEFAULT_MIN_SAVED_TOKENS
    close_call_margin: float | str | None = None  # answers below this top-two margin come again from exact (profiles but exact); "artifact": the artifact's measured one
    allow_approximate_shared_context: bool = False  # shared_context for models where it is not exact (non-causal)
    media_url_allow: tuple[str, ...] = ()  # hosts whose http(s) media URLs may be fetched; empty: none
    media_url_allow_private: bool = False
    media_url_timeout_s: float = 10.0
    cache_dir: str | None = None
    offline: bool = False
    accept_licences: tuple[str, ...] = ()  # SPDX ids of non-commercial or research licences the operator may use
    result_cache_entries: int = 16_384  # question rows whose answers each model keeps (0: no result cache)
    load_attempts: int = 5  # tries per model when a load fails for a transient reason (never for verification)
    load_retry_seconds: float = 5.0  # the first wait between tries; doubling up to MAX_LOAD_RETRY_SECONDS
    log_level: str = "info"
    access_log: bool = False  # one line per request on stderr: client, request line, status, bytes, ms, request id
    timeout: int = 120
    graceful_timeout: int = 60
    keepalive: int = 5  # seconds an idle kept-alive connection stays open
    extra: dict = field(default_factory=dict)

    def request_threads(self) -> int:
        """A request waits for its forward on its own thread, so with fewer threads than the model queues hold, every
        thread could wait on a forward and a liveness probe (or /metrics, or a request a full queue would refuse at
        once) queued behind them: /health/live took 12-15 s under 32 clients with 8 threads. By default there is a
        thread for every request the queues take, plus a reserve that nothing waits on."""
        return self.threads or self.queue_capacity() + RESERVED_REQUEST_THREADS

    def inflight_request_bytes(self) -> int:
        """The request-body bytes a worker's requests in flight may hold: by default as many largest bodies as the
        eight request threads held before threads followed the queues."""
        return self.max_inflight_request_bytes or RESERVED_REQUEST_THREADS * self.max_request_bytes

    def worker_weight_budget(self) -> int | None:
        """The bytes of weights one worker's models may hold: its share of --memory-budget."""
        if self.memory_budget_gib is None:
            return None
        return int(self.memory_budget_gib * 1024**3) // max(1, self.workers)

    def queue_capacity(self) -> int:
        """The requests a worker's model queues hold at once."""
        return self.max_queue * max(1, len(self.models))


def load_models_file(path: str) -> list[ModelSpec]:
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidRequest(f"--models {path}: {exc}") from None
    entries = data.get("models") if isinstance(data, dict) else data
    if not isinstance(entries, list) or not entries:
        raise InvalidRequest(f"--models {path}: expected a non-empty list of models")
    known = {f.name for f in fields(ModelSpec)}
    specs = []
    for index, entry in enumerate(entries):
        if isinstance(entry, str) and entry:
            entry = {"model": entry}  # `- vllm-sr/d3-nano`: a model with every default
        if not isinstance(entry, dict) or "model" not in entry:
            raise InvalidRequest(f"--models {path}: entry {index} needs a 'model' field")
        unknown = sorted(set(entry) - known)
        if unknown:
            raise InvalidRequest(f"--models {path}: entry {index} has unknown field(s) {', '.join(unknown)}")
        aliases = entry.pop("aliases", None) or []
        if not isinstance(aliases, list) or not all(isinstance(a, str) and a for a in aliases):
            raise InvalidRequest(f"--models {path}: entry {index} 'aliases' must be a list of names")
        accepted = entry.pop("accept_licences", None) or []
        if not isinstance(accepted, list) or not all(isinstance(a, str) and a.strip() for a in accepted):
            raise InvalidRequest(f"--models {path}: entry {index} 'accept_licences' must be a list of SPDX ids")
        margin = entry.pop("close_call_margin", None)
        if margin is not None:
            try:
                margin = close_call_margin(str(margin) if isinstance(margin, (int, float, str)) and not isinstance(margin, bool) else repr(margin))
            except argparse.ArgumentTypeError as exc:
                raise InvalidRequest(f"--models {path}: entry {index} close_call_margin {exc}") from None
        for key, value in entry.items():
            if value is not None and not isinstance(value, str):
                # YAML reads 01234567 as the octal number 342391 and yes as true: only quoted text stays as written
                raise InvalidRequest(
                    f"--models {path}: entry {index} {key} is not text (YAML read it as {type(value).__name__} {value!r}): quote it, e.g. {key}: \"...\""
                )
        specs.append(ModelSpec(**entry, aliases=tuple(aliases), accept_licences=tuple(accepted), close_call_margin=margin))
    return specs


def check_names(specs: list[ModelSpec]) -> None:
    names = [spec.served_name() for spec in specs] + [alias for spec in specs for alias in spec.aliases]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise InvalidRequest(f"duplicate served model name(s): {', '.join(duplicates)} (give each a name)")
    if SYSTEM_ONE_ALIAS in names:
        raise InvalidRequest(f"{SYSTEM_ONE_ALIAS} is the System One alias of the default (first) model; it cannot name a model")


def model_aliases(specs: list[ModelSpec], names: list[str]) -> dict[str, str]:
    """Every extra name a request may use -> the served model it names: System One's alias of the default
    model, and each model's own aliases."""
    aliases = {SYSTEM_ONE_ALIAS: names[0]} if names else {}
    for spec, name in zip(specs, names):
        aliases.update({alias: name for alias in spec.aliases})
    return aliases
