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

So the repair step (``move``; ``assess``, in observe/node_faults.py, only reads and recommends it) suspends
the TrainJob, waits for its pods to stop, adds a runtime patch with a ``NotIn`` node affinity term on the bad
nodes, deletes the JobSet, waits for Trainer to build it again, deletes it again while it lacks the term, and
resumes once it has it. Each step is recorded in an annotation on the TrainJob, so whichever client repairs next (a
waiting ``nemo experiment run``, ``nemo-kubeflow watch``) finishes a move that another one started; each
step reads the TrainJob from the API server first (a held copy may not have the step before yet);
``nemo experiment status`` only reports it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Sequence

from nemo_kubeflow.constants import HOSTNAME_LABEL, JOBSET_KIND, LABEL_PREFIX, TRAINER_NODE, TRAINJOB_KIND, queue_name
from nemo_kubeflow.errors import ClusterError
from nemo_kubeflow.observe.node_faults import (
    ANNOTATION,
    NODE_KIND,
    Avoidance,
    avoiding_line,
    capped,
    gang_restarts,
    is_off,
    jobset_node_selector,
    jobset_pods,
    new_faults,
    node_pod_spec,
    schedulable_nodes,
    status_line,
)
from nemo_kubeflow.observe.status import nested

if TYPE_CHECKING:
    from nemo_kubeflow.cluster.client import Cluster

#: The runtime patch this module owns (Trainer keys runtimePatches by a domain-prefixed manager).
PATCH_MANAGER = f"{LABEL_PREFIX}/node-avoidance"


# --- writing: the runtime patch --------------------------------------------------------------------------


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


# --- the move (writes), one step per look ------------------------------------------------------------------


def move(cluster: Cluster, namespace: str, name: str, trainjob: dict, nodes_wanted: int) -> str:
    """Move an unfinished TrainJob off the nodes that failed it, step by step (each call does what it can
    without waiting): the repair ``assess`` recommends. Returns the status line."""
    if is_off(trainjob):
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
    faults = new_faults(cluster, namespace, name, jobset_pods(cluster, namespace, name), avoidance)
    if not faults or queue_name(trainjob):
        return status_line(avoidance)
    node_selector = jobset_node_selector(cluster, namespace, name)
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
    if not _stopped(jobset_pods(cluster, namespace, name)):
        return f"{avoiding_line(avoidance.moving)}: suspended, waiting for its pods to stop"
    jobset = cluster.get(JOBSET_KIND, name, namespace)
    patches = runtime_patches(
        trainjob, avoidance_affinity(node_pod_spec(jobset), avoidance.all_nodes(), avoidance.nodes())
    )
    refused = patch_problems(trainjob, patches)
    if refused:  # what Trainer's webhook would refuse is not sent: give up the move, resume as it was
        moving = ", ".join(f.node for f in avoidance.moving)
        return _resume(cluster, namespace, name, avoidance.settled(f"not avoiding node {moving}: {refused[0]}"))
    replacing = avoidance.replaced(gang_restarts(jobset))
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
        return f"{avoiding_line(avoidance.moving)}: suspended, waiting for Trainer to build the JobSet again"
    if not keeps_off(node_pod_spec(jobset), avoidance.all_nodes()):
        # Built from a copy of the TrainJob older than the runtime patch (or the delete did not happen):
        # no apply can add the term to it, so it goes again.
        cluster.delete(JOBSET_KIND, name, namespace, uid=jobset["metadata"]["uid"])
        return (
            f"{avoiding_line(avoidance.moving)}: suspended; the JobSet was built again without the node affinity "
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
