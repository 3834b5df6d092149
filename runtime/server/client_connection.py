"""Whether a request's client is still there while its request waits (for a media slot, for its forward).

One watcher thread per worker looks at every waiting request's connection with one poll() every `every_s`: a
thread per request that woke to peek its own socket cost 0.3 ms of CPU per waiting request per second (8% of a core
with a full default queue of 256), on the GIL the scheduler's thread needs."""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import falcon

CLIENT_CHECK_S = 0.2  # how often the watcher looks at the waiting requests' connections
CLOSED = select.POLLHUP | select.POLLERR | select.POLLNVAL  # an EOF (a close, a half-close) reads as POLLIN: peeked


def socket_closed(sock: socket.socket) -> bool:
    """True once the peer has closed the connection (EOF or a reset). Bytes waiting (a next request on a kept-alive
    connection) or none yet mean it is still there; so does a socket that cannot be peeked."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError, ValueError):  # nothing to read yet; ValueError: a TLS socket takes no flags
        return False
    except OSError:  # reset by the peer
        return True


class Client:
    """A waiting request's client: `gone` is set once it has left, and each `when_gone` callback runs then (on the
    watcher's thread, so each must be quick: set an event, wake a condition)."""

    def __init__(self) -> None:
        self.gone = threading.Event()
        self._callbacks: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def when_gone(self, callback: Callable[[], None]) -> None:
        with self._lock:
            if not self.gone.is_set():
                self._callbacks.append(callback)
                return
        callback()

    def leave(self) -> None:
        with self._lock:
            if self.gone.is_set():
                return
            self.gone.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()


class ClientWatch:
    """Watches the connections of the requests that wait; its thread starts with the first one."""

    def __init__(self, every_s: float = CLIENT_CHECK_S):
        self.every_s = every_s
        self._watched: dict[int, tuple[socket.socket, Client]] = {}  # by id(): one socket may carry several requests in turn
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @contextmanager
    def watching(self, req: falcon.Request) -> Iterator[Client]:
        """The request's client, watched until the block ends. A request with no socket to watch (no gunicorn, a
        test's request) has a client that never leaves."""
        client = Client()
        sock = req.env.get("gunicorn.socket")
        if sock is None:
            yield client
            return
        key = id(client)
        with self._lock:
            self._watched[key] = (sock, client)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="client-watch", daemon=True)
                self._thread.start()
        try:
            yield client
        finally:
            with self._lock:
                del self._watched[key]

    def _run(self) -> None:
        while True:
            time.sleep(self.every_s)
            self.look()

    def look(self) -> None:
        """One look at every watched connection: one poll(), and a peek at those with something to read."""
        with self._lock:
            watched = list(self._watched.values())
        if not watched:
            return
        poller = select.poll()
        by_fd: dict[int, list[tuple[socket.socket, Client]]] = {}
        for sock, client in watched:
            try:
                fd = sock.fileno()
            except (OSError, ValueError):
                continue
            if fd < 0:  # closed under us: its request has ended
                continue
            if fd not in by_fd:
                poller.register(fd, select.POLLIN | CLOSED)
            by_fd.setdefault(fd, []).append((sock, client))
        for fd, events in poller.poll(0):
            for sock, client in by_fd.get(fd, ()):
                if events & CLOSED or socket_closed(sock):
                    client.leave()
