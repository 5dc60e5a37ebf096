"""Objects as metadata only: what the API server answers a client that asks for
``application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1`` (a list) or
``...;as=PartialObjectMetadata;...`` (one object) in its Accept header, as controllers' metadata
informers and ``kubectl get`` do, to read names, labels and owners without specs and statuses.

As the real server does (apiserver ``handlers/response.go``): every item becomes
``{"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": ...}`` and the list keeps
its ``resourceVersion``; the first media range of the Accept header that the server can produce wins,
and asking a list for ``PartialObjectMetadata`` (or one object for the list) is refused with 406
NotAcceptable. Metadata-only watches are not emulated: refused with 406 rather than answered in full.
"""

from __future__ import annotations

from typing import Optional

from nemo_kubeflow_local.apiserver.apierrors import ApiError

GROUP_VERSIONS = ("meta.k8s.io/v1", "meta.k8s.io/v1beta1")
OBJECT = "PartialObjectMetadata"
LIST = "PartialObjectMetadataList"


def _params(media_range: str) -> tuple[str, dict[str, str]]:
    kind, *rest = [part.strip() for part in media_range.split(";")]
    params = {}
    for part in rest:
        key, _, value = part.partition("=")
        params[key.strip()] = value.strip()
    return kind.lower(), params


def asked(accept: str) -> Optional[tuple[str, str]]:
    """(``PartialObjectMetadata`` or ``PartialObjectMetadataList``, "meta.k8s.io/v1") when the first media
    range of ``accept`` that JSON can answer asks for metadata only; None for a plain answer (or a Table,
    printers.py)."""
    for media_range in accept.split(","):
        kind, params = _params(media_range)
        if kind not in ("application/json", "application/*", "*/*"):
            continue  # protobuf, yaml: not produced here, the next range may be
        wanted = params.get("as")
        group_version = f"{params.get('g', '')}/{params.get('v', '')}"
        if wanted in (OBJECT, LIST) and group_version in GROUP_VERSIONS:
            return wanted, group_version
        return None
    return None


def _partial(obj: dict, group_version: str) -> dict:
    return {"kind": OBJECT, "apiVersion": group_version, "metadata": obj.get("metadata") or {}}


def transform(body: dict, wanted: str, group_version: str, is_list: bool) -> dict:
    """The metadata-only answer for ``body`` (a list or one object, as the server read it)."""
    if wanted == LIST and not is_list:
        raise ApiError(406, f"you requested {LIST}, but the requested object is not a list")
    if wanted == OBJECT and is_list:
        raise ApiError(406, f"you requested {OBJECT}, but the requested object is a list")
    if not is_list:
        return _partial(body, group_version)
    kept = ("resourceVersion", "continue", "remainingItemCount")
    meta = {k: v for k, v in (body.get("metadata") or {}).items() if k in kept}
    # An empty list's items are null, as kube-apiserver sends them (a nil Go slice), not [].
    items = [_partial(item, group_version) for item in body.get("items") or []]
    return {"kind": LIST, "apiVersion": group_version, "metadata": meta, "items": items or None}
