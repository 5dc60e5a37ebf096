"""Keep a job off a node that failed it: after a gang restart caused by a node fault, move the job
off that node (docs/resilience.md#bad-nodes).

Neither Trainer v2.3 nor JobSet v0.12 does this, and what they allow shapes how it is done:

- A TrainJob's ``runtimePatches`` may change only while it is suspended, and only once its JobSet
  has no active Job (Trainer's webhook).
- Trainer re-applies the JobSet of a suspended TrainJob, but JobSet's webhook lets a suspended
  JobSet change only pod labels, annotations, nodeSelector, tolerations and schedulingGates, not
  affinity. A node affinity patched in therefore never reaches an existing JobSet.
- Trainer creates a missing JobSet again from the TrainJob, with its patches.

- Trainer builds a JobSet from its informer cache of the TrainJob: a JobSet deleted just after the
  runtime patch may be built again from the copy before it, without the term, and then no later
  apply can add it (the JobSet webhook again); resuming such a JobSet leaves the TrainJob suspended
  for good, each apply refused (seen on the real control plane under load).

So the repair step (``move``; ``assess`` only reads and recommends it) suspends the TrainJob, waits for
its pods to stop, adds a runtime patch with a ``NotIn`` node affinity term on the bad nodes, deletes the
JobSet, waits for Trainer to build it again, deletes it again while it lacks the term, and resumes once
it has it. Each step is recorded in an annotation on the TrainJob, so whichever client repairs next (a
waiting ``nemo experiment run``, ``nemo-kubeflow watch``) finishes a move that another one started; each
step reads the TrainJob from the API server first (a held copy may not have the step before yet);
``nemo experiment status`` only reports it.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Iterator, Optional, Sequence

from nemo_kubeflow.constants import (
    HOSTNAME_LABEL,
    JOBSET_KIND,
    JOBSET_NAME_LABEL,
    JOBSET_UID_LABEL,
    LABEL_PREFIX,
    NODE_AVOIDANCE_ANNOTATION,
    NODE_AVOIDANCE_OFF,
    RESTART_ATTEMPT_LABEL,
    TRAINER_NODE,
    TRAINJOB_KIND,
    queue_name,
)
from nemo_kubeflow.errors import ClusterError
from nemo_kubeflow.observe.observation import MOVE_OFF_NODES, RepairAction
from nemo_kubeflow.observe.status import nested, true_condition

if TYPE_CHECKING:
    from nemo_kubeflow.cluster.client import Cluster, ClusterReader

#: The runtime patch this module owns (Trainer keys runtimePatches by a domain-prefixed manager).
PATCH_MANAGER = f"{LABEL_PREFIX}/node-avoidance"
ANNOTATION = NODE_AVOIDANCE_ANNOTATION
OFF = NODE_AVOIDANCE_OFF
NODE_KIND = "Node"

#: ``DisruptionTarget`` reasons that blame the node: the taint manager deleting the pods of a lost or
#: NotReady node, the kubelet evicting under node pressure or shutting down, the pod GC after the
#: node vanished. Not preemption or a drain (the Eviction API): the node is fine.
NODE_FAULT_REASONS = ("DeletionByTaintManager", "TerminationByKubelet", "DeletionByPodGC")
#: Pod events that blame the node, for pods JobSet deleted at the restart.
NODE_FAULT_EVENTS = ("TaintManagerEviction", "NodeNotReady", "Evicted")
_SCHEDULED = re.compile(r"^Successfully assigned (?P<namespace>[^/\s]+)/(?P<pod>\S+) to (?P<node>\S+)$")


@dataclass(frozen=True)
class NodeFault:
    node: str
    pod: str
    why: str

    def avoiding(self) -> str:
        return f"avoiding node {self.node} after its pod {self.pod} failed with {self.why}"

    def described(self) -> str:
        return f"node {self.node} (its pod {self.pod} failed with {self.why})"

    @classmethod
    def listed(cls, rows: Sequence[dict]) -> tuple["NodeFault", ...]:
        """The faults of the annotation's JSON rows."""
        return tuple(cls(**row) for row in rows)


def _avoiding(faults: Sequence[NodeFault]) -> str:
    """The line that says which nodes ``faults`` has the job avoid, and why."""
    return "; ".join(f.avoiding() for f in faults)


def _move_action(faults: Sequence[NodeFault]) -> RepairAction:
    """The repair that moves the job off the nodes of ``faults``."""
    return RepairAction(MOVE_OFF_NODES, _avoiding(faults), tuple(f.node for f in faults))


@dataclass(frozen=True)
class Avoidance:
    """What the TrainJob's annotation records."""

    #: Nodes the job is kept off, with why (in the order they failed).
    avoided: tuple[NodeFault, ...] = ()
    #: Set while a move is under way: the nodes to add.
    moving: tuple[NodeFault, ...] = ()
    #: Gang restarts of earlier JobSets (each move starts a new JobSet, whose count starts at 0).
    restarts_before: int = 0
    #: Faulty nodes not avoided, and why ("only 2 schedulable nodes would be left for 2 pods").
    capped: str = ""
    #: Set once the move has patched the TrainJob and deleted its JobSet: waiting for Trainer to build
    #: the JobSet again with the term (the replaced JobSet's restarts are in ``restarts_before`` by then).
    replacing: bool = False

    @classmethod
    def of(cls, trainjob: Optional[dict]) -> "Avoidance":
        text = nested(trainjob, "metadata", "annotations", ANNOTATION)
        if not text or text == OFF:
            return cls()
        try:
            data = json.loads(text)
            return cls(
                NodeFault.listed(data.get("avoided", [])),
                NodeFault.listed(data.get("moving", [])),
                int(data.get("restarts_before", 0)),
                str(data.get("capped", "")),
                bool(data.get("replacing", False)),
            )
        except (ValueError, TypeError, AttributeError):
            return cls()  # not ours to repair: start from nothing

    def to_json(self) -> str:
        data = {
            "avoided": [asdict(f) for f in self.avoided],
            "moving": [asdict(f) for f in self.moving],
            "restarts_before": self.restarts_before,
            "capped": self.capped,
        }
        if self.replacing:  # only while it is so: annotations written before it had no such key
            data["replacing"] = True
        return json.dumps(data, sort_keys=True)

    def nodes(self) -> list[str]:
        return [f.node for f in self.avoided]

    def settled(self, capped: str) -> "Avoidance":
        """No move under way, with ``capped`` saying which faulty nodes are not avoided and why."""
        return replace(self, moving=(), capped=capped, replacing=False)

    def replaced(self, restarts: int) -> "Avoidance":
        """The JobSet deleted, with its ``restarts`` counted; the move waits for the one Trainer builds."""
        return replace(self, restarts_before=self.restarts_before + restarts, replacing=True)

    def moved(self) -> "Avoidance":
        """The move done: its nodes avoided."""
        return Avoidance(self.avoided + self.moving, (), self.restarts_before, self.capped)

    def all_nodes(self) -> list[str]:
        """The nodes the job is to keep off once the move is done."""
        return [f.node for f in self.avoided + self.moving]


def _is_off(trainjob: dict) -> bool:
    """Whether the job was submitted with avoid_failed_nodes=False (the annotation's marker)."""
    return nested(trainjob, "metadata", "annotations", ANNOTATION) == OFF


def _restarts(jobset: Optional[dict]) -> int:
    """The JobSet's gang restarts so far (0 without a JobSet)."""
    return int(nested(jobset, "status", "restarts") or 0)


# --- reading: which nodes failed the job ------------------------------------------------------------------


def node_faults(pods: Sequence[dict], events: Sequence[dict], trainjob: str) -> list[NodeFault]:
    """The nodes whose fault failed a pod of this job, oldest first, from the pods still there
    (``DisruptionTarget`` with a node reason) and from the events of pods already deleted
    (TaintManagerEviction, NodeNotReady, Evicted; the node from the pod's Scheduled event)."""
    faults: dict[str, NodeFault] = {}
    for fault in [*_pod_faults(pods), *_event_faults(events, trainjob)]:
        faults.setdefault(fault.node, fault)
    return list(faults.values())


def _pod_faults(pods: Sequence[dict]) -> Iterator[NodeFault]:
    """The node faults the pods still there carry (a ``DisruptionTarget`` condition with a node reason)."""
    for pod in pods:
        condition, node = true_condition(pod, "DisruptionTarget") or {}, nested(pod, "spec", "nodeName")
        if node and condition.get("reason") in NODE_FAULT_REASONS:
            yield NodeFault(
                node,
                pod["metadata"]["name"],
                f"DisruptionTarget ({condition.get('reason')}: {condition.get('message', '')})".replace(": )", ")"),
            )


def _event_faults(events: Sequence[dict], trainjob: str) -> Iterator[NodeFault]:
    """The node faults in the events of the job's ``node`` pods, oldest first; the node from the pod's
    Scheduled event, or the event's source."""
    prefix = f"{trainjob}-{TRAINER_NODE}-"
    pod_events = [e for e in events if _event_pod(e).startswith(prefix)]
    placed = _placements(pod_events)
    for event in sorted(pod_events, key=_event_time):
        pod = event["involvedObject"]["name"]
        node = placed.get(pod) or nested(event, "source", "host")
        if event.get("reason") in NODE_FAULT_EVENTS and node:
            yield NodeFault(node, pod, f"{event['reason']} ({event.get('message') or ''})")


def _event_pod(event: dict) -> str:
    """The name of the pod the event is about ("" when it is about something else)."""
    involved = event.get("involvedObject") or {}
    return involved.get("name", "") if involved.get("kind") == "Pod" else ""


def _event_time(event: dict) -> str:
    """When the event last happened (events.k8s.io events carry only ``eventTime``)."""
    return event.get("lastTimestamp") or event.get("eventTime") or ""


def _placements(events: Sequence[dict]) -> dict[str, str]:
    """Pod -> the node the scheduler assigned it, from the ``Scheduled`` events."""
    placed = {}
    for event in events:
        if event.get("reason") == "Scheduled" and (match := _SCHEDULED.match(event.get("message") or "")):
            placed[match["pod"]] = match["node"]
    return placed


def gang_attempt(pods: Sequence[dict]) -> int:
    """The newest gang attempt among the pods (JobSet's restart-attempt label; 0 if none)."""
    attempts = [(p["metadata"].get("labels") or {}).get(RESTART_ATTEMPT_LABEL, "0") for p in pods]
    return max((int(a) for a in attempts if a.isdigit()), default=0)


def schedulable_nodes(nodes: Sequence[dict], node_selector: dict) -> list[str]:
    """Ready, uncordoned nodes with the pods' nodeSelector labels."""
    return [node["metadata"]["name"] for node in nodes if _takes_pods(node, node_selector)]


def _takes_pods(node: dict, node_selector: dict) -> bool:
    """Whether the node is Ready, not cordoned, and has the labels of the pods' nodeSelector."""
    if not true_condition(node, "Ready") or nested(node, "spec", "unschedulable"):
        return False
    labels = node["metadata"].get("labels") or {}
    return all(labels.get(k) == v for k, v in node_selector.items())


def capped(
    current: Sequence[NodeFault], new: Sequence[NodeFault], schedulable: Sequence[str], pods: int
) -> tuple[list[NodeFault], str]:
    """The new faults to avoid, oldest first, while the schedulable nodes left can still hold one
    pod each; and what was left out, and why ("" if nothing)."""
    avoided = {f.node for f in current}
    left = set(schedulable) - avoided  # node names are unique
    taken, dropped = [], []
    for fault in new:
        if fault.node in avoided:
            continue
        if fault.node in left and len(left) - 1 < pods:
            dropped.append(fault.node)
            continue
        taken.append(fault)
        avoided.add(fault.node)
        left.discard(fault.node)
    return taken, _capped_why(dropped, len(left), pods)


def _capped_why(dropped: Sequence[str], left: int, pods: int) -> str:
    """Why the ``dropped`` nodes are not avoided ("" if none): avoiding one more of the ``left``
    schedulable nodes would leave too few for the pods."""
    if not dropped:
        return ""
    remaining = left - 1  # what avoiding one more would leave
    return (
        f"not avoiding node{_plural(len(dropped))} {', '.join(dropped)}: only {remaining} schedulable "
        f"node{_plural(remaining)} would be left for {pods} pods"
    )


def _plural(count: int) -> str:
    return "" if count == 1 else "s"


# --- writing: the runtime patch --------------------------------------------------------------------------


def _node_pod_spec(jobset: Optional[dict]) -> dict:
    """The pod spec of the JobSet's ``node`` replicated job ({} if none)."""
    for rjob in nested(jobset, "spec", "replicatedJobs") or []:
        if rjob.get("name") == TRAINER_NODE:
            return nested(rjob, "template", "spec", "template", "spec") or {}
    return {}


def avoidance_affinity(pod_spec: dict, nodes: Sequence[str], previous: Sequence[str]) -> dict:
    """The pod's required node affinity with ``hostname NotIn nodes`` added to each of its terms
    (a runtime patch replaces the term list whole, so the runtime's own terms are kept here), and
    the term this module added before (``NotIn previous``) taken out."""
    ours_before, ours = _hostname_not_in(list(previous)), _hostname_not_in(sorted(nodes))
    terms = _required_terms(pod_spec)
    for term in terms:  # ours too: built from a pod spec that has it already, the term is not doubled
        kept = [e for e in term.get("matchExpressions") or [] if e not in (ours_before, ours)]
        term["matchExpressions"] = kept + [ours]
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}


def keeps_off(pod_spec: dict, nodes: Sequence[str]) -> bool:
    """Whether every required node selector term of the pod spec has ``hostname NotIn nodes``."""
    terms = (
        nested(
            pod_spec, "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms"
        )
        or []
    )
    ours = _hostname_not_in(sorted(nodes))
    return bool(terms) and all(ours in (t.get("matchExpressions") or []) for t in terms)


def _hostname_not_in(nodes: list[str]) -> dict:
    return {"key": HOSTNAME_LABEL, "operator": "NotIn", "values": nodes}


def _required_terms(pod_spec: dict) -> list[dict]:
    """Copies of the pod's required node selector terms; one empty term (any node) if it has none."""
    terms = nested(
        pod_spec, "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms"
    )
    return [dict(t) for t in terms or []] or [{}]


def runtime_patches(trainjob: dict, affinity: dict) -> list[dict]:
    """The TrainJob's runtimePatches with this module's entry set to `affinity` (others kept as they are)."""
    ours = {
        "manager": PATCH_MANAGER,
        "trainingRuntimeSpec": {
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {"name": TRAINER_NODE, "template": {"spec": {"template": {"spec": {"affinity": affinity}}}}}
                    ]
                }
            }
        },
    }
    others = [p for p in nested(trainjob, "spec", "runtimePatches") or [] if p.get("manager") != PATCH_MANAGER]
    return others + [ours]


# --- looking (reads only): is there a node to move off? ---------------------------------------------------

#: What ``assess`` recommends, with the status line.
Assessment = tuple[str, Optional[RepairAction]]


def assess(
    cluster: ClusterReader,
    namespace: str,
    name: str,
    trainjob: dict,
    nodes_wanted: int,
    pods: Optional[list] = None,
    checked: Optional[dict[tuple[str, str, str], int]] = None,
    jobset: Optional[dict] = None,
) -> Assessment:
    """Whether an unfinished TrainJob should be moved off nodes that failed it: the status line ("" when there
    is nothing to say) and the repair to apply (``move``), or None. Reads only. ``pods``: the job's pods when
    the caller has just read them (with ``jobset``, the JobSet just read: only its pods that are not running);
    ``checked``: the caller's memory of the gang attempts already looked at (events are listed only for a
    new attempt or a disrupted pod)."""
    if _is_off(trainjob):
        return "", None
    avoidance = Avoidance.of(trainjob)
    if avoidance.moving:
        return f"{_avoiding(avoidance.moving)}: the move is under way", _move_action(avoidance.moving)
    try:
        return _assess(
            cluster,
            namespace,
            name,
            trainjob,
            nodes_wanted,
            pods,
            avoidance,
            {} if checked is None else checked,
            jobset,
        )
    except ClusterError as error:
        return f"cannot check the nodes that failed the job: {error}", None


def _assess(
    cluster: ClusterReader,
    namespace: str,
    name: str,
    trainjob: dict,
    nodes_wanted: int,
    pods: Optional[list],
    avoidance: Avoidance,
    checked: dict[tuple[str, str, str], int],
    jobset: Optional[dict] = None,
) -> Assessment:
    if pods is None:
        pods, jobset = _pods(cluster, namespace, name), None
    key, attempt = _gang_key(namespace, trainjob, pods, jobset)
    if attempt <= checked.get(key, 0) and not any(true_condition(p, "DisruptionTarget") for p in pods):
        return status_line(avoidance), None  # looked at already, and no pod disrupted since
    line, action, settled = _recommend(cluster, namespace, name, trainjob, nodes_wanted, pods, avoidance)
    if settled:
        checked[key] = attempt
    return line, action


def _gang_key(
    namespace: str, trainjob: dict, pods: Sequence[dict], jobset: Optional[dict]
) -> tuple[tuple[str, str, str], int]:
    """Which gang the pods are (namespace, TrainJob uid, JobSet uids) and its newest attempt. With
    ``jobset`` the running pods were not read: the JobSet says which it is and its attempt."""
    if jobset is None:
        jobset_uids = {(p["metadata"].get("labels") or {}).get(JOBSET_UID_LABEL, "") for p in pods}
        attempt = gang_attempt(pods)
    else:
        jobset_uids = {jobset["metadata"].get("uid", "")}
        attempt = max(gang_attempt(pods), _restarts(jobset))
    return (namespace, trainjob["metadata"].get("uid", ""), ",".join(sorted(jobset_uids))), attempt


def _recommend(
    cluster: ClusterReader,
    namespace: str,
    name: str,
    trainjob: dict,
    nodes_wanted: int,
    pods: Sequence[dict],
    avoidance: Avoidance,
) -> tuple[str, Optional[RepairAction], bool]:
    """The status line and the repair for the pods' node faults not avoided yet, and whether that settles
    their gang attempt (not while a move is recommended, nor when the nodes could not be listed)."""
    faults = _new_faults(cluster, namespace, name, pods, avoidance)
    if not faults:
        return status_line(avoidance), None, True
    if queue_name(trainjob):
        return f"not avoiding {faults[0].described()}: Kueue admits this job and owns its suspension", None, True
    node_selector = _node_selector(cluster, namespace, name)
    try:
        schedulable = schedulable_nodes(cluster.list(NODE_KIND, None), node_selector)
    except Exception as error:  # noqa: BLE001 - no right to list nodes: say so, do nothing
        return (
            (f"not avoiding {faults[0].described()}: cannot list nodes to check the job would still fit ({error})"),
            None,
            False,
        )
    taken, why = capped(avoidance.avoided, faults, schedulable, nodes_wanted)
    line = status_line(avoidance.settled(why or avoidance.capped))
    if not taken:
        # A new reason not to avoid a node is recorded on the TrainJob, for whoever looks next.
        return line, (RepairAction(MOVE_OFF_NODES, why) if why != avoidance.capped else None), True
    to_move = f"{_avoiding(taken)}: to be moved (an attached run or `nemo-kubeflow watch` moves it)"
    return f"{line}; {to_move}" if line else to_move, _move_action(taken), False


def _pods(cluster: ClusterReader, namespace: str, name: str) -> list[dict]:
    """The pods of the job's JobSet."""
    return cluster.list("Pod", namespace, label_selector=f"{JOBSET_NAME_LABEL}={name}")


def _new_faults(
    cluster: ClusterReader, namespace: str, name: str, pods: Sequence[dict], avoidance: Avoidance
) -> list[NodeFault]:
    """The node faults that failed the job's pods, on nodes it does not avoid yet, oldest first."""
    events = cluster.list("Event", namespace, field_selector="involvedObject.kind=Pod")
    return [f for f in node_faults(pods, events, name) if f.node not in avoidance.nodes()]


def _node_selector(cluster: ClusterReader, namespace: str, name: str) -> dict:
    """The nodeSelector of the job's pods, as its JobSet has it."""
    return _node_pod_spec(cluster.get(JOBSET_KIND, name, namespace)).get("nodeSelector") or {}


# --- the move (writes), one step per look ------------------------------------------------------------------


def move(cluster: Cluster, namespace: str, name: str, trainjob: dict, nodes_wanted: int) -> str:
    """Move an unfinished TrainJob off the nodes that failed it, step by step (each call does what it can
    without waiting): the repair ``assess`` recommends. Returns the status line."""
    if _is_off(trainjob):
        return ""
    try:
        # Each step goes on from the last one's writes, which a held copy (a watch's) may not have yet.
        trainjob = cluster.get(TRAINJOB_KIND, name, namespace) or trainjob
        return _move(cluster, namespace, name, trainjob, nodes_wanted)
    except ClusterError as error:  # e.g. Trainer's webhook still sees an active Job: the next look goes on
        return f"moving the job off a failed node: {error}; trying again at the next look"


def _move(cluster: Cluster, namespace: str, name: str, trainjob: dict, nodes_wanted: int) -> str:
    avoidance = Avoidance.of(trainjob)
    if avoidance.moving:
        return _continue_move(cluster, namespace, name, trainjob, avoidance)
    faults = _new_faults(cluster, namespace, name, _pods(cluster, namespace, name), avoidance)
    if not faults or queue_name(trainjob):
        return status_line(avoidance)
    node_selector = _node_selector(cluster, namespace, name)
    try:
        schedulable = schedulable_nodes(cluster.list(NODE_KIND, None), node_selector)
    except Exception:  # noqa: BLE001 - as assess said: no right to list nodes, do nothing
        return status_line(avoidance)
    taken, why = capped(avoidance.avoided, faults, schedulable, nodes_wanted)
    if not taken:
        return _record_capped(cluster, namespace, name, avoidance, why)
    moving = replace(avoidance, moving=tuple(taken), capped=why)
    cluster.patch(
        TRAINJOB_KIND,
        name,
        namespace,
        {"metadata": {"annotations": {ANNOTATION: moving.to_json()}}, "spec": {"suspend": True}},
    )
    return _continue_move(cluster, namespace, name, cluster.get(TRAINJOB_KIND, name, namespace) or trainjob, moving)


def _record_capped(cluster: Cluster, namespace: str, name: str, avoidance: Avoidance, why: str) -> str:
    """No node to move off: record a new reason not to avoid one, for whoever looks next; the status line."""
    settled = avoidance.settled(why)
    if why != avoidance.capped:
        cluster.patch(TRAINJOB_KIND, name, namespace, {"metadata": {"annotations": {ANNOTATION: settled.to_json()}}})
    return status_line(settled)


def _continue_move(cluster: Cluster, namespace: str, name: str, trainjob: dict, avoidance: Avoidance) -> str:
    if not nested(trainjob, "spec", "suspend"):  # suspended by the step before (or by hand)
        cluster.patch(TRAINJOB_KIND, name, namespace, {"spec": {"suspend": True}})
    if avoidance.replacing:
        return _await_rebuilt_jobset(cluster, namespace, name, avoidance)
    if not _stopped(_pods(cluster, namespace, name)):
        return f"{_avoiding(avoidance.moving)}: suspended, waiting for its pods to stop"
    jobset = cluster.get(JOBSET_KIND, name, namespace)
    patches = runtime_patches(
        trainjob, avoidance_affinity(_node_pod_spec(jobset), avoidance.all_nodes(), avoidance.nodes())
    )
    refused = patch_problems(trainjob, patches)
    if refused:  # what Trainer's webhook would refuse is not sent: give up the move, resume as it was
        moving = ", ".join(f.node for f in avoidance.moving)
        return _resume(cluster, namespace, name, avoidance.settled(f"not avoiding node {moving}: {refused[0]}"))
    replacing = avoidance.replaced(_restarts(jobset))
    cluster.patch(
        TRAINJOB_KIND,
        name,
        namespace,
        {"metadata": {"annotations": {ANNOTATION: replacing.to_json()}}, "spec": {"runtimePatches": patches}},
    )
    if jobset is not None:
        # Trainer builds it again from the TrainJob, now with the node affinity (JobSet refuses the
        # affinity on the existing one).
        cluster.delete(JOBSET_KIND, name, namespace, uid=jobset["metadata"]["uid"])
    return _await_rebuilt_jobset(cluster, namespace, name, replacing)


def _await_rebuilt_jobset(cluster: Cluster, namespace: str, name: str, avoidance: Avoidance) -> str:
    """Resume once Trainer has built the JobSet again with the term; delete one built without it."""
    jobset = cluster.get(JOBSET_KIND, name, namespace)
    if jobset is None:
        return f"{_avoiding(avoidance.moving)}: suspended, waiting for Trainer to build the JobSet again"
    if not keeps_off(_node_pod_spec(jobset), avoidance.all_nodes()):
        # Built from a copy of the TrainJob older than the runtime patch (or the delete did not happen):
        # no apply can add the term to it, so it goes again.
        cluster.delete(JOBSET_KIND, name, namespace, uid=jobset["metadata"]["uid"])
        return (
            f"{_avoiding(avoidance.moving)}: suspended; the JobSet was built again without the node affinity "
            "(from an older copy of the TrainJob), deleted it, waiting for Trainer to build it again"
        )
    return _resume(cluster, namespace, name, avoidance.moved())


def _stopped(pods: Sequence[dict]) -> bool:
    """Whether every pod has stopped (Succeeded or Failed)."""
    return all(nested(p, "status", "phase") in ("Succeeded", "Failed") for p in pods)


def _resume(cluster: Cluster, namespace: str, name: str, avoidance: Avoidance) -> str:
    """Record ``avoidance`` on the TrainJob and resume it; the status line."""
    cluster.patch(
        TRAINJOB_KIND,
        name,
        namespace,
        {"metadata": {"annotations": {ANNOTATION: avoidance.to_json()}}, "spec": {"suspend": False}},
    )
    return status_line(avoidance)


def patch_problems(trainjob: dict, patches: list[dict]) -> list[str]:
    """What offline validation (validation.py, Trainer's CRD and webhook rules) says about the
    TrainJob's runtimePatches once `patches` replace them ([] if nothing)."""
    from nemo_kubeflow.schema.validation import validate_manifest

    candidate = {
        "apiVersion": trainjob.get("apiVersion"),
        "kind": TRAINJOB_KIND,
        "metadata": {"name": trainjob["metadata"]["name"], "namespace": trainjob["metadata"].get("namespace")},
        "spec": {**trainjob["spec"], "runtimePatches": patches},
    }
    return [p for p in validate_manifest(candidate) if "runtimePatches" in p]


def status_line(avoidance: Avoidance) -> str:
    """What status says about avoided nodes ("" if none)."""
    parts = [f.avoiding() for f in avoidance.avoided]
    if avoidance.restarts_before:
        parts.append(
            f"{avoidance.restarts_before} gang restart{'s' if avoidance.restarts_before > 1 else ''} before the move"
        )
    if avoidance.capped:
        parts.append(avoidance.capped)
    return "; ".join(parts)
