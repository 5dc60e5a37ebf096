"""A refused request as one of our errors: the server's own reason and message (its ``Status`` body), the
error class a caller can catch (already exists, not found, forbidden, an admission webhook's denial), and how
to fix the usual causes (RBAC, a missing namespace, a runtime name)."""

from __future__ import annotations

import json
from typing import Any, Optional

from nemo_kubeflow.cluster.kinds import KINDS, _scope, describe_target
from nemo_kubeflow.constants import CLUSTER_RUNTIME_KIND, RUNTIME_KIND
from nemo_kubeflow.errors import (
    AdmissionDeniedError,
    AlreadyExistsError,
    ClusterError,
    NotFoundError,
    PermissionDeniedError,
)


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
    if status == 0:
        # No response came (the kubernetes client's ApiException for a failed TLS handshake): its reason is the
        # connection's error, on several lines, and there is no server answer to quote beside it.
        message = " ".join(message.split())
        text = f"cannot {verb} {target}: {message} (HTTP 0: no response)"
    else:
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
