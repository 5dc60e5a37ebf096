"""PATCH bodies: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and a strategic merge patch.

The strategic merge patch knows the merge keys of the lists it will meet in pods and
runtime templates (containers by name, volumeMounts by mountPath, ...) and the `$patch`
directive; every other list is replaced, as for a merge patch.
"""

from __future__ import annotations

import copy
from typing import Any

from nemo_kubeflow_local.apiserver.apierrors import ApiError, bad_request

#: Field name -> merge key, from the `patchMergeKey` tags of the core/v1 and JobSet Go types.
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "imagePullSecrets": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
    "ownerReferences": "uid",
    "conditions": "type",
    "hostAliases": "ip",
    "replicatedJobs": "name",
    "resourceClaims": "name",
}
#: Lists of scalars merged as sets (`patchStrategy:"merge"` on a []string).
MERGE_SETS = {"finalizers"}


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue  # $retainKeys, $setElementOrder/...: ordering hints, not content
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and isinstance(result.get(key), list) and key in MERGE_KEYS:
            result[key] = _merge_list(result[key], value, MERGE_KEYS[key])
        elif isinstance(value, list) and isinstance(result.get(key), list) and key in MERGE_SETS:
            result[key] = result[key] + [v for v in value if v not in result[key]]
        elif isinstance(value, list):
            result[key] = [_strip_directives(v) for v in value if not (isinstance(v, dict) and v.get("$patch"))]
        else:
            result[key] = strategic_merge_patch(result.get(key), value)
    return result


def _strip_directives(value: Any) -> Any:
    return strategic_merge_patch({}, value) if isinstance(value, dict) else copy.deepcopy(value)


def _merge_list(current: list, patch: list, merge_key: str) -> list:
    result = [copy.deepcopy(item) for item in current]
    for item in patch:
        if not isinstance(item, dict) or merge_key not in item:
            raise bad_request(f"map: {item!r} does not contain declared merge key: {merge_key}")
        index = next(
            (i for i, cur in enumerate(result) if isinstance(cur, dict) and cur.get(merge_key) == item[merge_key]), None
        )
        if item.get("$patch") == "delete":
            if index is not None:
                result.pop(index)
        elif index is None:
            result.append(_strip_directives(item))
        else:
            result[index] = strategic_merge_patch(result[index], item)
    return _element_order(result, current, patch, merge_key)


def _element_order(merged: list, current: list, patch: list, merge_key: str) -> list:
    """normalizeElementOrder: the patch's items (in patch order) and the items only the target had
    (in their order) are merged by position in the target, where an item the target lacked counts
    as position -1, so the patch's new items come first."""
    target_keys = [item.get(merge_key) for item in current if isinstance(item, dict)]
    patch_keys = [item.get(merge_key) for item in patch]
    from_patch = sorted(
        (m for m in merged if m.get(merge_key) in patch_keys), key=lambda m: patch_keys.index(m.get(merge_key))
    )
    target_only = [m for m in merged if m.get(merge_key) not in patch_keys]

    def position(item: dict) -> int:
        key = item.get(merge_key)
        return target_keys.index(key) if key in target_keys else -1

    ordered = []
    while from_patch and target_only:
        ordered.append(target_only.pop(0) if position(target_only[0]) <= position(from_patch[0]) else from_patch.pop(0))
    return ordered + target_only + from_patch


# --- JSON patch -------------------------------------------------------------------------------


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise bad_request(f'the server rejected our request due to an error in our request: invalid path "{path}"')
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _resolve(doc: Any, parts: list[str], path: str) -> Any:
    for part in parts:
        if isinstance(doc, dict) and part in doc:
            doc = doc[part]
        elif isinstance(doc, list) and part.isdigit() and int(part) < len(doc):
            doc = doc[int(part)]
        else:
            raise ApiError(
                422,
                f'the server rejected our request due to an error in our request: doc is missing path: "{path}"',
                reason="Invalid",
            )
    return doc


def _add(doc: Any, parts: list[str], value: Any, path: str, replace: bool) -> Any:
    if not parts:
        return value
    parent = _resolve(doc, parts[:-1], path)
    last = parts[-1]
    if isinstance(parent, dict):
        if replace and last not in parent:
            _resolve(doc, parts, path)
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-":
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent) - (1 if replace else 0):
            if replace:
                parent[int(last)] = value
            else:
                parent.insert(int(last), value)
        else:
            _resolve(doc, parts, path)
    else:
        _resolve(doc, parts, path)
    return doc


def _remove(doc: Any, parts: list[str], path: str) -> Any:
    _resolve(doc, parts, path)
    parent = _resolve(doc, parts[:-1], path)
    if isinstance(parent, dict):
        del parent[parts[-1]]
    else:
        parent.pop(int(parts[-1]))
    return doc


def json_patch(target: Any, ops: Any) -> Any:
    if not isinstance(ops, list):
        raise bad_request(
            "the server rejected our request due to an error in our request: "
            "json: cannot unmarshal object into Go value of type jsonpatch.Patch"
        )
    doc = copy.deepcopy(target)
    for op in ops:
        kind, path = op.get("op"), op.get("path", "")
        parts = _pointer(path)
        if kind == "add":
            doc = _add(doc, parts, copy.deepcopy(op.get("value")), path, replace=False)
        elif kind == "replace":
            doc = _add(doc, parts, copy.deepcopy(op.get("value")), path, replace=True)
        elif kind == "remove":
            doc = _remove(doc, parts, path)
        elif kind in ("move", "copy"):
            source = _pointer(op.get("from", ""))
            value = copy.deepcopy(_resolve(doc, source, op.get("from", "")))
            if kind == "move":
                doc = _remove(doc, source, op.get("from", ""))
            doc = _add(doc, parts, value, path, replace=False)
        elif kind == "test":
            if _resolve(doc, parts, path) != op.get("value"):
                raise ApiError(
                    422,
                    f"the server rejected our request due to an error in our request: testing value {path} failed",
                    reason="Invalid",
                )
        else:
            raise bad_request(
                f"the server rejected our request due to an error in our request: Unexpected kind: {kind}"
            )
    return doc
