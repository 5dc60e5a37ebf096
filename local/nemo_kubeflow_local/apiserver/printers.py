"""Server-side printing: the `meta.k8s.io/v1` Table that `kubectl get` asks for (`Accept: ...;as=Table`).

Without it kubectl falls back to NAME and AGE for every kind, so `kubectl get pods` would not
show whether a pod runs. The columns are the real server's for pods and namespaces, and those the
Trainer CRD declares (`additionalPrinterColumns`) for TrainJobs; other kinds get NAME and AGE.
"""

from __future__ import annotations

import datetime as dt
from typing import Callable, Optional

from nemo_kubeflow_local.apiserver import resources as R
from nemo_kubeflow_local.apiserver.resources import ResourceType
from nemo_kubeflow_local.timeutil import now, parse

_NAME = {
    "name": "Name",
    "type": "string",
    "format": "name",
    "priority": 0,
    "description": "Name must be unique within a namespace.",
}
_AGE = {
    "name": "Age",
    "type": "string",
    "format": "",
    "priority": 0,
    "description": "CreationTimestamp is when the object was created.",
}


def wants_table(accept: str) -> bool:
    """kubectl lists Table first and plain JSON as its fallback; clients that ask for JSON only get JSON."""
    first = accept.split(",")[0]
    return "as=Table" in first and "g=meta.k8s.io" in first


def human_duration(seconds: float) -> str:
    """An age the way kubectl shows it: two units while the larger is small ("3m12s", "5h4m", "2d3h"), then one."""
    s = int(seconds)
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes, hours, days = s // 60, s // 3600, s // 86400

    def pair(big: int, big_unit: str, small: int, small_unit: str) -> str:
        return f"{big}{big_unit}" + (f"{small}{small_unit}" if small else "")

    if minutes < 10:
        return pair(minutes, "m", s % 60, "s")
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return pair(hours, "h", minutes % 60, "m")
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return pair(days, "d", hours % 24, "h")
    if days < 365 * 2:
        return f"{days}d"
    if days < 365 * 8:
        return pair(days // 365, "y", days % 365, "d")
    return f"{days // 365}y"


def _age(obj: dict, at: dt.datetime) -> str:
    return _since(obj.get("metadata", {}).get("creationTimestamp"), at)


def _pod_status(pod: dict) -> str:
    """What the STATUS column shows: a waiting or terminated container's reason over the phase."""
    status = pod.get("status") or {}
    reason = status.get("reason") or status.get("phase") or "Unknown"
    reason = _init_reason(pod, status) or _containers_reason(status, reason)
    if pod.get("metadata", {}).get("deletionTimestamp"):
        reason = "Terminating"
    return reason


def _exit_reason(terminated: dict) -> str:
    """A terminated container without a reason: its signal, else its exit code."""
    return f"Signal:{terminated['signal']}" if terminated.get("signal") else f"ExitCode:{terminated.get('exitCode')}"


def _init_reason(pod: dict, status: dict) -> Optional[str]:
    """``Init:...`` for the first init container that has not succeeded; None once all have."""
    init_statuses = status.get("initContainerStatuses") or []
    for i, cs in enumerate(init_statuses):
        state = cs.get("state") or {}
        terminated, waiting = state.get("terminated"), state.get("waiting")
        if terminated and terminated.get("exitCode") == 0:
            continue
        if terminated:
            return "Init:" + (terminated.get("reason") or _exit_reason(terminated))
        if waiting and waiting.get("reason") and waiting["reason"] != "PodInitializing":
            return "Init:" + waiting["reason"]
        return f"Init:{i}/{len(pod.get('spec', {}).get('initContainers') or init_statuses)}"
    return None


def _containers_reason(status: dict, reason: str) -> str:
    """The reason of the first container (in order) that waits or ended, over ``reason`` (the pod's);
    ``Completed`` reads ``Running`` while a container still runs ready."""
    running = False
    for cs in reversed(status.get("containerStatuses") or []):
        state = cs.get("state") or {}
        terminated, waiting = state.get("terminated"), state.get("waiting")
        if waiting and waiting.get("reason"):
            reason = waiting["reason"]
        elif terminated and terminated.get("reason"):
            reason = terminated["reason"]
        elif terminated:
            reason = _exit_reason(terminated)
        elif state.get("running") and cs.get("ready"):
            running = True
    if reason == "Completed" and running:
        reason = "Running"
    return reason


def _pod_cells(pod: dict) -> list:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    total = len(pod.get("spec", {}).get("containers") or statuses)
    ready = sum(1 for cs in statuses if cs.get("ready"))
    restarts = sum(cs.get("restartCount", 0) for cs in statuses)
    return [f"{ready}/{total}", _pod_status(pod), restarts]


def _column(name: str, description: str = "", priority: int = 0, type_: str = "string") -> dict:
    return {"name": name, "type": type_, "format": "", "priority": priority, "description": description}


def _since(stamp: Optional[str], at: dt.datetime) -> str:
    return human_duration((at - parse(stamp)).total_seconds()) if stamp else "<unknown>"


#: Events have no NAME column first: what happened matters more than the event's name.
_EVENT_COLUMNS = [
    _column("Last Seen"),
    _column("Type"),
    _column("Reason"),
    _column("Object"),
    _column("Subobject", priority=1),
    _column("Source", priority=1),
    _column("Message"),
    _column("First Seen", priority=1),
    _column("Count", priority=1, type_="integer"),
    _column("Name", priority=1),
]


def _event_row(event: dict, at: dt.datetime) -> list:
    involved, source = event.get("involvedObject") or {}, event.get("source") or {}
    last = event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp")
    return [
        _since(last, at),
        event.get("type", ""),
        event.get("reason", ""),
        f"{involved.get('kind', '').lower()}/{involved.get('name', '')}",
        involved.get("fieldPath", ""),
        ", ".join(x for x in (source.get("component"), source.get("host")) if x) or event.get("reportingComponent", ""),
        event.get("message", ""),
        _since(event.get("firstTimestamp") or event.get("eventTime"), at),
        event.get("count", 1),
        event.get("metadata", {}).get("name", ""),
    ]


def _last_condition_type(obj: dict) -> str:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return conditions[-1].get("type", "") if conditions else ""


#: Per kind: the columns between NAME and AGE, and how to fill them.
_COLUMNS: dict[ResourceType, tuple[list[dict], Callable[[dict], list]]] = {
    R.PODS: (
        [
            {
                "name": "Ready",
                "type": "string",
                "format": "",
                "priority": 0,
                "description": "The number of ready containers out of all containers.",
            },
            {
                "name": "Status",
                "type": "string",
                "format": "",
                "priority": 0,
                "description": "The aggregate state of the containers in this pod.",
            },
            {
                "name": "Restarts",
                "type": "integer",
                "format": "",
                "priority": 0,
                "description": "The number of times the containers in this pod have been restarted.",
            },
        ],
        _pod_cells,
    ),
    R.NAMESPACES: (
        [
            {
                "name": "Status",
                "type": "string",
                "format": "",
                "priority": 0,
                "description": "The status of the namespace.",
            }
        ],
        lambda ns: [(ns.get("status") or {}).get("phase", "")],
    ),
    R.TRAINJOBS: (
        [{"name": "State", "type": "string", "format": "", "priority": 0, "description": ""}],
        lambda job: [_last_condition_type(job)],
    ),
}
#: Pods also show their IP and node with `-o wide`.
_POD_WIDE = [
    {"name": "IP", "type": "string", "format": "", "priority": 1, "description": "The pod's IP."},
    {"name": "Node", "type": "string", "format": "", "priority": 1, "description": "The pod's node."},
]


def _row_object(obj: dict, include: str) -> Optional[dict]:
    if include == "None":
        return None
    if include == "Object":
        return obj
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj.get("metadata", {})}


def to_table(rt: ResourceType, body: dict, include_object: str = "PartialObjectMetadata") -> dict:
    """A Table of one object (a GET) or of a list's items (a LIST), keeping the list's metadata."""
    columns, cells = _COLUMNS.get(rt, ([], lambda _: []))
    items = (body.get("items") or []) if "items" in body else [body]
    at = now()
    definitions = _EVENT_COLUMNS if rt is R.EVENTS else [_NAME, *columns, _AGE] + (_POD_WIDE if rt is R.PODS else [])
    rows = []
    for obj in items:
        row = (
            _event_row(obj, at)
            if rt is R.EVENTS
            else [obj.get("metadata", {}).get("name", ""), *cells(obj), _age(obj, at)]
        )
        if rt is R.PODS:
            row += [(obj.get("status") or {}).get("podIP") or "<none>", obj.get("spec", {}).get("nodeName") or "<none>"]
        entry: dict = {"cells": row}
        included = _row_object(obj, include_object)
        if included is not None:
            entry["object"] = included
        rows.append(entry)
    metadata = (
        body.get("metadata", {})
        if "items" in body
        else {"resourceVersion": body.get("metadata", {}).get("resourceVersion", "")}
    )
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
        "columnDefinitions": definitions,
        "rows": rows,
    }
