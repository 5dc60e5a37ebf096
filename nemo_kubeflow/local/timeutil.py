"""Timestamps in the forms the API server writes."""

from __future__ import annotations

import datetime as dt


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
