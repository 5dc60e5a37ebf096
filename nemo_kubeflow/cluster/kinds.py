"""The kinds the product reads and writes: each one's API group, version, plural and scope (``KINDS``), the
paths of its requests, and how a message names an object of it (``describe_target``, ``kubectl_delete``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from nemo_kubeflow.constants import (
    ADMISSION_POLICY,
    ADMISSION_POLICY_BINDING,
    CLUSTER_RUNTIME_KIND,
    CLUSTER_RUNTIME_PLURAL,
    CLUSTERQUEUE_KIND,
    KUEUE_GROUP,
    KUEUE_VERSIONS,
    LOCALQUEUE_KIND,
    MUTATING_WEBHOOKS,
    RUNTIME_KIND,
    RUNTIME_PLURAL,
    TRAINER_GROUP,
    TRAINER_VERSION,
    TRAINJOB_KIND,
    TRAINJOB_PLURAL,
    VALIDATING_WEBHOOKS,
    WORKLOAD_KIND,
)


@dataclass(frozen=True)
class Kind:
    name: str
    group: str  # "" for core
    version: str
    plural: str
    namespaced: bool = True

    def path(self, namespace: Optional[str], name: Optional[str] = None, sub: Optional[str] = None) -> str:
        base = f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"
        if self.namespaced and namespace is not None:  # None: across all namespaces (list only)
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
        if sub:
            base += f"/{sub}"
        return base


KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind("ConfigMap", "", "v1", "configmaps"),
        Kind("Secret", "", "v1", "secrets"),
        Kind("PersistentVolumeClaim", "", "v1", "persistentvolumeclaims"),
        Kind("Pod", "", "v1", "pods"),
        Kind("Event", "", "v1", "events"),
        Kind("Namespace", "", "v1", "namespaces", namespaced=False),
        Kind("Node", "", "v1", "nodes", namespaced=False),
        # What a namespace admits, read before a submission writes (cluster/admission.py) and by doctor.
        Kind("ResourceQuota", "", "v1", "resourcequotas"),
        Kind("LimitRange", "", "v1", "limitranges"),
        Kind("ServiceAccount", "", "v1", "serviceaccounts"),
        Kind("PriorityClass", "scheduling.k8s.io", "v1", "priorityclasses", namespaced=False),
        # The policy engines doctor reports (read only).
        Kind(*ADMISSION_POLICY, "validatingadmissionpolicies", namespaced=False),
        Kind(*ADMISSION_POLICY_BINDING, "validatingadmissionpolicybindings", namespaced=False),
        Kind(*VALIDATING_WEBHOOKS, "validatingwebhookconfigurations", namespaced=False),
        Kind(*MUTATING_WEBHOOKS, "mutatingwebhookconfigurations", namespaced=False),
        # A JobSet's Jobs, read as metadata only (``list_metadata``): which is the running attempt's.
        Kind("Job", "batch", "v1", "jobs"),
        # Read by `nemo-kubeflow doctor` (the TrainJob CRD's fields), where the user may.
        Kind("CustomResourceDefinition", "apiextensions.k8s.io", "v1", "customresourcedefinitions", namespaced=False),
        # JobSet: read, and deleted to have Trainer build it again (node_avoidance.py).
        Kind("JobSet", "jobset.x-k8s.io", "v1alpha2", "jobsets"),
        Kind(TRAINJOB_KIND, TRAINER_GROUP, TRAINER_VERSION, TRAINJOB_PLURAL),
        Kind(RUNTIME_KIND, TRAINER_GROUP, TRAINER_VERSION, RUNTIME_PLURAL),
        Kind(CLUSTER_RUNTIME_KIND, TRAINER_GROUP, TRAINER_VERSION, CLUSTER_RUNTIME_PLURAL, namespaced=False),
        # Kueue, read only: the queue a job waits in, the Workload it waits as, the ClusterQueue
        # behind a queue. The version is the first of KUEUE_VERSIONS the server serves (_kind).
        Kind(LOCALQUEUE_KIND, KUEUE_GROUP, KUEUE_VERSIONS[0], "localqueues"),
        Kind(WORKLOAD_KIND, KUEUE_GROUP, KUEUE_VERSIONS[0], "workloads"),
        Kind(CLUSTERQUEUE_KIND, KUEUE_GROUP, KUEUE_VERSIONS[0], "clusterqueues", namespaced=False),
    )
}


def _scope(kind: str, namespace: Optional[str]) -> Optional[str]:
    """The namespace that a request on ``kind`` in ``namespace`` is about: none for a cluster-scoped kind."""
    spec = KINDS.get(kind)
    return namespace if namespace and (spec is None or spec.namespaced) else None


def describe_target(kind: str, name: Optional[str], namespace: Optional[str]) -> str:
    scoped = _scope(kind, namespace)
    where = f" in namespace {scoped!r}" if scoped else ""
    return f"{kind} {name!r}{where}" if name else f"{kind} objects{where}"


def kubectl_delete(kind: str, name: str, namespace: Optional[str]) -> str:
    """The kubectl command that deletes one object, for messages that ask a user to clean up."""
    spec = KINDS.get(kind)
    resource = (f"{spec.plural}.{spec.group}" if spec.group else spec.plural) if spec else kind.lower()
    scoped = _scope(kind, namespace)
    return f"kubectl delete {resource} {name}" + (f" -n {scoped}" if scoped else "")
