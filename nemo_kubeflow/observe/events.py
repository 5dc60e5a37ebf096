"""Kubernetes events, from either recorder (core ``involvedObject``/``lastTimestamp``, events.k8s.io
``regarding``/``eventTime``): what an event is about, when, what it says, and the newest Warning about the
TrainJob itself. Pure.
"""

from __future__ import annotations

from typing import Sequence


def event_object(event: dict) -> dict:
    """The object an event is about, from either recorder (core ``involvedObject``, events.k8s.io ``regarding``)."""
    return event.get("involvedObject") or event.get("regarding") or {}


def event_time(event: dict) -> str:
    return event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp") or ""


def event_text(event: dict) -> str:
    return event.get("message") or event.get("note") or ""


def _is_about(event: dict, kind: str, name: str) -> bool:
    """Whether the event is about the object of that kind and name."""
    obj = event_object(event)
    return obj.get("kind") == kind and obj.get("name") == name


def trainjob_warning(events: Sequence[dict], trainjob: str) -> str:
    """The newest Warning event about the TrainJob itself, as "Reason: message" ("" if none).

    Events come from both recorders (core ``firstTimestamp``/``lastTimestamp`` and
    events.k8s.io ``eventTime``), so either time is used to order them.
    """
    warnings = [e for e in events if e.get("type") == "Warning" and _is_about(e, "TrainJob", trainjob)]
    if not warnings:
        return ""
    newest = max(warnings, key=event_time)
    return f"{newest.get('reason')}: {event_text(newest)}".rstrip(": ")
