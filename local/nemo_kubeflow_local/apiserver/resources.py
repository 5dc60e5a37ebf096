"""The resource types the local API server serves."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from nemo_kubeflow_local import constants as C
from nemo_kubeflow_local.apiserver.versions import KUEUE_STORAGE_VERSION


@dataclass(frozen=True)
class ResourceType:
    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool
    #: Spec and status are written through separate endpoints (`<name>/status`).
    status_subresource: bool = False
    #: metadata.generation is kept (custom resources and pods).
    has_generation: bool = False
    #: Another group serves this type from the same storage (events.k8s.io events).
    storage: Optional[str] = None
    #: Clients may only get, list and watch it: the emulated controllers write it (405 otherwise).
    read_only: bool = False
    #: ... but clients may delete it (a JobSet: Trainer builds it again; node_avoidance.py does so).
    deletable: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> str:
        """Storage key: the resource's plural qualified by its group."""
        return self.storage or self.qualified

    @property
    def qualified(self) -> str:
        """`configmaps`, `trainjobs.trainer.kubeflow.org`: how NotFound messages name the resource."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def qualified_kind(self) -> str:
        """`ConfigMap`, `TrainJob.trainer.kubeflow.org`: how Invalid messages name the kind."""
        return f"{self.kind}.{self.group}" if self.group else self.kind

    @property
    def is_custom(self) -> bool:
        """Served from a CRD (Trainer's or Kueue's): no strategic merge patch, kind required."""
        return self.group in (C.TRAINER_GROUP, C.KUEUE_GROUP, C.JOBSET_GROUP)

    @property
    def is_trainer(self) -> bool:
        return self.group == C.TRAINER_GROUP


NAMESPACES = ResourceType("", "v1", "namespaces", "Namespace", False, status_subresource=True)
CONFIGMAPS = ResourceType("", "v1", "configmaps", "ConfigMap", True)
SECRETS = ResourceType("", "v1", "secrets", "Secret", True)
PVCS = ResourceType("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", True, status_subresource=True)
PODS = ResourceType("", "v1", "pods", "Pod", True, status_subresource=True, has_generation=True)
EVENTS = ResourceType("", "v1", "events", "Event", True)
#: Nodes, registered by node agents (nodeagent.py) attached to this server (no node controller).
NODES = ResourceType("", "v1", "nodes", "Node", False, status_subresource=True)
#: events.k8s.io/v1 is a second view of the core events (read-only here).
EVENTS_V1 = ResourceType("events.k8s.io", "v1", "events", "Event", True, storage="events", read_only=True)
#: What the emulated JobSet and Job controllers build for a TrainJob (trainer.py): the JobSet, its
#: headless Service and one Job per replica. Read-only here; the controllers own them.
SERVICES = ResourceType("", "v1", "services", "Service", True, status_subresource=True, read_only=True)
JOBS = ResourceType("batch", "v1", "jobs", "Job", True, status_subresource=True, has_generation=True, read_only=True)
JOBSETS = ResourceType(
    C.JOBSET_GROUP,
    C.JOBSET_VERSION,
    "jobsets",
    "JobSet",
    True,
    status_subresource=True,
    has_generation=True,
    read_only=True,
    deletable=True,
)
TRAINJOBS = ResourceType(
    C.TRAINER_GROUP,
    C.TRAINER_VERSION,
    C.TRAINJOB_PLURAL,
    C.TRAINJOB_KIND,
    True,
    status_subresource=True,
    has_generation=True,
)
RUNTIMES = ResourceType(C.TRAINER_GROUP, C.TRAINER_VERSION, C.RUNTIME_PLURAL, C.RUNTIME_KIND, True, has_generation=True)
CLUSTER_RUNTIMES = ResourceType(
    C.TRAINER_GROUP, C.TRAINER_VERSION, C.CLUSTER_RUNTIME_PLURAL, C.CLUSTER_RUNTIME_KIND, False, has_generation=True
)

#: What a namespace's admission reads (pod_admission.py): the identities its pods run as (the
#: ServiceAccount controller makes `default` in each namespace), its ResourceQuotas (the quota
#: controller writes their status) and LimitRanges.
SERVICEACCOUNTS = ResourceType("", "v1", "serviceaccounts", "ServiceAccount", True)
RESOURCEQUOTAS = ResourceType("", "v1", "resourcequotas", "ResourceQuota", True, status_subresource=True)
LIMITRANGES = ResourceType("", "v1", "limitranges", "LimitRange", True)
#: The Priority admission plugin's classes (cluster-scoped).
PRIORITYCLASSES = ResourceType("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False)
#: Policies and webhooks: ValidatingAdmissionPolicies (with their bindings) are evaluated on pod creation;
#: webhook configurations are only stored (no webhook is called).
ADMISSION_GROUP = "admissionregistration.k8s.io"
VALIDATING_POLICIES = ResourceType(
    ADMISSION_GROUP,
    "v1",
    "validatingadmissionpolicies",
    "ValidatingAdmissionPolicy",
    False,
    status_subresource=True,
    has_generation=True,
)
VALIDATING_POLICY_BINDINGS = ResourceType(
    ADMISSION_GROUP,
    "v1",
    "validatingadmissionpolicybindings",
    "ValidatingAdmissionPolicyBinding",
    False,
    has_generation=True,
)
VALIDATING_WEBHOOKS = ResourceType(
    ADMISSION_GROUP,
    "v1",
    "validatingwebhookconfigurations",
    "ValidatingWebhookConfiguration",
    False,
    has_generation=True,
)
MUTATING_WEBHOOKS = ResourceType(
    ADMISSION_GROUP,
    "v1",
    "mutatingwebhookconfigurations",
    "MutatingWebhookConfiguration",
    False,
    has_generation=True,
)

KUEUE_GROUP = C.KUEUE_GROUP
#: Kueue's queue of a namespace, and the Workload that stands for a job in it (the local Kueue
#: emulation, kueue.py). Stored as v1beta2; the server also serves v1beta1 unless told otherwise
#: (versions.py converts).
LOCALQUEUES = ResourceType(
    C.KUEUE_GROUP,
    KUEUE_STORAGE_VERSION,
    "localqueues",
    C.LOCALQUEUE_KIND,
    True,
    status_subresource=True,
    has_generation=True,
)
WORKLOADS = ResourceType(
    C.KUEUE_GROUP,
    KUEUE_STORAGE_VERSION,
    "workloads",
    C.WORKLOAD_KIND,
    True,
    status_subresource=True,
    has_generation=True,
)

#: A ClusterQueue's quota and preemption policy, and the priorities Workloads take from a
#: WorkloadPriorityClass: read by the local Kueue when a LocalQueue's ClusterQueue exists. A
#: ResourceFlavor is only stored (the local Kueue adds no node labels of a flavor).
RESOURCEFLAVORS = ResourceType(
    C.KUEUE_GROUP, KUEUE_STORAGE_VERSION, "resourceflavors", "ResourceFlavor", False, has_generation=True
)
CLUSTERQUEUES = ResourceType(
    C.KUEUE_GROUP,
    KUEUE_STORAGE_VERSION,
    "clusterqueues",
    "ClusterQueue",
    False,
    status_subresource=True,
    has_generation=True,
)
WORKLOAD_PRIORITY_CLASSES = ResourceType(
    C.KUEUE_GROUP, KUEUE_STORAGE_VERSION, "workloadpriorityclasses", "WorkloadPriorityClass", False, has_generation=True
)

ALL = (
    NAMESPACES,
    CONFIGMAPS,
    SECRETS,
    PVCS,
    PODS,
    SERVICES,
    EVENTS,
    EVENTS_V1,
    NODES,
    JOBS,
    JOBSETS,
    TRAINJOBS,
    RUNTIMES,
    CLUSTER_RUNTIMES,
    LOCALQUEUES,
    WORKLOADS,
    RESOURCEFLAVORS,
    CLUSTERQUEUES,
    WORKLOAD_PRIORITY_CLASSES,
    SERVICEACCOUNTS,
    RESOURCEQUOTAS,
    LIMITRANGES,
    PRIORITYCLASSES,
    VALIDATING_POLICIES,
    VALIDATING_POLICY_BINDINGS,
    VALIDATING_WEBHOOKS,
    MUTATING_WEBHOOKS,
)
_BY_GROUP_PLURAL = {(rt.group, rt.plural): rt for rt in ALL}
_BY_GROUP_KIND = {(rt.group, rt.kind): rt for rt in ALL}


def lookup(group: str, version: str, plural: str) -> Optional[ResourceType]:
    rt = _BY_GROUP_PLURAL.get((group, plural))
    return rt if rt is not None and rt.version == version else None


def by_kind(api_version: str, kind: str) -> Optional[ResourceType]:
    """The type an ownerReference names (any version of its group), None for one not served here."""
    return _BY_GROUP_KIND.get((api_version.rpartition("/")[0], kind))


def by_name(resource: str) -> ResourceType:
    """`configmaps`, `trainjobs` or `trainjobs.trainer.kubeflow.org` (the core group wins a tie)."""
    plural, _, group = resource.partition(".")
    rt = _BY_GROUP_PLURAL.get((group, plural))
    if rt is None and not group:
        rt = next((r for r in ALL if r.plural == plural), None)
    if rt is None:
        raise KeyError(f"unknown resource {resource!r}; known: {sorted({r.qualified for r in ALL})}")
    return rt
