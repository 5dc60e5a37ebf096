"""Which nodes failed a job, and whether to move it off them: the read side of node avoidance
(docs/resilience.md#bad-nodes). The move itself, which writes, is repair/node_avoidance.py's ``move``.

``node_faults`` reads the nodes whose fault failed the job's pods (their ``DisruptionTarget`` conditions, and the
events of pods JobSet already deleted); ``Avoidance`` is what the TrainJob's node-avoidance annotation records
(the nodes avoided, a move under way), which ``move`` writes; ``assess`` is the look's part (observe/look.py): it
says what status shows of it and recommends the move (``MOVE_OFF_NODES``) for faulty nodes not avoided yet,
while the schedulable nodes left can still hold the job. GETs and LISTs only.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Iterator, Optional, Sequence

from nemo_kubeflow.constants import (
    JOBSET_KIND,
    JOBSET_NAME_LABEL,
    JOBSET_UID_LABEL,
    NODE_AVOIDANCE_ANNOTATION,
    NODE_AVOIDANCE_OFF,
    RESTART_ATTEMPT_LABEL,
    TRAINER_NODE,
    queue_name,
)
from nemo_kubeflow.errors import ClusterError
from nemo_kubeflow.observe.observation import MOVE_OFF_NODES, RepairAction
from nemo_kubeflow.observe.status import nested, true_condition

if TYPE_CHECKING:
    from nemo_kubeflow.cluster.client import ClusterReader

#: On the TrainJob: the nodes avoided and why, and a move in progress (``Avoidance``, which ``move`` writes);
#: ``OFF`` for a job submitted with avoid_failed_nodes=False.
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


def avoiding_line(faults: Sequence[NodeFault]) -> str:
    """The line that says which nodes ``faults`` has the job avoid, and why."""
    return "; ".join(f.avoiding() for f in faults)


def _move_action(faults: Sequence[NodeFault]) -> RepairAction:
    """The repair that moves the job off the nodes of ``faults``."""
    return RepairAction(MOVE_OFF_NODES, avoiding_line(faults), tuple(f.node for f in faults))


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


def is_off(trainjob: dict) -> bool:
    """Whether the job was submitted with avoid_failed_nodes=False (the annotation's marker)."""
    return nested(trainjob, "metadata", "annotations", ANNOTATION) == OFF


def gang_restarts(jobset: Optional[dict]) -> int:
    """The JobSet's gang restarts so far (0 without a JobSet)."""
    return int(nested(jobset, "status", "restarts") or 0)


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


def node_pod_spec(jobset: Optional[dict]) -> dict:
    """The pod spec of the JobSet's ``node`` replicated job ({} if none)."""
    for rjob in nested(jobset, "spec", "replicatedJobs") or []:
        if rjob.get("name") == TRAINER_NODE:
            return nested(rjob, "template", "spec", "template", "spec") or {}
    return {}


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
    is nothing to say) and the repair to apply (``move``, repair/node_avoidance.py), or None. Reads only.
    ``pods``: the job's pods when the caller has just read them (with ``jobset``, the JobSet just read: only its
    pods that are not running); ``checked``: the caller's memory of the gang attempts already looked at (events
    are listed only for a new attempt or a disrupted pod)."""
    if is_off(trainjob):
        return "", None
    avoidance = Avoidance.of(trainjob)
    if avoidance.moving:
        return f"{avoiding_line(avoidance.moving)}: the move is under way", _move_action(avoidance.moving)
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
        pods, jobset = jobset_pods(cluster, namespace, name), None
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
        attempt = max(gang_attempt(pods), gang_restarts(jobset))
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
    faults = new_faults(cluster, namespace, name, pods, avoidance)
    if not faults:
        return status_line(avoidance), None, True
    if queue_name(trainjob):
        return f"not avoiding {faults[0].described()}: Kueue admits this job and owns its suspension", None, True
    node_selector = jobset_node_selector(cluster, namespace, name)
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
    to_move = f"{avoiding_line(taken)}: to be moved (an attached run or `nemo-kubeflow watch` moves it)"
    return f"{line}; {to_move}" if line else to_move, _move_action(taken), False


def jobset_pods(cluster: ClusterReader, namespace: str, name: str) -> list[dict]:
    """The pods of the job's JobSet."""
    return cluster.list("Pod", namespace, label_selector=f"{JOBSET_NAME_LABEL}={name}")


def new_faults(
    cluster: ClusterReader, namespace: str, name: str, pods: Sequence[dict], avoidance: Avoidance
) -> list[NodeFault]:
    """The node faults that failed the job's pods, on nodes it does not avoid yet, oldest first."""
    events = cluster.list("Event", namespace, field_selector="involvedObject.kind=Pod")
    return [f for f in node_faults(pods, events, name) if f.node not in avoidance.nodes()]


def jobset_node_selector(cluster: ClusterReader, namespace: str, name: str) -> dict:
    """The nodeSelector of the job's pods, as its JobSet has it."""
    return node_pod_spec(cluster.get(JOBSET_KIND, name, namespace)).get("nodeSelector") or {}
