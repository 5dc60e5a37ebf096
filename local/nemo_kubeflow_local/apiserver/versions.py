"""Kueue's two served API versions: objects are stored as v1beta2 (Kueue's storage version since
v0.16) and converted for a client that reads or writes v1beta1, as Kueue's conversion webhook does.

Only the fields that differ between the versions of the kinds served here are converted
(kueue apis/kueue/v1beta1 and v1beta2 at v0.19.2): a Workload's ``spec.priorityClassName`` and
``priorityClassSource`` (v1beta1) are ``spec.priorityClassRef`` (v1beta2), and a ClusterQueue's
``spec.cohort`` is ``spec.cohortName``. A LocalQueue's ``status.flavorUsage`` is ``flavorsUsage``.
"""

from __future__ import annotations

import copy
from typing import Any

from nemo_kubeflow_local.constants import KUEUE_GROUP, KUEUE_SERVED_DEFAULT, KUEUE_STORAGE_VERSION

__all__ = ["KUEUE_SERVED_DEFAULT", "KUEUE_STORAGE_VERSION", "from_storage", "list_from_storage", "to_storage"]

_WORKLOAD_PRIORITY_SOURCE = "kueue.x-k8s.io/workloadpriorityclass"
_POD_PRIORITY_SOURCE = "scheduling.k8s.io/priorityclass"
_REF_KIND = {
    _WORKLOAD_PRIORITY_SOURCE: ("kueue.x-k8s.io", "WorkloadPriorityClass"),
    _POD_PRIORITY_SOURCE: ("scheduling.k8s.io", "PriorityClass"),
}


#: Fields renamed in v1beta2, by kind: (section, v1beta1 name, v1beta2 name).
_RENAMED = {"ClusterQueue": ("spec", "cohort", "cohortName"), "LocalQueue": ("status", "flavorUsage", "flavorsUsage")}


def _rename(kind: str, obj: dict, to_v1beta2: bool) -> None:
    if kind in _RENAMED:
        where, old, new = _RENAMED[kind]
        section = obj.get(where)
        if not to_v1beta2:
            old, new = new, old
        if isinstance(section, dict) and old in section:
            section[new] = section.pop(old)


def to_storage(kind: str, obj: Any) -> Any:
    """A v1beta1 object as v1beta2 (a copy; anything not a dict as it is)."""
    if not isinstance(obj, dict):
        return obj
    obj = copy.deepcopy(obj)
    spec = obj.get("spec")
    if kind == "Workload" and isinstance(spec, dict) and "priorityClassName" in spec:
        name = spec.pop("priorityClassName")
        group, ref_kind = _REF_KIND.get(spec.pop("priorityClassSource", ""), _REF_KIND[_WORKLOAD_PRIORITY_SOURCE])
        spec["priorityClassRef"] = {"group": group, "kind": ref_kind, "name": name}
    _rename(kind, obj, to_v1beta2=True)
    return obj


def from_storage(kind: str, obj: Any, version: str) -> Any:
    """A stored (v1beta2) object as ``version`` would show it (a copy)."""
    if not isinstance(obj, dict):
        return obj
    obj = copy.deepcopy(obj)
    if str(obj.get("apiVersion", "")).startswith(f"{KUEUE_GROUP}/"):
        obj["apiVersion"] = f"{KUEUE_GROUP}/{version}"
    if version == KUEUE_STORAGE_VERSION:
        return obj
    spec = obj.get("spec")
    if kind == "Workload" and isinstance(spec, dict) and isinstance(spec.get("priorityClassRef"), dict):
        ref = spec.pop("priorityClassRef")
        spec["priorityClassName"] = ref.get("name", "")
        spec["priorityClassSource"] = next(
            (s for s, (g, _) in _REF_KIND.items() if g == ref.get("group")), _WORKLOAD_PRIORITY_SOURCE
        )
    _rename(kind, obj, to_v1beta2=False)
    return obj


def list_from_storage(kind: str, body: Any, version: str) -> Any:
    """An object, or a list of them (``items``), as ``version`` shows it."""
    if isinstance(body, dict) and isinstance(body.get("items"), list):
        body = dict(body, items=[from_storage(kind, item, version) for item in body["items"]])
        if str(body.get("apiVersion", "")).startswith(f"{KUEUE_GROUP}/"):
            body["apiVersion"] = f"{KUEUE_GROUP}/{version}"
        return body
    if isinstance(body, dict) and body.get("kind") == "Status":
        return body
    return from_storage(kind, body, version)
