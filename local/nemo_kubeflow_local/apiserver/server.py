"""The HTTP side of the API server: routing, bearer-token auth, faults, RBAC denials, the request
log, watches and pod log streaming. HTTP/1.1 over TLS on 127.0.0.1 only (see tls.py: kubectl sends
a bearer token over HTTPS only)."""

from __future__ import annotations

import json
import logging
import queue
import socket
import ssl
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator, Optional, Union
from urllib.parse import parse_qs, urlsplit

from nemo_kubeflow_local import constants as C
from nemo_kubeflow_local.apiserver import metadata_only, openapi, protobuf
from nemo_kubeflow_local.apiserver import resources as R
from nemo_kubeflow_local.apiserver.api_tokens import ApiTokens
from nemo_kubeflow_local.apiserver.apierrors import ApiError, FieldError, aggregate, bad_request
from nemo_kubeflow_local.apiserver.container_logs import LogStore, stream
from nemo_kubeflow_local.apiserver.faults import Hooks, LogStreamHandle, RequestRecord
from nemo_kubeflow_local.apiserver.kueue_visibility import (
    VISIBILITY_DEFAULT_LIMIT,
    VISIBILITY_GROUP,
    VISIBILITY_VERSIONS,
    pending_workloads,
)
from nemo_kubeflow_local.apiserver.printers import to_table, wants_table
from nemo_kubeflow_local.apiserver.registry import Registry, Result, event_v1
from nemo_kubeflow_local.apiserver.resources import ResourceType
from nemo_kubeflow_local.apiserver.selectors import field_matcher, label_matcher
from nemo_kubeflow_local.apiserver.store import Store
from nemo_kubeflow_local.apiserver.tls import ServerCredentials
from nemo_kubeflow_local.apiserver.versions import KUEUE_SERVED_DEFAULT, list_from_storage, to_storage

#: A client that went away while it was answered (a follower closing its connection mid-list): TLS reports it
#: as an EOF, plain TCP as a broken pipe or a reset.
CLIENT_GONE = (BrokenPipeError, ConnectionResetError, ssl.SSLEOFError)

logger = logging.getLogger(__name__)

_MAJOR, _MINOR, _ = C.KUBERNETES_VERSION.split(".")
#: What `GET /version` answers: the release whose schemas decode core objects here (core_schemas.py).
KUBERNETES_VERSION = {
    "major": _MAJOR,
    "minor": _MINOR,
    "gitVersion": f"v{C.KUBERNETES_VERSION}",
    "gitCommit": "nemo-kubeflow-local",
    "gitTreeState": "clean",
    "buildDate": "2025-04-23T00:00:00Z",
    "goVersion": "go1.24.2",
    "compiler": "gc",
    "platform": "linux/amd64",
}
#: How long a watch lasts when the client does not say (the real server picks 30-60 minutes).
DEFAULT_WATCH_SECONDS = 1800
#: A client that connects and never completes the TLS handshake gives its thread back after this.
HANDSHAKE_TIMEOUT_S = 10.0
PLAIN_HTTP_ANSWER = b"HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n"
_SUBRESOURCES = {
    "pods": {"log", "status"},
    "trainjobs": {"status"},
    "namespaces": {"status"},
    "persistentvolumeclaims": {"status"},
    "localqueues": {"status"},
    "workloads": {"status"},
    "nodes": {"status"},
    "resourcequotas": {"status"},
    "validatingadmissionpolicies": {"status"},
}
#: kubectl resolves `kubectl get ns` through these (the real server's; the Trainer CRDs declare none).
_SHORT_NAMES = {
    ("", "namespaces"): ["ns"],
    ("", "configmaps"): ["cm"],
    ("", "persistentvolumeclaims"): ["pvc"],
    ("", "pods"): ["po"],
    ("", "events"): ["ev"],
    ("events.k8s.io", "events"): ["ev"],
    ("", "serviceaccounts"): ["sa"],
    ("", "resourcequotas"): ["quota"],
    ("", "limitranges"): ["limits"],
    ("scheduling.k8s.io", "priorityclasses"): ["pc"],
}
_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch"}
#: `kubectl auth can-i`'s question: may I? (authorization.k8s.io, served for the doctor's rights check)
SSAR_GROUP = "authorization.k8s.io"
SSAR_PATH = f"/apis/{SSAR_GROUP}/v1/selfsubjectaccessreviews"
_LOCAL_ADMIN = "the local cluster's user may do anything not denied by a test"
_BOOLEAN_PARAMS = ("watch", "follow", "previous", "timestamps", "allowWatchBookmarks", "insecureSkipTLSVerifyBackend")


def _query(raw: str) -> dict[str, str]:
    """Query parameters, last value wins; booleans as "true"/"false" (Go's ParseBool: the Python
    client sends `watch=True`)."""
    query = {k: v[-1] for k, v in parse_qs(raw, keep_blank_values=True).items()}
    for key in _BOOLEAN_PARAMS:
        if key in query:
            query[key] = "true" if query[key].lower() in ("1", "t", "true") else "false"
    return query


@dataclass
class Route:
    """What a request path names. `rt` is None for discovery paths and unknown resources."""

    rt: Optional[ResourceType] = None
    namespace: Optional[str] = None
    name: Optional[str] = None
    subresource: str = ""
    discovery: Optional[dict] = None
    group: str = ""
    #: The version the path names, when it differs from the one stored (a Kueue v1beta1 path).
    version: str = ""
    #: A Kueue visibility API path (``pendingworkloads`` of a LocalQueue): the version it names.
    visibility: str = ""

    @property
    def resource(self) -> str:
        if self.visibility:
            return "localqueues/pendingworkloads"
        if self.rt is None:
            return ""
        return f"{self.rt.plural}/{self.subresource}" if self.subresource else self.rt.plural

    def verb(self, method: str, query: dict) -> str:
        if method in _VERBS:
            return _VERBS[method]
        if method == "DELETE":
            return "delete" if self.name else "deletecollection"
        if self.name or self.rt is None:
            return "get"
        return "watch" if query.get("watch") == "true" else "list"


def _resource_list(group_version: str, types: list[ResourceType]) -> dict:
    resources = []
    for rt in types:
        verbs = (
            ["get", "list", "watch"]
            if rt.read_only
            else ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
        )
        resource = {
            "name": rt.plural,
            "singularName": rt.kind.lower(),
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": verbs,
        }
        if (rt.group, rt.plural) in _SHORT_NAMES:
            resource["shortNames"] = _SHORT_NAMES[(rt.group, rt.plural)]
        if rt is R.PODS:
            resource["categories"] = ["all"]  # `kubectl get all`
        resources.append(resource)
        for sub in sorted(_SUBRESOURCES.get(rt.plural, ()) if rt.storage is None else ()):
            resources.append(
                {
                    "name": f"{rt.plural}/{sub}",
                    "singularName": "",
                    "namespaced": rt.namespaced,
                    "kind": "Pod" if sub == "log" else rt.kind,
                    "verbs": ["get"] if sub == "log" else ["get", "patch", "update"],
                }
            )
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources}


def _discovery(path: str, kueue_versions: tuple[str, ...] = KUEUE_SERVED_DEFAULT) -> Optional[dict]:
    groups: dict[tuple[str, str], list[ResourceType]] = {}
    for rt in R.ALL:
        for version in kueue_versions if rt.group == R.KUEUE_GROUP else (rt.version,) if rt.group else ():
            groups.setdefault((rt.group, version), []).append(rt)
    by_group: dict[str, list[str]] = {}
    for group, version in groups:
        by_group.setdefault(group, []).append(version)
    if kueue_versions:  # Kueue's visibility API, served with the emulated Kueue
        by_group[VISIBILITY_GROUP] = list(VISIBILITY_VERSIONS)
        for version in VISIBILITY_VERSIONS:
            if path == f"/apis/{VISIBILITY_GROUP}/{version}":
                return _visibility_resources(version)
    if path.startswith(openapi.PREFIX):
        return openapi.answer(path, kueue_versions, KUBERNETES_VERSION["gitVersion"])
    if path == "/version":
        return KUBERNETES_VERSION
    if path == "/api":
        return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
    if path == "/api/v1":
        return _resource_list("v1", [rt for rt in R.ALL if not rt.group])
    if path == "/apis":
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [_api_group(g, versions) for g, versions in by_group.items()],
        }
    if path.startswith("/apis/") and path.count("/") == 2 and path[len("/apis/") :] in by_group:
        group = path[len("/apis/") :]
        return dict(_api_group(group, by_group[group]), kind="APIGroup", apiVersion="v1")
    for (group, version), types in groups.items():
        if path == f"/apis/{group}/{version}":
            return _resource_list(f"{group}/{version}", types)
    return None


def _visibility_resources(version: str) -> dict:
    """Kueue's visibility API's resources emulated: the LocalQueues' pending workloads (not the ClusterQueues')."""
    resources = [
        {"name": plural, "singularName": "", "namespaced": namespaced, "kind": kind, "verbs": verbs}
        for plural, namespaced, kind, verbs in (
            ("localqueues", True, "LocalQueue", ["get"]),
            ("localqueues/pendingworkloads", True, "PendingWorkloadsSummary", ["get"]),
        )
    ]
    group_version = f"{VISIBILITY_GROUP}/{version}"
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources}


def _api_group(group: str, versions: list[str]) -> dict:
    """A group's discovery entry: its versions, the first preferred (the real server lists them so)."""
    listed = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"name": group, "versions": listed, "preferredVersion": listed[0]}


def route(path: str, kueue_versions: tuple[str, ...] = KUEUE_SERVED_DEFAULT) -> Route:
    discovery = _discovery(path.rstrip("/") or "/", kueue_versions)
    if discovery is not None:
        return Route(discovery=discovery)
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, version, rest = "", "v1", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return Route()
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in _SUBRESOURCES["namespaces"]:
        namespace, rest = rest[1], rest[2:]
    if group == VISIBILITY_GROUP:
        served = kueue_versions and version in VISIBILITY_VERSIONS and namespace is not None
        if served and len(rest) == 3 and rest[0] == "localqueues" and rest[2] == "pendingworkloads":
            return Route(namespace=namespace, name=rest[1], subresource=rest[2], group=group, visibility=version)
        return Route(group=group)
    if not rest or len(rest) > 3:
        return Route()
    asked = ""
    if group == R.KUEUE_GROUP:  # one stored version, served as each of kueue_versions
        if version not in kueue_versions:
            return Route(group=group)
        rt = R.lookup(group, R.KUEUE_STORAGE_VERSION, rest[0])
        asked = version if rt is not None and version != rt.version else ""
    else:
        rt = R.lookup(group, version, rest[0])
    name = rest[1] if len(rest) > 1 else None
    sub = rest[2] if len(rest) > 2 else ""
    if rt is None or (sub and sub not in _SUBRESOURCES.get(rt.plural, ())):
        return Route(group=group)
    if (rt.namespaced and name and namespace is None) or (not rt.namespaced and namespace is not None):
        return Route(group=group)
    return Route(rt=rt, namespace=namespace, name=name, subresource=sub, group=group, version=asked)


def _warning_header(text: str) -> str:
    """RFC 7234 warning: code 299, agent "-", the text quoted."""
    return '299 - "' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, api: "ApiServer", tls: ssl.SSLContext, port: int):
        super().__init__(("127.0.0.1", port), _Handler)
        self.api = api
        self.tls = tls
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()

    def get_request(self) -> tuple[socket.socket, tuple]:
        # The handshake happens in the connection's own thread (_Handler.setup), not in the accept loop.
        connection, address = super().get_request()
        return self.tls.wrap_socket(connection, server_side=True, do_handshake_on_connect=False), address

    def handle_error(self, request, client_address) -> None:
        # A client that hangs up, or refuses our certificate (a kubeconfig with another cluster's
        # CA, a plain-http URL), is not the server's error: no traceback on stderr.
        if not isinstance(sys.exc_info()[1], (ssl.SSLError, OSError)):
            super().handle_error(request, client_address)


class ApiServer:
    def __init__(
        self,
        store: Store,
        registry: Registry,
        hooks: Hooks,
        logs: LogStore,
        token: str,
        credentials: ServerCredentials,
        kueue_versions: tuple[str, ...] = KUEUE_SERVED_DEFAULT,
        port: int = 0,
    ):
        self.store, self.registry, self.hooks, self.logs, self.token = store, registry, hooks, logs, token
        #: Tokens taken besides ``token``, each for a while (``LocalCluster.issue_api_token``).
        self.api_tokens = ApiTokens()
        self.credentials = credentials
        #: The Kueue versions served, preferred first (("v1beta2",): as Kueue v0.20 ships).
        self.kueue_versions = kueue_versions
        #: The port to serve on (0: any free one).
        self.port = port
        self.stopping = threading.Event()
        self._httpd: Optional[_Server] = None

    @property
    def url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("the API server is not running")
        return f"https://127.0.0.1:{self._httpd.server_address[1]}"

    def start(self) -> None:
        self._httpd = _Server(self, self.credentials.server_context(), self.port)
        threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2}, name="api-server", daemon=True
        ).start()

    def stop(self) -> None:
        if self._httpd is None:
            return
        self.stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        with self._httpd.connections_lock:
            connections = list(self._httpd.connections)
        for connection in connections:  # idle keep-alive connections end too
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._httpd = None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Answers go out in several small writes; with Nagle's algorithm each keep-alive request
    # waits for the peer's delayed ACK (about 40 ms on loopback). API servers set TCP_NODELAY too.
    disable_nagle_algorithm = True
    server: _Server

    def setup(self) -> None:
        self.request.settimeout(HANDSHAKE_TIMEOUT_S)
        try:
            self.request.do_handshake()
        except ssl.SSLError as error:
            if error.reason == "HTTP_REQUEST":  # an http:// URL: say so in plain text, as Go's servers do
                socket.socket.sendall(self.request, PLAIN_HTTP_ANSWER)
            raise
        self.request.settimeout(None)
        super().setup()
        with self.server.connections_lock:
            self.server.connections.add(self.connection)

    def finish(self) -> None:
        with self.server.connections_lock:
            self.server.connections.discard(self.connection)
        super().finish()

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base class's name
        pass  # the request log replaces the access log

    def do_GET(self) -> None:  # noqa: N802
        self._handle("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._handle("POST")

    def do_PUT(self) -> None:  # noqa: N802
        self._handle("PUT")

    def do_PATCH(self) -> None:  # noqa: N802
        self._handle("PATCH")

    def do_DELETE(self) -> None:  # noqa: N802
        self._handle("DELETE")

    # -- the request --

    def _handle(self, method: str) -> None:
        started = time.time()
        api = self.server.api
        self._served_as: Optional[tuple[str, str]] = None  # one handler serves each request of a connection
        url = urlsplit(self.path)
        query = _query(url.query)
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        target = route(url.path, api.kueue_versions)
        verb = target.verb(method, query)
        self._counted_as = (verb, target.resource)
        code: Optional[int] = None
        logged = False

        def log_request(status: Optional[int], size: Optional[int] = None) -> None:
            # Logged before the answer's first byte: a client that has its answer finds its
            # request in the log (tests count requests right after a call returns).
            nonlocal logged
            if not logged:
                logged = True
                api.hooks.record(
                    RequestRecord(
                        method,
                        url.path,
                        query,
                        target.resource,
                        target.namespace,
                        target.name,
                        verb,
                        status,
                        started,
                        size,
                        self.headers.get("User-Agent") or "",
                    )
                )

        self._log_request = log_request
        try:
            code = self._serve(api, method, target, verb, query, raw)
        except CLIENT_GONE:
            self.close_connection = True
        finally:
            log_request(code)

    def _serve(self, api: ApiServer, method: str, target: Route, verb: str, query: dict, raw: bytes) -> Optional[int]:
        presented = self.headers.get("Authorization") or ""
        if presented != f"Bearer {api.token}" and not api.api_tokens.accepts(presented):
            return self._send(ApiError(401, "Unauthorized"))
        fault = api.hooks.take_fault(verb, target.resource, target.name)
        if fault is not None:
            if fault.delay:
                time.sleep(fault.delay)
            if fault.drop_connection:
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return None
            error = fault.error()
            if error is not None:
                return self._send(error)
        if target.discovery is not None:
            return self._send(Result(200, target.discovery))
        if target.visibility:
            return self._send_pending_workloads(api, target, query)
        if method == "POST" and target.group == SSAR_GROUP and self.path.split("?")[0] == SSAR_PATH:
            return self._send(self._access_review(api, raw, self.headers.get("Content-Type", "")))
        if target.rt is None:
            return self._send(
                ApiError(
                    404,
                    "the server could not find the requested resource",
                    details={"group": target.group} if target.group else {},
                )
            )
        denied = api.hooks.forbidden(verb, target.resource, target.rt.group, target.namespace, target.name)
        if denied is not None:
            return self._send(denied)
        try:
            return self._dispatch(api, method, target, target.rt, verb, query, raw)
        except ApiError as error:
            return self._send(error)
        except CLIENT_GONE:
            raise  # nobody to answer: not the server's error
        except Exception as error:  # noqa: BLE001 - answer like the server does, keep the traceback
            logger.exception("%s %s", method, self.path)
            return self._send(ApiError(500, f"Internal error occurred: {error}"))

    def _send_pending_workloads(self, api: ApiServer, target: Route, query: dict) -> int:
        """Kueue's visibility API: a LocalQueue's pending workloads and their places (controllers/kueue.py)."""
        denied = api.hooks.forbidden("get", target.resource, VISIBILITY_GROUP, target.namespace, target.name)
        if denied is not None:
            return self._send(denied)
        try:
            offset = int(query.get("offset") or 0)
            limit = int(query.get("limit") or VISIBILITY_DEFAULT_LIMIT)
            summary = pending_workloads(
                api.registry.store, target.visibility, target.namespace or "", target.name or "", offset, limit
            )
        except ValueError as error:
            return self._send(bad_request(f"offset and limit must be integers: {error}"))
        except ApiError as error:
            return self._send(error)
        return self._send(Result(200, summary))

    def _dispatch(
        self, api: ApiServer, method: str, target: Route, rt: ResourceType, verb: str, query: dict, raw: bytes
    ) -> int:
        """Serve a request for resource `rt` (target.rt, known)."""
        namespace, sub = target.namespace or "", target.subresource
        if target.name is None and verb not in ("create", "list", "watch", "deletecollection"):
            # a PUT or PATCH on a collection's path (a get or a delete without a name is a list or a
            # deletecollection): as kube-apiserver answers
            raise ApiError(405, "the server does not allow this method on the requested resource")
        name = target.name or ""  # the object's name, for the verbs that name one
        body = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError as error:
                raise bad_request(
                    f"the object provided is unrecognized (must be of type {rt.kind}): couldn't get "
                    f"version/kind; json parse error: {error}"
                ) from None
        elif method in ("POST", "PUT", "PATCH"):
            raise bad_request("the body of the request was empty")
        if target.version and rt is not None:  # a Kueue v1beta1 request: its objects converted to and from v1beta2
            if isinstance(body, dict) and body.get("apiVersion") == f"{rt.group}/{target.version}":
                body = dict(to_storage(rt.kind, body), apiVersion=rt.api_version)
            self._served_as = (rt.kind, target.version)
        registry = api.registry
        if verb == "get" and sub == "log":
            return self._send_log(api, namespace, name, query)
        metadata = metadata_only.asked(self.headers.get("Accept", ""))
        if verb in ("get", "list"):
            result = registry.get(rt, namespace, name) if verb == "get" else registry.list(rt, target.namespace, query)
            if wants_table(self.headers.get("Accept", "")):  # kubectl get
                result = Result(
                    result.code,
                    to_table(rt, result.body, query.get("includeObject") or "PartialObjectMetadata"),
                    result.warnings,
                )
            elif metadata is not None:  # a metadata informer, a client that needs names and labels only
                self._served_as = None
                result = Result(
                    result.code,
                    metadata_only.transform(result.body, *metadata, is_list=verb == "list"),
                    result.warnings,
                )
            return self._send(result)
        if verb == "watch":
            if metadata is not None:
                raise ApiError(406, "metadata-only watches are not emulated by the local cluster")
            return self._send_watch(api, rt, target.namespace, query)
        if verb == "create":
            if target.name or (rt.namespaced and target.namespace is None):
                raise ApiError(405, "the server does not allow this method on the requested resource")
            return self._send(registry.create(rt, namespace, body, query))
        if verb == "update":
            return self._send(registry.update(rt, namespace, name, body, query, sub))
        if verb == "patch":
            return self._send(
                registry.patch(rt, namespace, name, body, self.headers.get("Content-Type", ""), query, sub)
            )
        if verb == "delete":
            return self._send(registry.delete(rt, namespace, name, body, query))
        return self._send(registry.delete_collection(rt, target.namespace, body, query))

    @staticmethod
    def _access_review(api: ApiServer, raw: bytes, content_type: str) -> Union[ApiError, Result]:
        """A SelfSubjectAccessReview, answered from the RBAC denial rules (faults.Hooks.deny): what
        `kubectl auth can-i` asks, in protobuf as kubectl sends it (answered in JSON, which it accepts)
        or JSON. Everything not denied is allowed (the local user is an admin)."""
        try:
            review = (
                protobuf.self_subject_access_review(raw)
                if protobuf.is_protobuf(content_type)
                else json.loads(raw or b"{}")
            )
        except ValueError as error:
            return bad_request(f"the body of a SelfSubjectAccessReview could not be decoded: {error}")
        spec = review.get("spec") if isinstance(review, dict) else None
        spec = spec if isinstance(spec, dict) else {}
        attributes, non_resource = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
        if (attributes is None) == (non_resource is None):  # kube-apiserver's ValidateSelfSubjectAccessReviewSpec
            errors = [
                FieldError.invalid(
                    "spec.resourceAttributes",
                    non_resource,
                    "exactly one of nonResourceAttributes or resourceAttributes must be specified",
                )
            ]
            return ApiError(
                422,
                # the kind as the request wrote it, as kube-apiserver's NewInvalid(Kind(review.Kind)) words it
                f'{review.get("kind") or ""}.{SSAR_GROUP} "" is invalid: {aggregate(errors)}',
                details={
                    "group": SSAR_GROUP,
                    "kind": review.get("kind") or "",
                    "causes": [error.cause() for error in errors],
                },
            )
        review.setdefault("apiVersion", f"{SSAR_GROUP}/v1")
        review.setdefault("kind", "SelfSubjectAccessReview")
        if non_resource is not None:  # a path such as /healthz: no test denies one
            return Result(201, dict(review, status={"allowed": True, "reason": _LOCAL_ADMIN}))
        attributes = attributes if isinstance(attributes, dict) else {}
        resource = attributes.get("resource", "")
        if attributes.get("subresource"):
            resource += f"/{attributes['subresource']}"
        denied = api.hooks.forbidden(
            attributes.get("verb", ""),
            resource,
            attributes.get("group", ""),
            attributes.get("namespace") or None,
            attributes.get("name") or None,
        )
        status: dict[str, Any] = {"allowed": denied is None}
        if denied is None:
            status["reason"] = _LOCAL_ADMIN
        return Result(201, dict(review, status=status))

    # -- responses --

    def _send(self, answer: Union[ApiError, Result]) -> int:
        headers: dict[str, Any]  # a header's value, or a list of values sent as one header each
        if isinstance(answer, ApiError):
            code, body, headers = answer.code, answer.status(), dict(answer.headers)
        else:
            code, body = answer.code, answer.body
            headers = {"Warning": [_warning_header(w) for w in answer.warnings]}
            served_as = getattr(self, "_served_as", None)
            if served_as is not None:
                body = list_from_storage(served_as[0], body, served_as[1])
        data = json.dumps(body).encode()
        self._log_request(code, len(data))
        self.server.api.hooks.count_bytes(*self._counted_as, len(data))
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in headers.items():
            for item in value if isinstance(value, list) else [value]:
                self.send_header(key, item)
        self.end_headers()
        self.wfile.write(data)
        return code

    def _send_chunks(self, content_type: str, chunks: Iterator[bytes], cut: Optional[LogStreamHandle] = None) -> int:
        self._log_request(200)
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for chunk in chunks:
                if chunk:
                    self.server.api.hooks.count_bytes(*self._counted_as, len(chunk))
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
            if cut is not None and cut.cut.is_set() and cut.abrupt:
                # As a server that goes away mid-answer: the connection drops without the last chunk.
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return 200
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True
        return 200

    def _send_log(self, api: ApiServer, namespace: str, name: str, query: dict) -> int:
        log = api.logs.select(api.store, namespace, name, query)
        if query.get("follow") == "true":
            handle = api.hooks.open_log_stream(namespace, name)
            try:
                return self._send_chunks("text/plain", stream(log, query, api.stopping, handle.cut), handle)
            finally:
                api.hooks.close_log_stream(handle)
        chunks = stream(log, query, api.stopping)
        data = b"".join(chunks)
        self._log_request(200, len(data))
        api.hooks.count_bytes(*self._counted_as, len(data))
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        return 200

    def _send_watch(self, api: ApiServer, rt: ResourceType, namespace: Optional[str], query: dict) -> int:
        source = R.EVENTS if rt is R.EVENTS_V1 else rt
        labels, fields = label_matcher(query.get("labelSelector")), field_matcher(query.get("fieldSelector"), rt.plural)
        events: queue.Queue = queue.Queue()

        def wanted(kind: ResourceType, obj: dict) -> bool:
            return (
                kind is source
                and (namespace is None or obj["metadata"].get("namespace") == namespace)
                and labels(obj)
                and fields(obj)
            )

        def listener(event: str, kind: ResourceType, obj: dict) -> None:
            if wanted(kind, obj):
                events.put((event, obj))

        since = query.get("resourceVersion")
        with api.store.lock:
            if since and since != "0":
                history = api.store.history_since(int(since))
                if history is None:
                    expired = ApiError(
                        410, f"too old resource version: {since} ({api.store.resource_version})", reason="Expired"
                    ).status()
                    first = [("ERROR", expired)]
                else:
                    first = [(event, obj) for _, event, kind, obj in history if wanted(kind, obj)]
            else:
                first = [
                    ("ADDED", obj) for obj in api.store.list(source, namespace, lambda o: labels(o) and fields(o))[0]
                ]
            api.store.add_listener(listener)
        deadline = time.monotonic() + int(query.get("timeoutSeconds") or DEFAULT_WATCH_SECONDS)

        table = wants_table(self.headers.get("Accept", ""))  # kubectl get -w: each event's object a one-row Table

        served_as = getattr(self, "_served_as", None)

        def encode(event: str, obj: dict) -> bytes:
            if rt is R.EVENTS_V1 and event != "ERROR":
                obj = event_v1(obj)
            if served_as is not None and event != "ERROR":
                obj = list_from_storage(served_as[0], obj, served_as[1])
            if table and event != "ERROR":
                obj = to_table(rt, obj, query.get("includeObject") or "PartialObjectMetadata")
            return json.dumps({"type": event, "object": obj}).encode() + b"\n"

        def chunks() -> Iterator[bytes]:
            for event, obj in first:
                yield encode(event, obj)
            if first and first[0][0] == "ERROR":
                return
            while not api.stopping.is_set() and time.monotonic() < deadline:
                if api.hooks.drops_connections(*self._counted_as):
                    cut.cut.set()  # an API server gone away: its open watches break too
                    return
                try:
                    event, obj = events.get(timeout=min(0.5, max(0.0, deadline - time.monotonic())))
                except queue.Empty:
                    continue
                yield encode(event, obj)

        cut = LogStreamHandle(namespace or "", rt.plural)
        try:
            return self._send_chunks("application/json", chunks(), cut)
        finally:
            api.store.remove_listener(listener)
