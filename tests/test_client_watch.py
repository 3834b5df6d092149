"""One watcher per worker tells the waiting requests whose clients have closed their connections (the HTTP side is in
test_server_load: such requests are dropped before their forward)."""

from __future__ import annotations

import socket
import threading
from types import SimpleNamespace

from vllm_sr_runtime.server.client_connection import ClientWatch


def request_on(sock: socket.socket | None) -> SimpleNamespace:
    return SimpleNamespace(env={} if sock is None else {"gunicorn.socket": sock})


def test_a_client_is_gone_once_its_peer_closes_or_half_closes_and_not_before():
    watch = ClientWatch(every_s=3600)  # looked at by hand below
    pairs = {name: socket.socketpair() for name in ("idle", "pipelined", "closed", "half_closed", "reset")}
    called = []
    with (
        watch.watching(request_on(pairs["idle"][0])) as idle,
        watch.watching(request_on(pairs["pipelined"][0])) as pipelined,
        watch.watching(request_on(pairs["closed"][0])) as closed,
        watch.watching(request_on(pairs["half_closed"][0])) as half_closed,
        watch.watching(request_on(pairs["reset"][0])) as reset,
    ):
        closed.when_gone(lambda: called.append("closed"))
        watch.look()
        assert not any(c.gone.is_set() for c in (idle, pipelined, closed, half_closed, reset))
        pairs["pipelined"][1].sendall(b"GET /health HTTP/1.1\r\n\r\n")  # a next request on a kept-alive connection
        pairs["closed"][1].close()
        pairs["half_closed"][1].shutdown(socket.SHUT_WR)
        pairs["reset"][1].setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        pairs["reset"][1].close()
        watch.look()
        watch.look()
        assert [c.gone.is_set() for c in (idle, pipelined, closed, half_closed, reset)] == [False, False, True, True, True]
        assert called == ["closed"]  # once, however many looks
        closed.when_gone(lambda: called.append("late"))  # registered after it left: runs at once
        assert called == ["closed", "late"]
    pairs["idle"][1].close()
    watch.look()
    assert not idle.gone.is_set()  # no longer watched once its request ended
    assert pairs["pipelined"][0].recv(100).startswith(b"GET /health")  # the peeks took nothing


def test_the_watchers_thread_wakes_a_waiting_request_when_its_client_leaves():
    watch = ClientWatch(every_s=0.05)
    ours, theirs = socket.socketpair()
    woken = threading.Event()
    with watch.watching(request_on(ours)) as client:
        client.when_gone(woken.set)
        assert not woken.wait(0.3)
        theirs.close()
        assert woken.wait(5)


def test_a_request_with_no_socket_is_never_gone_and_starts_no_thread():
    watch = ClientWatch(every_s=0.01)
    before = threading.active_count()
    with watch.watching(request_on(None)) as client:
        watch.look()
        assert not client.gone.is_set()
        assert threading.active_count() == before
