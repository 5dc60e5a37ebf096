"""A cluster whose API server does not answer: what a look says meanwhile, and when it looks again.

While the API server does not answer, a look reports UNKNOWN with since when (never a state it could not
read), said once per outage, and looks again only with backoff; the scheduler keeps one ``Outage`` per
cluster (nemo_run/scheduler.py, ``_observe_or_unknown``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

from nemo_kubeflow.errors import ClusterError

#: After a look finds the API server unreachable, the next look waits this long, doubling up to the most.
OUTAGE_FIRST_BACKOFF_S = 2.0
OUTAGE_MAX_BACKOFF_S = 30.0


@dataclass
class Outage:
    """A cluster whose API server did not answer: since when, and when to look again (backoff)."""

    error: str
    since: float = field(default_factory=time.time)
    delay: float = OUTAGE_FIRST_BACKOFF_S
    next_look: float = field(default_factory=lambda: time.monotonic() + OUTAGE_FIRST_BACKOFF_S)
    said: bool = False

    def failed_again(self, error: str) -> None:
        self.error = error
        self.delay = min(self.delay * 2, OUTAGE_MAX_BACKOFF_S)
        self.next_look = time.monotonic() + self.delay

    def due(self) -> bool:
        return time.monotonic() >= self.next_look

    def since_text(self) -> str:
        return datetime.fromtimestamp(self.since, timezone.utc).strftime("%H:%M:%S UTC")

    def message(self) -> str:
        return (
            f"the API server cannot be reached since {self.since_text()} ({self.error}); the job's state is "
            "unknown, not changed: looking again with backoff"
        )

    def over_message(self) -> str:
        """What a look says when the API server answers again."""
        return (
            f"the API server answers again (unreachable from {self.since_text()} for {time.time() - self.since:.0f} s)"
        )


def short_error(error: ClusterError) -> str:
    """The error without its advice (said once, with the time it started)."""
    return str(error).split("; check the kubeconfig")[0]
