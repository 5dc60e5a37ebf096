"""TrainJob status -> TorchX ``AppState``, with the reason. Pure.

Trainer v2.3 sets only three condition types on a TrainJob (``Suspended``,
``Complete``, ``Failed``); "running" has to be read from ``jobsStatus`` (mirrored
from the JobSet) and the pods. The table below is checked in order; the first
row that matches wins.

| TrainJob                          | AppState  | why                                        | ``describe`` also reads (``diagnosis``)      |
|-----------------------------------|-----------|--------------------------------------------|----------------------------------------------|
| not found (404)                   | CANCELLED | deleted: cancelled, or removed by someone  | nothing                                      |
| condition Complete=True           | SUCCEEDED | every node finished with exit code 0       | nothing                                      |
| condition Failed=True             | FAILED    | JobSet failed after its restarts, deadline | pods, the failed node's last lines (up to 3 failed nodes' when a launcher agent failed without naming the failed rank), each node's log once (with a job dir); Warning events after a gang restart |
| being deleted (deletionTimestamp) | CANCELLED | cancel in progress                         | nothing                                      |
| condition Suspended=True          | PENDING   | waiting for resume or a queue's admission  | nothing; Kueue's Workloads in a queue        |
| ``node`` job ready or succeeded   | RUNNING   | every pod of the job is ready (or done)    | the JobSet and the pods not running (``JobView.read_running``; every pod when a stall check is due, for ft_launcher's restarts, or with in-place restarts); without ``trainerStatus``, node 0's last 500 lines for rank 0's progress line (``progress_view``); Warning events and the current Job's metadata after a gang restart; an ft_launcher job whose logs this process does not keep: every node's last 2000 lines (one log read per node); past ``stall_warning_seconds``, one short log read per node (throttled) |
| ``node`` job active, not ready    | PENDING   | pods starting                              | pods, Warning events                         |
| anything else                     | SUBMITTED | created, pods not there yet                | pods, Warning events                         |

``job_status`` needs only the TrainJob (one GET). ``jobsStatus`` mirrors JobSet's
``replicatedJobsStatus``, which counts child *Jobs*, not pods: our runtime has one Job of
N pods, and JobSet counts it ready once all its pods are ready or succeeded. What ``describe``
adds (why a job waits or failed, how often it restarted and why) needs the pods: the last
column is what one describe reads besides the TrainJob, each at most once (``diagnosis.JobView``).
A suspended TrainJob with Kueue's queue-name label waits for its queue: describe then lists the
namespace's Workloads and ``queue_wait_message`` says why. A job that can never start (an image
the registry does not have) is reported FAILED; describe only recommends deleting it, and the repair
step of an attached wait or ``nemo-kubeflow watch`` deletes it (``repair.steps``).

A pod that fails while the JobSet restarts the gang is *not* a job failure: only the
``Failed`` condition, which Trainer sets once the JobSet gives up, is.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Optional, Sequence

from torchx.specs import AppState

from nemo_kubeflow.constants import COMPLETION_INDEX_LABEL


@dataclass(frozen=True)
class JobStatus:
    state: AppState
    #: Human-readable reason ("" when there is nothing to add).
    message: str


def _condition(trainjob: dict, ctype: str) -> Optional[dict]:
    for cond in (trainjob.get("status") or {}).get("conditions") or []:
        if cond.get("type") == ctype and cond.get("status") == "True":
            return cond
    return None


def _cond_text(cond: dict) -> str:
    reason, message = cond.get("reason") or "", cond.get("message") or ""
    return f"{reason}: {message}" if reason and message else reason or message


def newest_pods_by_node(pods: Sequence[dict]) -> dict[int, dict]:
    """The newest pod of each node index (gang restarts leave older pods behind)."""
    newest: dict[int, dict] = {}
    for pod in pods:
        labels = pod.get("metadata", {}).get("labels", {})
        try:
            index = int(labels.get(COMPLETION_INDEX_LABEL, ""))
        except ValueError:
            continue
        created = pod["metadata"].get("creationTimestamp") or ""
        if index not in newest or created >= (newest[index]["metadata"].get("creationTimestamp") or ""):
            newest[index] = pod
    return newest


def job_status(trainjob: Optional[dict], *, name: str = "") -> JobStatus:
    """The state of a TrainJob from the object alone (one GET): see the table above."""
    if trainjob is None:
        return JobStatus(
            AppState.CANCELLED,
            f"TrainJob {name} no longer exists: it was cancelled or deleted outside NeMo-Run",
        )
    nodes_total = ((trainjob.get("spec") or {}).get("trainer") or {}).get("numNodes") or 0

    if (cond := _condition(trainjob, "Complete")) is not None:
        return JobStatus(AppState.SUCCEEDED, _cond_text(cond))
    if (cond := _condition(trainjob, "Failed")) is not None:
        return JobStatus(AppState.FAILED, _cond_text(cond))
    if trainjob.get("metadata", {}).get("deletionTimestamp"):
        return JobStatus(AppState.CANCELLED, "TrainJob is being deleted")
    if (cond := _condition(trainjob, "Suspended")) is not None:
        return JobStatus(AppState.PENDING, f"suspended ({_cond_text(cond)})")

    node_job = next((j for j in (trainjob.get("status") or {}).get("jobsStatus") or [] if j.get("name") == "node"), None)
    if node_job is not None:
        if (node_job.get("ready") or 0) > 0 or (node_job.get("succeeded") or 0) > 0:
            return JobStatus(AppState.RUNNING, "")
        if (node_job.get("active") or 0) > 0:
            count = f" {nodes_total}" if nodes_total else ""
            return JobStatus(AppState.PENDING, f"starting: waiting for all{count} nodes to be ready")
    return JobStatus(AppState.SUBMITTED, "waiting for pods")


def owned_workload(workloads: Sequence[dict], trainjob: dict) -> Optional[dict]:
    """The Kueue Workload that stands for ``trainjob`` in its queue (Kueue makes the TrainJob its owner)."""
    uid = trainjob.get("metadata", {}).get("uid")
    for workload in workloads:
        if any(ref.get("uid") == uid and ref.get("kind") == "TrainJob"
               for ref in workload.get("metadata", {}).get("ownerReferences") or []):
            return workload
    return None


def queue_wait_message(queue: str, workload: Optional[dict]) -> str:
    """"waiting for queue <name> to admit it", with what Kueue says about the Workload when there is one.

    Kueue records why a Workload waits in its conditions: ``QuotaReserved=False`` with reason
    ``Inadmissible`` ("LocalQueue q is stopped", "... doesn't exist") or ``Pending`` ("couldn't
    assign flavors to pod set node: insufficient unused quota ..."); ``Evicted=True`` after a
    preemption; ``Admitted=False`` while admission checks run after the quota is reserved.
    """
    text = f"waiting for queue {queue} to admit it"
    if workload is None:
        return text
    conditions = {c.get("type"): c for c in (workload.get("status") or {}).get("conditions") or []}
    evicted, reserved, admitted = (conditions.get(t) or {} for t in ("Evicted", "QuotaReserved", "Admitted"))
    if evicted.get("status") == "True" and reserved.get("status") != "True":
        if evicted.get("reason") == "Preempted":  # not a failure: it resumes once admitted again
            return f"preempted, waiting for queue {queue} to admit it again ({_cond_text(evicted)})"
        return f"{text} again (evicted: {_cond_text(evicted)})"
    if reserved.get("status") == "False" and _cond_text(reserved):
        return f"{text}: {_cond_text(reserved)}"
    if reserved.get("status") == "True" and admitted.get("status") != "True":
        why = _cond_text(admitted)
        return f"{text}: quota reserved, waiting for admission checks" + (f" ({why})" if why else "")
    if admitted.get("status") == "True":
        return f"admitted by queue {queue}, starting"
    return text


def running_for_at_least(pods: Sequence[dict], seconds: float, now: datetime) -> dict[int, str]:
    """Node index -> pod name of the newest node pods whose ``node`` container has run ``seconds`` or more
    (a node that just started has not had the time to be silent)."""
    found = {}
    for index, pod in newest_pods_by_node(pods).items():
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            started = ((cs.get("state") or {}).get("running") or {}).get("startedAt")
            if cs.get("name") == "node" and started and \
                    (now - datetime.fromisoformat(started.replace("Z", "+00:00"))).total_seconds() >= seconds:
                found[index] = pod["metadata"]["name"]
    return found


def stall_message(silent: Sequence[int], seconds: int) -> str:
    """The warning for running nodes that printed nothing for ``seconds`` ("" when none)."""
    if not silent:
        return ""
    which = "node " + str(silent[0]) if len(silent) == 1 else "nodes " + ", ".join(map(str, silent))
    return (f"warning: {which} printed nothing for the last {seconds} s while running (a hung collective? "
            "a stuck data loader?); see their logs")

