"""Kueue's API side, as the API server applies it: the fields of Kueue's CRDs (what a decode prunes), their
schema's checks, and Kueue's mutating webhook for TrainJobs (a job that names a queue is created suspended).

Kueue's controller (controllers/kueue.py) reconciles the objects; these checks run on every write, inside the
API server (admission.py, core_validation.py, registry.py), which sits below the controllers
(docs/local-cluster.md, "Layers").
"""

from __future__ import annotations

from nemo_kubeflow_local import constants as C
from nemo_kubeflow_local.apiserver import resources as R
from nemo_kubeflow_local.apiserver.apierrors import FieldError, bad_request
from nemo_kubeflow_local.apiserver.resources import ResourceType

STOP_POLICIES = ("None", "Hold", "HoldAndDrain")

#: Fields of the CRDs' `spec` as stored (v1beta2: versions.py converts a v1beta1 client's objects);
#: anything else is an unknown field.
_SPEC_FIELDS = {
    R.LOCALQUEUES.key: {"clusterQueue", "stopPolicy", "fairSharing"},
    R.WORKLOADS.key: {"podSets", "queueName", "priorityClassRef", "priority", "active", "maximumExecutionTimeSeconds"},
    R.CLUSTERQUEUES.key: {
        "namespaceSelector",
        "resourceGroups",
        "preemption",
        "queueingStrategy",
        "cohortName",
        "flavorFungibility",
        "stopPolicy",
        "fairSharing",
        "admissionChecksStrategy",
        "admissionScope",
        "concurrentAdmissionPolicy",
    },
    R.RESOURCEFLAVORS.key: {"nodeLabels", "nodeTaints", "tolerations", "topologyName"},
}
_TOP_FIELDS = {"apiVersion", "kind", "metadata", "spec", "status"}
#: A WorkloadPriorityClass has no spec: its value sits at the top.
_PRIORITY_CLASS_FIELDS = {"apiVersion", "kind", "metadata", "value", "description"}


def fields(rt: ResourceType) -> tuple[list[str], list[str]]:
    """A Kueue kind's fields as stored (v1beta2), sorted: those at the top, and those of its spec (none for a
    WorkloadPriorityClass). What the OpenAPI documents list (openapi.py)."""
    if rt is R.WORKLOAD_PRIORITY_CLASSES:
        return sorted(_PRIORITY_CLASS_FIELDS), []
    return sorted(_TOP_FIELDS), sorted(_SPEC_FIELDS[rt.key])


def unknown_fields(rt: ResourceType, obj: dict) -> list[tuple]:
    """Decode a Kueue object: the paths of unknown fields (the CRD schema would prune them)."""
    if rt is R.WORKLOAD_PRIORITY_CLASSES:
        return sorted((key,) for key in obj if key not in _PRIORITY_CLASS_FIELDS)
    unknown: list[tuple] = [(key,) for key in obj if key not in _TOP_FIELDS]
    spec = obj.get("spec", {})
    if not isinstance(spec, dict):
        raise bad_request(
            f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: json: cannot '
            f"unmarshal {type(spec).__name__} into Go struct field {rt.kind}.spec of type object"
        )
    unknown += [("spec", key) for key in spec if key not in _SPEC_FIELDS[rt.key]]
    return sorted(unknown)


def crd_errors(rt: ResourceType, obj: dict) -> list[FieldError]:
    spec = obj.get("spec") or {}
    errors = []
    if rt is R.LOCALQUEUES and spec.get("stopPolicy", "None") not in STOP_POLICIES:
        errors.append(
            FieldError(
                "spec.stopPolicy",
                "Unsupported value",
                "supported values: " + ", ".join(f'"{p}"' for p in STOP_POLICIES),
                spec.get("stopPolicy"),
            )
        )
    if rt is R.WORKLOADS and not spec.get("podSets"):
        errors.append(FieldError.required("spec.podSets"))
    if rt is R.WORKLOAD_PRIORITY_CLASSES and (not isinstance(obj.get("value"), int) or isinstance(obj["value"], bool)):
        errors.append(FieldError.required("value"))
    return errors


def default_trainjob(obj: dict) -> None:
    """Kueue's mutating webhook (on create): a job that names a queue starts suspended."""
    if (obj.get("metadata", {}).get("labels") or {}).get(C.QUEUE_LABEL) and isinstance(obj.get("spec"), dict):
        obj["spec"]["suspend"] = True
