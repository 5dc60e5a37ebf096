"""The Kubernetes protobuf encoding of the one request a client sends only that way here.

kubectl sends its typed requests to built-in APIs as ``application/vnd.kubernetes.protobuf``
(``kubectl auth can-i``: a SelfSubjectAccessReview) and accepts JSON back. The body is the magic
``k8s\\x00`` then a ``runtime.Unknown`` (typeMeta = 1, raw = 2, contentEncoding = 3, contentType = 4)
whose ``raw`` is the object's message. Only the fields of a SelfSubjectAccessReview are decoded
(k8s.io/api authorization/v1 generated.proto): spec = 2; its resourceAttributes = 1 and
nonResourceAttributes = 2; a ResourceAttributes' namespace, verb, group, version, resource,
subresource, name = 1..7; a NonResourceAttributes' path = 1, verb = 2.
"""

from __future__ import annotations

from typing import Iterator

CONTENT_TYPE = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"

_RESOURCE_FIELDS = {1: "namespace", 2: "verb", 3: "group", 4: "version", 5: "resource", 6: "subresource", 7: "name"}
_NON_RESOURCE_FIELDS = {1: "path", 2: "verb"}


class DecodeError(ValueError):
    """A body that is not the protobuf it says it is."""


def is_protobuf(content_type: str) -> bool:
    return content_type.split(";", 1)[0].strip().lower() == CONTENT_TYPE


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise DecodeError("truncated varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


def _fields(data: bytes) -> Iterator[tuple[int, object]]:
    """(field number, value) of a message: an int (varint) or bytes (length-delimited); others skipped."""
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _varint(data, at)
            yield number, value
        elif wire == 2:
            length, at = _varint(data, at)
            if at + length > len(data):
                raise DecodeError("truncated field")
            yield number, data[at : at + length]
            at += length
        elif wire == 1:
            at += 8
        elif wire == 5:
            at += 4
        else:
            raise DecodeError(f"wire type {wire}")


def _strings(message: bytes, names: dict[int, str]) -> dict:
    return {
        names[number]: value.decode("utf-8")
        for number, value in _fields(message)
        if number in names and isinstance(value, bytes)
    }


def _message(data: bytes, number: int) -> bytes | None:
    return next((value for n, value in _fields(data) if n == number and isinstance(value, bytes)), None)


def self_subject_access_review(body: bytes) -> dict:
    """A protobuf SelfSubjectAccessReview as the dict its JSON would give."""
    if not body.startswith(MAGIC):
        raise DecodeError("no k8s protobuf magic number")
    unknown = body[len(MAGIC) :]
    raw = _message(unknown, 2) or b""
    type_meta = _strings(_message(unknown, 1) or b"", {1: "apiVersion", 2: "kind"})
    spec_message = _message(raw, 2) or b""
    spec: dict = {}
    resource = _message(spec_message, 1)
    if resource is not None:
        spec["resourceAttributes"] = _strings(resource, _RESOURCE_FIELDS)
    non_resource = _message(spec_message, 2)
    if non_resource is not None:
        spec["nonResourceAttributes"] = _strings(non_resource, _NON_RESOURCE_FIELDS)
    return {**type_meta, "metadata": {}, "spec": spec}
