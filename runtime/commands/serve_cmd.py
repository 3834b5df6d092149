"""`vllm-sr-runtime serve [MODEL[@REV] | DIR ...] [--models FILE] ...`: the HTTP server under gunicorn."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from vllm_sr_runtime.cli_options import add_licence_option, add_source_options
from vllm_sr_runtime.cli_values import close_call_margin, non_negative_float, non_negative_int, port, positive_float, positive_int, ranged
from vllm_sr_runtime.profiles import installed_profiles
from vllm_sr_runtime.server.config import MAX_DEADLINE_MS, ModelSpec, ServeConfig, check_names, checked_uds_path, load_models_file
from vllm_sr_runtime.server.preflight import check_models

DEFAULT_FIXTURE = "synthetic-d3-tiny"


def default_model(cache_dir: str | None) -> str:
    """A tiny synthetic Decision 3.0 package in the cache, created on first use (so a first command works).

    Written by a child process: the gunicorn master must not run torch (its OpenMP pool does not survive fork).
    """
    import subprocess
    import sys

    from vllm_sr_runtime.packages.resolve import default_cache_dir

    root = Path(cache_dir) if cache_dir else default_cache_dir()
    target = root / "fixtures" / DEFAULT_FIXTURE
    if not (target / "MODEL_MANIFEST.json").is_file():
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(
                f"no model given, and the cache {root} cannot hold the default synthetic package ({exc.strerror or exc}): "
                "give a model, or a writable --cache-dir (or VLLM_SR_RUNTIME_CACHE_DIR)"
            ) from None
        print(f"no model given: writing a tiny synthetic Decision 3.0 package to {target}", flush=True)
        code = (
            "import sys; from pathlib import Path; from vllm_sr_runtime.artifacts import atomic_directory; "
            "from vllm_sr_runtime.synthetic.writer import write_synthetic_package\n"
            "with atomic_directory(Path(sys.argv[1]), 'MODEL_MANIFEST.json') as temp: write_synthetic_package('decision3', temp, golden=True)"
        )
        if subprocess.run([sys.executable, "-c", code, str(target)]).returncode != 0:
            raise ValueError(f"no model given, and writing the default synthetic package to {target} failed (its error is above)")
    return str(target)


def build_config(args: argparse.Namespace) -> ServeConfig:
    specs: list[ModelSpec] = []
    if args.models:
        specs.extend(load_models_file(args.models))
    for ref in args.model:
        specs.append(ModelSpec(model=ref, base_path=args.base_path))
    if not specs:
        specs.append(ModelSpec(model=default_model(args.cache_dir)))
    if args.served_model_name:
        if len(specs) != 1:
            raise ValueError("--served-model-name needs exactly one model (use name: and aliases: in --models for several)")
        specs[0].name, *extra = args.served_model_name
        specs[0].aliases = (*specs[0].aliases, *extra)
    if args.artifact:
        if len(specs) != 1:
            raise ValueError("--artifact needs exactly one model (use artifact: in --models for several)")
        specs[0].artifact = args.artifact
    check_names(specs)
    if args.uds:
        checked_uds_path(args.uds)
    for spec in specs:
        if spec.close_call_margin is not None and (spec.profile or args.profile) == "exact":
            raise ValueError(f"--models: {spec.served_name()} has a close_call_margin and profile exact, whose answers are the reference's: give it another profile")
    if args.close_call_margin is not None:  # its range: checked by its argparse type
        if all((spec.profile or args.profile) == "exact" for spec in specs):
            raise ValueError("--close-call-margin answers close calls again with profile exact: serve another profile (e.g. --profile max_speed)")
    return ServeConfig(
        models=specs,
        device=args.device,
        profile=args.profile,
        host=args.host or ServeConfig.host,
        # --uds alone listens on the socket only; with --host or --port given too, on TCP as well
        port=args.port if args.port is not None else (None if args.uds and args.host is None else ServeConfig.port),
        uds=args.uds,
        workers=args.workers,
        threads=args.threads,
        max_queue=args.max_queue,
        max_queued_tokens=args.max_queued_tokens,
        memory_budget_gib=args.memory_budget,
        max_request_bytes=args.max_request_bytes,
        max_inflight_request_bytes=args.max_inflight_request_bytes,
        max_bundle_tasks=args.max_bundle_tasks,
        default_deadline_ms=args.deadline_ms,
        batch_window_ms=args.batch_window_ms,
        max_batch_tokens=args.max_batch_tokens,
        max_batch_requests=args.max_batch_requests,
        media_slots=args.media_slots,
        shared_min_tokens=args.shared_min_tokens,
        close_call_margin=args.close_call_margin,
        allow_approximate_shared_context=args.allow_approximate_shared_context,
        media_url_allow=tuple(h.strip() for h in (args.media_url_allow or "").split(",") if h.strip()),
        media_url_allow_private=args.media_url_allow_private,
        media_url_timeout_s=args.media_url_timeout,
        cache_dir=args.cache_dir,
        offline=args.offline,
        accept_licences=tuple(args.accept_licence),
        result_cache_entries=args.result_cache_entries,
        load_attempts=args.load_attempts,
        load_retry_seconds=args.load_retry_seconds,
        log_level=args.log_level,
        access_log=args.access_log,
        graceful_timeout=args.graceful_timeout,
        keepalive=args.keepalive,
    )


def run(args: argparse.Namespace) -> int:
    if args.offline:
        os.environ["HF_HUB_OFFLINE"] = "1"
    config = checked_config(args)
    if config.threads is not None and config.threads <= config.queue_capacity():
        print(
            f"warning: --threads {config.threads} is not above what the model queues hold ({config.queue_capacity()}: --max-queue "
            "times the models): when every thread waits on a forward, /health and /metrics wait behind them",
            file=sys.stderr,
        )
    from vllm_sr_runtime.server.gunicorn_app import ServeApplication

    # a reload (SIGHUP) reads the --models file again and checks it as a start does
    ServeApplication(config, reread=lambda: checked_config(args)).run()
    return 0


def checked_config(args: argparse.Namespace) -> ServeConfig:
    config = build_config(args)
    check_models(config)
    return config


def register(sub) -> None:
    parser = sub.add_parser("serve", help="serve models over HTTP (Falcon under gunicorn, TCP or Unix socket)")
    parser.add_argument("model", nargs="*", help="MODEL[@REV] or package directory (none: a tiny synthetic Decision 3.0 package)")
    parser.add_argument("--models", help="YAML list of {model, revision, name, aliases, device, profile, artifact, base_path, accept_licences, close_call_margin}")
    parser.add_argument("--device", default=ServeConfig.device, help="auto | cpu | cuda[:N] | rocm[:N] (`vllm-sr-runtime devices` lists them and what auto picks)")
    parser.add_argument(
        "--profile", default=ServeConfig.profile, choices=sorted(installed_profiles()),
        help="exact: eager PyTorch, the reference; shared_context: a request's common prefix runs once (exact for causal "
        "models; APPROXIMATE for Decision 3.0's non-causal packages, which lose the prefix-to-question direction of "
        "attention: refused for them unless --allow-approximate-shared-context); batching: rows of concurrent requests "
        "merged; max_speed: ONNX Runtime artifact; others: installed profile plugins (vllm-sr-runtime plugins)",
    )  # fmt: skip
    parser.add_argument("--artifact", help="exported artifact for max_speed (default: exported into the cache on first use)")
    parser.add_argument("--host", help=f"TCP address (default {ServeConfig.host})")
    parser.add_argument("--port", type=port, help=f"TCP port (default {ServeConfig.port})")
    parser.add_argument(
        "--uds", help="listen on this Unix socket (its directory must be 0700) instead of TCP; with --host or --port too, on both "
        "(a router on the socket, Prometheus on TCP)",
    )  # fmt: skip
    parser.add_argument("--workers", type=positive_int, default=ServeConfig.workers, help="gunicorn worker processes (each loads every model)")
    parser.add_argument(
        "--threads", type=positive_int, default=ServeConfig.threads,
        help="request threads per worker (default: --max-queue times the models, plus 8: every queued request waits on a "
        "thread of its own, and /health never waits behind them)",
    )  # fmt: skip
    parser.add_argument("--max-queue", type=positive_int, default=ServeConfig.max_queue, help="queued requests per model and worker before 429")
    parser.add_argument(
        "--memory-budget", type=positive_float, default=None, metavar="GiB",
        help="the memory the models' weights may take, all workers together (each worker holds its own copy: it gets its "
        "share); a model that would pass it fails before its weights load (default: no budget)",
    )
    parser.add_argument(
        "--max-queued-tokens", type=positive_int, default=ServeConfig.max_queued_tokens, metavar="N",
        help="input tokens of the requests queued per model and worker before 429 (a request alone in the queue is always "
        "taken): the queue's work, where --max-queue counts requests however long",
    )  # fmt: skip
    parser.add_argument(
        "--keepalive", type=positive_int, default=ServeConfig.keepalive, metavar="SECONDS",
        help="how long an idle kept-alive connection stays open; behind a proxy that pools connections, keep its upstream "
        "idle timeout below this (Envoy's default is 1 h): a request sent as the server closes the connection fails",
    )  # fmt: skip
    parser.add_argument(
        "--graceful-timeout", type=positive_int, default=ServeConfig.graceful_timeout, metavar="SECONDS",
        help="on SIGTERM (and for a reload's old workers), how long a worker may take to answer its requests in flight and "
        "end a running forward before it is killed (keep the pod's terminationGracePeriodSeconds above it plus --deadline-ms)",
    )  # fmt: skip
    parser.add_argument(
        "--max-request-bytes", type=positive_int, default=ServeConfig.max_request_bytes,
        help="the largest request body, once decoded (413 beyond it; a bundle may be 4 times it)",
    )  # fmt: skip
    parser.add_argument(
        "--max-inflight-request-bytes", type=positive_int, default=ServeConfig.max_inflight_request_bytes,
        help="request-body bytes a worker's requests in flight may hold together before more are answered 429 (default: 8 "
        "times --max-request-bytes; a request alone is always taken)",
    )  # fmt: skip
    parser.add_argument(
        "--max-bundle-tasks", type=positive_int, default=ServeConfig.max_bundle_tasks,
        help="POST /v1/bundle: model calls per bundle (each task body is held to --max-request-bytes)",
    )  # fmt: skip
    parser.add_argument("--deadline-ms", type=ranged(int, 1, MAX_DEADLINE_MS), default=ServeConfig.default_deadline_ms, help=f"default request deadline (requests may set their own, at most {MAX_DEADLINE_MS})")
    parser.add_argument("--batch-window-ms", type=non_negative_float, default=ServeConfig.batch_window_ms, help="batching: wait this long for queued siblings to join")
    parser.add_argument("--max-batch-tokens", type=positive_int, default=ServeConfig.max_batch_tokens, help="batching: padded tokens per shared pass")
    parser.add_argument(
        "--max-batch-requests", type=positive_int, default=ServeConfig.max_batch_requests,
        help="batching: queued requests one run merges (the rest wait for the next run)",
    )  # fmt: skip
    parser.add_argument(
        "--shared-min-tokens", type=non_negative_int, default=ServeConfig.shared_min_tokens,
        help="shared_context: share a request's prefix only when (questions - 1) x prefix tokens reaches this",
    )  # fmt: skip
    parser.add_argument(
        "--close-call-margin", type=close_call_margin, default=None, metavar="M|artifact",
        help="profiles other than exact: answer again with exact (loaded beside, its memory too) every question whose "
        "top-two probability margin is below M, so a faster graph's rounding cannot turn a close call around "
        "(meta.reanswered_questions and /metrics count them); artifact: the margin each model's int8 export measured "
        "on its calibration questions (a model whose artifact recorded none fails to load); close_call_margin in --models sets one model's",
    )  # fmt: skip
    parser.add_argument(
        "--allow-approximate-shared-context", action="store_true",
        help="serve shared_context for non-causal models too, knowing its answers differ from exact (see README)",
    )  # fmt: skip
    parser.add_argument(
        "--media-slots", type=positive_int, default=ServeConfig.media_slots,
        help="Decision 3.0 media: requests with images or videos a worker holds decoded at once; more wait up to their "
        "deadline, then get 429 (each holds its decoded pixels: 7.4 MB for a 640x480 image)",
    )  # fmt: skip
    parser.add_argument(
        "--media-url-allow", help="Decision 3.0 media: hosts whose http(s) image/video URLs may be fetched "
        "(comma list; *.example.com for subdomains, * for any); default: only data URLs",
    )  # fmt: skip
    parser.add_argument("--media-url-allow-private", action="store_true", help="also fetch from loopback/private addresses")
    parser.add_argument("--media-url-timeout", type=positive_float, default=ServeConfig.media_url_timeout_s, help="seconds per media URL fetch")
    parser.add_argument(
        "--served-model-name", action="append",
        help="the name requests use for the model; repeat to add aliases (the System One alias jev-latest always names the first model)",
    )  # fmt: skip
    parser.add_argument(
        "--result-cache-entries", type=non_negative_int, default=ServeConfig.result_cache_entries,
        help="answers of question rows kept per model and worker (LRU, keyed by everything an answer depends on); 0 turns it off",
    )  # fmt: skip
    parser.add_argument(
        "--load-attempts", type=positive_int, default=ServeConfig.load_attempts,
        help="tries per model when loading fails for a transient reason (download, device busy, out of memory while placing); "
        "a verification failure is never retried",
    )  # fmt: skip
    parser.add_argument("--load-retry-seconds", type=non_negative_float, default=ServeConfig.load_retry_seconds, help="first wait between load tries, doubling up to 300 s")
    add_source_options(parser)
    add_licence_option(parser)
    parser.add_argument("--log-level", default=ServeConfig.log_level, choices=["debug", "info", "warning", "error"], help="gunicorn's and the workers' log level")
    parser.add_argument("--access-log", action="store_true", help="log one line per request to stderr: client, request line, status, bytes, ms, request id")
    parser.set_defaults(func=run)
