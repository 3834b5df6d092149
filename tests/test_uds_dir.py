"""--uds: the socket's private directory when servers start side by side (two made it at once in CI)."""

from __future__ import annotations

import os
import stat
import threading

import pytest

from vllm_sr_runtime.errors import InvalidRequest
from vllm_sr_runtime.server.listeners import prepare_uds


def test_servers_starting_together_share_a_new_private_socket_directory(tmp_path):
    for attempt in range(40):
        parent = tmp_path / f"run{attempt}" / "sockets"
        barrier, failures = threading.Barrier(4), []

        def start(index: int) -> None:
            barrier.wait()
            try:
                prepare_uds(str(parent / f"server{index}.sock"))
            except Exception as exc:  # noqa: BLE001 - any failure of a concurrent start is the bug
                failures.append(exc)

        threads = [threading.Thread(target=start, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not failures
        assert stat.S_IMODE(parent.stat().st_mode) == 0o700


def test_a_socket_directory_others_can_enter_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o755)
    with pytest.raises(InvalidRequest, match="accessible to other users"):
        prepare_uds(str(shared / "server.sock"))


def test_a_stale_socket_is_replaced_and_a_live_one_refused(tmp_path, monkeypatch):
    import socket

    folder = tmp_path / "sockets"
    folder.mkdir(mode=0o700)
    path = folder / "server.sock"
    monkeypatch.delenv("GUNICORN_FD", raising=False)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        listener.listen(1)
        with pytest.raises(InvalidRequest, match="another server is listening on this socket"):
            prepare_uds(str(path))
        assert path.is_socket()
        monkeypatch.setenv("GUNICORN_FD", "3")  # a binary upgrade's new master: the listener is its inheritance
        assert prepare_uds(str(path)) == str(path) and path.is_socket()
        monkeypatch.delenv("GUNICORN_FD")
    # the listener is closed, its file left behind (a server that was killed): removed for the new server to bind
    assert path.is_socket()
    assert prepare_uds(str(path)) == str(path) and not path.exists()
