"""Test hooks of the API server: the request log, the request and byte counters, injected faults and RBAC
denials."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Optional

from nemo_kubeflow_local.apiserver.apierrors import REASONS, ApiError

#: The user every request is made as (the kubeconfig's user name).
USER = "nemo-kubeflow-local"

_DEFAULT_MESSAGES = {
    429: "Too many requests, please try again later.",
    500: "Internal error occurred: injected fault",
    503: "The server is currently unable to handle the request",
    504: "The server was unable to return a response in the time allotted, but may still be processing the request",
}


@dataclass(frozen=True)
class RequestRecord:
    method: str
    path: str
    query: dict
    resource: str  # plural, with `/subresource` ("pods/log"); "" for discovery
    namespace: Optional[str]
    name: Optional[str]
    verb: str  # create, get, list, watch, patch, update, delete, deletecollection
    status_code: Optional[int]  # None when the connection was dropped
    time: float
    #: The response body's size; None for a stream (a watch, a followed log: see ``Hooks.counters``).
    bytes: Optional[int] = None
    #: The client's ``User-Agent`` header ("" without one).
    user_agent: str = ""


@dataclass(frozen=True)
class ApiCount:
    """What the server served of one verb on one resource: requests (every answer, errors included) and the
    bytes of the response bodies (a stream's chunks as they go out)."""

    verb: str
    resource: str  # plural, with `/subresource` ("pods/log"); "" for discovery
    requests: int
    bytes: int


@dataclass
class Fault:
    verb: Optional[str]
    resource: Optional[str]
    name: Optional[str]
    nth: Optional[int]
    status: Optional[int]
    reason: Optional[str]
    message: Optional[str]
    retry_after: Optional[int]
    delay: float
    drop_connection: bool
    times: int
    seen: int = 0
    fired: int = 0

    def wants(self, verb: str, resource: str, name: Optional[str]) -> bool:
        """Count a matching request; True when this one is to fail."""
        if self.fired >= self.times:
            return False
        if (
            (self.verb and self.verb != verb)
            or (self.resource and self.resource != resource)
            or (self.name and self.name != name)
        ):
            return False
        self.seen += 1
        if self.nth is not None and self.seen < self.nth:
            return False
        self.fired += 1
        return True

    def error(self) -> Optional[ApiError]:
        """The error to answer with; None for a pure delay."""
        status = self.status
        if status is None and (self.delay and not self.drop_connection):
            return None
        status = status or 500
        details = {"retryAfterSeconds": self.retry_after} if self.retry_after is not None else None
        headers = {"Retry-After": str(self.retry_after)} if self.retry_after is not None else None
        return ApiError(
            status,
            self.message or _DEFAULT_MESSAGES.get(status, "injected fault"),
            reason=self.reason or REASONS.get(status, "Unknown"),
            details=details,
            headers=headers,
        )


class FaultHandle:
    def __init__(self, hooks: "Hooks", fault: Fault):
        self._hooks, self.fault = hooks, fault

    @property
    def fired(self) -> int:
        return self.fault.fired

    def remove(self) -> None:
        self._hooks.remove_fault(self.fault)


class LogStreamHandle:
    """An open ``follow`` stream of a pod's log, as the test hooks see it: ``cut`` ends it."""

    def __init__(self, namespace: str, pod: str):
        self.namespace, self.pod = namespace, pod
        self.cut = threading.Event()
        #: Cut by dropping the connection (no last chunk), rather than by ending the answer.
        self.abrupt = True


@dataclass
class Hooks:
    """Shared between the cluster (which configures them) and the server (which applies them)."""

    requests: list[RequestRecord] = field(default_factory=list)
    _faults: list[Fault] = field(default_factory=list)
    _denied: set[tuple[str, str, Optional[str]]] = field(default_factory=set)
    _log_streams: list[LogStreamHandle] = field(default_factory=list)
    #: (verb, resource) -> [requests, response body bytes] since the last ``clear_counters``.
    _counters: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, record: RequestRecord) -> None:
        with self._lock:
            self.requests.append(record)
            self._counters.setdefault((record.verb, record.resource), [0, 0])[0] += 1

    def count_bytes(self, verb: str, resource: str, size: int) -> None:
        """``size`` more bytes of response body sent for a request of ``verb`` on ``resource`` (counted before
        they are written: a client that has its answer finds them counted)."""
        with self._lock:
            self._counters.setdefault((verb, resource), [0, 0])[1] += size

    def counters(self) -> list[ApiCount]:
        """Requests and response body bytes per verb and resource, as the server counted them."""
        with self._lock:
            return [ApiCount(verb, resource, n, size) for (verb, resource), (n, size) in sorted(self._counters.items())]

    def clear_counters(self) -> None:
        with self._lock:
            self._counters.clear()

    def snapshot(self) -> list[RequestRecord]:
        with self._lock:
            return list(self.requests)

    def clear(self) -> None:
        with self._lock:
            self.requests.clear()

    def add_fault(self, fault: Fault) -> FaultHandle:
        with self._lock:
            self._faults.append(fault)
        return FaultHandle(self, fault)

    def remove_fault(self, fault: Fault) -> None:
        with self._lock:
            if fault in self._faults:
                self._faults.remove(fault)

    def take_fault(self, verb: str, resource: str, name: Optional[str]) -> Optional[Fault]:
        """The fault this request triggers: the first rule (in the order added) that fires."""
        with self._lock:
            for fault in self._faults:
                if fault.wants(verb, resource, name):
                    if fault.fired >= fault.times:
                        self._faults.remove(fault)
                    return fault
            return None

    def drops_connections(self, verb: str, resource: str) -> bool:
        """Whether a fault that drops the connections of requests like this one is in force (not counted as
        fired): an open watch then breaks, as when the API server goes away."""
        with self._lock:
            return any(
                f.drop_connection
                and f.fired < f.times
                and (not f.verb or f.verb == verb)
                and (not f.resource or f.resource == resource)
                and not f.name
                for f in self._faults
            )

    def open_log_stream(self, namespace: str, pod: str) -> LogStreamHandle:
        handle = LogStreamHandle(namespace, pod)
        with self._lock:
            self._log_streams.append(handle)
        return handle

    def close_log_stream(self, handle: LogStreamHandle) -> None:
        with self._lock:
            if handle in self._log_streams:
                self._log_streams.remove(handle)

    def log_streams(self) -> list[LogStreamHandle]:
        with self._lock:
            return list(self._log_streams)

    def cut_log_streams(self, pod: Optional[str], abrupt: bool) -> int:
        with self._lock:
            cut = [h for h in self._log_streams if pod is None or h.pod == pod]
        for handle in cut:
            handle.abrupt = abrupt
            handle.cut.set()
        return len(cut)

    def deny(self, verb: str, resource: str, namespace: Optional[str]) -> None:
        with self._lock:
            self._denied.add((verb, resource, namespace))

    def allow_all(self) -> None:
        with self._lock:
            self._denied.clear()

    def forbidden(
        self, verb: str, resource: str, group: str, namespace: Optional[str], name: Optional[str]
    ) -> Optional[ApiError]:
        """RBAC: the apiserver's Forbidden error if a deny rule covers this request."""
        with self._lock:
            denied = any(
                v in (verb, "*") and r in (resource, "*") and ns in (namespace, None) for v, r, ns in self._denied
            )
        if not denied:
            return None
        plural = resource.split("/")[0]
        subject = f'{plural} "{name}"' if name else plural
        scope = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
        details = {"name": name} if name else {}
        if group:
            details["group"] = group
        details["kind"] = plural
        return ApiError(
            403,
            f'{subject} is forbidden: User "{USER}" cannot {verb} resource "{resource}" in API group "{group}" {scope}',
            details=details,
        )


# --- faults of nodes and containers (not of the API server) ---------------------------------------------

#: What Kubernetes' taint-eviction controller writes on a pod of a lost node before deleting it.
TAINT_EVICTION_CONDITION = {
    "type": "DisruptionTarget",
    "status": "True",
    "reason": "DeletionByTaintManager",
    "message": "Taint manager: deleting due to NoExecute taint",
}


def lose_node(store, events, kubelet, node: str) -> list[str]:
    """A node dies and comes back (a flapping node): the node lifecycle controller marks its pods not
    ready (event NodeNotReady), the taint-eviction controller sets ``DisruptionTarget`` on each
    (event TaintManagerEviction), their containers die (the pods end Failed, which the Job controller
    counts) and the pods are deleted. Returns the names of the pods. The Node itself stays Ready,
    free for new pods."""
    import time

    from nemo_kubeflow_local.apiserver import resources as R
    from nemo_kubeflow_local.timeutil import now_rfc3339

    deleted = []
    for pod in store.list(R.PODS, None, lambda p: p["spec"].get("nodeName") == node)[0]:
        meta = pod["metadata"]
        if meta.get("deletionTimestamp") or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        events.record(pod, "Warning", "NodeNotReady", "Node is not ready", "node-controller")

        def disrupt(obj: dict, uid=meta["uid"]) -> Optional[dict]:
            if obj["metadata"]["uid"] != uid:
                return None
            conditions = [
                c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] != "DisruptionTarget"
            ]
            obj.setdefault("status", {})["conditions"] = conditions + [
                {**TAINT_EVICTION_CONDITION, "lastTransitionTime": now_rfc3339()}
            ]
            return obj

        if store.mutate(R.PODS, meta["namespace"], meta["name"], disrupt) is None:
            continue
        events.record(
            pod,
            "Normal",
            "TaintManagerEviction",
            f"Marking for deletion Pod {meta['namespace']}/{meta['name']}",
            "taint-eviction-controller",
        )
        worker = kubelet.worker(meta["uid"])
        if worker is not None:
            worker.kill()
            deadline = time.monotonic() + 10.0
            while (
                time.monotonic() < deadline
                and ((store.find(R.PODS, meta["namespace"], meta["name"]) or {}).get("status") or {}).get("phase")
                == "Running"
            ):
                time.sleep(0.05)
        deleted.append(meta["name"])
        try:
            store.delete(R.PODS, meta["namespace"], meta["name"], preconditions={"uid": meta["uid"]})
        except ApiError:
            pass  # the Job controller was first (a gang restart deletes the pods)
    return deleted


def oom_kill(kubelet, store, namespace: str, pod_name: str, container: str) -> None:
    """The kernel's OOM killer ends `container` of a running pod: SIGKILL to its processes, exit
    code 137, terminated reason OOMKilled."""
    from nemo_kubeflow_local.apiserver import resources as R

    pod = store.find(R.PODS, namespace, pod_name)
    worker = kubelet.worker(pod["metadata"]["uid"]) if pod is not None and kubelet is not None else None
    if worker is None or not worker.oom_kill(container):
        raise ValueError(f"container {container!r} of pod {namespace}/{pod_name} is not running on the local kubelet")
