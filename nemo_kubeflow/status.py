"""TrainJob status -> TorchX ``AppState``, with the reason. Pure.

Trainer v2.3 sets only three condition types on a TrainJob (``Suspended``,
``Complete``, ``Failed``); "running" has to be read from ``jobsStatus`` (mirrored
from the JobSet) and the pods. The table below is checked in order; the first
row that matches wins.

| TrainJob                                    | AppState  | why                                        |
|---------------------------------------------|-----------|--------------------------------------------|
| not found (404)                             | CANCELLED | deleted: cancelled, or removed by someone  |
| condition Complete=True                     | SUCCEEDED | every node finished with exit code 0       |
| condition Failed=True                       | FAILED    | JobSet failed after its restarts, deadline |
| being deleted (deletionTimestamp)           | CANCELLED | cancel in progress                         |
| condition Suspended=True                    | PENDING   | waiting for resume or a queue's admission  |
| ``node`` job ready or succeeded             | RUNNING   | every pod of the job is ready (or done)    |
| ``node`` job active, not ready              | PENDING   | pods starting                              |
| anything else                               | SUBMITTED | created, pods not there yet                |

A suspended TrainJob with Kueue's queue-name label waits for its queue: the scheduler then lists
the namespace's Workloads (one more read, only in that state) and ``queue_wait_message`` says why.

Status costs one GET (the TrainJob). ``jobsStatus`` mirrors JobSet's
``replicatedJobsStatus``, which counts child *Jobs*, not pods: our runtime has one Job of
N pods, and JobSet counts it ready once all its pods are ready or succeeded. Per-pod
detail needs a pod list, which logs and failure reports do.

A pod that fails while the JobSet restarts the gang is *not* a job failure: only the
``Failed`` condition, which Trainer sets once the JobSet gives up, is.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Optional, Sequence

from torchx.specs import AppState

from nemo_kubeflow.constants import COMPLETION_INDEX_LABEL, QUEUE_LABEL, REPLICATED_JOB_LABEL, RESTART_ATTEMPT_LABEL
from nemo_kubeflow.steps import INITIALIZER_STEPS


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


@dataclass(frozen=True)
class NodeFailure:
    """The first ``node`` container that ended with a non-zero exit code."""

    index: str
    pod: str
    exit_code: Optional[int]
    #: The kubelet's reason ("Error", "OOMKilled", "StartError"...).
    reason: str

    def how(self) -> str:
        code = self.exit_code
        how = f"was killed by signal {code - 128}" if isinstance(code, int) and code > 128 else f"exited with code {code}"
        extra = f" ({self.reason})" if self.reason and self.reason not in ("Error", "Completed") else ""
        return how + extra


def first_failed_node(pods: Sequence[dict]) -> Optional[NodeFailure]:
    """Which node failed first, from the pods' ``node`` container statuses (None if none did)."""
    failures = []
    for pod in pods:
        labels = pod.get("metadata", {}).get("labels", {})
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            if cs.get("name") != "node":
                continue
            term = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated")
            if term and term.get("exitCode", 0) != 0:
                failures.append((term.get("finishedAt") or "", NodeFailure(
                    labels.get(COMPLETION_INDEX_LABEL, "?"), pod["metadata"]["name"], term.get("exitCode"),
                    term.get("reason") or "")))
    return min(failures, key=lambda f: f[0])[1] if failures else None


def failure_detail(pods: Sequence[dict]) -> str:
    """Which node failed first and how, from the pods' container statuses ("" if none did).

    Trainer's ``Failed`` condition copies JobSet's text ("first failed job: ..."), which
    names neither the pod nor the exit code; the kubelet's container status has both.
    """
    first = first_failed_node(pods)
    return f"node {first.index} (pod {first.pod}) {first.how()}" if first else ""


def trainjob_warning(events: Sequence[dict], trainjob: str) -> str:
    """The newest Warning event about the TrainJob itself, as "Reason: message" ("" if none).

    Events come from both recorders (core ``firstTimestamp``/``lastTimestamp`` and
    events.k8s.io ``eventTime``), so either time is used to order them.
    """
    def when(e: dict) -> str:
        return e.get("lastTimestamp") or e.get("eventTime") or e.get("firstTimestamp") or ""

    warnings = [
        e for e in events
        if e.get("type") == "Warning"
        and (e.get("involvedObject") or e.get("regarding") or {}).get("kind") == "TrainJob"
        and (e.get("involvedObject") or e.get("regarding") or {}).get("name") == trainjob
    ]
    if not warnings:
        return ""
    newest = max(warnings, key=when)
    return f"{newest.get('reason')}: {newest.get('message') or newest.get('note') or ''}".rstrip(": ")


# Registry answers that no amount of waiting fixes.
_PERMANENT_PULL_ERRORS = ("not found", "manifest unknown", "unauthorized", "denied", "no such host",
                          "invalid reference format")


@dataclass(frozen=True)
class PendingReason:
    message: str
    #: The job can never start as configured (an image that does not exist): stop waiting.
    fatal: bool = False


def pending_reason(pods: Sequence[dict], events: Sequence[dict], nodes: int) -> PendingReason:
    """Why a job that has not started yet is waiting, from its pods and their events.

    Checked in order: image pulls (fatal when the registry says the image does not exist),
    missing Secret/ConfigMap keys, scheduling, volumes, then "k/N nodes running".
    """
    newest = newest_pods_by_node(pods)
    for index, pod in sorted(newest.items()):
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            reason, message = waiting.get("reason", ""), waiting.get("message", "")
            if reason in ("ErrImagePull", "ImagePullBackOff", "InvalidImageName"):
                text = _pull_error(pod, cs["name"], events) or message
                fatal = reason == "InvalidImageName" or any(p in text.lower() for p in _PERMANENT_PULL_ERRORS)
                return PendingReason(f"image {cs.get('image', '')!r} cannot be pulled on node {index}: {text}", fatal)
            if reason == "CreateContainerConfigError":
                return PendingReason(f"node {index} cannot start: {message}")
    for index, pod in sorted(newest.items()):
        for cond in (pod.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                return PendingReason(f"node {index} cannot be scheduled: {cond.get('message', cond.get('reason', ''))}")
    pod_names = {p["metadata"]["name"] for p in newest.values()}
    mounts = [e for e in events if e.get("reason") == "FailedMount"
              and (e.get("involvedObject") or {}).get("name") in pod_names]
    if mounts:
        return PendingReason(f"a volume cannot be mounted: {mounts[-1].get('message', '')}")
    running = sum(1 for p in newest.values() if (p.get("status") or {}).get("phase") in ("Running", "Succeeded"))
    return PendingReason(f"{running}/{nodes} nodes running")


def _pull_error(pod: dict, container: str, events: Sequence[dict]) -> str:
    """The kubelet's 'Failed to pull image' event text for this container, if any."""
    for e in reversed(list(events)):
        obj = e.get("involvedObject") or {}
        if (e.get("reason") == "Failed" and obj.get("name") == pod["metadata"]["name"]
                and container in (obj.get("fieldPath") or "") and "pull" in (e.get("message") or "").lower()):
            return e["message"]
    return ""


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


def initializer_progress(pods: Sequence[dict]) -> str:
    """``initializing: dataset-initializer Running, ..." while initializer pods exist (``""`` otherwise)."""
    phases = {}
    for pod in pods:
        step = pod.get("metadata", {}).get("labels", {}).get(REPLICATED_JOB_LABEL)
        if step in INITIALIZER_STEPS:
            phases[step] = (pod.get("status") or {}).get("phase", "Pending")
    if not phases:
        return ""
    return "initializing: " + ", ".join(f"{step} {phase}" for step, phase in sorted(phases.items()))


def queue_name(trainjob: Optional[dict]) -> str:
    """The Kueue LocalQueue a TrainJob waits in ("" for none)."""
    return (((trainjob or {}).get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL, "")


def gang_restarts_note(pods: Sequence[dict]) -> str:
    """How many times JobSet restarted the whole gang before the pods at hand ("" if never).

    JobSet labels each pod with its attempt (``jobset.sigs.k8s.io/restart-attempt``), so the newest
    pods tell the count without reading events. A failure the ``podFailurePolicy`` classes as a user
    error fails the job without a restart: "no gang restart" then says the budget was left untouched.
    """
    attempts = [int(v) for p in pods if (v := ((p.get("metadata") or {}).get("labels") or {})
                                          .get(RESTART_ATTEMPT_LABEL, "")).isdigit()]
    if not attempts:
        return ""
    count = max(attempts)
    return "no gang restart" if count == 0 else f"after {count} gang restart{'s' if count > 1 else ''}"


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

