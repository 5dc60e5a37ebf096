"""Kubernetes events, from either recorder (core ``involvedObject``/``lastTimestamp``, events.k8s.io
``regarding``/``eventTime``): what an event is about, when, what it says. Pure.
"""

from __future__ import annotations


def event_object(event: dict) -> dict:
    """The object an event is about, from either recorder (core ``involvedObject``, events.k8s.io ``regarding``)."""
    return event.get("involvedObject") or event.get("regarding") or {}


def event_time(event: dict) -> str:
    return event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp") or ""


def event_text(event: dict) -> str:
    return event.get("message") or event.get("note") or ""
