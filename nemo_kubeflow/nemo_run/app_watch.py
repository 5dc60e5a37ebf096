"""What the scheduler remembers about one app between looks.

Lifetime: an ``AppWatch`` is made at the first look at an app (``describe``) in a scheduler, and lives as
long as that scheduler: one per NeMo-Run runner, so the process that waits for the job, or one
``nemo experiment status`` call. Nothing in it is needed to report a job right: a new process reads the
state and the reason from the cluster alone. What it adds is what only a process that keeps looking can
see: the failed pods of gang attempts JobSet has since deleted, the node logs it follows, what it already
said (each progress line and a failure once), and how far node faults were looked at. What the look itself
remembers is its ``LookMemory`` (observe/look_memory.py); the rest is the scheduler's.
"""

from __future__ import annotations

from dataclasses import dataclass
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
    #: A look found the job over: a later look reads it from the API server (one GET), not through watches it
    #: would start again (its experiment's, stopped once its last running task ended: three lists each look).
    over: bool = False
    #: The experiment of the job (its TrainJob's ``EXPERIMENT_LABEL``, once read): its tasks share one set of
    #: watches (``cluster/watched.py``).
    experiment: str = ""
