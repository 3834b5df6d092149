"""The listeners serve binds, and what a binary upgrade (USR2) hands its new master: gunicorn starts that master with
the old one's listening sockets (GUNICORN_FD) and the old master's pid (GUNICORN_PID, until it promotes the new one)."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

from vllm_sr_runtime.errors import InvalidRequest
from vllm_sr_runtime.server.config import checked_uds_path

INHERITED_LISTENERS_ENV = "GUNICORN_FD"
UPGRADING_MASTER_ENV = "GUNICORN_PID"


def inherits_listeners() -> bool:
    """This master is a binary upgrade's new one: its listeners are the old master's."""
    return bool(os.environ.get(INHERITED_LISTENERS_ENV))


def upgrading_from() -> int:
    """The old master's pid while this one is a binary upgrade's new master not yet promoted; else 0."""
    return int(os.environ.get(UPGRADING_MASTER_ENV) or 0)


def prepare_uds(path: str) -> str:
    """The socket's directory must be private (0700): created so, or refused when others can enter it. A socket left
    by a server that has gone is removed; one a server still listens on is refused (unlinking it would leave that
    server unreachable), unless this master inherits it from the old master of a binary upgrade."""
    socket_path = checked_uds_path(path)
    parent = socket_path.parent
    try:
        parent.mkdir(parents=True, mode=0o700)
        os.chmod(parent, 0o700)
    except FileExistsError:
        pass  # there already, or made by a server starting beside this one (mkdir's mode is 0700 or tighter): checked below
    mode = stat.S_IMODE(parent.stat().st_mode)
    if mode & 0o077:
        raise InvalidRequest(f"--uds directory {parent} is accessible to other users (mode {mode:o}); use a 0700 directory")
    if socket_path.exists():
        if not stat.S_ISSOCK(socket_path.stat().st_mode):
            raise InvalidRequest(f"--uds {socket_path} exists and is not a socket")
        if inherits_listeners():
            return str(socket_path)
        if socket_answers(socket_path):
            raise InvalidRequest(f"--uds {socket_path}: another server is listening on this socket; stop it first, or give another path")
        socket_path.unlink()
    return str(socket_path)


def socket_answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(2.0)
        try:
            probe.connect(str(path))
        except OSError:  # refused (no listener: a stale socket), or not ours to reach
            return False
    return True
