"""A scheduler's status answers, given again without a read when nothing can have changed them.

NeMo-Run's ``Experiment.status`` asks each task's state twice in a row (its table and its dict), and each look
reads the TrainJob, its JobSet, pods and node 0's progress line. So the same status query again within
``ANSWER_REUSE_S``, with no look at that job (an attached wait's, ``nemo-kubeflow watch``'s, another status
query's) and no write (a submission, a repair, a cancel) in between, gets the same answer without a read. Looks at
other jobs do not count: NeMo-Run asks its tasks from a pool of threads, and its second query of a task comes
while other threads look at theirs.

The answers, and the looks and writes that count, are an object handed to each scheduler, ``StatusAnswers``:
NeMo-Run cancels through another runner's scheduler and waits through a third, so the schedulers torchx makes for
the runners of one process (``create_scheduler``) share one, each with answers of its own; a scheduler made
without one keeps its own.
"""

from __future__ import annotations

import copy
import threading
import time
from typing import Optional

from torchx.schedulers.api import DescribeAppResponse

from nemo_kubeflow.cluster.experiment_snapshot import ExperimentSnapshots

#: A status query answered this recently is answered again without a read (when no look or write came between).
ANSWER_REUSE_S = 1.0


class StatusAnswers:
    """The status answers of the schedulers that share it, each scheduler's by its key, the looks at each job and
    the writes to jobs (a submission, a cancel, a repair) that make them stale, and the snapshots of experiments
    their status queries read (dropped at each write)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._writes = 0
        self._looks: dict[str, int] = {}
        #: (scheduler's key, app id) -> (when, ``_count(app_id)`` then, the answer) of its last status query.
        self._answered: dict[tuple[int, str], tuple[float, tuple[int, int], DescribeAppResponse]] = {}
        self.snapshots = ExperimentSnapshots()

    def looked(self, app_id: str) -> None:
        with self._lock:
            self._looks[app_id] = self._looks.get(app_id, 0) + 1

    def wrote(self) -> None:
        """A write to a job: no status answer or snapshot is given again."""
        self.snapshots.drop()
        with self._lock:
            self._writes += 1

    def _count(self, app_id: str) -> tuple[int, int]:
        """(Writes, looks at ``app_id``) so far, under ``_lock``: an answer kept with another count is stale."""
        return self._writes, self._looks.get(app_id, 0)

    def again(self, scheduler: int, app_id: str) -> Optional[DescribeAppResponse]:
        """The last answer to this status query of that scheduler (a copy), if it may be given again; else None."""
        with self._lock:
            answered = self._answered.get((scheduler, app_id))
            if answered is None or answered[1] != self._count(app_id):
                return None
        if time.monotonic() - answered[0] >= ANSWER_REUSE_S:
            return None
        return copy.deepcopy(answered[2])

    def keep(self, scheduler: int, app_id: str, response: DescribeAppResponse) -> None:
        """The answer a status query of that scheduler just got, after its own look."""
        kept = copy.deepcopy(response)
        with self._lock:
            self._answered[(scheduler, app_id)] = (time.monotonic(), self._count(app_id), kept)
