"""Trainer's TrainJobStatus feature (alpha gate ``TrainJobStatus``, Trainer v2.2+), as v2.3.0 does it.

Two halves, as in Trainer (pkg/runtime/framework/plugins/trainjobstatus and pkg/statusserver):

* **The plugin** (``enforce``): every container of the trainer's pods gets ``KUBEFLOW_TRAINER_SERVER_URL``
  (this TrainJob's status endpoint), ``KUBEFLOW_TRAINER_SERVER_CA_CERT`` and ``KUBEFLOW_TRAINER_SERVER_TOKEN``
  (files under ``/var/run/secrets/kubeflow/trainer``), from one projected volume: a service-account token
  whose audience is ``trainer.kubeflow.org/v1alpha1/namespaces/<ns>/trainjobs/<name>/status`` (1 h), and the
  ``ca.crt`` of a ConfigMap ``<name>-tls-config`` the plugin creates, owned by the TrainJob.
* **The status server** (``StatusServer``): HTTPS; ``POST /apis/trainer.kubeflow.org/v1alpha1/namespaces/
  <ns>/trainjobs/<name>/status`` with a bearer token; the token must verify, carry that audience and the
  namespace; the body (at most 64 KiB) is ``{"trainerStatus": {...}}``, applied to the TrainJob's
  ``status.trainerStatus`` (server-side apply, field manager ``trainer-status``: what it sent replaces what it
  sent before), and echoed back. Errors are ``metav1.Status`` bodies: 403 ``Forbidden``, 422 ``Invalid
  payload`` or the validation message, 413, 404 ``Train job not found``, 404 ``Not found`` for any other path.
  Throttling is the server's API client's: QPS 5, burst 10 (requests beyond wait, none is refused).

Differences, on one host: the URL names 127.0.0.1 and this server's port rather than the webhook Service's
DNS name; tokens are this cluster's own (HS256, signed by the server; a real cluster's are the API server's
OIDC-verifiable service-account tokens), and the kubelet rotates them only when asked
(``LocalCluster.rotate_service_account_tokens``: a new signing key, the pods' token files rewritten, the old
tokens refused).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import re
import secrets
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator, Optional

from nemo_kubeflow_local.apiserver import resources as R
from nemo_kubeflow_local.apiserver.store import Store
from nemo_kubeflow_local.apiserver.tls import ServerCredentials, make_credentials

logger = logging.getLogger(__name__)

FEATURE_GATE = "TrainJobStatus"
URL_ENV, CA_CERT_ENV, TOKEN_ENV = (
    "KUBEFLOW_TRAINER_SERVER_URL",
    "KUBEFLOW_TRAINER_SERVER_CA_CERT",
    "KUBEFLOW_TRAINER_SERVER_TOKEN",
)
MOUNT_PATH = "/var/run/secrets/kubeflow/trainer"
VOLUME_NAME = "kubeflow-trainer-token"
TOKEN_FILE, CA_FILE = "token", "ca.crt"
TOKEN_EXPIRY_S = 3600
AUDIENCE_PREFIX = "trainer.kubeflow.org"
FIELD_MANAGER = "trainer-status"
MAX_BODY = 1 << 16
#: What Go's net/http server still reads of a request body the handler did not (maxPostHandlerReadBytes).
MAX_UNREAD_BODY_DRAINED = 256 << 10
QPS, BURST = 5.0, 10
_PATH = re.compile(r"^/apis/trainer\.kubeflow\.org/v1alpha1/namespaces/([^/]+)/trainjobs/([^/]+)/status$")
_ISSUER = "https://nemo-kubeflow-local"


def token_audience(namespace: str, name: str) -> str:
    return f"{AUDIENCE_PREFIX}/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status"


def status_path(namespace: str, name: str) -> str:
    return f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class TokenIssuer:
    """Service-account tokens of this cluster (the TokenRequest API's part): JWTs, HS256."""

    def __init__(self) -> None:
        #: The first key signs; a token signed by any of them verifies (two only during a ``rotation``).
        self._keys = [secrets.token_bytes(32)]

    @contextmanager
    def rotation(self) -> Iterator[None]:
        """A signing-key rotation: the tokens issued in the block are signed by a new key, and from its end on
        the tokens of the old key are refused. (A real kubelet refreshes a projected token at 80 % of its life
        and the old one stays valid to its expiry; this is the harsher case, a token that stops working.)"""
        self._keys.insert(0, secrets.token_bytes(32))
        try:
            yield
        finally:
            del self._keys[1:]

    def issue(self, namespace: str, service_account: str, audience: str, seconds: int = TOKEN_EXPIRY_S) -> str:
        now = int(time.time())
        claims = {
            "iss": _ISSUER,
            "aud": [audience],
            "iat": now,
            "nbf": now,
            "exp": now + int(seconds),
            "sub": f"system:serviceaccount:{namespace}:{service_account}",
            "kubernetes.io": {"namespace": namespace, "serviceaccount": {"name": service_account}},
        }
        signing = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode()) + "." + _b64(json.dumps(claims).encode())
        return signing + "." + _b64(hmac.new(self._keys[0], signing.encode(), hashlib.sha256).digest())

    def verify(self, token: str, audience: str) -> Optional[dict]:
        """The claims of a token this issuer signed, unexpired, for ``audience``; None otherwise."""
        try:
            header, payload, signature = token.split(".")
            signed = [hmac.new(key, f"{header}.{payload}".encode(), hashlib.sha256).digest() for key in self._keys]
            if not any(hmac.compare_digest(expected, _unb64(signature)) for expected in signed):
                return None
            claims = json.loads(_unb64(payload))
        except ValueError:
            return None
        audiences = claims.get("aud") if isinstance(claims.get("aud"), list) else [claims.get("aud")]
        if claims.get("iss") != _ISSUER or audience not in audiences or claims.get("exp", 0) <= time.time():
            return None
        return claims


class RateLimiter:
    """client-go's token bucket: ``qps`` tokens a second, at most ``burst`` saved; a request waits for one."""

    def __init__(
        self,
        qps: float = QPS,
        burst: int = BURST,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.qps, self.burst, self._clock, self._sleep = qps, burst, clock, sleep
        self._tokens, self._at = float(burst), clock()
        self._lock = threading.Lock()
        #: Requests that had to wait, and for how long in all (for tests and benchmarks).
        self.waited, self.waited_s = 0, 0.0

    def wait(self) -> None:
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.qps)
            self._at = now
            self._tokens -= 1
            delay = -self._tokens / self.qps if self._tokens < 0 else 0.0
            if delay:
                self.waited, self.waited_s = self.waited + 1, self.waited_s + delay
        if delay:
            self._sleep(delay)


def _invalid_trainer_status(status: Any) -> Optional[str]:
    """What the TrainJob CRD's schema refuses in ``status.trainerStatus`` (the API server's 422 message)."""
    if not isinstance(status, dict):
        return "status.trainerStatus: Invalid value: must be an object"
    if not status.get("lastUpdatedTime"):
        return (
            'status.trainerStatus: Invalid value: "object": lastUpdatedTime is required when trainerStatus is present'
        )
    percent, eta = status.get("progressPercentage"), status.get("estimatedRemainingSeconds")
    if percent is not None and (not isinstance(percent, int) or not 0 <= percent <= 100):
        return f"status.trainerStatus.progressPercentage: Invalid value: {percent}: must be between 0 and 100"
    if eta is not None and (not isinstance(eta, int) or eta < 0):
        return (
            f"status.trainerStatus.estimatedRemainingSeconds: Invalid value: {eta}: must be greater than or equal to 0"
        )
    metrics = status.get("metrics") or []
    if not isinstance(metrics, list) or len(metrics) > 256:
        return "status.trainerStatus.metrics: Too many: must have at most 256 items"
    for i, metric in enumerate(metrics):
        for key in ("name", "value"):
            value = metric.get(key) if isinstance(metric, dict) else None
            if not isinstance(value, str) or not 1 <= len(value) <= 64:
                return f"status.trainerStatus.metrics[{i}].{key}: Invalid value: must be 1 to 64 characters"
    return None


class StatusServer:
    """The status server and the plugin's part for one local cluster (``FEATURE_GATE`` on)."""

    def __init__(
        self, store: Store, credentials: Optional[ServerCredentials] = None, tokens: Optional[TokenIssuer] = None
    ):
        self.store = store
        self.credentials = credentials or make_credentials("kubeflow-trainer-status-server")
        self.tokens = tokens or TokenIssuer()
        self.limiter = RateLimiter()
        self._httpd: Optional[_Server] = None
        #: Status updates applied (for tests and benchmarks).
        self.applied = 0

    @property
    def url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("the status server is not running")
        return f"https://127.0.0.1:{self._httpd.server_address[1]}"

    def start(self) -> None:
        self._httpd = _Server(self)
        threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2}, name="trainjob-status-server", daemon=True
        ).start()

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    # -- the plugin: EnforceMLPolicy and Build --------------------------------------------------------------

    def enforce(self, trainjob: dict, spec: dict, trainer_jobs: list[str]) -> None:
        """Give the trainer's containers the env and the projected volume; create the CA ConfigMap."""
        meta = trainjob["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        env = [
            {"name": URL_ENV, "value": self.url + status_path(namespace, name)},
            {"name": CA_CERT_ENV, "value": f"{MOUNT_PATH}/{CA_FILE}"},
            {"name": TOKEN_ENV, "value": f"{MOUNT_PATH}/{TOKEN_FILE}"},
        ]
        volume = {
            "name": VOLUME_NAME,
            "projected": {
                "sources": [
                    {
                        "serviceAccountToken": {
                            "audience": token_audience(namespace, name),
                            "expirationSeconds": TOKEN_EXPIRY_S,
                            "path": TOKEN_FILE,
                        }
                    },
                    {"configMap": {"name": f"{name}-tls-config", "items": [{"key": CA_FILE, "path": CA_FILE}]}},
                ]
            },
        }
        for rjob in spec.get("replicatedJobs") or []:
            if rjob["name"] not in trainer_jobs:
                continue
            pod = rjob["template"]["spec"]["template"]["spec"]
            for container in pod.get("containers") or []:
                container["env"] = [e for e in container.get("env") or [] if e["name"] not in {v["name"] for v in env}]
                container["env"] += env
                mounts = [m for m in container.get("volumeMounts") or [] if m["name"] != VOLUME_NAME]
                container["volumeMounts"] = mounts + [{"name": VOLUME_NAME, "mountPath": MOUNT_PATH, "readOnly": True}]
            pod["volumes"] = [v for v in pod.get("volumes") or [] if v["name"] != VOLUME_NAME] + [volume]
        if self.store.find(R.CONFIGMAPS, namespace, f"{name}-tls-config") is None:
            self.store.create(
                R.CONFIGMAPS,
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {
                        "name": f"{name}-tls-config",
                        "namespace": namespace,
                        "ownerReferences": [
                            {
                                "apiVersion": trainjob.get("apiVersion", "trainer.kubeflow.org/v1alpha1"),
                                "kind": "TrainJob",
                                "name": name,
                                "uid": meta["uid"],
                                "controller": True,
                                "blockOwnerDeletion": True,
                            }
                        ],
                    },
                    "data": {CA_FILE: self.credentials.ca_pem.decode()},
                },
            )

    # -- the handler ------------------------------------------------------------------------------------------

    def handle(self, method: str, path: str, authorization: str, body: bytes) -> tuple[int, dict]:
        match = _PATH.match(path)
        if method != "POST" or match is None:
            return _status(404, "Not found", "NotFound")
        namespace, name = match.groups()
        parts = authorization.split()
        token = parts[1] if len(parts) == 2 and parts[0].lower() == "bearer" else ""
        claims = self.tokens.verify(token, token_audience(namespace, name))
        if claims is None or (claims.get("kubernetes.io") or {}).get("namespace") != namespace:
            return _status(403, "Forbidden", "Forbidden")
        try:
            request = json.loads(body)
            if not isinstance(request, dict):
                raise ValueError("not an object")
        except ValueError:
            return _status(422, "Invalid payload", "Invalid")
        trainer_status = request.get("trainerStatus")
        if trainer_status is None:
            return 200, request
        problem = _invalid_trainer_status(trainer_status)
        if problem:
            return _status(422, f'TrainJob.trainer.kubeflow.org "{name}" is invalid: {problem}', "Invalid")
        self.limiter.wait()
        applied = {
            k: trainer_status[k]
            for k in ("progressPercentage", "estimatedRemainingSeconds", "metrics", "lastUpdatedTime")
            if trainer_status.get(k) is not None
        }

        def change(trainjob: dict) -> dict:
            trainjob.setdefault("status", {})["trainerStatus"] = applied
            return trainjob

        if self.store.mutate(R.TRAINJOBS, namespace, name, change) is None:
            return _status(404, "Train job not found", "NotFound")
        self.applied += 1
        return 200, request


def _status(code: int, message: str, reason: str) -> tuple[int, dict]:
    return code, {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, owner: StatusServer):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.owner = owner
        self.tls = owner.credentials.server_context()

    def get_request(self) -> tuple[Any, Any]:
        connection, address = super().get_request()
        return self.tls.wrap_socket(connection, server_side=True, do_handshake_on_connect=False), address

    def handle_error(self, request: Any, client_address: Any) -> None:
        logger.debug("status server: connection from %s failed", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        logger.debug("status server: " + format, *args)

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            code, answer = _status(413, "Payload too large", "RequestEntityTooLarge")
            # Go's server reads up to 256 KiB of a body its handler left unread before it answers and closes,
            # so that the client, still sending, reads the 413 rather than a reset connection.
            self.rfile.read(min(length, MAX_UNREAD_BODY_DRAINED))
            self.close_connection = True
        else:
            body = self.rfile.read(length) if length else b""
            try:
                code, answer = self.server.owner.handle(
                    self.command, self.path.split("?")[0], self.headers.get("Authorization") or "", body
                )
            except Exception:  # recoveryMiddleware
                logger.exception("status server: handler failed")
                code, answer = _status(500, "Internal Server Error", "InternalError")
        data = json.dumps(answer).encode() + b"\n"
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_POST = do_GET = do_PUT = do_PATCH = do_DELETE = _serve  # noqa: N815 - http.server's names
