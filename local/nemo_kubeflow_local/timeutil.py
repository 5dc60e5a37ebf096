"""Timestamps in the forms the API server writes."""

from __future__ import annotations

import datetime as dt
from typing import Optional


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def now_rfc3339() -> str:
    """metav1.Time: second precision, UTC, `Z` suffix."""
    return now().strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    """metav1.MicroTime (Event.eventTime)."""
    return now().strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


def set_condition(
    conditions: list[dict],
    type_: str,
    status: str,
    reason: str,
    message: str,
    observed_generation: Optional[int] = None,
) -> None:
    """Kubernetes' meta.SetStatusCondition: update in place, moving lastTransitionTime only on a status change."""
    for condition in conditions:
        if condition["type"] == type_:
            if condition["status"] != status:
                condition["lastTransitionTime"] = now_rfc3339()
            condition.update(status=status, reason=reason, message=message)
            return
    condition = {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now_rfc3339(),
    }
    if observed_generation is not None:
        condition["observedGeneration"] = observed_generation
    conditions.append(condition)
