"""Kueue's visibility API (its on-demand pending workloads, feature ``VisibilityOnDemand``), which Kueue serves as
an aggregated API server: ``GET /apis/visibility.kueue.x-k8s.io/{version}/namespaces/{ns}/localqueues/{name}/
pendingworkloads`` answers a ``PendingWorkloadsSummary`` of the LocalQueue's waiting Workloads with their places
(from 0) in the LocalQueue and in its ClusterQueue. Served by the local API server while the emulated Kueue runs
(controllers/kueue.py admits in the same order)."""

from __future__ import annotations

from nemo_kubeflow_local.apiserver import resources as R
from nemo_kubeflow_local.apiserver.apierrors import ApiError
from nemo_kubeflow_local.apiserver.store import Store


def queue_order(workload: dict) -> tuple:
    """Kueue's queue order (StrictFIFO and BestEffortFIFO alike): the highest priority first, then the oldest."""
    return -(workload.get("spec") or {}).get("priority", 0), workload["metadata"].get("creationTimestamp", "")


def _true(workload: dict, type_: str) -> bool:
    conditions = (workload.get("status") or {}).get("conditions") or []
    return any(c.get("type") == type_ and c.get("status") == "True" for c in conditions)


VISIBILITY_GROUP = "visibility.kueue.x-k8s.io"
VISIBILITY_VERSIONS = ("v1beta2", "v1beta1")
#: How many pending workloads one answer holds unless the request says (``limit``; Kueue's default).
VISIBILITY_DEFAULT_LIMIT = 1000


def _pending_in(store: Store, cluster_queue: str) -> list[dict]:
    """The Workloads of ``cluster_queue`` that wait (no quota reserved, not finished) through an active LocalQueue,
    in Kueue's queue order."""
    found = []
    for w in store.list(R.WORKLOADS, None)[0]:
        if _true(w, "QuotaReserved") or _true(w, "Finished"):
            continue
        local_queue = store.find(R.LOCALQUEUES, w["metadata"]["namespace"], w["spec"].get("queueName", ""))
        spec = (local_queue or {}).get("spec") or {}
        if spec.get("clusterQueue") == cluster_queue and spec.get("stopPolicy", "None") == "None":
            found.append(w)  # a held or draining LocalQueue's Workloads are not in Kueue's queue
    return sorted(found, key=queue_order)


def pending_workloads(store: Store, version: str, namespace: str, queue_name: str, offset: int, limit: int) -> dict:
    """What ``GET .../namespaces/{namespace}/localqueues/{queue_name}/pendingworkloads`` answers: the LocalQueue's
    waiting Workloads from ``offset`` (at most ``limit``), each with its place (from 0) in the LocalQueue and in its
    ClusterQueue, Kueue's order: the highest priority first, then the oldest."""
    local_queue = store.find(R.LOCALQUEUES, namespace, queue_name)
    if local_queue is None:
        raise ApiError(404, f'localqueues.{VISIBILITY_GROUP} "{queue_name}" not found')
    in_cluster_queue = _pending_in(store, ((local_queue.get("spec") or {}).get("clusterQueue")) or "")
    items: list[dict] = []
    for place, w in enumerate(in_cluster_queue):
        meta = w["metadata"]
        if meta["namespace"] != namespace or w["spec"].get("queueName") != queue_name:
            continue
        items.append(
            {
                "metadata": {
                    key: meta[key]
                    for key in ("name", "namespace", "creationTimestamp", "ownerReferences")
                    if key in meta
                },
                "priority": w["spec"].get("priority", 0),
                "localQueueName": queue_name,
                "positionInClusterQueue": place,
                "positionInLocalQueue": len(items),
            }
        )
    return {
        "kind": "PendingWorkloadsSummary",
        "apiVersion": f"{VISIBILITY_GROUP}/{version}",
        "metadata": {"creationTimestamp": None},
        "items": items[offset : offset + limit],
    }
