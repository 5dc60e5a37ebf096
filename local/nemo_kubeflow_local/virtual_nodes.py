"""Virtual nodes: several Node objects that the local cluster's one kubelet serves, so that
placement (node affinity, node selectors) and node faults can be tried without more machines.

Without virtual nodes every pod is bound to the one local node, as before. With them
(`LocalCluster.add_virtual_nodes`), the scheduler's part of the kubelet binds each pod to a
Ready, schedulable virtual node that satisfies its ``nodeSelector`` and required node affinity,
the least loaded first; every pod still runs as local processes on this machine.

Shared by the kubelet and the status-only pods controller (controllers/status_only_pods.py), which bind
pods alike: it sits below both (docs/local-cluster.md, "Layers").
"""

from __future__ import annotations

from typing import Optional, Sequence

from nemo_kubeflow_local.constants import HOSTNAME_LABEL
from nemo_kubeflow_local.timeutil import now_rfc3339

#: Marks the Nodes the local kubelet schedules onto (a node agent's Nodes are not its own).
VIRTUAL_NODE_LABEL = "nemo-kubeflow.local/virtual-node"


def node_object(name: str) -> dict:
    now = now_rfc3339()
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {HOSTNAME_LABEL: name, "kubernetes.io/os": "linux", VIRTUAL_NODE_LABEL: "true"},
        },
        "spec": {},
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ]
        },
    }


def is_virtual(node: dict) -> bool:
    return (node["metadata"].get("labels") or {}).get(VIRTUAL_NODE_LABEL) == "true"


def schedulable(node: dict) -> bool:
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (node.get("status") or {}).get("conditions") or []
    )
    return ready and not (node.get("spec") or {}).get("unschedulable")


def _matches(requirement: dict, values: dict) -> bool:
    key, operator, wanted = requirement.get("key"), requirement.get("operator"), requirement.get("values") or []
    present = key in values
    if operator == "In":
        return present and values[key] in wanted
    if operator == "NotIn":
        return not present or values[key] not in wanted
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    return False  # Gt/Lt: not emulated, never matched


def fits(pod: dict, node: dict) -> bool:
    """The pod's nodeSelector and requiredDuringScheduling node affinity (ORed terms of ANDed
    matchExpressions on labels and matchFields on metadata.name) allow this node."""
    labels = node["metadata"].get("labels") or {}
    spec = pod.get("spec") or {}
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return True
    fields = {"metadata.name": node["metadata"]["name"]}
    return any(
        all(_matches(r, labels) for r in term.get("matchExpressions") or [])
        and all(_matches(r, fields) for r in term.get("matchFields") or [])
        for term in terms
    )


def choose(pod: dict, nodes: Sequence[dict], load: dict[str, int]) -> tuple[Optional[str], str]:
    """(node name, "") for the pod, the least loaded fitting node first; (None, the scheduler's
    FailedScheduling message) when none fits."""
    ready = [n for n in nodes if schedulable(n)]
    fitting = [n for n in ready if fits(pod, n)]
    if fitting:
        best = min(fitting, key=lambda n: (load.get(n["metadata"]["name"], 0), n["metadata"]["name"]))
        return best["metadata"]["name"], ""
    reasons = []
    if len(nodes) - len(ready):
        reasons.append(f"{len(nodes) - len(ready)} node(s) were unschedulable or not ready")
    if ready:
        reasons.append(f"{len(ready)} node(s) didn't match Pod's node affinity/selector")
    return None, f"0/{len(nodes)} nodes are available: {', '.join(reasons)}."
