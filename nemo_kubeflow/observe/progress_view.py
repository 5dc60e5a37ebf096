"""A running job's progress, as its rank 0 reports it (``nemo_kubeflow.progress``): step N of M, rate, ETA
and the latest metrics, and the stall warning that progress allows. Reads only.

Where it comes from, cheapest first:

* ``status.trainerStatus`` (Trainer's TrainJobStatus feature gate on): in the TrainJob that ``describe``
  has already read, so no request at all.
* Else rank 0's marked log line (``progress.LINE_MARKER``): from node 0's lines this process already has
  (a waiting process follows the node logs; an ft_launcher job's look reads them for its restarts), else one
  log read of node 0's newest pod, its last ``TAIL_LINES`` lines, at most once per ``RECHECK_S`` (and, where the
  look read only the pods not running, a metadata-only list of node 0's pods for its name).

A job that reports nothing reads as no progress, and the stall warning then falls back to log silence.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Iterable, Optional

from nemo_kubeflow import progress as reporting
from nemo_kubeflow.constants import COMPLETION_INDEX_LABEL, JOBSET_NAME_LABEL, REPLICATED_JOB_LABEL, TRAINER_NODE
from nemo_kubeflow.errors import ClusterError, ClusterUnreachableError
from nemo_kubeflow.observe.status import newest_pods_by_node

if TYPE_CHECKING:
    from nemo_kubeflow.cluster.client import ClusterReader
    from nemo_kubeflow.observe.diagnosis import JobView
    from nemo_kubeflow.observe.logs import NodeLogKeeper

#: How much of node 0's log the fallback reads: a progress line followed by more lines is not seen (the
#: reporter writes one per interval, 30 s by default; the status server has no such limit).
TAIL_LINES = 500
#: A process that keeps looking (an attached wait) reads the log line again at most this often.
RECHECK_S = 10.0

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Progress:
    step: Optional[int]
    total_steps: Optional[int]
    percent: Optional[int]
    steps_per_second: Optional[float]
    eta_seconds: Optional[int]
    #: The user's metrics, as reported (name -> text).
    metrics: dict[str, str]
    #: When rank 0 reached the step (its clock).
    updated: Optional[datetime]
    #: "trainerStatus" or "log".
    source: str

    def age(self, now: datetime) -> Optional[float]:
        return (now - self.updated).total_seconds() if self.updated else None

    def text(self) -> str:
        """``step 250 of 1000 (25%), 2.5 steps/s, ETA 5m 0s; loss=1.23, lr=0.0003 (at 09:00:12 UTC)``: the same
        until rank 0 reports again (a wait and ``watch`` print each change)."""
        if self.step is not None:
            where = f"step {self.step}" + (f" of {self.total_steps}" if self.total_steps else "")
            where += f" ({self.percent}%)" if self.percent is not None else ""
        else:
            where = f"{self.percent}% done" if self.percent is not None else "progress reported"
        parts = [where]
        if self.steps_per_second is not None:
            parts.append(f"{self.steps_per_second:.3g} steps/s")
        if self.eta_seconds is not None:
            parts.append(f"ETA {format_duration(self.eta_seconds)}")
        text = ", ".join(parts)
        if self.metrics:
            text += "; " + ", ".join(f"{k}={v}" for k, v in self.metrics.items())
        return text + (f" (at {self.updated.strftime('%H:%M:%S')} UTC)" if self.updated else "")


def format_duration(seconds: int) -> str:
    """``42 s``, ``5m 3s``, ``2h 5m``, ``3d 4h``."""
    if seconds < 60:
        return f"{seconds} s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {secs}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {minutes}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h"


def _time(text: Optional[str]) -> Optional[datetime]:
    if not text:
        return None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)).astimezone(timezone.utc)


def _int(text: object) -> Optional[int]:
    try:
        return int(str(text))
    except (TypeError, ValueError):
        return None


def _float(text: object) -> Optional[float]:
    try:
        return float(str(text))
    except (TypeError, ValueError):
        return None


def from_trainjob(trainjob: dict) -> Optional[Progress]:
    """``status.trainerStatus`` (written through Trainer's status server), or None."""
    status = (trainjob.get("status") or {}).get("trainerStatus")
    if not status:
        return None
    metrics = {str(m.get("name")): str(m.get("value")) for m in status.get("metrics") or [] if m.get("name")}
    step, total = _int(metrics.pop(reporting.STEP_METRIC, None)), _int(metrics.pop(reporting.TOTAL_METRIC, None))
    rate = _float(metrics.pop(reporting.RATE_METRIC, None))
    return Progress(step, total, status.get("progressPercentage"), rate, status.get("estimatedRemainingSeconds"),
                    metrics, _time(status.get("lastUpdatedTime")), "trainerStatus")


def from_log_lines(lines: Iterable[str]) -> Optional[Progress]:
    """The last marked progress line among ``lines`` (a prefix before the marker, torchrun's, is allowed)."""
    found = None
    for line in lines:
        at = line.find(reporting.LINE_MARKER)
        if at < 0:
            continue
        try:
            fields = json.loads(line[at + len(reporting.LINE_MARKER):])
        except ValueError:
            continue
        if isinstance(fields, dict):
            found = fields
    if found is None:
        return None
    step, total = _int(found.get("step")), _int(found.get("total_steps"))
    percent = max(0, min(100, step * 100 // total)) if step is not None and total else None
    metrics = found.get("metrics")
    metrics = metrics if isinstance(metrics, dict) else {}
    return Progress(step, total, percent, _float(found.get("steps_per_second")), _int(found.get("eta_seconds")),
                    {str(k): str(v) for k, v in metrics.items()}, _time(found.get("time")), "log")


@dataclass
class ProgressSeen:
    """What a process that keeps looking remembers: when it last read the log line, and what it found."""

    read_at: float = float("-inf")
    #: Kept across looks: a new pod's log (after a gang restart) has no line until rank 0 reports again.
    last: Optional[Progress] = None


def read(cluster: "ClusterReader", view: "JobView", seen: Optional[ProgressSeen] = None,
         keeper: Optional["NodeLogKeeper"] = None) -> Optional[Progress]:
    """The job's progress: its TrainJob's ``trainerStatus``; else node 0's log line, from the lines this
    process already has (the ``keeper`` of a waiting process, or those this look read for ft_launcher's
    restarts), else from one log read (throttled with ``seen``)."""
    reported = from_trainjob(view.trainjob)
    if reported is not None:
        return reported
    at_hand = keeper.kept_lines().get(0) if keeper is not None else view.node_lines.get(0)
    if at_hand is not None:
        found = from_log_lines(at_hand)
        if seen is not None:
            seen.last = found or seen.last
            return seen.last
        return found
    if seen is not None and time.monotonic() - seen.read_at < RECHECK_S:
        return seen.last
    try:
        pod = _node_zero_pod(cluster, view)
        if pod is None:
            return seen.last if seen is not None else None
        found = from_log_lines(cluster.pod_log(pod["metadata"]["name"], view.namespace, container=TRAINER_NODE,
                                               tail_lines=TAIL_LINES))
    except ClusterUnreachableError:
        raise  # describe reports the outage
    except ClusterError as error:  # the log cannot be read now: no progress to show, not a state
        log.debug("cannot read node 0's log of %s: %s", view.name, error)
        found = None
    if seen is not None:
        seen.read_at = time.monotonic()
        seen.last = found or seen.last
        return seen.last
    return found


def _node_zero_pod(cluster: "ClusterReader", view: "JobView") -> Optional[dict]:
    """Node 0's newest pod: among the pods the look read, or, where a running job's look read only the pods
    that are not running (``JobView.read_running``), from the metadata of node 0's pods (one small list)."""
    if view.jobset is None:
        return newest_pods_by_node(view.node_pods).get(0)
    selector = (f"{JOBSET_NAME_LABEL}={view.name},{REPLICATED_JOB_LABEL}={TRAINER_NODE},"
                f"{COMPLETION_INDEX_LABEL}=0")
    return newest_pods_by_node(cluster.list_metadata("Pod", view.namespace, selector)).get(0)


def stall_message(found: Progress, seconds: int, now: datetime) -> str:
    """The stall warning from progress: no new step for ``seconds`` ("" when there was one)."""
    age = found.age(now)
    if age is None or age < seconds:
        return ""
    step = f"step {found.step}" if found.step is not None else "its last progress report"
    return (f"warning: no new step for {format_duration(int(age))} (stall_warning_seconds={seconds}): rank 0 "
            f"reported {step} last (a hung collective? a stuck data loader?); see the node logs")
