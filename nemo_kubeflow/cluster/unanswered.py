"""How a client says that its API server does not answer: once, then quietly, then that it is back.

While the API server is down every request is tried ``max_attempts`` times, and a waiting process looks again
and again: at INFO, each retry made some 20 lines every 30 s. The first failed connection of an outage is said
at INFO, with the reason; the retries after it go to DEBUG (``-v``, or the ``nemo_kubeflow`` logger at DEBUG,
shows them); the first request answered after it says at INFO that the API server answers again. What the
user must act on (a look that could not be made, a submission that failed) is said by the caller, as before.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Optional


class Unanswered:
    """One client's outage, if any: when its first failed connection was, and whether it was said."""

    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self._lock = threading.Lock()
        self._since: Optional[float] = None
        self._host = ""

    def retrying(self, host: str, message: str, *args: object) -> None:
        """A connection failed and is tried again: ``message % args`` at INFO if it is the first of an
        outage, else at DEBUG."""
        with self._lock:
            first, self._host = self._since is None, host
            if first:
                self._since = time.monotonic()
        if first:
            self._log.info(
                message + "; the API server at %s does not answer: its retries are logged at DEBUG until it does",
                *args,
                host,
            )
        else:
            self._log.debug(message, *args)

    def answered(self) -> None:
        """The API server answered (anything, errors included): say so once if it had not."""
        if self._since is None:  # the common case, without the lock
            return
        with self._lock:
            since, self._since = self._since, None
        if since is not None:
            self._log.info(
                "the API server at %s answers again (it did not for %.0f s)", self._host, time.monotonic() - since
            )
