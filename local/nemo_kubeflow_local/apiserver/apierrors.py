"""API errors as the real API server reports them: a ``Status`` object with code, reason and message.

Messages follow k8s.io/apimachinery ``pkg/api/errors`` and ``pkg/util/validation/field`` word for word
where that is practical, because clients (and our own executor) match on them.
"""

from __future__ import annotations

import json
from typing import Any, Optional, Sequence

from nemo_kubeflow_local.apiserver.resources import ResourceType

#: The reason the API server reports for each HTTP code it produces itself.
REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


class ApiError(Exception):
    """An error answered as a ``Status`` object (and raised anywhere below the HTTP layer)."""

    def __init__(
        self,
        code: int,
        message: str,
        *,
        reason: Optional[str] = None,
        details: Optional[dict] = None,
        headers: Optional[dict[str, str]] = None,
    ):
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason if reason is not None else REASONS.get(code, "Unknown")
        self.details = details
        self.headers = headers or {}

    def status(self) -> dict:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
        }
        if self.details:
            body["details"] = self.details
        body["code"] = self.code
        return body


def _details(rt: ResourceType, name: str = "", *, kind: Optional[str] = None, causes=None) -> dict:
    details: dict[str, Any] = {}
    if name:
        details["name"] = name
    if rt.group:
        details["group"] = rt.group
    details["kind"] = kind or rt.plural
    if causes:
        details["causes"] = causes
    return details


def not_found(rt: ResourceType, name: str) -> ApiError:
    return ApiError(404, f'{rt.qualified} "{name}" not found', details=_details(rt, name))


def already_exists(rt: ResourceType, name: str) -> ApiError:
    return ApiError(409, f'{rt.qualified} "{name}" already exists', reason="AlreadyExists", details=_details(rt, name))


def conflict(rt: ResourceType, name: str) -> ApiError:
    return ApiError(
        409,
        f'Operation cannot be fulfilled on {rt.qualified} "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again",
        details=_details(rt, name),
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, message)


def forbidden(rt: ResourceType, name: str, message: str) -> ApiError:
    return ApiError(403, message, details=_details(rt, name))


# --- field errors (k8s.io/apimachinery/pkg/util/validation/field) ------------------------------


def format_value(value: Any) -> str:
    """How ``field.Error`` prints a bad value: strings quoted, numbers bare, anything else as JSON.

    Go prints structs with ``%#v``; JSON is the readable stand-in (documented difference).
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if value is None:
        return "null"
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


class FieldError:
    """One ``field.Error``; ``str()`` gives the ``<path>: <Type>: <detail>`` text the server prints."""

    _REASONS = {
        "Invalid value": "FieldValueInvalid",
        "Required value": "FieldValueRequired",
        "Duplicate value": "FieldValueDuplicate",
        "Forbidden": "FieldValueForbidden",
        "Not found": "FieldValueNotFound",
        "Too long": "FieldValueTooLong",
        "Unsupported value": "FieldValueNotSupported",
    }

    def __init__(self, path: str, type_: str, detail: str = "", value: Any = ..., *, show_value: bool = True):
        self.path = path
        self.type = type_
        self.detail = detail
        self.value = value
        self.show_value = show_value

    @classmethod
    def invalid(cls, path: str, value: Any, detail: str) -> "FieldError":
        return cls(path, "Invalid value", detail, value)

    @classmethod
    def required(cls, path: str, detail: str = "") -> "FieldError":
        return cls(path, "Required value", detail, show_value=False)

    @classmethod
    def forbidden(cls, path: str, detail: str) -> "FieldError":
        return cls(path, "Forbidden", detail, show_value=False)

    @classmethod
    def duplicate(cls, path: str, value: Any) -> "FieldError":
        return cls(path, "Duplicate value", "", value)

    @classmethod
    def not_found(cls, path: str, value: Any) -> "FieldError":
        return cls(path, "Not found", "", value)

    @classmethod
    def too_long(cls, path: str, limit: int) -> "FieldError":
        return cls(path, "Too long", f"must have at most {limit} bytes", show_value=False)

    def body(self) -> str:
        text = self.type
        if self.show_value and self.value is not ...:
            text += f": {format_value(self.value)}"
        if self.detail:
            text += f": {self.detail}"
        return text

    def __str__(self) -> str:
        return f"{self.path or '<nil>'}: {self.body()}"

    def cause(self) -> dict:
        return {"reason": self._REASONS.get(self.type, "FieldValueInvalid"), "message": self.body(), "field": self.path}


def aggregate(errors: Sequence[Any]) -> str:
    """``utilerrors.NewAggregate(...).Error()``: one message bare, several in brackets."""
    texts = [str(e) for e in errors]
    return texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"


def invalid(rt: ResourceType, name: str, errors: Sequence[FieldError]) -> ApiError:
    """422 Invalid, as ``apierrors.NewInvalid`` words it."""
    return ApiError(
        422,
        f'{rt.qualified_kind} "{name}" is invalid: {aggregate(errors)}',
        details=_details(rt, name, kind=rt.kind, causes=[e.cause() for e in errors]),
    )


def webhook_denied(webhook: str, errors: Sequence[FieldError]) -> ApiError:
    """A validating webhook said no. controller-runtime answers a plain error with 403 Forbidden
    (``admission.Denied``) and the API server prefixes the webhook's name; there are no details."""
    return ApiError(403, f'admission webhook "{webhook}" denied the request: {aggregate(errors)}')
