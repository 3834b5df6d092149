"""Whether a request's client is still there while its request waits for a forward."""

from __future__ import annotations

import socket

import falcon


def client_closed(req: falcon.Request) -> bool:
    """True once the client has closed its connection (EOF or a reset on gunicorn's socket). Bytes waiting (a next
    request on a kept-alive connection) or none yet mean it is still there; so does a socket that cannot be peeked."""
    sock = req.env.get("gunicorn.socket")
    if sock is None:
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError, ValueError):  # nothing to read yet; ValueError: a TLS socket takes no flags
        return False
    except OSError:  # reset by the peer
        return True
