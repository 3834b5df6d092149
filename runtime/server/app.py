"""The Falcon app: validation and rendering on the request thread, forwards on the model's scheduler thread.

Every error becomes the `{"error": {"code", "message"}}` envelope in one place (`_handle_error`).
"""

from __future__ import annotations

import copy
import logging
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from typing import Any

import falcon
import orjson
import yaml

from vllm_sr_runtime.errors import ClientGone, InvalidRequest, ModelNotFound, NotReady, Overloaded, RequestTooLarge, RuntimeServiceError
from vllm_sr_runtime.families.answers import error_answer
from vllm_sr_runtime.families.questions import check_state
from vllm_sr_runtime.profiles import profile_named
from vllm_sr_runtime.server import metrics
from vllm_sr_runtime.server.body_budget import BodyBudget
from vllm_sr_runtime.server.body_encoding import decoded_body
from vllm_sr_runtime.server.client_connection import Client, ClientWatch
from vllm_sr_runtime.server.config import MAX_DEADLINE_MS, ServeConfig, model_aliases
from vllm_sr_runtime.server.media_slots import MediaSlots
from vllm_sr_runtime.server.slots import ModelSlot

log = logging.getLogger("vllm_sr_runtime.server")
BODY_FIELDS = {"model", "state", "questions", "options", "images", "videos"}
OPTION_FIELDS = {"deadline_ms", "profile", "return_meta"}
BUNDLE_SURFACES = ("decisions", "systemone")
BUNDLE_BODY_FACTOR = 4  # a bundle's body may be this many times --max-request-bytes; each task's body is held to it alone


def _json(resp: falcon.Response, status: int, body: Any) -> None:
    resp.status = falcon.code_to_http_status(status)
    resp.content_type = falcon.MEDIA_JSON
    resp.data = orjson.dumps(body)


OPENAPI = yaml.safe_load(resources.files("vllm_sr_runtime.server").joinpath("openapi.yaml").read_text())
LOADING_RETRY_AFTER_S = 5  # Retry-After of a 503 from a model still loading or warming, or restarting after a device fault (one that failed to load has none)
DISCARD_BYTES = 64 * 1024 * 1024  # how much of an over-limit body is read and dropped before answering 413


def checked_deadline(deadline: Any) -> int:
    """A request's deadline_ms (or serve's --deadline-ms, bounded alike on the command line)."""
    if isinstance(deadline, bool) or not isinstance(deadline, int) or not 1 <= deadline <= MAX_DEADLINE_MS:
        raise InvalidRequest(f"options.deadline_ms must be an integer in 1..{MAX_DEADLINE_MS}")
    return deadline


def body_stream(req: falcon.Request):
    """The request body. falcon's bounded stream stops at Content-Length, which a chunked body (Go's and Envoy's
    streaming clients send one) does not have: it would read as empty. A server that ends the input itself
    (gunicorn says so with wsgi.input_terminated) is read to its end."""
    if req.content_length is None and req.env.get("wsgi.input_terminated"):
        return req.stream
    return req.bounded_stream


class Server:
    def __init__(self, config: ServeConfig, slots: list[ModelSlot]):
        self.config = config
        self.slots = {slot.name: slot for slot in slots}
        self.aliases = model_aliases(config.models, list(self.slots))
        self.body_budget = BodyBudget(config.inflight_request_bytes(), metrics.INFLIGHT_BODY_BYTES.set)
        self.media_slots = MediaSlots(config.media_slots)
        self.client_watch = ClientWatch()
        for slot in slots:
            slot.aliases = sorted(alias for alias, name in self.aliases.items() if name == slot.name)

    # -- request parsing -----------------------------------------------------------------------------
    @contextmanager
    def held_body(self, req: falcon.Request, limit: int | None = None) -> Iterator[dict]:
        """The request's body, read and parsed, its bytes held in the worker's budget until the request ends."""
        limit = limit or self.config.max_request_bytes
        if req.content_length is not None and req.content_length > limit:
            self.discard_body(req)
            raise RequestTooLarge(f"request body is {req.content_length} bytes, the limit is {limit}")
        # a body of unknown length, or compressed, may take the whole limit once read and decoded
        plain = req.content_length is not None and not req.get_header("Content-Encoding")
        try:
            holding = self.body_budget.reserve(req.content_length if plain else limit)
        except Overloaded:
            self.discard_body(req)  # so that a client writing its whole body first reads the 429
            raise
        try:
            body, size = self.read_body(req, limit)
            holding.settle(size)
            yield body
        finally:
            holding.release()

    def read_body(self, req: falcon.Request, limit: int) -> tuple[dict, int]:
        """The parsed body and its size once read and decoded."""
        raw = body_stream(req).read(limit + 1)
        if len(raw) > limit:
            self.discard_body(req)
            raise RequestTooLarge(f"request body is over the limit of {limit} bytes")
        raw = decoded_body(raw, req.get_header("Content-Encoding"), limit)
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise InvalidRequest(f"request body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise InvalidRequest("request body must be a JSON object")
        return body, len(raw)

    @staticmethod
    def discard_body(req: falcon.Request) -> None:
        """Read and drop what the client sends beyond the limit, up to DISCARD_BYTES, so that a client that
        writes its whole body before reading (http.client does) reads the 413 instead of a broken pipe; on a
        Unix socket the small kernel buffers fill long before TCP's do. What is left beyond that bound is
        gunicorn's to drain or drop before the connection's next request (it ignores an application's Connection
        header, so the answer cannot close the connection itself)."""
        stream, left = body_stream(req), DISCARD_BYTES
        while left > 0 and (chunk := stream.read(min(left, 1 << 20))):
            left -= len(chunk)

    def validate(self, body: dict, default_deadline_ms: int | None = None) -> tuple[ModelSlot, dict]:
        if "instructions" in body:
            raise InvalidRequest("top-level 'instructions' is not part of the contract: give each question its own instructions")
        unknown = sorted(set(body) - BODY_FIELDS)
        if unknown:
            raise InvalidRequest(f"unknown field(s): {', '.join(unknown)}")
        if "state" not in body:
            raise InvalidRequest("'state' is required (a string, object or array)")
        check_state(body["state"])
        options = body.get("options") or {}
        if not isinstance(options, dict):
            raise InvalidRequest("'options' must be an object")
        bad = sorted(set(options) - OPTION_FIELDS)
        if bad:
            raise InvalidRequest(f"unknown option(s): {', '.join(bad)}")
        deadline = checked_deadline(options.get("deadline_ms", default_deadline_ms or self.config.default_deadline_ms))
        if "return_meta" in options and not isinstance(options["return_meta"], bool):
            raise InvalidRequest("options.return_meta must be a boolean")
        if "profile" in options and not isinstance(options["profile"], str):
            raise InvalidRequest("options.profile must be a string")
        slot = self.select(body.get("model"))
        for media in ("images", "videos"):
            value = body.get(media)
            if value is None:
                continue
            if not isinstance(value, list):
                raise InvalidRequest(f"'{media}' must be a list of data URLs")
            # Decoded (with every limit) by the model's family when the request is planned; text-only
            # models refuse non-empty lists there.
        profile = options.get("profile", slot.profile)
        if slot.ready and profile not in slot.profiles:  # a model still loading is a 503 (prepare), whatever it will enable
            raise InvalidRequest(f"profile {profile!r} is not enabled for model {slot.name} (enabled: {', '.join(slot.profiles)})")
        return slot, {"deadline_ms": deadline, "return_meta": options.get("return_meta", False), "profile": profile}

    def select(self, name: Any) -> ModelSlot:
        if name is None:
            if len(self.slots) == 1:
                return next(iter(self.slots.values()))
            raise InvalidRequest(f"'model' is required when several models are served ({', '.join(self.slots)})")
        if not isinstance(name, str):
            raise InvalidRequest("'model' must be a string")
        name = self.aliases.get(name, name)
        if name not in self.slots:
            raise ModelNotFound(f"model {name!r} is not served here (served: {', '.join(self.slots)})")
        return self.slots[name]

    def lagging_models(self) -> list[str]:
        """Models ready in this worker but not yet in every worker answering requests (with several workers, a
        probe or a router reaches one, and a sibling still loading would answer 503)."""
        everywhere = metrics.ready_in_every_worker() or {}
        return [name for name, slot in self.slots.items() if slot.ready and not everywhere.get(name, True)]

    def openapi_document(self) -> dict:
        """The contract as this deployment accepts it: the served model names and aliases, the profiles they
        enable, and no media lists unless a ready model reads them (a schema-driven client then sends nothing
        the server refuses)."""
        document = copy.deepcopy(OPENAPI)
        schema = document["components"]["schemas"]["DecisionRequest"]
        if len(self.slots) > 1:
            schema["required"] = [*schema["required"], "model"]  # only one served model may be left implicit
        request = schema["properties"]
        request["model"]["enum"] = sorted(set(self.slots) | set(self.aliases))
        request["options"]["properties"]["profile"]["enum"] = sorted({p for slot in self.slots.values() for p in slot.profiles})
        if not any(slot.ready and slot.model.reads_media for slot in self.slots.values()):
            for media in ("images", "videos"):
                request[media]["maxItems"] = 0
        return document

    # -- the decision endpoints ---------------------------------------------------------------------
    def decide(self, req: falcon.Request, resp: falcon.Response, endpoint: str) -> None:
        started = time.perf_counter()
        with self.held_body(req) as body:
            slot, options = self.admitted(body)
            with self.client_watch.watching(req) as client, self.media_slot([body], options["deadline_ms"], started, client):
                call = self.planned(slot, options, body, started)
                job = self.submit(call, client)
                payload, timing = self.finish(call, job)
        serialize_start = time.perf_counter()
        data = orjson.dumps(payload)
        serialize = time.perf_counter() - serialize_start
        resp.status = falcon.HTTP_200
        resp.content_type = falcon.MEDIA_JSON
        resp.data = data
        resp.set_header("Server-Timing", timing + f", serialize;dur={serialize * 1000:.3f}")

    def prepare(self, body: dict, started: float, default_deadline_ms: int | None = None) -> "Call":
        """Validate and render one request (the request thread); raises the request-level errors."""
        return self.planned(*self.admitted(body, default_deadline_ms), body, started)

    def admitted(self, body: dict, default_deadline_ms: int | None = None) -> tuple[ModelSlot, dict]:
        """The request's model and options once its body is valid and its model ready."""
        slot, options = self.validate(body, default_deadline_ms)
        if not slot.ready:
            raise NotReady(
                f"model {slot.name} is {slot.state}" + (f": {slot.reason}" if slot.reason else ""),
                retry_after_s=None if slot.state == "failed" and not slot.restarting else LOADING_RETRY_AFTER_S,
            )
        return slot, options

    def planned(self, slot: ModelSlot, options: dict, body: dict, started: float) -> "Call":
        """The admitted request rendered (its media decoded) into its model's passes."""
        plan = slot.model.plan(body["state"], body.get("questions"), profile=options["profile"], images=body.get("images"), videos=body.get("videos"))
        return Call(slot, options, plan, started, time.perf_counter(), deadline_at(started, options["deadline_ms"]))

    @staticmethod
    def submit(call: "Call", client: Client):
        """Queue the request's passes on its model's scheduler (None when every question errored already); the job is
        abandoned if its client leaves."""
        if not call.plan.batches:
            return None
        job = call.slot.scheduler.submit(call.plan, call.deadline, mergeable=profile_named(call.options["profile"]).merges_requests)
        client.when_gone(job.abandon)
        return job

    def finish(self, call: "Call", job) -> tuple[dict, str]:
        """Wait for the request's answers (to its deadline) and build its payload; returns (payload, Server-Timing).
        Raises ClientGone when its client left before its answers came (its job dropped unless already running)."""
        slot, options, plan = call.slot, call.options, call.plan
        queue_s = forward_s = 0.0
        cache_hits = reanswered = 0
        if job is not None:
            finished = job.done.wait(max(0.0, call.deadline - time.monotonic()))
            if not finished:
                job.give_up()  # its run stops early if nobody else waits for it
            if job.abandoned and (job.finished is None or job.interrupted):
                raise ClientGone("the client closed its connection while its request waited for its answers")
            queue_s, forward_s = job.queue_seconds, job.forward_seconds
            if finished and job.error is not None:
                raise job.error
            if finished and job.response is not None:
                answers, tokens = job.response.answers, job.response.input_tokens
                cache_hits, reanswered = job.response.cache_hits, job.response.reanswered
            else:
                answers = {q.id: plan.errors.get(q.id) or error_answer(q.type, "deadline_exceeded", f"not answered within {options['deadline_ms']} ms") for q in plan.questions}
                tokens = 0
        else:
            answers = {q.id: plan.errors[q.id] for q in plan.questions}
            tokens = 0
        labels = {"model": slot.name, "profile": options["profile"]}
        metrics.QUEUE_SECONDS.labels(**labels).observe(queue_s)
        metrics.FORWARD_SECONDS.labels(**labels).observe(forward_s)
        metrics.INPUT_TOKENS.labels(**labels).inc(tokens)
        if reanswered:
            metrics.CLOSE_CALLS.labels(**labels).inc(reanswered)
        for answer in answers.values():
            metrics.QUESTIONS.labels(**labels, type=answer["type"], outcome=answer.get("error", "answered")).inc()
        payload = {"model": slot.name, "answers": answers, "usage": {"input_tokens": tokens, "output_tokens": 0}}
        if options["return_meta"]:
            card = slot.model.card()
            payload["meta"] = {
                "revision": card.get("revision"), "model_sha256": card["model_sha256"], "profile": options["profile"],
                "numerics": card["dtype"], "engine": card["engine"], "accelerator": card["accelerator"], "device": card["device"],
                "queue_ms": round(queue_s * 1000, 3), "compute_ms": round(forward_s * 1000, 3),
                "cached_questions": cache_hits, "reanswered_questions": reanswered,
            }  # fmt: skip
        timing = (
            f"parse;dur={(call.parsed - call.started) * 1000:.3f}, queue;dur={queue_s * 1000:.3f}, forward;dur={forward_s * 1000:.3f}"
        )
        return payload, timing

    # -- the bundle endpoint -------------------------------------------------------------------------
    def bundle(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Several model calls in one request: every task answered exactly as it would be alone (its status and
        body), in task order; a bad task never fails its siblings. All tasks are queued before any is awaited,
        so tasks for one model share its scheduler (and `batching` merges them)."""
        started = time.perf_counter()
        with self.held_body(req, BUNDLE_BODY_FACTOR * self.config.max_request_bytes) as body:
            tasks, default_deadline = self.validate_bundle(body)
            media_bodies = [task["body"] for task in tasks if isinstance(task["body"], dict)]
            with (
                self.client_watch.watching(req) as client,
                self.media_slot(media_bodies, default_deadline or self.config.default_deadline_ms, started, client),
            ):
                results = self.answer_tasks(tasks, default_deadline, started, request_id(req), client)
        metrics.BUNDLE_TASKS.observe(len(tasks))
        for result, task in zip(results, tasks):
            metrics.REQUESTS.labels(endpoint=f"bundle:{task['surface']}", status=str(result["status"])).inc()
        _json(resp, 200, {"results": results})

    def answer_tasks(
        self, tasks: list[dict], default_deadline: int | None, started: float, request_id: str, client: Client
    ) -> list[dict]:
        queued: list[tuple[Call, Any] | dict] = []  # a call on its way, or the task's result when it failed first
        where = [f"request {request_id} task {index}" for index in range(len(tasks))]
        for index, task in enumerate(tasks):
            try:
                size = len(orjson.dumps(task["body"]))
                if size > self.config.max_request_bytes:
                    raise RequestTooLarge(f"request body is {size} bytes, the limit is {self.config.max_request_bytes}")  # as compact JSON
                if not isinstance(task["body"], dict):
                    raise InvalidRequest("request body must be a JSON object")
                call = self.prepare(task["body"], started, default_deadline)
                queued.append((call, self.submit(call, client)))
            except Exception as exc:  # the task's own error, as it would be answered alone
                queued.append(error_result(exc, where[index]))
        results = []
        for index, entry in enumerate(queued):
            if isinstance(entry, dict):
                results.append(entry)
                continue
            try:
                results.append({"status": 200, "body": self.finish(*entry)[0]})
            except ClientGone:
                raise  # not the task's own error: the client left, abandoning every task's job
            except Exception as exc:
                results.append(error_result(exc, where[index]))
        return results

    @contextmanager
    def media_slot(self, bodies: list[dict], deadline_ms: int, started: float, client: Client) -> Iterator[None]:
        """A request (or bundle) that carries images or videos holds one of the worker's media slots from before its
        media decode until it is answered: its decoded pixels (7.4 MB for a 3 kB PNG of 640x480) are held that long,
        so --media-slots bounds them. One that finds none free waits, for what is left of its deadline (a bundle's,
        else the server's default), or until its client leaves (ClientGone: nothing is decoded for nobody)."""
        if not any(body.get("images") or body.get("videos") for body in bodies):
            yield
            return
        if not self.media_slots.acquire(deadline_at(started, deadline_ms), client):
            raise Overloaded(f"every media slot of this worker (--media-slots {self.config.media_slots}) held a request with images or videos until its deadline; retry later", "media_slots")
        metrics.MEDIA_SLOTS_HELD.inc()
        try:
            yield
        finally:
            metrics.MEDIA_SLOTS_HELD.dec()
            self.media_slots.release()

    def validate_bundle(self, body: dict) -> tuple[list[dict], int | None]:
        unknown = sorted(set(body) - {"tasks", "options"})
        if unknown:
            raise InvalidRequest(f"unknown field(s): {', '.join(unknown)}")
        tasks = body.get("tasks")
        if not isinstance(tasks, list) or not tasks:
            raise InvalidRequest("'tasks' must be a non-empty list of {surface, body}")
        if len(tasks) > self.config.max_bundle_tasks:
            raise InvalidRequest(f"a bundle holds at most {self.config.max_bundle_tasks} tasks, this one {len(tasks)}")
        for index, task in enumerate(tasks):
            if not isinstance(task, dict) or set(task) != {"surface", "body"}:
                raise InvalidRequest(f"tasks[{index}] must be an object with exactly 'surface' and 'body'")
            if task["surface"] not in BUNDLE_SURFACES:
                raise InvalidRequest(f"tasks[{index}].surface must be one of {', '.join(BUNDLE_SURFACES)}")
        options = body.get("options") or {}
        if not isinstance(options, dict) or set(options) - {"deadline_ms"}:
            raise InvalidRequest("bundle 'options' takes only deadline_ms")
        deadline = options.get("deadline_ms")
        if deadline is not None:
            checked_deadline(deadline)
        return tasks, deadline


@dataclass
class Call:
    """One model call on its way: validated and rendered, then queued, then answered."""

    slot: ModelSlot
    options: dict
    plan: Any
    started: float
    parsed: float
    deadline: float


class DecisionsResource:
    def __init__(self, server: Server, endpoint: str):
        self.server, self.endpoint = server, endpoint

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        self.server.decide(req, resp, self.endpoint)


def answers_head(resource: type) -> type:
    """HEAD is GET without the body (falcon drops it, keeping the headers): what load balancers' health checks send."""
    resource.on_head = resource.on_get
    return resource


class BundleResource:
    def __init__(self, server: Server):
        self.server = server

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        self.server.bundle(req, resp)


@answers_head
class ModelsResource:
    def __init__(self, server: Server):
        self.server = server

    def on_get(self, req, resp) -> None:
        lagging = self.server.lagging_models()
        cards = [slot.card() for slot in self.server.slots.values()]
        for card in cards:
            if card["id"] in lagging:
                card.update(ready=False, every_worker=False)
        _json(resp, 200, {"object": "list", "data": cards})


@answers_head
class HealthResource:
    def __init__(self, server: Server):
        self.server = server

    def on_get(self, req, resp) -> None:
        """This worker's models; ready only when every worker answering for them has them ready."""
        states = {name: slot.status() for name, slot in self.server.slots.items()}
        lagging = self.server.lagging_models()
        for name in lagging:
            states[name]["every_worker"] = False
        ready = not lagging and all(slot.ready for slot in self.server.slots.values())
        if ready:
            status = "ready"
        elif lagging or any(s["status"] in ("loading", "warming") for s in states.values()):
            status = "loading"  # not settled yet, whatever has failed meanwhile (each model's own state says)
        else:
            status = "degraded" if any(s["status"] == "ready" for s in states.values()) else "failed"
        _json(resp, 200 if ready else 503, {"status": status, "models": states})


@answers_head
class LiveResource:
    def on_get(self, req, resp) -> None:
        _json(resp, 200, {"status": "alive"})


@answers_head
class MetricsResource:
    def on_get(self, req, resp) -> None:
        data, content_type = metrics.render()
        resp.content_type = content_type
        resp.data = data


@answers_head
class OpenAPIResource:
    def __init__(self, server: Server):
        self.server = server

    def on_get(self, req, resp) -> None:
        resp.content_type = "application/yaml"
        resp.data = yaml.safe_dump(self.server.openapi_document(), sort_keys=False).encode()


class RequestMetrics:
    """Counts every response by endpoint and status, times it, and tags it with a request id."""

    ENDPOINTS = {"/v1/systemone", "/v1/decisions", "/v1/bundle", "/v1/models", "/health", "/health/live", "/metrics", "/openapi.yaml"}

    def process_request(self, req, resp) -> None:
        req.context.started = time.perf_counter()
        # the client's id, or one of ours: the response carries it, and a failure's log line names it
        req.context.request_id = req.get_header("X-Request-Id") or uuid.uuid4().hex

    def process_response(self, req, resp, resource, req_succeeded) -> None:
        endpoint = req.path if req.path in self.ENDPOINTS else "other"
        status = resp.status.split()[0] if isinstance(resp.status, str) else str(int(resp.status))
        metrics.REQUESTS.labels(endpoint=endpoint, status=status).inc()
        if hasattr(req.context, "started"):
            metrics.REQUEST_SECONDS.labels(endpoint=endpoint).observe(time.perf_counter() - req.context.started)
        resp.set_header("X-Request-Id", request_id(req))


def deadline_at(started: float, deadline_ms: int) -> float:
    """A request's deadline in time.monotonic() seconds. It counts from the request's start (`started`, a
    time.perf_counter()): reading its body and waiting for a media slot spend it too."""
    return time.monotonic() - (time.perf_counter() - started) + deadline_ms / 1000


def request_id(req: falcon.Request) -> str:
    return getattr(req.context, "request_id", None) or req.get_header("X-Request-Id") or uuid.uuid4().hex


def error_response(error: Exception, where: str) -> tuple[int, dict]:
    """The status and `{"error": {"code", "message"}}` envelope of any error (the one place they are made). An
    unexpected one is logged with its traceback and `where` (the request id), which its 500's message names too."""
    if isinstance(error, Overloaded):
        metrics.OVERLOADED.labels(limit=error.limit).inc()
    if isinstance(error, RuntimeServiceError):
        return error.status, error.envelope()
    if isinstance(error, falcon.HTTPError):
        code = {404: "not_found", 405: "method_not_allowed", 415: "unsupported_media_type"}.get(error.status_code, "invalid_request")
        return error.status_code, {"error": {"code": code, "message": error.title + (f": {error.description}" if error.description else "")}}
    log.error("internal error (%s): %s", where, error, exc_info=error)
    return 500, {"error": {"code": "internal_error", "message": f"{type(error).__name__}: the server failed on this request ({where}; the server's log has the details)"}}


def error_result(error: Exception, where: str) -> dict:
    """A bundle task's result for an error: the status and envelope it would get alone."""
    status, envelope = error_response(error, where)
    return {"status": status, "body": envelope}


def _routing_hint(req: falcon.Request, error: Exception) -> str:
    """What a 404 or 405 names besides its title: the path or method asked for, and what exists."""
    if isinstance(error, falcon.HTTPMethodNotAllowed):
        return f": {req.method} {req.path} (allowed: {error.headers.get('Allow', '')})"
    if isinstance(error, falcon.HTTPNotFound) and not error.description:
        return f": {req.path} (paths: {', '.join(sorted(RequestMetrics.ENDPOINTS))})"
    return ""


def _handle_error(req: falcon.Request, resp: falcon.Response, error: Exception, params) -> None:
    status, envelope = error_response(error, f"request {request_id(req)}")
    if status in (404, 405):
        envelope["error"]["message"] += _routing_hint(req, error)
    _json(resp, status, envelope)
    if isinstance(error, RuntimeServiceError):
        retry_after_s = getattr(error, "retry_after_s", None)
        if retry_after_s is not None:
            resp.set_header("Retry-After", str(retry_after_s))
        return
    if isinstance(error, falcon.HTTPError) and error.headers:
        for key, value in error.headers.items():
            resp.set_header(key, value)


def create_app(config: ServeConfig, slots: list[ModelSlot]) -> falcon.App:
    server = Server(config, slots)
    app = falcon.App(middleware=[RequestMetrics()])
    app.req_options.strip_url_path_trailing_slash = True
    app.add_route("/v1/systemone", DecisionsResource(server, "systemone"))
    app.add_route("/v1/decisions", DecisionsResource(server, "decisions"))
    app.add_route("/v1/bundle", BundleResource(server))
    app.add_route("/v1/models", ModelsResource(server))
    app.add_route("/health", HealthResource(server))
    app.add_route("/health/live", LiveResource())
    app.add_route("/metrics", MetricsResource())
    app.add_route("/openapi.yaml", OpenAPIResource(server))
    app.add_error_handler(Exception, _handle_error)
    app.add_error_handler(falcon.HTTPError, _handle_error)
    return app
