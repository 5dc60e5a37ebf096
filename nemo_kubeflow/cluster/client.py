"""The one module that talks to a Kubernetes API server.

``Cluster`` is a small interface (create/get/list/patch/delete/log/events on plain
dicts); ``KubernetesCluster`` implements it with the ``kubernetes`` client's
``ApiClient`` so that objects stay plain JSON (no model round trips that drop unknown
fields). Everything above this module is pure or talks through this interface, which
is what lets tests run against the local cluster over real HTTP.

Errors carry the server's own reason and message and say how to fix the usual causes
(RBAC, missing namespace, unreachable server). Transient failures (429 with
Retry-After, 500/502/503/504, dropped connections, timeouts) are retried with a
bounded exponential backoff, here only: urllib3's own retries are off, so a stalled
server costs ``max_attempts`` tries, not that many times urllib3's. Inside ``deadline``
every try and every wait ends by the deadline (a submission's total time).
"""

from __future__ import annotations

import builtins
import dataclasses
import json
import logging
import math
import os
import random
import re
import socket
import threading
import time
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Protocol

from nemo_kubeflow.constants import (
    CLUSTER_RUNTIME_KIND,
    CLUSTER_RUNTIME_PLURAL,
    CLUSTERQUEUE_KIND,
    KUEUE_GROUP,
    KUEUE_VERSIONS,
    LOCALQUEUE_KIND,
    RUNTIME_KIND,
    RUNTIME_PLURAL,
    TRAINER_GROUP,
    TRAINER_VERSION,
    TRAINJOB_KIND,
    TRAINJOB_PLURAL,
    WORKLOAD_KIND,
)
from nemo_kubeflow.errors import (
    AdmissionDeniedError,
    AlreadyExistsError,
    ClusterError,
    ClusterUnreachableError,
    DeadlineExceededError,
    KubeconfigError,
    NotFoundError,
    PermissionDeniedError,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Kind:
    name: str
    group: str  # "" for core
    version: str
    plural: str
    namespaced: bool = True

    def path(self, namespace: Optional[str], name: Optional[str] = None, sub: Optional[str] = None) -> str:
        base = f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"
        if self.namespaced and namespace is not None:  # None: across all namespaces (list only)
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
        if sub:
            base += f"/{sub}"
        return base


KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind("ConfigMap", "", "v1", "configmaps"),
        Kind("Secret", "", "v1", "secrets"),
        Kind("PersistentVolumeClaim", "", "v1", "persistentvolumeclaims"),
        Kind("Pod", "", "v1", "pods"),
        Kind("Event", "", "v1", "events"),
        Kind("Namespace", "", "v1", "namespaces", namespaced=False),
        Kind("Node", "", "v1", "nodes", namespaced=False),
        # A JobSet's Jobs, read as metadata only (``list_metadata``): which is the running attempt's.
        Kind("Job", "batch", "v1", "jobs"),
        # Read by `nemo-kubeflow doctor` (the TrainJob CRD's fields), where the user may.
        Kind("CustomResourceDefinition", "apiextensions.k8s.io", "v1", "customresourcedefinitions", namespaced=False),
        # JobSet: read, and deleted to have Trainer build it again (node_avoidance.py).
        Kind("JobSet", "jobset.x-k8s.io", "v1alpha2", "jobsets"),
        Kind(TRAINJOB_KIND, TRAINER_GROUP, TRAINER_VERSION, TRAINJOB_PLURAL),
        Kind(RUNTIME_KIND, TRAINER_GROUP, TRAINER_VERSION, RUNTIME_PLURAL),
        Kind(CLUSTER_RUNTIME_KIND, TRAINER_GROUP, TRAINER_VERSION, CLUSTER_RUNTIME_PLURAL, namespaced=False),
        # Kueue, read only: the queue a job waits in, the Workload it waits as, the ClusterQueue
        # behind a queue. The version is the first of KUEUE_VERSIONS the server serves (_kind).
        Kind(LOCALQUEUE_KIND, KUEUE_GROUP, KUEUE_VERSIONS[0], "localqueues"),
        Kind(WORKLOAD_KIND, KUEUE_GROUP, KUEUE_VERSIONS[0], "workloads"),
        Kind(CLUSTERQUEUE_KIND, KUEUE_GROUP, KUEUE_VERSIONS[0], "clusterqueues", namespaced=False),
    )
}

#: The group of SelfSubjectAccessReview (``may``).
ACCESS_REVIEW_GROUP = "authorization.k8s.io"

#: The versions each API group serves, by (server, group): API discovery, asked once per process.
_SERVED_VERSIONS: dict[tuple[str, str], tuple[str, ...]] = {}
_SERVED_VERSIONS_LOCK = threading.Lock()
#: Kubeconfigs are loaded one at a time in a process: the kubernetes client writes a kubeconfig's inline
#: certificates to temp files shared process-wide by content and hands out a file's name before writing it, so
#: a second load of the same kubeconfig at that moment got an empty CA file (``NO_CERTIFICATE_OR_CRL_FOUND``).
_KUBECONFIG_LOADING = threading.Lock()

#: The Accept header that asks for a list of objects' metadata only (``PartialObjectMetadataList``: names,
#: labels, owners; no spec, no status), as metadata informers do; served by every supported API server.
METADATA_LIST_ACCEPT = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"

#: A watch that sends nothing this long past its own timeout is taken as broken (a server or network gone
#: silent): what it kept is not trusted from then on.
WATCH_SILENCE_S = 15

#: HTTP codes worth retrying: the request may succeed later unchanged.
TRANSIENT_STATUS = {429, 500, 502, 503, 504}


@dataclass
class Deadline:
    """When the requests of a block must be done by (``KubernetesCluster.deadline``)."""

    end: float  # time.monotonic()
    seconds: float
    #: The user's setting of ``seconds``, for the message ("submit_timeout_seconds"); None: ours.
    setting: Optional[str]

    def left(self) -> float:
        return self.end - time.monotonic()


@dataclass
class _Request:
    """One request of ``KubernetesCluster._call`` across its tries: what it does to which object (for the
    messages), the deadline it must meet, the wait before its next try, and its last try's error."""

    verb: str
    kind: str
    name: Optional[str]
    namespace: Optional[str]
    deadline: Optional[Deadline]
    delay: float
    last_error: str = ""

    def target(self) -> str:
        return describe_target(self.kind, self.name, self.namespace)


class ClusterReader(Protocol):
    """The reads: what observing a job needs (``observe/``, the scheduler's ``describe``). Typed with
    this, code that writes does not type-check."""

    def get(self, kind: str, name: str, namespace: Optional[str] = None) -> Optional[dict]: ...
    def list(
        self,
        kind: str,
        namespace: Optional[str],
        label_selector: Optional[str] = None,
        field_selector: Optional[str] = None,
        limit: Optional[int] = None,
    ) -> list[dict]: ...
    def list_metadata(
        self,
        kind: str,
        namespace: Optional[str],
        label_selector: Optional[str] = None,
        field_selector: Optional[str] = None,
    ) -> builtins.list[dict]: ...
    def pod_log(
        self,
        name: str,
        namespace: str,
        *,
        container: Optional[str] = None,
        follow: bool = False,
        tail_lines: Optional[int] = None,
        since_seconds: Optional[int] = None,
        since_time: Optional[str] = None,
        timestamps: bool = False,
        limit_bytes: Optional[int] = None,
    ) -> Iterator[str]: ...
    def pod_log_stream(
        self,
        name: str,
        namespace: str,
        *,
        container: Optional[str] = None,
        since_time: Optional[str] = None,
        tail_lines: Optional[int] = None,
        idle_timeout: Optional[float] = None,
    ) -> "LogStream": ...


class Cluster(ClusterReader, Protocol):
    """The reads and the writes: submitting (``cluster/submit.py``), cancelling, repairing (``repair/``)."""

    def deadline(self, seconds: float, setting: Optional[str] = None) -> AbstractContextManager[None]: ...
    def create(self, obj: dict, *, dry_run: bool = False) -> dict: ...
    def patch(self, kind: str, name: str, namespace: Optional[str], patch: dict) -> dict: ...
    def delete(self, kind: str, name: str, namespace: Optional[str] = None, *, uid: Optional[str] = None) -> bool: ...


def _scope(kind: str, namespace: Optional[str]) -> Optional[str]:
    """The namespace that a request on ``kind`` in ``namespace`` is about: none for a cluster-scoped kind."""
    spec = KINDS.get(kind)
    return namespace if namespace and (spec is None or spec.namespaced) else None


def describe_target(kind: str, name: Optional[str], namespace: Optional[str]) -> str:
    scoped = _scope(kind, namespace)
    where = f" in namespace {scoped!r}" if scoped else ""
    return f"{kind} {name!r}{where}" if name else f"{kind} objects{where}"


def kubectl_delete(kind: str, name: str, namespace: Optional[str]) -> str:
    """The kubectl command that deletes one object, for messages that ask a user to clean up."""
    spec = KINDS.get(kind)
    resource = (f"{spec.plural}.{spec.group}" if spec.group else spec.plural) if spec else kind.lower()
    scoped = _scope(kind, namespace)
    return f"kubectl delete {resource} {name}" + (f" -n {scoped}" if scoped else "")


def _status_of(body: Any) -> dict:
    if isinstance(body, (bytes, bytearray)):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str):
        try:
            parsed = json.loads(body)
            return parsed if isinstance(parsed, dict) else {}
        except ValueError:
            return {"message": body.strip()[:500]}
    return {}


def _webhook_denial(status: int, message: str) -> bool:
    """Whether a refusal is an admission webhook's: a 403 too, but nothing RBAC can fix (the object was refused)."""
    return status == 403 and "admission webhook" in message


def _forbidden_hint(kind: str, verb: str, namespace: Optional[str]) -> str:
    """How to get the RBAC permission a request was refused (403)."""
    spec = KINDS.get(kind)
    plural = spec.plural if spec else kind.lower()
    scoped = _scope(kind, namespace)
    hint = f"ask a cluster admin for RBAC permission to {verb} {plural}" + (
        f" in namespace {scoped!r}" if scoped else ""
    )
    if kind == CLUSTER_RUNTIME_KIND:
        hint += ", or set runtime_kind='TrainingRuntime' to use a namespaced runtime instead"
    return hint


def _hint(status: int, reason: str, kind: str, verb: str, namespace: Optional[str], message: str) -> str:
    """How to fix the usual causes of a refused request; "" when there is nothing to say."""
    if status == 401:
        return "the credentials in the kubeconfig were refused; refresh them (e.g. log in again)"
    if _webhook_denial(status, message):
        return "an admission webhook refused the object; fix what its message names"
    if status == 403:
        return _forbidden_hint(kind, verb, namespace)
    if status == 404 and "namespaces" in message and "not found" in message:
        return f"create the namespace ({namespace!r}) or set the executor's namespace to an existing one"
    if status == 404 and kind in (CLUSTER_RUNTIME_KIND, RUNTIME_KIND):
        return "check runtime_name, or leave it unset to let nemo_kubeflow render a runtime"
    if status == 422 or reason == "Invalid":
        return "the server rejected the manifest; run a dry run to see what was sent"
    return ""


def translate_api_exception(
    e: Exception, *, verb: str, kind: str, name: Optional[str], namespace: Optional[str]
) -> ClusterError:
    """An ``ApiException`` as one of our errors, with the server's message and a fix."""
    status, reason, message = _server_answer(e)
    target = describe_target(kind, name, namespace)
    hint = _hint(status, reason, kind, verb, namespace, message)
    text = f"cannot {verb} {target}: {message} (HTTP {status} {reason})".rstrip()
    if hint:
        text += f"; {hint}"
    return _error_class(status, verb, message)(text, status=status, reason=reason, server_message=message)


def _server_answer(e: Exception) -> tuple[int, str, str]:
    """An ``ApiException``'s HTTP status, reason and message: the server's ``Status`` body's where it sent one."""
    status = int(getattr(e, "status", 0) or 0)
    body = _status_of(getattr(e, "body", None))
    reason = body.get("reason") or getattr(e, "reason", None) or ""
    message = body.get("message") or str(reason) or "no message"
    return status, reason, message


def _error_class(status: int, verb: str, message: str) -> type[ClusterError]:
    """Which of our errors a refused request raises."""
    if status == 409 and verb == "create":  # on other verbs a 409 is a Conflict, not a name clash
        return AlreadyExistsError
    if _webhook_denial(status, message):
        return AdmissionDeniedError
    return {403: PermissionDeniedError, 404: NotFoundError}.get(status, ClusterError)


class KubernetesCluster:
    """``Cluster`` over the ``kubernetes`` client. Loads the kubeconfig on first use only."""

    def __init__(
        self,
        kubeconfig: Optional[str] = None,
        context: Optional[str] = None,
        *,
        max_attempts: int = 5,
        backoff: float = 0.2,
        max_backoff: float = 5.0,
        request_timeout: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.kubeconfig = kubeconfig
        self.context = context
        self.max_attempts = max_attempts
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.request_timeout = request_timeout
        self._sleep = sleep
        self._api_client = None
        #: Per thread: the ``Deadline`` its requests must meet, if any (one client serves parallel submissions).
        self._local = threading.local()

    # --- connection ---------------------------------------------------------
    @property
    def api_client(self):
        if self._api_client is None:
            with _KUBECONFIG_LOADING:
                if self._api_client is None:
                    self._api_client = self._load()
        return self._api_client

    def _load(self):
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException

        path = self._kubeconfig_path()
        if path is not None and not os.path.exists(path):
            raise KubeconfigError(
                f"kubeconfig {path!r} does not exist; set the executor's kubeconfig= or $KUBECONFIG "
                "to your cluster's kubeconfig (a dry run needs none)"
            )
        try:
            configuration = client.Configuration()
            if path is None:
                config.load_incluster_config(client_configuration=configuration)
            else:
                config.load_kube_config(config_file=path, context=self.context, client_configuration=configuration)
            return _api_client(configuration)
        except ConfigException as e:
            where = f" context {self.context!r} of" if self.context else ""
            raise KubeconfigError(f"cannot load{where} kubeconfig {path!r}: {e}") from None
        except (OSError, ValueError) as e:
            raise KubeconfigError(f"cannot read kubeconfig {path!r}: {e}") from None

    def _kubeconfig_path(self) -> Optional[str]:
        """The kubeconfig file to load: ``kubeconfig``, else $KUBECONFIG's first, else ~/.kube/config; None
        for the in-cluster config (in a pod, with none of them set or there)."""
        path = self.kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or None
        default_path = os.path.expanduser("~/.kube/config")
        if path is None and not os.path.exists(default_path) and os.environ.get("KUBERNETES_SERVICE_HOST"):
            return None
        return os.path.expanduser(path or default_path)

    # --- the request loop ----------------------------------------------------
    def _call(
        self,
        method: str,
        path: str,
        *,
        verb: str,
        kind: str,
        name: Optional[str],
        namespace: Optional[str],
        query: Optional[list] = None,
        body: Any = None,
        content_type: str = "application/json",
        stream: bool = False,
        retry: bool = True,
        stream_timeout: Optional[float] = None,
        accept: str = "application/json",
    ) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError as Urllib3Error

        attempts = self.max_attempts if retry else 1
        request = _Request(
            verb, kind, name, namespace, None if stream else getattr(self._local, "deadline", None), delay=self.backoff
        )
        for attempt in range(1, attempts + 1):
            timeout = self._try_timeout(request, attempt - 1, stream, stream_timeout)
            try:
                resp = self.api_client.call_api(
                    path,
                    method,
                    query_params=query or [],
                    header_params={"Accept": accept, "Content-Type": content_type},
                    body=body,
                    auth_settings=["BearerToken"],
                    _preload_content=False,
                    _return_http_data_only=True,
                    _request_timeout=timeout,
                )
                return resp if stream else _json_body(resp)
            except ApiException as e:
                if int(e.status or 0) not in TRANSIENT_STATUS or attempt == attempts:
                    raise translate_api_exception(e, verb=verb, kind=kind, name=name, namespace=namespace) from None
                self._wait_to_retry(request, e, path, attempt, attempts)
            except (Urllib3Error, OSError) as e:
                self._wait_to_reconnect(request, e, path, attempt, attempts)
        raise AssertionError("unreachable")  # pragma: no cover

    def _try_timeout(
        self, request: _Request, tries: int, stream: bool, stream_timeout: Optional[float]
    ) -> Optional[tuple[float, float]]:
        """The timeout of a request's next try (after ``tries``), within its deadline: past it,
        ``DeadlineExceededError``. A (connect, read) tuple: the client silently ignores a float timeout.
        A stream has no read timeout unless asked (a quiet follow stream waits for its next line)."""
        left = math.inf
        if request.deadline is not None:
            left = request.deadline.left()
            if left <= 0:
                raise self._past_deadline(request.deadline, request, tries)
        if stream and stream_timeout is None:
            return None
        return min(10.0, self.request_timeout, left), min(stream_timeout or self.request_timeout, left)

    def _wait_to_retry(self, request: _Request, e: Exception, path: str, attempt: int, attempts: int) -> None:
        """Wait to try again a request the server answered with a transient error (``TRANSIENT_STATUS``):
        its Retry-After, else the backoff (at most twice ``max_backoff``)."""
        status = int(getattr(e, "status", 0) or 0)
        wait = _retry_after(e) or request.delay
        request.last_error = f"HTTP {status} {getattr(e, 'reason', None) or ''}".strip()
        self._fit_in_deadline(request, min(wait, self.max_backoff * 2), attempt)
        log.info("%s %s: HTTP %s, retrying in %.1fs (%d/%d)", request.verb, path, status, wait, attempt, attempts)
        self._sleep(min(wait, self.max_backoff * 2))
        request.delay = min(request.delay * 2, self.max_backoff)

    def _wait_to_reconnect(self, request: _Request, e: Exception, path: str, attempt: int, attempts: int) -> None:
        """Wait to try again a request whose connection failed (refused, dropped, timed out), or, after the
        last try, raise ``ClusterUnreachableError``."""
        request.last_error = _short(e)
        self._fit_in_deadline(request, request.delay, attempt)
        if attempt == attempts:
            host = getattr(self.api_client.configuration, "host", "?")
            raise ClusterUnreachableError(
                f"cannot {request.verb} {request.target()}: the API server at {host} "
                f"did not answer ({_short(e)}); check the kubeconfig's server "
                "address, your network/VPN, and that the cluster is up (kubectl cluster-info)"
            ) from None
        log.info(
            "%s %s: %s, retrying in %.1fs (%d/%d)",
            request.verb,
            path,
            type(e).__name__,
            request.delay,
            attempt,
            attempts,
        )
        self._sleep(request.delay * (1 + random.random() * 0.1))
        request.delay = min(request.delay * 2, self.max_backoff)

    def _fit_in_deadline(self, request: _Request, wait: float, tries: int) -> None:
        """``DeadlineExceededError`` (after ``tries``) unless the request's deadline, if any, leaves more than
        ``wait`` seconds."""
        if request.deadline is not None and request.deadline.left() <= wait:
            raise self._past_deadline(request.deadline, request, tries) from None

    @contextmanager
    def deadline(self, seconds: float, setting: Optional[str] = None) -> Iterator[None]:
        """Within the block, this thread's requests (tries and waits between them together) end by
        ``seconds`` from now: past it, ``DeadlineExceededError``, naming ``setting`` (the user's setting of
        ``seconds``, if any). Streams are not bound."""
        outer = getattr(self._local, "deadline", None)
        self._local.deadline = Deadline(time.monotonic() + seconds, seconds, setting)
        try:
            yield
        finally:
            self._local.deadline = outer

    def _past_deadline(self, deadline: Deadline, request: _Request, tries: int) -> DeadlineExceededError:
        host = getattr(self.api_client.configuration, "host", "?")
        tried = (
            f"{tries} tr{'y' if tries == 1 else 'ies'}, the last: {request.last_error}"
            if tries
            else "no time left to try"
        )
        raise_it = f", or raise {deadline.setting} if it is only slow" if deadline.setting else ""
        within = f"{deadline.seconds:g} s" + (f", {deadline.setting}" if deadline.setting else "")
        return DeadlineExceededError(
            f"cannot {request.verb} {request.target()}: the API server at {host} stalled: no answer "
            f"within {within} ({tried}); check that it is healthy (kubectl get --raw /readyz) and try again{raise_it}",
            tries=tries,
        )

    # --- API discovery ------------------------------------------------------------
    def answers(self) -> bool:
        """Whether the API server answers now: one GET of ``/version`` (a few hundred bytes, readable by any
        user), one try. For a reader that answers from watches (``watched.py``): a watch broken without a
        sign does not say so."""
        try:
            self._call("GET", "/version", verb="get", kind="version", name=None, namespace=None, retry=False)
            return True
        except (ClusterError, OSError):
            return False

    def served_versions(self, group: str) -> tuple[str, ...]:
        """The versions of an API group the server serves (its discovery document, ``/apis/<group>``),
        ``()`` when it serves none. Asked once per process and server; a failure to ask raises (and
        is not remembered): it says nothing about what is served."""
        key = (str(getattr(self.api_client.configuration, "host", "")), group)
        with _SERVED_VERSIONS_LOCK:
            if key in _SERVED_VERSIONS:
                return _SERVED_VERSIONS[key]
        try:
            found = self._call("GET", f"/apis/{group}", verb="discover", kind="APIGroup", name=group, namespace=None)
            versions = tuple(v["version"] for v in found.get("versions") or [] if v.get("version"))
        except NotFoundError:
            versions = ()
        with _SERVED_VERSIONS_LOCK:
            _SERVED_VERSIONS[key] = versions
        return versions

    def served_version(self, group: str, known: tuple[str, ...]) -> Optional[str]:
        """The first of ``known`` (preferred first) that the server serves, ``None`` for none."""
        served = self.served_versions(group)
        return next((v for v in known if v in served), None)

    def may(
        self, verb: str, resource: str, *, group: str = "", namespace: Optional[str] = None, subresource: str = ""
    ) -> bool:
        """Whether the current user may ``verb`` the ``resource`` (a SelfSubjectAccessReview, what
        ``kubectl auth can-i`` asks; it needs no right of its own)."""
        review = {
            "apiVersion": f"{ACCESS_REVIEW_GROUP}/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {
                "resourceAttributes": {
                    k: v
                    for k, v in {
                        "verb": verb,
                        "resource": resource,
                        "group": group,
                        "namespace": namespace,
                        "subresource": subresource,
                    }.items()
                    if v
                }
            },
        }
        found = self._call(
            "POST",
            f"/apis/{ACCESS_REVIEW_GROUP}/v1/selfsubjectaccessreviews",
            verb="create",
            kind="SelfSubjectAccessReview",
            name=None,
            namespace=None,
            body=review,
        )
        return bool((found.get("status") or {}).get("allowed"))

    def _kind(self, kind: str) -> Kind:
        """``KINDS[kind]``, a Kueue kind at the version the server serves (the preferred one when it
        serves none: the request then finds nothing, as it should)."""
        spec = KINDS[kind]
        if spec.group == KUEUE_GROUP:
            version = self.served_version(KUEUE_GROUP, KUEUE_VERSIONS) or KUEUE_VERSIONS[0]
            if version != spec.version:
                spec = dataclasses.replace(spec, version=version)
        return spec

    # --- the interface ------------------------------------------------------------
    def create(self, obj: dict, *, dry_run: bool = False, retry: bool = True) -> dict:
        kind = self._kind(obj["kind"])
        meta = obj.get("metadata", {})
        namespace = meta.get("namespace") if kind.namespaced else None
        query = [("fieldValidation", "Strict")]
        if dry_run:
            query.append(("dryRun", "All"))
        return self._call(
            "POST",
            kind.path(namespace),
            verb="create",
            kind=kind.name,
            name=meta.get("name"),
            namespace=namespace,
            query=query,
            body=obj,
            retry=retry,
        )

    def get(self, kind: str, name: str, namespace: Optional[str] = None) -> Optional[dict]:
        """The object, or ``None`` if it does not exist (and only then)."""
        spec = self._kind(kind)
        try:
            return self._call("GET", spec.path(namespace, name), verb="get", kind=kind, name=name, namespace=namespace)
        except NotFoundError:
            return None

    def list(
        self,
        kind: str,
        namespace: Optional[str],
        label_selector: Optional[str] = None,
        field_selector: Optional[str] = None,
        limit: Optional[int] = None,
    ) -> list[dict]:
        """The matching objects; with ``limit``, only the first ``limit`` of them in the server's key order (the
        first chunk: a sample, for a look that does not need them all)."""
        return self._list_answer(kind, namespace, label_selector, field_selector, "application/json", limit)[0]

    def list_metadata(
        self,
        kind: str,
        namespace: Optional[str],
        label_selector: Optional[str] = None,
        field_selector: Optional[str] = None,
    ) -> builtins.list[dict]:
        """The objects' metadata only (``PartialObjectMetadata`` items: ``{"metadata": ...}``), a fraction of
        their size: for what names, labels and owners tell."""
        return self._list_answer(kind, namespace, label_selector, field_selector, METADATA_LIST_ACCEPT)[0]

    def _list_answer(
        self,
        kind: str,
        namespace: Optional[str],
        label_selector: Optional[str],
        field_selector: Optional[str],
        accept: str = "application/json",
        limit: Optional[int] = None,
    ) -> tuple[builtins.list[dict], str]:
        """The items of a list and the resourceVersion it was read at."""
        spec = self._kind(kind)
        query = _selector_query(label_selector, field_selector)
        if limit:
            query.append(("limit", str(limit)))
        result = self._call(
            "GET",
            spec.path(namespace),
            verb="list",
            kind=kind,
            name=None,
            namespace=namespace,
            query=query,
            accept=accept,
        )
        # kube-apiserver sends an empty metadata-only list's items as null
        return result.get("items") or [], (result.get("metadata") or {}).get("resourceVersion", "")

    def list_to_watch(
        self,
        kind: str,
        namespace: Optional[str],
        label_selector: Optional[str] = None,
        field_selector: Optional[str] = None,
    ) -> tuple[builtins.list[dict], str]:
        """The matching objects, and the resourceVersion to ``watch`` them from."""
        return self._list_answer(kind, namespace, label_selector, field_selector)

    def watch(
        self,
        kind: str,
        namespace: Optional[str],
        resource_version: str,
        *,
        label_selector: Optional[str] = None,
        field_selector: Optional[str] = None,
        timeout_seconds: int = 240,
    ) -> "LogStream":
        """The changes of the matching objects after ``resource_version``, as a stream of lines, each an event
        ``{"type": ADDED, MODIFIED, DELETED, BOOKMARK or ERROR, "object": ...}`` in JSON, until the server ends the
        watch (after about ``timeout_seconds``) or ``close``. One try: a watch that cannot be opened raises
        ``ClusterError``; one that breaks, urllib3's ``HTTPError`` or ``OSError``, also when nothing (not even
        its end) came for ``WATCH_SILENCE_S`` past its timeout."""
        spec = self._kind(kind)
        query = _selector_query(label_selector, field_selector) + [
            ("watch", "true"),
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_seconds)),
        ]
        resp = self._call(
            "GET",
            spec.path(namespace),
            verb="watch",
            kind=kind,
            name=None,
            namespace=namespace,
            query=query,
            stream=True,
            retry=False,
            stream_timeout=timeout_seconds + WATCH_SILENCE_S,
        )
        return LogStream(resp)

    def patch(self, kind: str, name: str, namespace: Optional[str], patch: dict) -> dict:
        spec = self._kind(kind)
        return self._call(
            "PATCH",
            spec.path(namespace, name),
            verb="patch",
            kind=kind,
            name=name,
            namespace=namespace,
            body=patch,
            content_type="application/merge-patch+json",
            query=[("fieldValidation", "Strict")],
        )

    def delete(self, kind: str, name: str, namespace: Optional[str] = None, *, uid: Optional[str] = None) -> bool:
        """Delete with background propagation; ``False`` if it was already gone. With ``uid``, only
        that object: one recreated under the same name is refused (409 Conflict)."""
        spec = self._kind(kind)
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            self._call(
                "DELETE",
                spec.path(namespace, name),
                verb="delete",
                kind=kind,
                name=name,
                namespace=namespace,
                body=body,
            )
            return True
        except NotFoundError:
            return False

    def pod_log(
        self,
        name: str,
        namespace: str,
        *,
        container: Optional[str] = None,
        follow: bool = False,
        tail_lines: Optional[int] = None,
        since_seconds: Optional[int] = None,
        since_time: Optional[str] = None,
        timestamps: bool = False,
        limit_bytes: Optional[int] = None,
    ) -> Iterator[str]:
        """Lines of a pod's log (without newlines). With ``follow``, until the container ends;
        with ``since_seconds``, only the lines of that many last seconds; with ``since_time``
        (RFC 3339; the kubelet gets it to the second), those of that second and later; with
        ``timestamps``, each line starts with its RFC 3339 time and a space; with ``limit_bytes``, the
        first that many bytes of what the others select (the kubelet cuts there, mid-line too)."""
        query: list = []
        if container:
            query.append(("container", container))
        if follow:
            query.append(("follow", "true"))
        if tail_lines is not None:
            query.append(("tailLines", str(tail_lines)))
        if since_seconds is not None:
            query.append(("sinceSeconds", str(since_seconds)))
        if since_time is not None:
            query.append(("sinceTime", since_time))
        if timestamps:
            query.append(("timestamps", "true"))
        if limit_bytes is not None:
            query.append(("limitBytes", str(limit_bytes)))
        resp = self._call(
            "GET",
            KINDS["Pod"].path(namespace, name, "log"),
            verb="read log of",
            kind="Pod",
            name=name,
            namespace=namespace,
            query=query,
            stream=True,
            retry=not follow,
        )
        return _iter_lines(resp)

    def pod_log_stream(
        self,
        name: str,
        namespace: str,
        *,
        container: Optional[str] = None,
        since_time: Optional[str] = None,
        tail_lines: Optional[int] = None,
        idle_timeout: Optional[float] = None,
    ) -> "LogStream":
        """A ``follow`` read of a pod's log with ``timestamps`` (from ``since_time`` on, if given; starting with
        its last ``tail_lines`` lines, if given), as a ``LogStream``: open until the container ends, the server
        closes it, or ``close``. With ``idle_timeout``, a stream silent that long ends in ``ReadTimeoutError``."""
        query: list = [("follow", "true"), ("timestamps", "true")]
        if container:
            query.append(("container", container))
        if since_time is not None:
            query.append(("sinceTime", since_time))
        if tail_lines is not None:
            query.append(("tailLines", str(tail_lines)))
        resp = self._call(
            "GET",
            KINDS["Pod"].path(namespace, name, "log"),
            verb="read log of",
            kind="Pod",
            name=name,
            namespace=namespace,
            query=query,
            stream=True,
            retry=False,
            stream_timeout=idle_timeout,
        )
        return LogStream(resp)


class LogStream:
    """An open ``follow`` stream of a pod's log (or a ``watch``'s events). Iterating gives the complete lines (without newlines)
    of each chunk the server sends, one list per chunk; a line the stream ends in the middle of is
    left out (a read from its second gets it whole). A stream that breaks raises urllib3's
    ``HTTPError`` (or ``OSError``). ``close`` may be called from any thread: it ends an iteration
    waiting for the next chunk at once, and closes the connection."""

    def __init__(self, resp) -> None:
        self._resp = resp
        self._lock = threading.Lock()
        self._reading = False
        self._done = False  # closed, or read to its end: the connection went back to the pool
        #: Set by ``close`` while the stream was open: it did not end by itself.
        self.interrupted = False

    def __iter__(self) -> Iterator[list[str]]:
        with self._lock:
            if self._done:
                return  # closed before it was read
            self._reading = True
        pending = b""
        complete = False
        try:
            for chunk in self._resp.stream(64 * 1024, decode_content=True):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                if lines:
                    yield [line.decode("utf-8", "replace") for line in lines]
            complete = True
        finally:
            with self._lock:
                self._done = True
                if not complete or self.interrupted:
                    self._resp.close()  # not reused: it may be half read, or shut down
                self._resp.release_conn()

    def close(self) -> None:
        with self._lock:
            if self._done:
                return
            self._done = self.interrupted = True
            if not self._reading:
                self._resp.close()
                self._resp.release_conn()
                return
            # Shutting the socket down wakes a read blocked in another thread (closing it would not).
            sock = getattr(getattr(self._resp, "_connection", None), "sock", None)
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


#: Jobs one process watches at once (``watched.py``: 3 watches each); the looks of more jobs (``nemo-kubeflow
#: watch`` of a large experiment) read the API server, as a status query does, until one of these ends.
MAX_WATCHED_JOBS = 4

#: Connections one API client keeps open: the log follower's readers (``log_follower.LOG_READERS``, 8, each
#: holding one stream or read) plus the describes and lists beside them, plus the watches of the jobs
#: watched at once. The kubernetes client's default is 5 per CPU: 5 on a 1-CPU machine, where urllib3
#: would drop and reopen connections.
API_CONNECTIONS = 16 + 3 * MAX_WATCHED_JOBS


def user_agent() -> str:
    """What every request of ours says it comes from (``User-Agent``), as kubectl says ``kubectl/v1.x``: an
    API server's audit log and request logs tell our load from other clients'."""
    from nemo_kubeflow import __version__

    return f"nemo-kubeflow/{__version__}"


def _api_client(configuration):
    from kubernetes import client

    configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize, API_CONNECTIONS)
    # One retry layer, ours (``_call``): urllib3 would retry each of our tries up to 3 times more, each up
    # to the read timeout, and a DELETE of a rollback with it.
    configuration.retries = False
    api = client.ApiClient(configuration)
    api.user_agent = user_agent()
    return api


def _selector_query(label_selector: Optional[str], field_selector: Optional[str]) -> builtins.list:
    query = []
    if label_selector:
        query.append(("labelSelector", label_selector))
    if field_selector:
        query.append(("fieldSelector", field_selector))
    return query


def _json_body(resp) -> Any:
    """The JSON a (non-streamed) response carries; ``{}`` for an empty body."""
    data = resp.data
    return json.loads(data) if data else {}


def _iter_lines(resp) -> Iterator[str]:
    pending = b""
    try:
        for chunk in resp.stream(64 * 1024, decode_content=True):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                yield line.decode("utf-8", "replace")
        if pending:
            yield pending.decode("utf-8", "replace")
    finally:
        resp.release_conn()


def _retry_after(e) -> Optional[float]:
    headers = getattr(e, "headers", None) or {}
    value = headers.get("Retry-After") if hasattr(headers, "get") else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _short(e: Exception) -> str:
    """The root cause of a connection error ("Connection refused"), without urllib3's object dumps."""
    text = str(getattr(e, "reason", None) or e)
    errno = re.search(r"\[Errno -?\d+\] ([^'\")]+)", text)
    if errno:
        return errno.group(1).strip()
    return f"{type(e).__name__}: {text[:200]}"
