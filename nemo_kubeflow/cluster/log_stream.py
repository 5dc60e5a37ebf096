"""An open stream of a pod's log, or of a watch's events, as ``KubernetesCluster`` opens it: complete lines,
one list per chunk the server sends, and a ``close`` that any thread may call."""

from __future__ import annotations

import socket
import threading
from typing import Iterator


class LogStream:
    """An open ``follow`` stream of a pod's log (or a ``watch``'s events). Iterating gives the complete lines (without newlines)
    of each chunk the server sends, one list per chunk; a line the stream ends in the middle of is
    left out (a read from its second gets it whole). A stream that breaks raises urllib3's
    ``HTTPError`` (or ``OSError``). ``close`` may be called from any thread: it ends an iteration
    waiting for the next chunk at once, and closes the connection."""

    def __init__(self, resp) -> None:
        self._resp = resp
        self._lock = threading.Lock()
        self._reading = False
        self._done = False  # closed, or read to its end: the connection went back to the pool
        #: Set by ``close`` while the stream was open: it did not end by itself.
        self.interrupted = False

    def __iter__(self) -> Iterator[list[str]]:
        with self._lock:
            if self._done:
                return  # closed before it was read
            self._reading = True
        pending = b""
        complete = False
        try:
            for chunk in self._resp.stream(64 * 1024, decode_content=True):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                if lines:
                    yield [line.decode("utf-8", "replace") for line in lines]
            complete = True
        finally:
            with self._lock:
                self._done = True
                if not complete or self.interrupted:
                    self._resp.close()  # not reused: it may be half read, or shut down
                self._resp.release_conn()

    def close(self) -> None:
        with self._lock:
            if self._done:
                return
            self._done = self.interrupted = True
            if not self._reading:
                self._resp.close()
                self._resp.release_conn()
                return
            # Shutting the socket down wakes a read blocked in another thread (closing it would not).
            sock = getattr(getattr(self._resp, "_connection", None), "sock", None)
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
