"""Small reads of Kubernetes objects the emulated controllers share: conditions, pod phases, owners."""

from __future__ import annotations

from typing import Optional


def condition(obj: dict, type_: str) -> Optional[dict]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == type_), None)


def is_true(obj: dict, type_: str) -> bool:
    return (condition(obj, type_) or {}).get("status") == "True"


def terminal(pod: dict) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def gone_or_going(pod: dict) -> bool:
    return terminal(pod) or bool(pod["metadata"].get("deletionTimestamp"))


def pod_ready(pod: dict) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running" and is_true(pod, "Ready")


def owned_by(obj: dict, uid: str) -> bool:
    return any(ref.get("uid") == uid and ref.get("controller") for ref in obj["metadata"].get("ownerReferences") or [])


def controller_ref(owner: dict) -> dict:
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
