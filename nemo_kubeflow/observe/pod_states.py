"""What a TrainJob's pods say: how their containers ended (``NodeFailure``: which node failed first, and
how; ``pod_end``), which initializer or preflight check failed (``failed_step``), how far the initializers got,
and why a job that has not started waits (``pending_reason``: image pulls, missing Secret/ConfigMap keys,
scheduling, volumes). Pure: they read the pods (and the events about them) they are given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

from nemo_kubeflow.constants import COMPLETION_INDEX_LABEL, REPLICATED_JOB_LABEL, RESTART_ATTEMPT_LABEL, TRAINER_NODE
from nemo_kubeflow.observe.events import event_object, event_text
from nemo_kubeflow.observe.status import condition_text, nested, newest_pods_by_node, true_condition
from nemo_kubeflow.parts.steps import INITIALIZER_STEPS, PREFLIGHT_CONTAINER


def terminated_state(container_status: dict) -> Optional[dict]:
    """The container's terminated state: its current one, else the one before its last restart."""
    return nested(container_status, "state", "terminated") or nested(container_status, "lastState", "terminated")


def failed_containers(pod: dict, *, init: bool = False) -> Iterable[tuple[dict, dict]]:
    """(container status, terminated state) of each container of ``pod`` that ended with a non-zero
    exit code (init containers with ``init``): the one scan of container states for every diagnosis."""
    for cs in nested(pod, "status", "initContainerStatuses" if init else "containerStatuses", default=[]):
        term = terminated_state(cs)
        if term and term.get("exitCode", 0) != 0:
            yield cs, term


def labels_of(obj: dict) -> dict:
    return nested(obj, "metadata", "labels", default={})


def _node_index(pod: dict) -> str:
    """The pod's node index, as its label says ("?" when it has none)."""
    return labels_of(pod).get(COMPLETION_INDEX_LABEL, "?")


def step_of(pod: dict) -> Optional[str]:
    return labels_of(pod).get(REPLICATED_JOB_LABEL)


def restart_attempt(pod: dict) -> Optional[int]:
    """The gang attempt a pod belongs to (JobSet's label; 0 for the first), None when unlabelled."""
    value = labels_of(pod).get(RESTART_ATTEMPT_LABEL, "")
    return int(value) if value.isdigit() else None


@dataclass(frozen=True)
class NodeFailure:
    """The first ``node`` container that ended with a non-zero exit code."""

    index: str
    pod: str
    exit_code: Optional[int]
    #: The kubelet's reason ("Error", "OOMKilled", "StartError"...).
    reason: str
    #: When the container ended (RFC 3339, to the second).
    finished: str = ""
    #: The runtime's message when the container could not start (``StartError``): why, in its words.
    start_error: str = ""

    @classmethod
    def of(cls, pod: dict, term: dict) -> "NodeFailure":
        """The failure of ``pod``'s ``node`` container, from its terminated state."""
        return cls(
            _node_index(pod),
            pod_name(pod),
            term.get("exitCode"),
            term.get("reason") or "",
            term.get("finishedAt") or "",
            (term.get("message") or "") if term.get("reason") == "StartError" else "",
        )

    def number(self) -> Optional[int]:
        """The node index as a number (None when the pod had no index label)."""
        return int(self.index) if self.index.isdigit() else None

    def how(self) -> str:
        code = self.exit_code
        how = (
            f"was killed by signal {code - 128}" if isinstance(code, int) and code > 128 else f"exited with code {code}"
        )
        extra = f" ({self.reason})" if self.reason and self.reason not in ("Error", "Completed") else ""
        return how + extra + (f": {self.start_error}" if self.start_error else "")

    def detail(self) -> str:
        return f"node {self.index} (pod {self.pod}) {self.how()}"


def _ended_by_deletion(pod: dict, term: dict) -> bool:
    """Whether a container ended once its pod was being deleted: the Job controller deletes a failed Job's
    running pods, JobSet a restarted gang's, so such an end follows another node's failure rather than causes
    it. ``finishedAt`` is to the second, and the pods that a failure has deleted often end in its second."""
    deleted = nested(pod, "metadata", "deletionTimestamp", default="")
    return bool(deleted) and (term.get("finishedAt") or deleted) >= deleted


def _end_order(pod: dict, term: dict) -> tuple[str, bool]:
    """A sort key for the ends of containers, the first to end first: when (``finishedAt``, else the pod's
    ``deletionTimestamp``), then, in the same second, one that ended on its own before one its pod's deletion
    ended."""
    return term.get("finishedAt") or nested(
        pod, "metadata", "deletionTimestamp", default=""
    ) or "~", _ended_by_deletion(pod, term)


def failed_nodes(pods: Sequence[dict]) -> list[NodeFailure]:
    """The ``node`` containers that ended with a non-zero exit code, the first to end first (``_end_order``)."""
    failures = [
        (_end_order(pod, term), NodeFailure.of(pod, term))
        for pod in pods
        for cs, term in failed_containers(pod)
        if cs.get("name") == TRAINER_NODE
    ]
    return [failure for _, failure in sorted(failures, key=lambda ended: ended[0])]


def first_failed_node(pods: Sequence[dict]) -> Optional[NodeFailure]:
    """Which node failed first, from the pods' ``node`` container statuses (None if none did)."""
    return next(iter(failed_nodes(pods)), None)


def failure_detail(pods: Sequence[dict]) -> str:
    """Which node failed first and how, from the pods' container statuses ("" if none did).

    Trainer's ``Failed`` condition copies JobSet's text ("first failed job: ..."), which
    names neither the pod nor the exit code; the kubelet's container status has both.
    """
    first = first_failed_node(pods)
    return first.detail() if first else ""


def _failed_step_containers(pod: dict) -> tuple[str, list[dict]]:
    """Where a step ran ("dataset-initializer", "preflight on node 1") and the terminated states of its
    containers that failed (none for a pod of no step)."""
    job = step_of(pod)
    if job in INITIALIZER_STEPS:
        return str(job), [term for _, term in failed_containers(pod)]
    if job == TRAINER_NODE:  # its preflight check runs as an init container of the node's pod
        return f"preflight on node {_node_index(pod)}", [
            term for cs, term in failed_containers(pod, init=True) if cs.get("name") == PREFLIGHT_CONTAINER
        ]
    return "", []


def _step_failure(where: str, pod: dict, term: dict) -> tuple[str, str]:
    """(when, what) of a step's container that failed: its termination message's headline, else its exit code."""
    why = _headline(term.get("message") or "") or f"exited with code {term.get('exitCode')}"
    return term.get("finishedAt") or "", f"{where} (pod {pod_name(pod)}): {why}"


def failed_step(pods: Sequence[dict]) -> Optional[str]:
    """What failed first among the initializers and the preflight checks, with its message
    (``None`` if neither did). Give it the TrainJob's pods (``steps.step_selector`` or the JobSet label).

    Trainer's ``Failed`` condition only names the first failed Job; the step's own message is in its
    pod's container status, where the initializer and preflight containers put it
    (``terminationMessagePolicy: FallbackToLogsOnError``; the preflight script writes its verdict to
    the termination log)."""
    failures = []
    for pod in pods:
        where, terms = _failed_step_containers(pod)
        failures += [_step_failure(where, pod, term) for term in terms]
    return min(failures)[1] if failures else None


def _headline(message: str) -> str:
    """The line of a termination message (often a log tail) that says what went wrong: the last
    one mentioning an error (a logged ERROR, ``FooError: ...``), else the last line."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower() or "failed" in line.lower()]
    return (errors or lines or [""])[-1]


def initializer_progress(pods: Sequence[dict]) -> str:
    """``initializing: dataset-initializer Running, ..." while initializer pods exist (``""`` otherwise)."""
    phases = {}
    for pod in pods:
        step = step_of(pod)
        if step in INITIALIZER_STEPS:
            phases[step] = (pod.get("status") or {}).get("phase", "Pending")
    if not phases:
        return ""
    return "initializing: " + ", ".join(f"{step} {phase}" for step, phase in sorted(phases.items()))


# Registry answers that no amount of waiting fixes.
_PERMANENT_PULL_ERRORS = (
    "not found",
    "manifest unknown",
    "unauthorized",
    "denied",
    "no such host",
    "invalid reference format",
)
#: A container's waiting reasons for an image that cannot be pulled.
_PULL_FAILURES = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName")


@dataclass(frozen=True)
class PendingReason:
    message: str
    #: The job can never start as configured (an image that does not exist): stop waiting.
    fatal: bool = False


def _container_waits_for(index: int, pod: dict, cs: dict, events: Sequence[dict]) -> Optional[PendingReason]:
    """Why a container of node ``index`` waits when it waits for what time does not bring: an image that
    cannot be pulled (fatal when the registry says the image does not exist), a missing Secret/ConfigMap
    key (None otherwise)."""
    waiting = nested(cs, "state", "waiting", default={})
    reason, message = waiting.get("reason", ""), waiting.get("message", "")
    if reason in _PULL_FAILURES:
        text = _pull_error(pod, cs["name"], events) or message
        fatal = reason == "InvalidImageName" or any(p in text.lower() for p in _PERMANENT_PULL_ERRORS)
        return PendingReason(f"image {cs.get('image', '')!r} cannot be pulled on node {index}: {text}", fatal)
    if reason == "CreateContainerConfigError":
        return PendingReason(f"node {index} cannot start: {message}")
    return None


def _containers_cannot_start(newest: dict[int, dict], events: Sequence[dict]) -> Optional[PendingReason]:
    """The first node whose container cannot start (``_container_waits_for``)."""
    for index, pod in sorted(newest.items()):
        for cs in nested(pod, "status", "containerStatuses", default=[]):
            if reason := _container_waits_for(index, pod, cs, events):
                return reason
    return None


def _unschedulable(newest: dict[int, dict], events: Sequence[dict]) -> Optional[PendingReason]:
    """The first node that kube-scheduler cannot place (its pod's ``PodScheduled=False``)."""
    for index, pod in sorted(newest.items()):
        for cond in nested(pod, "status", "conditions", default=[]):
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                message = cond.get("message", cond.get("reason", ""))
                return PendingReason(f"node {index} cannot be scheduled: {message}{_unbound_claims(pod, message)}")
    return None


def _mount_failure(newest: dict[int, dict], events: Sequence[dict]) -> Optional[PendingReason]:
    """The kubelet's last ``FailedMount`` event about the nodes' pods."""
    pod_names = {pod_name(pod) for pod in newest.values()}
    mounts = [e for e in events if e.get("reason") == "FailedMount" and event_object(e).get("name") in pod_names]
    return PendingReason(f"a volume cannot be mounted: {event_text(mounts[-1])}") if mounts else None


#: Why a job that has not started waits, in the order checked; the first that applies wins: a container that
#: cannot start (first: an image that does not exist is fatal, it ends the wait), a node that cannot be
#: scheduled, then a volume that cannot be mounted (a pod meets its volumes only once scheduled).
_PENDING_CAUSES = (_containers_cannot_start, _unschedulable, _mount_failure)


def pending_reason(pods: Sequence[dict], events: Sequence[dict], nodes: int) -> PendingReason:
    """Why a job that has not started yet is waiting, from its pods and their events.

    Checked in order: image pulls (fatal when the registry says the image does not exist),
    missing Secret/ConfigMap keys, scheduling, volumes, then "k/N nodes running".
    """
    newest = newest_pods_by_node(pods)
    for cause in _PENDING_CAUSES:
        if reason := cause(newest, events):
            return reason
    running = sum(1 for p in newest.values() if nested(p, "status", "phase") in ("Running", "Succeeded"))
    return PendingReason(f"{running}/{nodes} nodes running")


def _unbound_claims(pod: dict, scheduler_message: str) -> str:
    """kube-scheduler says "pod has unbound immediate PersistentVolumeClaims" without naming them:
    name the pod's claims (a claim binds once a PersistentVolume matches it or a StorageClass
    provisions one)."""
    if "unbound" not in scheduler_message or "PersistentVolumeClaim" not in scheduler_message:
        return ""
    claims = [
        v["persistentVolumeClaim"]["claimName"]
        for v in nested(pod, "spec", "volumes", default=[])
        if "persistentVolumeClaim" in v
    ]
    if not claims:
        return ""
    return (
        f" (the pod's claims: {', '.join(claims)}; a claim is bound once a PersistentVolume matches it or "
        "its StorageClass provisions one: `kubectl get pvc` shows which is Pending)"
    )


def _pull_error(pod: dict, container: str, events: Sequence[dict]) -> str:
    """The kubelet's 'Failed to pull image' event text for this container, if any."""
    for e in reversed(list(events)):
        obj = event_object(e)
        if (
            e.get("reason") == "Failed"
            and obj.get("name") == pod_name(pod)
            and container in (obj.get("fieldPath") or "")
            and "pull" in event_text(e).lower()
        ):
            return event_text(e)
    return ""


def pod_end(pod: dict) -> str:
    """Why a ``node`` pod ended, in a few words ("" while it runs): disrupted (the pod's
    ``DisruptionTarget`` condition, an eviction), else its ``node`` container's exit code."""
    disruption = true_condition(pod, "DisruptionTarget")
    if disruption is not None:
        why = condition_text(disruption)
        return f"was disrupted (DisruptionTarget{', ' + why if why else ''})"
    if nested(pod, "status", "reason") == "Evicted":
        return f"was evicted ({nested(pod, 'status', 'message', default='Evicted')})"
    first = first_failed_node([pod])
    return first.how() if first else ""


def pod_name(pod: dict) -> str:
    return pod["metadata"]["name"]


def node_pod_end(pod: dict) -> Optional[tuple[tuple[str, bool], str]]:
    """(``_end_order``, how) a ``node`` pod ended: "node 1 (pod p) exited with code 3" (None while it runs)."""
    how = pod_end(pod)
    if not how:
        return None
    term = next((t for _, t in failed_containers(pod)), {})
    return _end_order(pod, term), f"node {_node_index(pod)} (pod {pod_name(pod)}) {how}"
