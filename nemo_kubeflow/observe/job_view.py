"""What a describe reads of a TrainJob, and why a job waits: ``JobView`` reads the TrainJob's pods once,
and its Warning events at most once, per describe; ``why_waiting``, ``rank_failure.why_failed`` and
``JobView.restarts`` read only from it (plus, for a failed job, the failed node's last lines and every node's
log, kept next to the job).

What a describe reads in each state is the last column of ``status.py``'s table.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Iterable, Optional

from torchx.specs import AppState

from nemo_kubeflow.constants import (
    JOBSET_KIND,
    JOBSET_NAME_LABEL,
    JOBSET_UID_LABEL,
    NOT_RUNNING,
    RESTART_ATTEMPT_LABEL,
    TRAINER_NODE,
)
from nemo_kubeflow.errors import ClusterError
from nemo_kubeflow.observe.pod_states import (
    NodeFailure,
    first_failed_node,
    initializer_progress,
    labels_of,
    node_pod_end,
    pending_reason,
    pod_name,
    restart_attempt,
    step_of,
)
from nemo_kubeflow.observe.refusals import chain_refusal
from nemo_kubeflow.observe.restarts import (
    FAIL_FAST_REASON,
    InJobRestarts,
    Restarts,
    first_failure,
    gang_causes,
    jobset_restarting,
    jobset_restarts,
    read_in_job_restarts,
    restarts_in_place,
    runs_ft_launcher,
)
from nemo_kubeflow.observe.status import nested, newest_pods_by_node

if TYPE_CHECKING:
    from nemo_kubeflow.cluster.client import ClusterReader


@dataclass
class JobView:
    """A TrainJob with its pods, read once per describe, and its Warning events, read at most once
    (only the states that need them: waiting, and after a gang restart).

    ``read`` lists every pod of the job. ``read_running`` (a running job, the look a wait repeats) reads
    its JobSet and only the pods that are not running (``NOT_RUNNING``): what a restart, a failed rank or
    a node fault leaves behind; a thousand running pods are not read again on each poll. ``read_waiting``
    (a job not started) reads a sample of the pods that wait; ``read_failed`` the running pods' metadata only."""

    cluster: "ClusterReader"
    trainjob: dict
    pods: list[dict]
    _events: Optional[list[dict]] = field(default=None, repr=False)
    #: Node index -> the last lines of its log, where this look has read them (progress reuses node 0's).
    node_lines: dict[int, list[str]] = field(default_factory=dict, repr=False)
    #: The JobSet, read by ``read_running`` (None: ``pods`` are all the job's pods).
    jobset: Optional[dict] = None
    _current_jobs: Optional[frozenset[str]] = field(default=None, repr=False)
    #: The field selector of the Warning events read (``read_waiting`` leaves out the scheduler's).
    events_selector: str = field(default="type=Warning", repr=False)

    @classmethod
    def read(cls, cluster: "ClusterReader", trainjob: dict) -> "JobView":
        meta = trainjob["metadata"]
        pods = cluster.list("Pod", meta["namespace"], f"{JOBSET_NAME_LABEL}={meta['name']}")
        return cls(cluster, trainjob, pods)

    @classmethod
    def read_running(cls, cluster: "ClusterReader", trainjob: dict) -> "JobView":
        """A running job's JobSet (its restarts, its uid) and its pods that are not running; every pod
        (``read``) when the JobSet is not there or its node pods restart containers in place (their
        restart counts are on the running pods)."""
        meta = trainjob["metadata"]
        jobset = cluster.get(JOBSET_KIND, meta["name"], meta["namespace"])
        if jobset is None or restarts_in_place(jobset):
            return cls.read(cluster, trainjob)
        pods = cluster.list("Pod", meta["namespace"], f"{JOBSET_NAME_LABEL}={meta['name']}", field_selector=NOT_RUNNING)
        return cls(cluster, trainjob, pods, jobset=jobset)

    @classmethod
    def read_waiting(cls, cluster: "ClusterReader", trainjob: dict) -> "JobView":
        """A waiting job's JobSet, its pods that started or ended (``NOT_PENDING``), and a sample of its pods
        that wait (``WAITING_SAMPLE`` of those not placed, as many of those placed and starting): not a thousand
        pods that wait for the same reason. Every pod (``read``) when the JobSet is not there yet."""
        meta = trainjob["metadata"]
        jobset = cluster.get(JOBSET_KIND, meta["name"], meta["namespace"])
        if jobset is None:
            return cls.read(cluster, trainjob)
        selector = f"{JOBSET_NAME_LABEL}={meta['name']}"
        pods = cluster.list("Pod", meta["namespace"], selector, field_selector=NOT_PENDING)
        for waiting in (UNSCHEDULED, STARTING):
            pods += cluster.list("Pod", meta["namespace"], selector, field_selector=waiting, limit=WAITING_SAMPLE)
        return cls(cluster, trainjob, pods, jobset=jobset, events_selector=WAITING_EVENTS)

    @classmethod
    def read_failed(cls, cluster: "ClusterReader", trainjob: dict) -> "JobView":
        """A failed job's JobSet, the metadata of its pods still running (the Job controller deletes a failed
        Job's running pods: their names say which nodes still have a log to read) and its other pods in full
        (those that failed tell how). Every pod (``read``) when the JobSet is not there or its node pods restart
        containers in place (their restart counts are on the running pods)."""
        meta = trainjob["metadata"]
        jobset = cluster.get(JOBSET_KIND, meta["name"], meta["namespace"])
        if jobset is None or restarts_in_place(jobset):
            return cls.read(cluster, trainjob)
        selector = f"{JOBSET_NAME_LABEL}={meta['name']}"
        # The running ones first: a pod that ends between the two reads is in both, and the full one, later in
        # the list, is the one ``newest_pods_by_node`` keeps.
        pods = cluster.list_metadata("Pod", meta["namespace"], selector, field_selector=RUNNING)
        pods += cluster.list("Pod", meta["namespace"], selector, field_selector=NOT_RUNNING)
        return cls(cluster, trainjob, pods, jobset=jobset)

    @property
    def name(self) -> str:
        return self.trainjob["metadata"]["name"]

    @property
    def namespace(self) -> str:
        return self.trainjob["metadata"]["namespace"]

    @property
    def nodes(self) -> int:
        return nested(self.trainjob, "spec", "trainer", "numNodes", default=0)

    @property
    def events(self) -> list[dict]:
        if self._events is None:
            self._events = self.cluster.list("Event", self.namespace, field_selector=self.events_selector)
        return self._events

    @property
    def node_pods(self) -> list[dict]:
        return [p for p in self.pods if step_of(p) == TRAINER_NODE]

    def newest_nodes(self) -> dict[int, dict]:
        return newest_pods_by_node(self.node_pods)

    def runs_ft_launcher(self) -> bool:
        return runs_ft_launcher(self.trainjob)

    def node_log(self, pod: str, tail_lines: int) -> Optional[list[str]]:
        """The last ``tail_lines`` of a node pod's log (None when it cannot be read)."""
        try:
            return list(self.cluster.pod_log(pod, self.namespace, container=TRAINER_NODE, tail_lines=tail_lines))
        except ClusterError:
            return None

    def in_job_restarts_of_nodes(self) -> Optional[InJobRestarts]:
        """ft_launcher's restarts so far, from the last ``IN_JOB_TAIL`` lines of every node's log (one log
        read per node; None when no log can be read). Every agent logs every restart of the group and the
        rendezvous round it joins, but only the node whose worker died says how: ``first_failure`` names it."""
        found: dict[int, InJobRestarts] = {}
        for node, pod in sorted(self.newest_nodes().items()):
            lines = self.node_log(pod_name(pod), IN_JOB_TAIL)
            if lines is not None:
                self.node_lines[node] = lines
                found[node] = read_in_job_restarts(lines)
        return first_failure(found)

    def gang_restarts(self) -> int:
        """JobSet's restarts so far: the attempt of the newest pods (JobSet labels each pod with it), or the
        JobSet's own count when it was read."""
        from_pods = max((a for p in self.node_pods if (a := restart_attempt(p)) is not None), default=0)
        return max(from_pods, jobset_restarts(self.jobset)) if self.jobset is not None else from_pods

    def nodes_starting(self) -> int:
        """After a gang restart, the new attempt's ``node`` pods still pending (not being deleted); 0 before any.
        The TrainJob's ``node`` Job counts are mirrored from the JobSet, a reconcile or two behind it: just after
        a gang restart they still say the previous attempt's Job is ready while the new attempt's pods start."""
        attempt = self.gang_restarts()
        if not attempt:
            return 0
        return sum(
            1
            for p in self.node_pods
            if restart_attempt(p) == attempt
            and nested(p, "status", "phase", default="Pending") == "Pending"
            and not p["metadata"].get("deletionTimestamp")
        )

    def _of_newest_attempt(self) -> list[dict]:
        attempt = self.gang_restarts()
        return [p for p in self.node_pods if (restart_attempt(p) or 0) == attempt]

    def failing(self) -> Optional[NodeFailure]:
        """The node whose failure fails the newest attempt's Job while the Job controller stops its other pods
        (None when that is not what the pods show). The Job's Failed condition, and so JobSet's restart or
        verdict, waits until every pod of the Job has ended (Kubernetes 1.31 on, "terminal Job conditions"),
        and meanwhile the TrainJob counts no node active or ready. Shown by a node pod of the attempt that
        failed on its own beside one whose pod is being deleted: a Job that replaces a failed pod instead (an
        admin runtime's ``backoffLimit``) deletes none."""
        pods = self._of_newest_attempt()
        if not any(p["metadata"].get("deletionTimestamp") for p in pods):
            return None
        return first_failed_node([p for p in pods if not p["metadata"].get("deletionTimestamp")])

    def nodes_stopping(self) -> int:
        """The newest attempt's node pods being deleted that have not ended yet."""
        return sum(
            1
            for p in self._of_newest_attempt()
            if p["metadata"].get("deletionTimestamp") and nested(p, "status", "phase") not in ("Succeeded", "Failed")
        )

    def restarting(self) -> bool:
        """Whether a gang restart is under way: JobSet's ``RestartingJobSet`` condition when the JobSet was read
        (v0.12 on: True from the restart until every Job of the new attempt is ready, also before the new pods
        exist), else the new attempt's pods still pending (``nodes_starting``)."""
        return jobset_restarting(self.jobset) or self.nodes_starting() > 0

    def current_jobs(self) -> frozenset[str]:
        """The uids of the Jobs that own the newest ``node`` pods (the current attempt's); without the
        running pods at hand, those of the JobSet's Jobs of its current attempt (one metadata-only list)."""
        if self.jobset is None:
            return _owner_uids(self.newest_nodes().values(), "Job")
        if self._current_jobs is None:
            jobs = self.cluster.list_metadata("Job", self.namespace, f"{JOBSET_NAME_LABEL}={self.name}")
            self._current_jobs = frozenset(
                job["metadata"].get("uid") for job in jobs if _of_current_attempt(job, self.jobset)
            )
        return self._current_jobs

    def attempts_seen(self) -> bool:
        return any(restart_attempt(p) is not None for p in self.node_pods)

    def failures_by_attempt(self) -> dict[int, str]:
        """Attempt -> how its first ``node`` pod ended, for the pods at hand that failed or were disrupted."""
        ends: dict[int, list[tuple[tuple[str, bool], str]]] = {}
        for pod in self.node_pods:
            attempt, end = restart_attempt(pod), node_pod_end(pod)
            if attempt is not None and end is not None:
                ends.setdefault(attempt, []).append(end)
        # min keeps the first of pods that ended at the same time (``_end_order``).
        return {attempt: min(found, key=lambda end: end[0])[1] for attempt, found in ends.items()}

    def in_place_restarts(self) -> int:
        """The containers the kubelet restarted in place in the newest ``node`` pods."""
        return sum(
            cs.get("restartCount") or 0
            for p in self.newest_nodes().values()
            for cs in nested(p, "status", "containerStatuses", default=[])
        )

    def restarts(
        self,
        *,
        seen: Optional[dict[int, str]] = None,
        in_job: Optional[InJobRestarts] = None,
        condition_reason: str = "",
    ) -> Restarts:
        """How often the job restarted, of which kind, and why. ``seen``: what this process saw of
        earlier attempts' failed pods; ``in_job``: ft_launcher's restarts read from node logs."""
        gang = self.gang_restarts()
        causes = (
            gang_causes(
                gang, {**self.failures_by_attempt(), **(seen or {})}, self.events, self.name, self.current_jobs()
            )
            if gang
            else ()
        )
        restarts = Restarts(
            gang=gang,
            gang_causes=causes,
            in_place=self.in_place_restarts(),
            failed_fast=condition_reason == FAIL_FAST_REASON,
        )
        if in_job is None:
            return restarts
        return replace(restarts, in_job=in_job.count, in_job_cause=in_job.why, not_applied=in_job.not_applied)


def _owner_uids(objs: Iterable[dict], kind: str) -> frozenset[str]:
    """The uids of the owners of kind ``kind`` of ``objs``."""
    return frozenset(
        ref.get("uid")
        for obj in objs
        for ref in nested(obj, "metadata", "ownerReferences", default=[])
        if ref.get("kind") == kind
    )


def _of_current_attempt(job: dict, jobset: dict) -> bool:
    """Whether a Job (its metadata) is one of the JobSet's current attempt: labelled with the JobSet's uid
    and restart count, and not being deleted."""
    labels = labels_of(job)
    return (
        not job["metadata"].get("deletionTimestamp")
        and labels.get(RESTART_ATTEMPT_LABEL) == str(jobset_restarts(jobset))
        and labels.get(JOBSET_UID_LABEL) == jobset["metadata"].get("uid")
    )


#: The pods a failed job's look reads by their metadata only (``JobView.read_failed``).
RUNNING = "status.phase=Running"
#: The pods a waiting job's look reads in full (``JobView.read_waiting``): those that started or ended, and a
#: sample of the pending ones, apart those kube-scheduler has not placed (``spec.nodeName`` empty: why is their
#: ``PodScheduled`` condition) and those placed and starting (why is in their container statuses and events).
NOT_PENDING = "status.phase!=Pending"
UNSCHEDULED = "status.phase=Pending,spec.nodeName="
STARTING = "status.phase=Pending,spec.nodeName!="
#: Pending pods of each kind read (the first chunk of a list, ``limit``). A sample says why the job waits: its
#: ``node`` pods share one template (image, volumes, resources, node selector), so what keeps one from being
#: placed or from starting keeps the others too, and the first in the server's key order is node 0's. What a
#: sample cannot tell, the count of nodes running, comes from the pods that are not pending, read in full.
WAITING_SAMPLE = 8
#: The Warning events a waiting job's look reads: kube-scheduler records a FailedScheduling event for each pod
#: it cannot place (a thousand at 1,024 nodes) and says the same in the pod's ``PodScheduled`` condition, read
#: from the pods; the kubelet's (image pulls, mounts) and Trainer's are kept.
WAITING_EVENTS = "type=Warning,reason!=FailedScheduling"
#: Lines of each node's log read to count ft_launcher's restarts of a running job that this process does
#: not follow (``JobView.in_job_restarts_of_nodes``): the rendezvous round of the last restart must be
#: among them, so more than a failure's tail; at most a few hundred KB.
IN_JOB_TAIL = 2000


@dataclass(frozen=True)
class Verdict:
    state: AppState
    message: str
    #: The job can never start as configured: the look recommends deleting it (``repair.steps``).
    fatal: bool = False


def why_waiting(view: JobView, nodes: int, state: AppState) -> Verdict:
    """What a job whose TrainJob counts no node running waits for: a failure whose Job still stops its other
    nodes (``JobView.failing``: running, failing); a refusal of the chain TrainJob -> JobSet -> Jobs -> pods
    (``refusals.chain_refusal``: fatal where the job can never start as submitted); a pod that can never start
    (``pending_reason`` fatal); a refusal that may pass (a quota in use); its initializers; then its pods
    (``pending_reason``).

    The state never steps back while the job waits: SUBMITTED only before its JobSet exists, PENDING from then
    on (its Jobs make its pods; a pod the cluster refused, or one gone since, leaves it PENDING), also while a
    JobSet that Trainer counted in the TrainJob's ``jobsStatus`` is built again."""
    if (failed := view.failing()) is not None:
        stopping = view.nodes_stopping()
        stops = (
            f"the Job controller stops its other nodes ({stopping} of {nodes} still stopping)"
            if stopping
            else "its other nodes stopped"
        )
        return Verdict(
            AppState.RUNNING, f"failing: {failed.detail()}; {stops}, then JobSet restarts the gang or fails the job"
        )
    refusal = chain_refusal(view.events, view.trainjob, view.jobset, view.pods)
    if refusal is not None and refusal.fatal:
        return Verdict(AppState.FAILED, refusal.message, fatal=True)
    pods = view.node_pods
    reason = pending_reason(pods, view.events, nodes)
    if reason.fatal:
        return Verdict(AppState.FAILED, reason.message, fatal=True)
    # JobSet recreates the gang: its new pods wait, the message says why they do.
    restarting = "restarting: " if jobset_restarting(view.jobset) else ""
    # A JobSet that exists, or that Trainer has counted (rebuilt by a move off failed nodes), makes its pods.
    built = view.jobset is not None or bool(nested(view.trainjob, "status", "jobsStatus"))
    waiting = AppState.PENDING if pods or restarting or built else state
    if refusal is not None:
        return Verdict(AppState.PENDING, restarting + refusal.message)
    if not pods and (initializing := initializer_progress(view.pods)):
        return Verdict(AppState.PENDING, initializing)
    return Verdict(waiting, restarting + reason.message)
