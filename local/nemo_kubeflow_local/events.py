"""Events, recorded the way each component's client-go recorder does.

The kubelet and the Job controller use the core/v1 recorder: `firstTimestamp`, `lastTimestamp` and `count`.
kube-scheduler and the Trainer and JobSet controllers (`trainer-trainjob-controller`, `jobset`, as they sign them
for real) use the events.k8s.io/v1 recorder: `eventTime`, `action` and `series`, with `firstTimestamp` null in the
core/v1 view (so the Kubeflow SDK's `get_job_events`, which drops events without it, does not show them).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Optional, Protocol

from nemo_kubeflow_local.apiserver import resources as R
from nemo_kubeflow_local.apiserver.apierrors import ApiError
from nemo_kubeflow_local.apiserver.store import Store
from nemo_kubeflow_local.timeutil import now_micro, now_rfc3339

#: The host name in `source.host`, `reportingInstance` and every pod's spec.nodeName.
NODE_NAME = "nemo-kubeflow-local"
#: client-go's EventAggregator: from the 10th different message of alike events in 10 minutes, one combined event.
AGGREGATE_AFTER, AGGREGATE_INTERVAL_S = 10, 600.0
#: Components that record through events.k8s.io/v1.
NEW_API_COMPONENTS = {"default-scheduler", "trainer-trainjob-controller", "jobset"}


class Recorder(Protocol):
    """What records events: the local cluster's EventRecorder (into the store), or a node agent's over the API."""

    def record(
        self, involved: dict, type_: str, reason: str, message: str, component: str, field_path: Optional[str] = None
    ) -> None: ...


class EventRecorder:
    def __init__(self, store: Store):
        self._store = store
        self._lock = threading.Lock()
        self._names: dict[tuple, str] = {}  # (namespace, uid, type, reason, component, message) -> event name
        #: (namespace, uid, type, reason, component) -> (the different messages seen, when last)
        self._similar: dict[tuple, tuple[set[str], float]] = {}

    def _correlate(self, similar: tuple, message: str, key: tuple) -> tuple[str, tuple]:
        """client-go's EventAggregator: events alike but for their message (a refused pod's name differs each
        time) are recorded apart up to the 10th different message in 10 minutes; from then on as one event,
        "(combined from similar events): <the latest message>", whose count grows."""
        now = time.monotonic()
        with self._lock:
            messages, last = self._similar.get(similar, (set(), now))
            if now - last > AGGREGATE_INTERVAL_S:
                messages = set()
            messages.add(message)
            if len(messages) >= AGGREGATE_AFTER:
                messages.pop()
                message, key = f"(combined from similar events): {message}", similar
            if len(self._similar) > 4096:
                self._similar.clear()
            self._similar[similar] = (messages, now)
        return message, key

    def record(
        self, involved: dict, type_: str, reason: str, message: str, component: str, field_path: Optional[str] = None
    ) -> None:
        """Record an event about `involved` (a stored object or an object reference)."""
        meta = involved.get("metadata", involved)
        namespace = meta.get("namespace") or "default"
        ref = {
            "kind": involved.get("kind"),
            "namespace": meta.get("namespace"),
            "name": meta.get("name"),
            "uid": meta.get("uid"),
            "apiVersion": involved.get("apiVersion"),
            "resourceVersion": meta.get("resourceVersion"),
        }
        if field_path:
            ref["fieldPath"] = field_path
        ref = {k: v for k, v in ref.items() if v}
        new_api = component in NEW_API_COMPONENTS
        similar = (namespace, ref.get("uid") or ref.get("name"), type_, reason, component)
        key: tuple = similar + (message,)
        if not new_api:
            message, key = self._correlate(similar, message, key)
        stamp = now_micro() if new_api else now_rfc3339()
        with self._lock:
            name = self._names.get(key)
        # The store is called without our lock held: store listeners may record events too.
        if (
            name is not None
            and self._store.mutate(R.EVENTS, namespace, name, lambda e: _repeat(e, stamp, new_api, message)) is not None
        ):
            return
        name = f"{meta.get('name')}.{time.time_ns():x}"
        with self._lock:
            if len(self._names) > 4096:  # client-go's correlator keeps an LRU of this size
                self._names.clear()
            self._names[key] = name
        event: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": ref,
            "reason": reason,
            "message": message,
            "type": type_,
            "reportingComponent": component,
            "reportingInstance": NODE_NAME,
        }
        if new_api:
            event.update(source={}, firstTimestamp=None, lastTimestamp=None, eventTime=stamp, action=reason)
        else:
            event.update(
                source={"component": component, "host": NODE_NAME},
                firstTimestamp=stamp,
                lastTimestamp=stamp,
                count=1,
                eventTime=None,
            )
        try:
            self._store.create(R.EVENTS, event)
        except ApiError:
            pass  # the namespace is gone (or going): so is the object the event is about


def _repeat(event: dict, stamp: str, new_api: bool, message: str) -> dict:
    if new_api:
        series = event.get("series") or {"count": 1}
        return {**event, "series": {"count": series["count"] + 1, "lastObservedTime": stamp}}
    return {**event, "count": event.get("count", 1) + 1, "lastTimestamp": stamp, "message": message}
