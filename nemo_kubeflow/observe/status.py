"""TrainJob status -> TorchX ``AppState``, with the reason. Pure.

Trainer v2.3 sets only three condition types on a TrainJob (``Suspended``,
``Complete``, ``Failed``); "running" has to be read from ``jobsStatus`` (mirrored
from the JobSet) and the pods. The table below is checked in order; the first
row that matches wins.

| TrainJob                          | AppState  | why                                        | ``describe`` also reads (``job_view``)       |
|-----------------------------------|-----------|--------------------------------------------|----------------------------------------------|
| not found (404)                   | CANCELLED | deleted: cancelled, or removed by someone  | nothing                                      |
| condition Complete=True           | SUCCEEDED | every node finished with exit code 0       | nothing                                      |
| condition Failed=True             | FAILED    | JobSet failed after its restarts, deadline | the JobSet, the running pods' metadata and the other pods (``JobView.read_failed``; every pod with in-place restarts), the failed node's last lines (up to 3 failed nodes' when a launcher agent failed without naming the failed rank), each node's log once (with a job dir); Warning events after a gang restart |
| being deleted (deletionTimestamp) | CANCELLED | cancel in progress                         | nothing                                      |
| condition Suspended=True          | PENDING   | waiting for resume or a queue's admission (spec.suspend false: resumed or admitted, Trainer not yet caught up) | nothing; Kueue's Workloads in a queue while spec.suspend |
| ``node`` job ready or succeeded   | RUNNING   | every pod of the job is ready (or done)    | the JobSet and the pods not running (``JobView.read_running``; every pod when a stall check is due, for ft_launcher's restarts, or with in-place restarts); without ``trainerStatus``, node 0's last 500 lines for rank 0's progress line, at most 16 KiB a read and two reads (``progress_view``; the node where rank 0's line was found instead, and up to 8 nodes where node 0's agent is not rank 0); Warning events and the current Job's metadata after a gang restart; an ft_launcher job whose logs this process does not keep: every node's last 2000 lines (one log read per node); past ``stall_warning_seconds``, one short log read per node (throttled). After a gang restart, PENDING ("restarting") while the JobSet's ``RestartingJobSet`` condition is True (v0.12 on) or pods of the new attempt are pending: the counts mirror the JobSet's a reconcile late |
| ``node`` job active, not ready    | PENDING   | pods starting                              | the JobSet, the pods not pending, the first 8 of those not placed and of those starting (``JobView.read_waiting``; every pod before the JobSet), Warning events but kube-scheduler's |
| anything else                     | SUBMITTED | created, pods not there yet                | the same. A node failed on its own beside pods being deleted: RUNNING, "failing" (``JobView.failing``): the Job's ``Failed`` condition, and so JobSet's restart or verdict, waits until its pods ended (Kubernetes 1.31 on) while the counts say no node is active. PENDING once the JobSet exists (a waiting job's state never steps back). The newest refusal of the chain TrainJob -> JobSet -> Jobs -> pods in those Warning events (``refusals.chain_refusal``: a quota, Pod Security, a LimitRange, a ServiceAccount, a policy): PENDING, FAILED where the job can never start as submitted |

``job_status`` needs only the TrainJob (one GET). ``jobsStatus`` mirrors JobSet's
``replicatedJobsStatus``, which counts child *Jobs*, not pods: our runtime has one Job of
N pods, and JobSet counts it ready once all its pods are ready or succeeded. What ``describe``
adds (why a job waits or failed, how often it restarted and why) needs the pods: the last
column is what one describe reads besides the TrainJob, each at most once (``job_view.JobView``).
A suspended TrainJob with Kueue's queue-name label waits for its queue: describe then lists the
namespace's Workloads and ``queue_wait_message`` says why. A job that can never start (an image
the registry does not have, a pod the namespace's rules refuse) is reported FAILED; describe only recommends deleting it, and the repair
step of an attached wait or ``nemo-kubeflow watch`` deletes it (``repair.steps``).

A pod that fails while the JobSet restarts the gang is *not* a job failure: only the
``Failed`` condition, which Trainer sets once the JobSet gives up, is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Optional, Sequence

from torchx.specs import AppState

from nemo_kubeflow.constants import COMPLETION_INDEX_LABEL, queue_name


@dataclass(frozen=True)
class JobStatus:
    state: AppState
    #: Human-readable reason ("" when there is nothing to add).
    message: str


def nested(obj: Optional[dict], *path: str, default: Any = None) -> Any:
    """The value at ``path`` in a Kubernetes object, ``default`` where it, or a level above it, is missing
    or empty (the API server omits empty fields, and writers may send them as null)."""
    value: Any = obj
    for key in path:
        value = (value or {}).get(key)
    return value or default


def true_condition(obj: Optional[dict], ctype: str) -> Optional[dict]:
    """The object's condition of type ``ctype`` when it is True (None otherwise)."""
    for cond in nested(obj, "status", "conditions", default=[]):
        if cond.get("type") == ctype and cond.get("status") == "True":
            return cond
    return None


def condition_text(cond: dict) -> str:
    """ "Reason: message", or whichever of the two the condition has."""
    return ": ".join(text for text in (cond.get("reason"), cond.get("message")) if text)


def _completion_index(pod: dict) -> Optional[int]:
    """The node index of a pod (the Job's completion index label), None when it has none."""
    try:
        return int(nested(pod, "metadata", "labels", COMPLETION_INDEX_LABEL, default=""))
    except ValueError:
        return None


def _created(pod: Optional[dict]) -> str:
    return nested(pod, "metadata", "creationTimestamp", default="")


def newest_pods_by_node(pods: Sequence[dict]) -> dict[int, dict]:
    """The newest pod of each node index (gang restarts leave older pods behind)."""
    newest: dict[int, dict] = {}
    for pod in pods:
        index = _completion_index(pod)
        if index is not None and _created(pod) >= _created(newest.get(index)):
            newest[index] = pod
    return newest


# The rows of the table above after "not found", in its order: each says the state of a TrainJob it
# matches (None when it does not match); the first row that matches wins.


def _finished(trainjob: dict) -> Optional[JobStatus]:
    """Trainer's verdict (condition Complete or Failed): final, whatever else the object says."""
    for ctype, state in (("Complete", AppState.SUCCEEDED), ("Failed", AppState.FAILED)):
        if (cond := true_condition(trainjob, ctype)) is not None:
            return JobStatus(state, condition_text(cond))
    return None


def _being_deleted(trainjob: dict) -> Optional[JobStatus]:
    """A cancel in progress: after the verdict (a finished job's deletion is no cancel)."""
    if nested(trainjob, "metadata", "deletionTimestamp"):
        return JobStatus(AppState.CANCELLED, "TrainJob is being deleted")
    return None


def _suspended(trainjob: dict) -> Optional[JobStatus]:
    """Waiting for a resume or a queue's admission: the ``node`` Job's counts are those of before."""
    cond = true_condition(trainjob, "Suspended")
    if cond is None:
        return None
    if not nested(trainjob, "spec", "suspend", default=False):
        # Resumed (Kueue admitted it, or our submission resumed it), and Trainer has not yet seen it.
        queue = queue_name(trainjob)
        resumed = f"admitted by queue {queue}" if queue else "resumed"
        return JobStatus(AppState.PENDING, f"{resumed}, starting (the TrainJob still says {condition_text(cond)})")
    return JobStatus(AppState.PENDING, f"suspended ({condition_text(cond)})")


def _node_job(trainjob: dict) -> dict:
    """The ``node`` Job's counts in ``jobsStatus`` (mirrored from the JobSet; {} before it counts the Job)."""
    return next((j for j in nested(trainjob, "status", "jobsStatus", default=[]) if j.get("name") == "node"), {})


def _node_job_state(trainjob: dict) -> Optional[JobStatus]:
    """What the ``node`` Job's counts say: ready or done -> running, active -> starting."""
    node_job = _node_job(trainjob)
    if nested(node_job, "ready", default=0) > 0 or nested(node_job, "succeeded", default=0) > 0:
        return JobStatus(AppState.RUNNING, "")
    if nested(node_job, "active", default=0) > 0:
        nodes_total = nested(trainjob, "spec", "trainer", "numNodes", default=0)
        count = f" {nodes_total}" if nodes_total else ""
        return JobStatus(AppState.PENDING, f"starting: waiting for all{count} nodes to be ready")
    return None


_STATE_ROWS: tuple[Callable[[dict], Optional[JobStatus]], ...] = (
    _finished,
    _being_deleted,
    _suspended,
    _node_job_state,
)


def job_status(trainjob: Optional[dict], *, name: str = "") -> JobStatus:
    """The state of a TrainJob from the object alone (one GET): see the table above."""
    if trainjob is None:
        return JobStatus(
            AppState.CANCELLED,
            f"TrainJob {name} no longer exists: it was cancelled or deleted outside NeMo-Run",
        )
    for row in _STATE_ROWS:
        if (status := row(trainjob)) is not None:
            return status
    return JobStatus(AppState.SUBMITTED, "waiting for pods")


def _owned_by(obj: dict, uid: Optional[str], kind: str) -> bool:
    return any(
        ref.get("uid") == uid and ref.get("kind") == kind
        for ref in nested(obj, "metadata", "ownerReferences", default=[])
    )


def owned_workload(workloads: Sequence[dict], trainjob: dict) -> Optional[dict]:
    """The Kueue Workload that stands for ``trainjob`` in its queue (Kueue makes the TrainJob its owner)."""
    uid = nested(trainjob, "metadata", "uid")
    return next((workload for workload in workloads if _owned_by(workload, uid, "TrainJob")), None)


def _workload_conditions(workload: Optional[dict]) -> tuple[dict, dict, dict]:
    """A Kueue Workload's ``Evicted``, ``QuotaReserved`` and ``Admitted`` conditions ({} for one not set)."""
    conditions = {c.get("type"): c for c in nested(workload, "status", "conditions", default=[])}
    evicted, reserved, admitted = (conditions.get(t, {}) for t in ("Evicted", "QuotaReserved", "Admitted"))
    return evicted, reserved, admitted


def _evicted_message(queue: str, evicted: dict) -> str:
    if evicted.get("reason") == "Preempted":  # not a failure: it resumes once admitted again
        return f"preempted, waiting for queue {queue} to admit it again ({condition_text(evicted)})"
    return f"waiting for queue {queue} to admit it again (evicted: {condition_text(evicted)})"


def _admission_checks_message(text: str, admitted: dict) -> str:
    why = condition_text(admitted)
    return f"{text}: quota reserved, waiting for admission checks" + (f" ({why})" if why else "")


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def queue_place(queue: str, pending: Sequence[dict], workload: dict) -> str:
    """ " (12th of 990 in LocalQueue q)": the Workload's place among ``pending`` (Kueue's visibility API's items,
    ``positionInLocalQueue`` from 0); "" when it is not among them (admitted, or the answer is older)."""
    name = nested(workload, "metadata", "name")
    for item in pending:
        if nested(item, "metadata", "name") == name and isinstance(item.get("positionInLocalQueue"), int):
            total = f"{len(pending)}" if len(pending) < 1000 else f"{len(pending)} or more"  # Kueue's page: 1000
            return f" ({_ordinal(item['positionInLocalQueue'] + 1)} of {total} in LocalQueue {queue})"
    return ""


#: A waiting task's place in its message, as ``queue_place`` writes it.
_PLACE = re.compile(r" \(\d+(?:st|nd|rd|th) of \d+(?: or more)? in LocalQueue [^)]*\)")


def without_place(message: str) -> str:
    """``message`` without a waiting task's place in its LocalQueue (``queue_place``): what it waits for, which
    does not change as the queue moves."""
    return _PLACE.sub("", message, count=1)


#: A Workload with none of Kueue's conditions, where no place is read: Kueue writes its reason on the Workloads it
#: tried to admit only (a StrictFIFO queue tries its head; a new Workload waits for Kueue's next pass).
NOT_TRIED_YET = "Kueue has not tried it yet"


def queue_wait_message(queue: str, workload: Optional[dict], place: str = "") -> str:
    """ "waiting for queue <name> to admit it", with what Kueue says about the Workload when there is one.

    Kueue records why a Workload waits in its conditions (none before it tries it: ``NOT_TRIED_YET``, unless
    ``place`` says where it waits): ``QuotaReserved=False`` with reason
    ``Inadmissible`` ("LocalQueue q is stopped", "... doesn't exist") or ``Pending`` ("couldn't
    assign flavors to pod set node: insufficient unused quota ..."); ``Evicted=True`` after a
    preemption; ``Admitted=False`` while admission checks run after the quota is reserved.
    """
    text = f"waiting for queue {queue} to admit it{place}"
    evicted, reserved, admitted = _workload_conditions(workload)
    if workload is not None and not (evicted or reserved or admitted or place):
        return f"{text}: {NOT_TRIED_YET}"
    is_reserved, is_admitted = reserved.get("status") == "True", admitted.get("status") == "True"
    if evicted.get("status") == "True" and not is_reserved:
        return _evicted_message(queue, evicted)
    if reserved.get("status") == "False" and condition_text(reserved):
        return f"{text}: {condition_text(reserved)}"
    if is_reserved and not is_admitted:
        return _admission_checks_message(text, admitted)
    return f"admitted by queue {queue}, starting" if is_admitted else text


def _node_started_at(pod: dict) -> Optional[datetime]:
    """When the pod's ``node`` container started running (None while it does not run)."""
    for cs in nested(pod, "status", "containerStatuses", default=[]):
        started = nested(cs, "state", "running", "startedAt")
        if cs.get("name") == "node" and started:
            return datetime.fromisoformat(started.replace("Z", "+00:00"))
    return None


def running_for_at_least(pods: Sequence[dict], seconds: float, now: datetime) -> dict[int, str]:
    """Node index -> pod name of the newest node pods whose ``node`` container has run ``seconds`` or more
    (a node that just started has not had the time to be silent)."""
    found = {}
    for index, pod in newest_pods_by_node(pods).items():
        started = _node_started_at(pod)
        if started is not None and (now - started).total_seconds() >= seconds:
            found[index] = pod["metadata"]["name"]
    return found


def stall_message(silent: Sequence[int], seconds: int) -> str:
    """The warning for running nodes that printed nothing for ``seconds`` ("" when none)."""
    if not silent:
        return ""
    which = "node " + str(silent[0]) if len(silent) == 1 else "nodes " + ", ".join(map(str, silent))
    return (
        f"warning: {which} printed nothing for the last {seconds} s while running (a hung collective? "
        "a stuck data loader?); see their logs"
    )
