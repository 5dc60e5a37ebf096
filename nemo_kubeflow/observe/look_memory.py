"""What the look at one app remembers between looks (``observe/look.py``).

Lifetime: made at the first look at an app in a scheduler (as part of its ``AppWatch``,
nemo_run/app_watch.py), it lives as long as that scheduler: one per NeMo-Run runner, so the process that waits
for the job, or one ``nemo experiment status`` call. Nothing in it is needed to report a job right: a new
process reads the state and the reason from the cluster alone. What it adds is what only a process that keeps
looking can see: the failed pods of gang attempts JobSet has since deleted, the node logs it follows, and how
far node faults were looked at.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from nemo_kubeflow.observe.progress_view import ProgressSeen

if TYPE_CHECKING:
    from nemo_kubeflow.observe.kept_logs import NodeLogKeeper
    from nemo_kubeflow.observe.restarts import InJobRestarts


@dataclass
class LookMemory:
    #: Looks that found the job running (from the second, its node logs are kept: a wait polls).
    running_seen: int = 0
    #: Follows each node's log while the job runs; stopped when the job is seen finished.
    keeper: Optional[NodeLogKeeper] = None
    #: When node 0's progress line was last read, and what it said (observe/progress_view.py).
    progress: ProgressSeen = field(default_factory=ProgressSeen)
    #: (when, warning) of the last stall check: NeMo-Run's wait loop polls often.
    stall_checked: tuple[float, str] = (float("-inf"), "")
    #: gang attempt -> how its failed pod ended, as this process saw it: JobSet deletes an attempt's pods
    #: when it restarts the gang, so later looks only have the events.
    failures_seen: dict[int, str] = field(default_factory=dict)
    #: The most ft_launcher restarts the kept node logs showed (old lines leave the keeper).
    in_job_seen: Optional[InJobRestarts] = None
    #: (ft_launcher restarts counted, reads of every node for the last one's cause so far, when the last read
    #: was): a cause not read with the look that counts a restart (the failing node's line not yet logged, a slow
    #: read) is read again at a later look.
    in_job_cause_reads: tuple[int, int, float] = (0, 0, float("-inf"))
    #: (namespace, TrainJob uid, JobSet uids) -> the gang attempt whose node faults were looked at.
    checked_attempts: dict[tuple[str, str, str], int] = field(default_factory=dict)
    #: The task's role, read from its TrainJob while it existed.
    role: str = ""
    #: This process cancelled the job (a TrainJob gone otherwise was deleted outside NeMo-Run).
    cancelled_here: bool = False
