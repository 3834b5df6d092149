"""The worker's media slots: a request (or bundle) with images or videos holds one from before its media decode until
it is answered, so `--media-slots` bounds the decoded pixels a worker holds."""

from __future__ import annotations

import threading
import time

from vllm_sr_runtime.errors import ClientGone
from vllm_sr_runtime.server.client_connection import Client


class MediaSlots:
    def __init__(self, count: int):
        self.free = count
        self._changed = threading.Condition()

    def acquire(self, until: float, client: Client) -> bool:
        """Whether a slot was taken by `until` (time.monotonic()); raises ClientGone once the client has left (nothing
        is decoded for nobody)."""
        client.when_gone(self._wake)
        with self._changed:
            while True:
                if client.gone.is_set():
                    raise ClientGone("the client closed its connection while its request waited for a media slot")
                if self.free:
                    self.free -= 1
                    return True
                left = until - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)

    def release(self) -> None:
        with self._changed:
            self.free += 1
            self._changed.notify_all()  # a waiter woken whose client has left does not pass the slot on

    def _wake(self) -> None:
        with self._changed:
            self._changed.notify_all()
