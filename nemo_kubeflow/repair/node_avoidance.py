"""Keep a job off a node that failed it: after a gang restart caused by a node fault, move the job
off that node (docs/resilience.md#bad-nodes).

Neither Trainer v2.3 nor JobSet v0.12 does this, and what they allow shapes how it is done:

- A TrainJob's ``runtimePatches`` may change only while it is suspended, and only once its JobSet
  has no active Job (Trainer's webhook).
- Trainer re-applies the JobSet of a suspended TrainJob, but JobSet's webhook lets a suspended
  JobSet change only pod labels, annotations, nodeSelector, tolerations and schedulingGates, not
  affinity. A node affinity patched in therefore never reaches an existing JobSet.
- Trainer creates a missing JobSet again from the TrainJob, with its patches.

So the repair step (``move``; ``assess`` only reads and recommends it) suspends the TrainJob, waits for its pods to stop, adds a runtime patch with a
``NotIn`` node affinity term on the bad nodes, deletes the JobSet (Trainer creates it again, with
the term), and resumes. Each step is recorded in an annotation on the TrainJob, so whichever client
repairs next (a waiting ``nemo experiment run``, ``nemo-kubeflow watch``) finishes a move that another one
started; ``nemo experiment status`` only reports it.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
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

    @classmethod
    def of(cls, trainjob: Optional[dict]) -> "Avoidance":
        text = (((trainjob or {}).get("metadata") or {}).get("annotations") or {}).get(ANNOTATION)
        if not text or text == OFF:
            return cls()
        try:
            data = json.loads(text)
            return cls(tuple(NodeFault(**f) for f in data.get("avoided", [])),
                       tuple(NodeFault(**f) for f in data.get("moving", [])),
                       int(data.get("restarts_before", 0)), str(data.get("capped", "")))
        except (ValueError, TypeError, AttributeError):
            return cls()  # not ours to repair: start from nothing

    def to_json(self) -> str:
        return json.dumps({"avoided": [asdict(f) for f in self.avoided], "moving": [asdict(f) for f in self.moving],
                           "restarts_before": self.restarts_before, "capped": self.capped}, sort_keys=True)

    def nodes(self) -> list[str]:
        return [f.node for f in self.avoided]


# --- reading: which nodes failed the job ------------------------------------------------------------------


def _disruption(pod: dict) -> Optional[dict]:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
            return condition
    return None


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
        condition, node = _disruption(pod), (pod.get("spec") or {}).get("nodeName")
        if condition and node and condition.get("reason") in NODE_FAULT_REASONS:
            yield NodeFault(node, pod["metadata"]["name"], f"DisruptionTarget ({condition.get('reason')}: "
                                                           f"{condition.get('message', '')})".replace(": )", ")"))


def _event_faults(events: Sequence[dict], trainjob: str) -> Iterator[NodeFault]:
    """The node faults in the events of the job's ``node`` pods, oldest first; the node from the pod's
    Scheduled event, or the event's source."""
    prefix = f"{trainjob}-{TRAINER_NODE}-"
    pod_events = [e for e in events if (e.get("involvedObject") or {}).get("kind") == "Pod"
                  and (e.get("involvedObject") or {}).get("name", "").startswith(prefix)]
    placed = {}
    for event in pod_events:
        if event.get("reason") == "Scheduled" and (match := _SCHEDULED.match(event.get("message") or "")):
            placed[match["pod"]] = match["node"]
    for event in sorted(pod_events, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or ""):
        pod = event["involvedObject"]["name"]
        node = placed.get(pod) or (event.get("source") or {}).get("host")
        if event.get("reason") in NODE_FAULT_EVENTS and node:
            yield NodeFault(node, pod, f"{event['reason']} ({event.get('message') or ''})")


def gang_attempt(pods: Sequence[dict]) -> int:
    """The newest gang attempt among the pods (JobSet's restart-attempt label; 0 if none)."""
    attempts = [(p["metadata"].get("labels") or {}).get(RESTART_ATTEMPT_LABEL, "0") for p in pods]
    return max((int(a) for a in attempts if a.isdigit()), default=0)


def schedulable_nodes(nodes: Sequence[dict], node_selector: dict) -> list[str]:
    """Ready, uncordoned nodes with the pods' nodeSelector labels."""
    names = []
    for node in nodes:
        ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in (node.get("status") or {}).get("conditions") or [])
        labels = node["metadata"].get("labels") or {}
        if ready and not (node.get("spec") or {}).get("unschedulable") and \
                all(labels.get(k) == v for k, v in node_selector.items()):
            names.append(node["metadata"]["name"])
    return names


def capped(current: Sequence[NodeFault], new: Sequence[NodeFault], schedulable: Sequence[str],
           pods: int) -> tuple[list[NodeFault], str]:
    """The new faults to avoid, oldest first, while the schedulable nodes left can still hold one
    pod each; and what was left out, and why ("" if nothing)."""
    avoided = {f.node for f in current}
    left = [n for n in schedulable if n not in avoided]
    taken, dropped = [], []
    for fault in new:
        if fault.node in avoided:
            continue
        if fault.node in left and len(left) - 1 < pods:
            dropped.append(fault.node)
            continue
        taken.append(fault)
        avoided.add(fault.node)
        left = [n for n in left if n != fault.node]
    remaining = len(left) - 1  # what avoiding one more would leave
    why = (f"not avoiding node{'s' if len(dropped) > 1 else ''} {', '.join(dropped)}: only {remaining} schedulable "
           f"node{'s' if remaining != 1 else ''} would be left for {pods} pods") if dropped else ""
    return taken, why


# --- writing: the runtime patch --------------------------------------------------------------------------


def _node_pod_spec(jobset: Optional[dict]) -> dict:
    for rjob in ((jobset or {}).get("spec") or {}).get("replicatedJobs") or []:
        if rjob.get("name") == TRAINER_NODE:
            return ((rjob.get("template") or {}).get("spec") or {}).get("template", {}).get("spec") or {}
    return {}


def avoidance_affinity(pod_spec: dict, nodes: Sequence[str], previous: Sequence[str]) -> dict:
    """The pod's required node affinity with ``hostname NotIn nodes`` added to each of its terms
    (a runtime patch replaces the term list whole, so the runtime's own terms are kept here), and
    the term this module added before (``NotIn previous``) taken out."""
    ours_before = {"key": HOSTNAME_LABEL, "operator": "NotIn", "values": list(previous)}
    required = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = [dict(t) for t in required.get("nodeSelectorTerms") or []] or [{}]
    ours = {"key": HOSTNAME_LABEL, "operator": "NotIn", "values": sorted(nodes)}
    for term in terms:
        term["matchExpressions"] = [e for e in term.get("matchExpressions") or [] if e != ours_before] + [ours]
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}


def runtime_patches(trainjob: dict, affinity: dict) -> list[dict]:
    """The TrainJob's runtimePatches with this module's entry set to `affinity` (others kept as they are)."""
    ours = {"manager": PATCH_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": TRAINER_NODE, "template": {"spec": {"template": {"spec": {"affinity": affinity}}}}}]}}}}
    others = [p for p in (trainjob.get("spec") or {}).get("runtimePatches") or [] if p.get("manager") != PATCH_MANAGER]
    return others + [ours]


# --- looking (reads only): is there a node to move off? ---------------------------------------------------

#: What ``assess`` recommends, with the status line.
Assessment = tuple[str, Optional[RepairAction]]


def assess(cluster: ClusterReader, namespace: str, name: str, trainjob: dict, nodes_wanted: int,
           pods: Optional[list] = None, checked: Optional[dict[tuple[str, str, str], int]] = None,
           jobset: Optional[dict] = None) -> Assessment:
    """Whether an unfinished TrainJob should be moved off nodes that failed it: the status line ("" when there
    is nothing to say) and the repair to apply (``move``), or None. Reads only. ``pods``: the job's pods when
    the caller has just read them (with ``jobset``, the JobSet just read: only its pods that are not running);
    ``checked``: the caller's memory of the gang attempts already looked at (events are listed only for a
    new attempt or a disrupted pod)."""
    if ((trainjob.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION) == OFF:
        return "", None
    avoidance = Avoidance.of(trainjob)
    if avoidance.moving:
        moving_line = "; ".join(f.avoiding() for f in avoidance.moving)
        return (f"{moving_line}: the move is under way",
                RepairAction(MOVE_OFF_NODES, moving_line, tuple(f.node for f in avoidance.moving)))
    try:
        return _assess(cluster, namespace, name, trainjob, nodes_wanted, pods, avoidance,
                       {} if checked is None else checked, jobset)
    except ClusterError as error:
        return f"cannot check the nodes that failed the job: {error}", None


def _assess(cluster: ClusterReader, namespace: str, name: str, trainjob: dict, nodes_wanted: int,
            pods: Optional[list], avoidance: Avoidance, checked: dict[tuple[str, str, str], int],
            jobset: Optional[dict] = None) -> Assessment:
    if pods is None:
        pods, jobset = cluster.list("Pod", namespace, label_selector=f"{JOBSET_NAME_LABEL}={name}"), None
    if jobset is not None:  # the running pods were not read: the JobSet says which it is and its attempt
        jobset_uids = {jobset["metadata"].get("uid", "")}
        attempt = max(gang_attempt(pods), int((jobset.get("status") or {}).get("restarts") or 0))
    else:
        jobset_uids = {(p["metadata"].get("labels") or {}).get(JOBSET_UID_LABEL, "") for p in pods}
        attempt = gang_attempt(pods)
    key = (namespace, trainjob["metadata"].get("uid", ""), ",".join(sorted(jobset_uids)))
    if attempt <= checked.get(key, 0) and not any(_disruption(p) for p in pods):
        return status_line(avoidance), None
    events = cluster.list("Event", namespace, field_selector="involvedObject.kind=Pod")
    faults = [f for f in node_faults(pods, events, name) if f.node not in avoidance.nodes()]
    if not faults:
        checked[key] = attempt
        return status_line(avoidance), None
    first = f"node {faults[0].node} (its pod {faults[0].pod} failed with {faults[0].why})"
    if queue_name(trainjob):
        checked[key] = attempt
        return f"not avoiding {first}: Kueue admits this job and owns its suspension", None
    node_selector = _node_pod_spec(cluster.get(JOBSET_KIND, name, namespace)).get("nodeSelector") or {}
    try:
        schedulable = schedulable_nodes(cluster.list(NODE_KIND, None), node_selector)
    except Exception as error:  # noqa: BLE001 - no right to list nodes: say so, do nothing
        return f"not avoiding {first}: cannot list nodes to check the job would still fit ({error})", None
    taken, why = capped(avoidance.avoided, faults, schedulable, nodes_wanted)
    line = status_line(Avoidance(avoidance.avoided, (), avoidance.restarts_before, why or avoidance.capped))
    if not taken:
        checked[key] = attempt
        # A new reason not to avoid a node is recorded on the TrainJob, for whoever looks next.
        return line, (RepairAction(MOVE_OFF_NODES, why) if why != avoidance.capped else None)
    wanted = "; ".join(f.avoiding() for f in taken)
    return ("; ".join(p for p in (line, f"{wanted}: to be moved (an attached run or `nemo-kubeflow watch` moves it)")
                      if p),
            RepairAction(MOVE_OFF_NODES, wanted, tuple(f.node for f in taken)))


# --- the move (writes), one step per look ------------------------------------------------------------------


def move(cluster: Cluster, namespace: str, name: str, trainjob: dict, nodes_wanted: int) -> str:
    """Move an unfinished TrainJob off the nodes that failed it, step by step (each call does what it can
    without waiting): the repair ``assess`` recommends. Returns the status line."""
    if ((trainjob.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION) == OFF:
        return ""
    try:
        return _move(cluster, namespace, name, trainjob, nodes_wanted)
    except ClusterError as error:  # e.g. Trainer's webhook still sees an active Job: the next look goes on
        return f"moving the job off a failed node: {error}; trying again at the next look"


def _move(cluster: Cluster, namespace: str, name: str, trainjob: dict, nodes_wanted: int) -> str:
    avoidance = Avoidance.of(trainjob)
    if avoidance.moving:
        return _continue_move(cluster, namespace, name, trainjob, avoidance, nodes_wanted)
    pods = cluster.list("Pod", namespace, label_selector=f"{JOBSET_NAME_LABEL}={name}")
    events = cluster.list("Event", namespace, field_selector="involvedObject.kind=Pod")
    faults = [f for f in node_faults(pods, events, name) if f.node not in avoidance.nodes()]
    if not faults or queue_name(trainjob):
        return status_line(avoidance)
    node_selector = _node_pod_spec(cluster.get(JOBSET_KIND, name, namespace)).get("nodeSelector") or {}
    try:
        schedulable = schedulable_nodes(cluster.list(NODE_KIND, None), node_selector)
    except Exception:  # noqa: BLE001 - as assess said: no right to list nodes, do nothing
        return status_line(avoidance)
    taken, why = capped(avoidance.avoided, faults, schedulable, nodes_wanted)
    if not taken:
        if why != avoidance.capped:
            _annotate(cluster, namespace, name, Avoidance(avoidance.avoided, (), avoidance.restarts_before, why))
        return status_line(Avoidance(avoidance.avoided, (), avoidance.restarts_before, why))
    moving = Avoidance(avoidance.avoided, tuple(taken), avoidance.restarts_before, why)
    cluster.patch(TRAINJOB_KIND, name, namespace, {
        "metadata": {"annotations": {ANNOTATION: moving.to_json()}}, "spec": {"suspend": True}})
    return _continue_move(cluster, namespace, name, cluster.get(TRAINJOB_KIND, name, namespace) or trainjob, moving,
                          nodes_wanted)


def _continue_move(cluster: Cluster, namespace: str, name: str, trainjob: dict, avoidance: Avoidance,
                   nodes_wanted: int) -> str:
    nodes = avoidance.nodes() + [f.node for f in avoidance.moving]
    moving_line = "; ".join(f.avoiding() for f in avoidance.moving)
    if not (trainjob.get("spec") or {}).get("suspend"):  # suspended by the step before (or by hand)
        cluster.patch(TRAINJOB_KIND, name, namespace, {"spec": {"suspend": True}})
    pods = cluster.list("Pod", namespace, label_selector=f"{JOBSET_NAME_LABEL}={name}")
    if any((p.get("status") or {}).get("phase") not in ("Succeeded", "Failed") for p in pods):
        return f"{moving_line}: suspended, waiting for its pods to stop"
    jobset = cluster.get(JOBSET_KIND, name, namespace)
    restarts = int(((jobset or {}).get("status") or {}).get("restarts") or 0)
    done = Avoidance(avoidance.avoided + avoidance.moving, (), avoidance.restarts_before + restarts,
                     avoidance.capped)
    patches = runtime_patches(trainjob, avoidance_affinity(_node_pod_spec(jobset), nodes, avoidance.nodes()))
    refused = patch_problems(trainjob, patches)
    if refused:  # what Trainer's webhook would refuse is not sent: give up the move, resume as it was
        given_up = Avoidance(avoidance.avoided, (), avoidance.restarts_before,
                             f"not avoiding node {', '.join(f.node for f in avoidance.moving)}: {refused[0]}")
        cluster.patch(TRAINJOB_KIND, name, namespace, {
            "metadata": {"annotations": {ANNOTATION: given_up.to_json()}}, "spec": {"suspend": False}})
        return status_line(given_up)
    cluster.patch(TRAINJOB_KIND, name, namespace, {"spec": {"runtimePatches": patches}})
    if jobset is not None:
        # Trainer creates it again from the TrainJob, now with the node affinity (JobSet refuses
        # the affinity on the existing one).
        cluster.delete(JOBSET_KIND, name, namespace, uid=jobset["metadata"]["uid"])
    cluster.patch(TRAINJOB_KIND, name, namespace, {
        "metadata": {"annotations": {ANNOTATION: done.to_json()}}, "spec": {"suspend": False}})
    return status_line(done)


def patch_problems(trainjob: dict, patches: list[dict]) -> list[str]:
    """What offline validation (validation.py, Trainer's CRD and webhook rules) says about the
    TrainJob's runtimePatches once `patches` replace them ([] if nothing)."""
    from nemo_kubeflow.schema.validation import validate_manifest

    candidate = {"apiVersion": trainjob.get("apiVersion"), "kind": TRAINJOB_KIND,
                 "metadata": {"name": trainjob["metadata"]["name"], "namespace": trainjob["metadata"].get("namespace")},
                 "spec": {**trainjob["spec"], "runtimePatches": patches}}
    return [p for p in validate_manifest(candidate) if "runtimePatches" in p]


def _annotate(cluster: Cluster, namespace: str, name: str, avoidance: Avoidance) -> None:
    cluster.patch(TRAINJOB_KIND, name, namespace, {"metadata": {"annotations": {ANNOTATION: avoidance.to_json()}}})


def status_line(avoidance: Avoidance) -> str:
    """What status says about avoided nodes ("" if none)."""
    parts = [f.avoiding() for f in avoidance.avoided]
    if avoidance.restarts_before:
        parts.append(f"{avoidance.restarts_before} gang restart{'s' if avoidance.restarts_before > 1 else ''} "
                     "before the move")
    if avoidance.capped:
        parts.append(avoidance.capped)
    return "; ".join(parts)

