"""A scheduler's status answers, given again without a read when nothing can have changed them.

NeMo-Run's ``Experiment.status`` asks each task's state twice in a row (its table and its dict), and each look
reads the TrainJob, its JobSet, pods and node 0's progress line. So the same status query again within
``ANSWER_REUSE_S``, with no look or write in between (a look of an attached wait or of ``nemo-kubeflow watch``,
a status query's look, a repair, a cancel), gets the same answer without a read.

Which looks and writes count is an object handed to each scheduler, ``LooksAndWrites``: NeMo-Run cancels through
another runner's scheduler, and waits through a third, so the schedulers torchx makes for the runners of one
process (``create_scheduler``) share one; a scheduler made without one counts its own.
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


class LooksAndWrites:
    """A count of the looks at jobs and the writes to them (a cancel, a repair) by the schedulers that share it,
    and the snapshots of experiments their status queries read (dropped at each write)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self.snapshots = ExperimentSnapshots()

    def looked_or_wrote(self) -> None:
        with self._lock:
            self._count += 1

    def wrote(self) -> None:
        """A write to a job (a submission, a cancel, a repair): no status answer or snapshot is given again."""
        self.snapshots.drop()
        self.looked_or_wrote()

    @property
    def count(self) -> int:
        with self._lock:
            return self._count


class StatusAnswers:
    """One scheduler's status answers; ``looks`` counts the looks and writes that make them stale."""

    def __init__(self, looks: LooksAndWrites) -> None:
        self.looks = looks
        self._lock = threading.Lock()
        #: app id -> (when, ``looks.count`` then, the answer) of its last status query.
        self._answered: dict[str, tuple[float, int, DescribeAppResponse]] = {}

    def again(self, app_id: str) -> Optional[DescribeAppResponse]:
        """The last answer to this status query (a copy), if it may be given again; else None."""
        with self._lock:
            answered = self._answered.get(app_id)
        if answered is None or time.monotonic() - answered[0] >= ANSWER_REUSE_S or answered[1] != self.looks.count:
            return None
        return copy.deepcopy(answered[2])

    def keep(self, app_id: str, response: DescribeAppResponse) -> None:
        """The answer a status query just got, after its own look."""
        answered = (time.monotonic(), self.looks.count, copy.deepcopy(response))
        with self._lock:
            self._answered[app_id] = answered
