"""List chunking, as kube-apiserver serves it (``limit`` and ``continue``, API concepts "Retrieving large
results sets in chunks").

A list with ``limit`` > 0 answers at most that many items, in key order (namespace, name), and when more match,
``metadata.continue``: an opaque token (kube-apiserver's: base64url of ``{"v": "meta.k8s.io/v1", "rv": N,
"start": "<key>\\u0000"}``) that a list with ``continue`` resumes after. ``metadata.remainingItemCount`` is set
only when the list has no label or field selector (kube-apiserver does not count what a selector would filter).
A token serves the snapshot of its resourceVersion; this store keeps no history, so a token whose
resourceVersion is no longer the current one is answered 410 Expired, as kube-apiserver answers a token whose
revision etcd compacted. A limit that is not an integer, or a token that does not decode, is 400 Bad Request; a
limit of 0 or less means no limit.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Optional

from nemo_kubeflow_local.apiserver.apierrors import ApiError, bad_request

#: The version kube-apiserver writes in its continue tokens.
_TOKEN_VERSION = "meta.k8s.io/v1"
#: kube-apiserver's words for a token whose revision is gone (storage/errors: NewResourceExpired).
EXPIRED = (
    "The provided continue parameter is too old to display a consistent list result. You can start a new "
    "list without the continue parameter."
)


def limit_of(query: dict) -> int:
    """The list's ``limit`` (0: none)."""
    raw = query.get("limit")
    if raw in (None, ""):
        return 0
    try:
        return max(int(raw), 0)
    except ValueError:
        raise bad_request(f"limit: invalid value {raw!r}: must be an integer") from None


def _key(namespace: str, name: str, cluster_wide: bool) -> str:
    """The key relative to the list's prefix (kube-apiserver: "<name>" in a namespace, "<ns>/<name>" across)."""
    return f"{namespace}/{name}" if cluster_wide and namespace else name


def start_of(query: dict, resource_version: str) -> Optional[str]:
    """The key a ``continue`` token resumes at (None without one)."""
    token = query.get("continue")
    if not token:
        return None
    try:
        decoded = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        version, rv, start = decoded["v"], int(decoded["rv"]), str(decoded["start"])
    except (binascii.Error, ValueError, KeyError, TypeError):
        raise bad_request("continue key is not valid: could not decode") from None
    if version != _TOKEN_VERSION:
        raise bad_request(
            f"continue key is not valid: incorrect encoded start resourceVersion (version {_TOKEN_VERSION})"
        )
    if rv <= 0 or not start:
        raise bad_request("continue key is not valid: incorrect encoded start resourceVersion")
    if str(rv) != resource_version:
        raise ApiError(410, EXPIRED)
    return start


def _token(resource_version: str, last_key: str) -> str:
    body = json.dumps(
        {"v": _TOKEN_VERSION, "rv": int(resource_version), "start": last_key + "\x00"}, separators=(",", ":")
    )
    return base64.urlsafe_b64encode(body.encode()).decode().rstrip("=")


def chunk(
    items: list[dict], query: dict, resource_version: str, *, cluster_wide: bool, selected: bool
) -> tuple[list[dict], dict]:
    """The items of this chunk (``items`` in key order) and the list metadata to add: ``continue`` and, without a
    selector (``selected``), ``remainingItemCount``, when items are left."""
    limit, start = limit_of(query), start_of(query, resource_version)

    def key(obj: dict) -> str:
        meta = obj["metadata"]
        return _key(meta.get("namespace") or "", meta["name"], cluster_wide)

    if start is not None:
        items = [obj for obj in items if key(obj) >= start]
    if not limit or len(items) <= limit:
        return items, {}
    page = items[:limit]
    extra: dict = {"continue": _token(resource_version, key(page[-1]))}
    if not selected:
        extra["remainingItemCount"] = len(items) - limit
    return page, extra
