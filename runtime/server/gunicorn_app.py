"""gunicorn application: the master never loads a model (no CUDA/HIP before fork); each worker does."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from gunicorn.app.base import BaseApplication
from gunicorn.arbiter import Arbiter

from vllm_sr_runtime.cpu_threads import cpu_threads, share_among_workers
from vllm_sr_runtime.server.config import ServeConfig
from vllm_sr_runtime.server.listeners import inherits_listeners, prepare_uds, upgrading_from

METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
DEFAULT_WORKER_CONNECTIONS = 1000  # gunicorn's


def upgrade_metrics_dir() -> str | None:
    """The old master's metrics folder, for the new master of a binary upgrade (USR2): the workers of both count into
    it, so the counters /metrics reports go on across the upgrade instead of alternating between two sets."""
    inherited = os.environ.get(METRICS_DIR_ENV)
    if inherits_listeners() and inherited and Path(inherited).is_dir():
        return inherited
    return None


WORKER_LOG_FORMAT = "[%(asctime)s] [%(process)d] [%(levelname)s] %(name)s: %(message)s"
# gunicorn's atoms: client, request line, status, response bytes, milliseconds, and the X-Request-Id the response carries
ACCESS_LOG_FORMAT = '%(h)s "%(r)s" %(s)s %(B)s %(M)sms request_id=%({x-request-id}o)s'


class ServeArbiter(Arbiter):
    """gunicorn's master, but a reload (SIGHUP) retires the old workers only once the new ones have settled (each
    model ready or failed), so the old ones serve meanwhile instead of the socket going unanswered for a load."""

    def newest_have_settled(self) -> bool:
        newest = sorted(self.WORKERS.values(), key=lambda worker: worker.age)[-self.num_workers :]
        return all(self.app.has_settled(worker.pid) for worker in newest)

    def manage_workers(self) -> None:
        if len(self.WORKERS) > self.num_workers and not self.newest_have_settled():
            return
        super().manage_workers()

    def reap_workers(self) -> None:
        super().reap_workers()
        # reload() waits for the old workers to go (reaping, up to graceful_timeout): retire them once the new settled
        if len(self.WORKERS) > self.num_workers and self.newest_have_settled():
            super().manage_workers()


class ServeApplication(BaseApplication):
    def __init__(self, config: ServeConfig, reread: Callable[[], ServeConfig] | None = None):
        """`reread` builds the configuration again (the --models file read anew) for a reload (SIGHUP)."""
        self.config = config
        self.reread = reread
        self.configured = False
        inherited = upgrade_metrics_dir()
        self.metrics_dir = inherited or tempfile.mkdtemp(prefix="vllm-sr-runtime-metrics-")
        self.metrics_dir_inherited = inherited is not None
        self.settled_dir = Path(tempfile.mkdtemp(prefix="vllm-sr-runtime-settled-"))
        os.environ[METRICS_DIR_ENV] = self.metrics_dir
        try:
            super().__init__()  # reads the configuration: a refused --uds ends the start here
        except BaseException:
            self.remove_folders(None)
            raise

    def settled_mark(self, pid: int) -> Path:
        """The file a worker leaves once its models have settled (ready or failed)."""
        return self.settled_dir / str(pid)

    def has_settled(self, pid: int) -> bool:
        return self.settled_mark(pid).exists()

    def reread_config(self) -> None:
        """A reload's configuration; one that cannot be read or checked keeps the models served before (gunicorn
        would stop the master on any error here)."""
        try:
            self.config = self.reread()
        except Exception as exc:  # noqa: BLE001 - whatever it is, the server keeps serving what it had
            logging.getLogger("gunicorn.error").error("reload: the configuration was not changed, keeping the models served before: %s", exc)
        else:
            names = ", ".join(spec.served_name() for spec in self.config.models)
            logging.getLogger("gunicorn.error").info("reload: serving %s", names)

    def load_config(self) -> None:
        if not self.configured:
            # once: a reload keeps its listeners, and preparing the socket again would unlink the one they serve
            uds, host, port = self.config.uds, self.config.host, self.config.port
            self.bind = ([f"unix:{prepare_uds(uds)}"] if uds else []) + ([f"{host}:{port}"] if port is not None else [])
        elif self.reread is not None:
            self.reread_config()
        self.configured = True
        config, bind = self.config, self.bind
        metrics_dir = self.metrics_dir
        settled_mark = self.settled_mark

        def child_exit(server, worker) -> None:
            from prometheus_client import multiprocess

            multiprocess.mark_process_dead(worker.pid, metrics_dir)
            settled_mark(worker.pid).unlink(missing_ok=True)

        def pre_fork(server, worker) -> None:
            # torch's pool reads the share when the worker starts it; a worker forked after a TTIN or TTOU gets the
            # share of the count then (the running ones keep theirs until a reload)
            ServeApplication.cpu_share.update(share_among_workers(server.num_workers, ServeApplication.cpu_share))

        def worker_exit(server, worker) -> None:
            end_native_work(ServeApplication.worker_slots, config.graceful_timeout)

        def post_fork(server, worker) -> None:
            ServeApplication.current_worker = worker
            ServeApplication.others_at_fork = len(server.WORKERS)  # the workers that serve while this one starts
            # a binary upgrade (USR2): the old master's workers share the listeners until the operator stops them
            ServeApplication.old_master_serves = server.master_pid != 0

        settings = {
            "bind": bind,
            "workers": config.workers,
            "worker_class": "gthread",
            "threads": config.request_threads(),
            "worker_connections": max(DEFAULT_WORKER_CONNECTIONS, 2 * config.request_threads()),  # keep-alive room beyond the threads
            "timeout": config.timeout,
            "graceful_timeout": config.graceful_timeout,
            "keepalive": config.keepalive,
            "preload_app": False,
            "control_socket_disable": True,
            "accesslog": "-" if config.access_log else None,
            "access_log_format": ACCESS_LOG_FORMAT,
            "errorlog": "-",
            "loglevel": config.log_level,
            "proc_name": "vllm-sr-runtime",
            "child_exit": child_exit,
            "pre_fork": pre_fork,
            "post_fork": post_fork,
            "worker_exit": worker_exit,
            "umask": 0o077 if config.uds else 0o022,
        }
        for key, value in settings.items():
            self.cfg.set(key, value)

    cpu_share: dict[str, str] = {}  # the master's: what share_among_workers set
    current_worker = None
    worker_slots: list = []  # this worker's models, for its exit
    others_at_fork = 0
    old_master_serves = False

    def run(self) -> None:
        """gunicorn's master; its metrics folder is removed here however it ends (gunicorn's on_exit hook is skipped
        when it cannot bind its address). Workers are forked inside this call and unwind through it too: only the
        master removes."""
        master, arbiter = os.getpid(), None
        try:
            arbiter = ServeArbiter(self)
            arbiter.run()
        except RuntimeError as exc:
            raise SystemExit(f"\nError: {exc}\n") from None  # as gunicorn's own run() ends
        finally:
            if os.getpid() == master:
                self.remove_folders(arbiter)

    def remove_folders(self, arbiter: Arbiter | None) -> None:
        """The master's own folders, as it ends. Under a binary upgrade both masters count into one metrics folder: the
        old master leaves it to the new one it started, and the new one leaves it to the old one while that runs."""
        handed_over = arbiter is not None and arbiter.reexec_pid != 0
        old_master = upgrading_from()
        borrowed = self.metrics_dir_inherited and old_master != 0 and os.getppid() == old_master
        if not handed_over and not borrowed:
            shutil.rmtree(self.metrics_dir, ignore_errors=True)
        shutil.rmtree(self.settled_dir, ignore_errors=True)

    def load(self):
        """Runs in each worker after fork. A worker of the server's first start answers while its models load:
        `/health/live` 200, `/health` 503 with each model's state (the try and last error of a retried load),
        requests 503 with Retry-After, instead of connections that hang until every model is loaded; so does the
        replacement of a lone worker (nothing else could answer). A later worker started while others serve (the
        replacement of one of several, any worker of a reload, whose old workers serve until it has settled, or any
        worker of a binary upgrade's new master, whose old master's workers serve) loads before it accepts
        connections, so it never answers 503 while they serve; a heartbeat keeps gunicorn from timing it out
        meanwhile. Each worker leaves a mark in `settled_dir` once its models have settled."""
        from vllm_sr_runtime.server.app import create_app
        from vllm_sr_runtime.server.slots import ModelSlot
        from vllm_sr_runtime.weight_budget import WeightBudget

        # gunicorn's own line shape, the worker's pid included: with several workers each line says whose it is
        logging.basicConfig(level=self.config.log_level.upper(), format=WORKER_LOG_FORMAT, datefmt="%Y-%m-%d %H:%M:%S %z")
        logging.getLogger("vllm_sr_runtime.server").info("this worker computes on %d CPU thread(s)", cpu_threads())
        worker = ServeApplication.current_worker
        mark = self.settled_mark(os.getpid())
        # gunicorn numbers workers 1, 2, ... as it spawns them: a higher number replaces one, or is a reload's
        replaces_one = worker is not None and worker.age > self.config.workers and ServeApplication.others_at_fork > 0
        started_while_others_serve = replaces_one or ServeApplication.old_master_serves
        names = [spec.served_name() for spec in self.config.models]
        share = self.config.worker_weight_budget()
        budget = WeightBudget(share) if share is not None else None  # this worker's models share it
        slots = [
            ModelSlot(
                spec, self.config, name, accepts_while_loading=not started_while_others_serve, restart_worker=lambda: _restart(worker), weight_budget=budget
            )
            for spec, name in zip(self.config.models, names)
        ]
        ServeApplication.worker_slots = slots
        if started_while_others_serve:
            loading = threading.Event()
            threading.Thread(target=_heartbeat, args=(worker, loading), daemon=True).start()
            try:
                _load_all(slots, mark)
            finally:
                loading.set()
        else:
            threading.Thread(target=_load_all, args=(slots, mark), name="model-load", daemon=True).start()
        return create_app(self.config, slots)


def _load_all(slots, settled_mark: Path) -> None:
    """Every slot's load in a thread of its own, one model loading at a time: a model waiting out a retry's
    back-off (a Hub that does not answer) does not hold the others back. Marks the worker settled at the end."""
    one_at_a_time = threading.Lock()
    threads = [threading.Thread(target=slot.load, args=(one_at_a_time,), name=f"load-{slot.name}", daemon=True) for slot in slots]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    settled_mark.touch()


def end_native_work(slots, timeout: float) -> None:
    """Before a worker's interpreter finalizes. A thread still inside torch or ONNX Runtime then is ended under its C++
    frames and the worker aborts ("terminate called without an active exception", SIGABRT): a forward may still run
    (a request past the graceful timeout, an engine plugin that cannot stop a pass), and a SIGTERM may come mid-load.
    Each model's scheduler interrupts its run and stops; a worker whose load still runs, or whose forward outlasts
    `timeout`, exits at once."""
    until = time.monotonic() + timeout
    running = {slot.name: slot.close(max(0.0, until - time.monotonic())) for slot in slots}
    unfinished = [f"model {name}: {what}" for name, what in running.items() if what]
    if unfinished:
        logging.getLogger("vllm_sr_runtime.server").warning("exiting without waiting for %s", "; ".join(unfinished))
        logging.shutdown()
        os._exit(0)


def _restart(worker) -> None:
    """Ends the worker as gunicorn's own graceful stop does (no new connections; those open are served up to the
    graceful timeout); the master then starts a new one in its place."""
    if worker is not None:
        worker.alive = False


def _heartbeat(worker, done: threading.Event) -> None:
    while not done.wait(1.0):
        worker.notify()
