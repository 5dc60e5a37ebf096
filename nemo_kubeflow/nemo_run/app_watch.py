"""What the scheduler remembers about one app between looks, and about a cluster that stopped answering.

Lifetime: an ``AppWatch`` is made at the first look at an app (``describe``) in a scheduler, and lives as
long as that scheduler: one per NeMo-Run runner, so the process that waits for the job, or one
``nemo experiment status`` call. Nothing in it is needed to report a job right: a new process reads the
state and the reason from the cluster alone. What it adds is what only a process that keeps looking can
see: the failed pods of gang attempts JobSet has since deleted, the node logs it follows, what it already
said (each progress line and a failure once), and how far node faults were looked at. What the look itself
remembers is its ``LookMemory`` (observe/look_memory.py); the rest is the scheduler's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Optional

from nemo_kubeflow.observe.look_memory import LookMemory

if TYPE_CHECKING:
    from nemo_kubeflow.cluster.watched import WatchedJob


@dataclass
class AppWatch(LookMemory):
    """What the look remembers (``LookMemory``), and what the scheduler said and how it reads the job."""

    #: The last progress line shown in NeMo-Run's console.
    last_progress: str = ""
    #: The end (failure, deletion outside NeMo-Run) was said in the console.
    reported_end: bool = False
    #: The last repair line shown.
    last_repair: str = ""
    #: The job's TrainJob, JobSet and pods from watches, for the looks that repeat (``cluster/watched.py``).
    job_cache: Optional[WatchedJob] = None
    #: Looks of an attached wait or ``nemo-kubeflow watch`` so far (``look_after`` with its repair step).
    looks_after: int = 0


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
