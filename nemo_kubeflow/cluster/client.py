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

Credentials and servers change under a long-lived client: an exec plugin's token is revoked, a cluster's
CA is rotated, a local cluster restarts on a new port and rewrites its kubeconfig. A refused credential
(401), a refused connection or a failed TLS handshake reads the kubeconfig again (running its exec plugin
again) before it counts as an error: once per failure burst (until a request is answered), and once more
each time the kubeconfig file changes during one, or ``READ_AGAIN_EVERY_S`` after the last read (an exec
plugin that hands out a good token again once its user logs in again).
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
import threading
import time
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Protocol

from nemo_kubeflow.cluster.api_errors import translate_api_exception
from nemo_kubeflow.cluster.kinds import KINDS, Kind, describe_target
from nemo_kubeflow.cluster.log_stream import LogStream
from nemo_kubeflow.cluster.unanswered import Unanswered
from nemo_kubeflow.constants import (
    KUEUE_GROUP,
    KUEUE_VERSIONS,
    KUEUE_VISIBILITY_GROUP,
    KUEUE_VISIBILITY_VERSIONS,
)
from nemo_kubeflow.errors import (
    ClusterError,
    ClusterUnreachableError,
    DeadlineExceededError,
    KubeconfigError,
    NotFoundError,
)

log = logging.getLogger(__name__)


#: The group of SelfSubjectAccessReview (``may``).
ACCESS_REVIEW_GROUP = "authorization.k8s.io"

#: The versions each API group serves, by (server address, the CA trusted for it, group): API discovery, asked
#: once per process and server. The CA tells apart two servers met at one address (a cluster rebuilt there, a
#: local cluster on a port another used before): the kubernetes client names a kubeconfig's CA file by content.
_SERVED_VERSIONS: dict[tuple[str, str, str], tuple[str, ...]] = {}
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

#: How long a failure burst waits before it reads an unchanged kubeconfig again (``KubernetesCluster._read_again``).
READ_AGAIN_EVERY_S = 60.0

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
    def pending_workloads(self, namespace: str, queue: str) -> Optional[builtins.list[dict]]: ...


class Cluster(ClusterReader, Protocol):
    """The reads and the writes: submitting (``cluster/submit.py``), cancelling, repairing (``repair/``)."""

    def deadline(self, seconds: float, setting: Optional[str] = None) -> AbstractContextManager[None]: ...
    def create(self, obj: dict, *, dry_run: bool = False) -> dict: ...
    def patch(
        self, kind: str, name: str, namespace: Optional[str], patch: dict, *, strategic: bool = False
    ) -> dict: ...
    def delete(self, kind: str, name: str, namespace: Optional[str] = None, *, uid: Optional[str] = None) -> bool: ...


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
        self._api_client: Any = None
        #: The kubeconfig file (inode, size, mtime) when it was last read; None: not read, or in-cluster.
        self._kubeconfig_stamp: Optional[tuple[int, int, int]] = None
        #: Whether the kubeconfig was read again since the last answered request (``_read_again``).
        self._read_again_in_burst = False
        self._read_again_at = -math.inf  # time.monotonic()
        self._read_again_lock = threading.Lock()
        #: Per thread: the ``Deadline`` its requests must meet, if any (one client serves parallel submissions).
        self._local = threading.local()
        #: Its API server's outage, said once (cluster/unanswered.py).
        self._unanswered = Unanswered(log)

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
        self._kubeconfig_stamp = _file_stamp(path)
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
        attempt, read_again = 1, False
        while True:
            timeout = self._try_timeout(request, attempt - 1, stream, stream_timeout)
            api = self.api_client
            try:
                resp = api.call_api(
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
                if self._read_again_in_burst:
                    self._read_again_in_burst = False
                self._unanswered.answered()
                return resp if stream else _json_body(resp)
            except ApiException as e:
                status = int(e.status or 0)
                if status:  # status 0: no answer came (a failed TLS handshake)
                    self._unanswered.answered()
                sign = "HTTP 401 Unauthorized" if status == 401 else _tls_failure(e)
                if sign and not read_again and self._read_again(api, sign):
                    read_again = True  # a try with what the kubeconfig says now, not counted
                    continue
                if status not in TRANSIENT_STATUS or attempt == attempts:
                    raise translate_api_exception(e, verb=verb, kind=kind, name=name, namespace=namespace) from None
                self._wait_to_retry(request, e, path, attempt, attempts)
            except (Urllib3Error, OSError) as e:
                sign = _stale_config_sign(e)
                if sign and not read_again and self._read_again(api, sign):
                    read_again = True
                    continue
                self._wait_to_reconnect(request, e, path, attempt, attempts)
            attempt += 1

    def _read_again(self, used, why: str) -> bool:
        """After ``why`` (a refused credential or connection, a failed TLS handshake) answered a request made
        with the API client ``used``: read the kubeconfig again (running its exec plugin again), once per
        failure burst and once more each time the file changes or ``READ_AGAIN_EVERY_S`` after the last read;
        whether the request is worth another try at once (the kubeconfig now says something else, or another
        thread read it again meanwhile). Threads failing together read it once."""
        with self._read_again_lock:
            if self._api_client is not used:
                return True
            path = self._kubeconfig_path()
            if (
                self._read_again_in_burst
                and _file_stamp(path) == self._kubeconfig_stamp
                and time.monotonic() - self._read_again_at < READ_AGAIN_EVERY_S
            ):
                return False
            self._read_again_in_burst, self._read_again_at = True, time.monotonic()
            try:
                with _KUBECONFIG_LOADING:
                    fresh = self._load()
            except KubeconfigError as e:
                # The request's own error follows, as it would have without this read.
                log.info("kubeconfig read again after %s, and it cannot be used: %s", why, e)
                return False
            changes = _config_changes(used.configuration, fresh.configuration)
            self._api_client = fresh
        where = path or "the in-cluster service account"
        # A change is news (the requests go on with it); an unchanged kubeconfig is the error's to tell.
        log.log(
            logging.WARNING if changes else logging.INFO,
            "kubeconfig read again: %s after %s: %s",
            where,
            why,
            ", ".join(changes) if changes else "nothing changed",
        )
        return bool(changes)

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
        self._unanswered.retrying(
            self._host(),
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

    def _host(self) -> str:
        return str(getattr(self.api_client.configuration, "host", "?"))

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
        configuration = self.api_client.configuration
        key = (str(getattr(configuration, "host", "")), str(getattr(configuration, "ssl_ca_cert", "") or ""), group)
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

    def pending_workloads(self, namespace: str, queue: str) -> Optional[builtins.list[dict]]:
        """Kueue's visibility API's pending workloads of LocalQueue ``queue`` (``PendingWorkloadsSummary`` items,
        each with ``positionInLocalQueue`` from 0), or None where the server does not serve that API (its discovery
        lacks it). A refusal or failure raises, as any read."""
        version = self.served_version(KUEUE_VISIBILITY_GROUP, KUEUE_VISIBILITY_VERSIONS)
        if version is None:
            return None
        found = self._call(
            "GET",
            f"/apis/{KUEUE_VISIBILITY_GROUP}/{version}/namespaces/{namespace}/localqueues/{queue}/pendingworkloads",
            verb="get",
            kind="PendingWorkloadsSummary",
            name=queue,
            namespace=namespace,
        )
        return found.get("items") or []

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

    def patch(self, kind: str, name: str, namespace: Optional[str], patch: dict, *, strategic: bool = False) -> dict:
        """A JSON merge patch (lists replaced whole); ``strategic``: a strategic merge patch, for the built-in kinds
        only, which merges lists by their key (``ownerReferences`` by uid: one owner added, the others kept)."""
        spec = self._kind(kind)
        return self._call(
            "PATCH",
            spec.path(namespace, name),
            verb="patch",
            kind=kind,
            name=name,
            namespace=namespace,
            body=patch,
            content_type="application/strategic-merge-patch+json" if strategic else "application/merge-patch+json",
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


#: Sets of watches one process keeps at once (``watched.py``: 3 watches each, one set per experiment and namespace,
#: shared by its tasks, or per job where the experiment is not known); the looks of more (``nemo-kubeflow watch``
#: of many experiments) read the API server, as a status query does, until one of these ends.
MAX_WATCHED_SETS = 4

#: Connections one API client keeps open: the log follower's readers (``log_follower.LOG_READERS``, 8, each
#: holding one stream or read) plus the describes and lists beside them, plus the watches of the sets watched
#: at once. The kubernetes client's default is 5 per CPU: 5 on a 1-CPU machine, where urllib3
#: would drop and reopen connections.
API_CONNECTIONS = 16 + 3 * MAX_WATCHED_SETS


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


def _file_stamp(path: Optional[str]) -> Optional[tuple[int, int, int]]:
    """What tells a rewritten file from the one read before: its inode, size and modification time."""
    try:
        found = os.stat(path) if path else None
    except OSError:
        return None
    return (found.st_ino, found.st_size, found.st_mtime_ns) if found else None


#: The parts of an API client's configuration that a kubeconfig read again may change, and how they are named
#: in the log line (the credentials' values never are).
_CONFIG_PARTS = {
    "ssl_ca_cert": "a new CA",
    "cert_file": "a new client certificate",
    "key_file": "a new client key",
}


def _config_changes(old, new) -> builtins.list[str]:
    """What differs between two clients' configurations, in words that show no credential."""
    changes = []
    if old.host != new.host:
        changes.append(f"server {old.host} -> {new.host}")
    token = new.api_key.get("authorization")
    if old.api_key.get("authorization") != token:
        changes.append("a new token" if token else "no token (the exec plugin or token file gave none)")
    for attribute, words in _CONFIG_PARTS.items():
        if getattr(old, attribute, None) != getattr(new, attribute, None):
            changes.append(words)
    return changes


def _tls_failure(e: Exception) -> Optional[str]:
    """A failed TLS handshake (a CA that is not the server's), which the kubernetes client raises as an
    ``ApiException`` of status 0 whose reason starts with ``SSLError``: in words; ``None`` for other answers."""
    reason = str(getattr(e, "reason", "") or "")
    if int(getattr(e, "status", 0) or 0) != 0 or not reason.startswith("SSLError"):
        return None
    detail = reason.partition("\n")[2].split(" (_ssl.c")[0].strip()
    return f"a TLS failure ({detail[:200] or 'SSLError'})"


def _stale_config_sign(e: Exception) -> Optional[str]:
    """What in a connection error says that the kubeconfig may be out of date (the server moved, or its CA
    changed): a refused connection or a failed TLS handshake; ``None`` for others (a drop, a timeout: the
    server is there, slow or restarting)."""
    from urllib3.exceptions import SSLError

    reason = getattr(e, "reason", None) or e
    if isinstance(reason, SSLError) or isinstance(e, SSLError) or "SSL" in type(reason).__name__:
        return f"a TLS failure ({_short(e)})"
    if isinstance(reason, ConnectionRefusedError) or "Connection refused" in str(reason):
        return "a refused connection"
    return None


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
