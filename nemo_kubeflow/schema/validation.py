"""Offline validation of every manifest a submission sends.

Each object is checked before any API call, so that a typo or an invalid value fails
the submission up front with ``<path>: <what is wrong>; <how to fix>`` instead of being
pruned silently or rejected with a 422 half-way through a submission.

Three layers check each object (docs/validation.md lists every rule):

1. The Trainer v2.3 CRDs' schemas (TrainJob, ClusterTrainingRuntime, TrainingRuntime), with
   Strict semantics: unknown fields (with a "did you mean"), wrong types (no "8" for 8),
   missing required fields, enums (the CRDs' and the kubeflow_trainer_api models'), and the
   CRDs' minimum/maxItems/maxLength/pattern rules; metadata against the API server's ObjectMeta.
2. The strict Kubernetes schemas of ``kubernetes-validate``, pinned to
   ``constants.KUBERNETES_VERSION``:
   the Job and pod templates inside runtimes, ConfigMaps, Secrets and PVCs.
3. The rules neither schema knows, mirrored from the API server, the CRDs' CEL rules, the
   Trainer webhooks and the Kubeflow SDK: names, quantities, env, runtime structure, sizes.

Layers 1 and 2 read nemo_kubeflow/schema/schemas.json, compiled from those sources by
``python -m tools.compile_schemas`` and shipped in the wheel: one ``json.load`` of ~35 kB
instead of importing ~400 pydantic models and 1.3 MB of core definitions (0.5 s and more in a
fresh process). ``import nemo_kubeflow`` stays cheap: the file is read on first use.

This module holds the entry points (``check_manifests``, which a submission's build calls,
``validate_manifest``, ``validate_manifests``) and the dispatch by kind. The checks are in the
modules of what they validate: ``walk`` (layers 1 and 2), ``trainjob`` and ``runtimes`` (the
Trainer webhook and CEL mirrors), ``core_kinds`` (ConfigMaps, Secrets, PVCs), ``pods``, ``names``
(names, labels, annotations, pod names), ``resources`` (quantities, resources, env), all reporting
through ``problems``; ``patch_conflicts`` checks an admin's runtime against our runtime patch.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from nemo_kubeflow import constants as C
from nemo_kubeflow.errors import ManifestValidationError
from nemo_kubeflow.schema.core_kinds import _check_configmap, _check_pvc, _check_secret
from nemo_kubeflow.schema.names import _check_metadata, _runtime_of, pod_name_problems
from nemo_kubeflow.schema.problems import Path, _dict, _json_type, _Problems, _short
from nemo_kubeflow.schema.runtimes import _check_runtime
from nemo_kubeflow.schema.trainjob import _check_trainjob

__all__ = ["check_manifests", "validate_manifest", "validate_manifests"]

#: Results kept, keyed by a hash of the object; identical runtimes repeat across tasks.
_CACHE_SIZE = 512
_CACHE: OrderedDict[bytes, tuple[str, ...]] = OrderedDict()
_CACHE_LOCK = threading.Lock()


# --- public API ----------------------------------------------------------------------


def validate_manifest(obj: dict) -> list[str]:
    """Return the problems of one manifest as sorted ``"path: message"`` strings ([] if valid).

    Dispatches on ``kind``: TrainJob, ClusterTrainingRuntime, TrainingRuntime, ConfigMap,
    Secret, PersistentVolumeClaim. Results are memoized by a hash of the canonical JSON.
    """
    try:
        canonical = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=repr)
    except TypeError:  # keys of mixed types cannot be sorted; _validate reports them
        return _validate(obj)
    key = hashlib.sha256(canonical.encode()).digest()
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
            return list(hit)
    problems = tuple(_validate(obj))
    with _CACHE_LOCK:
        _CACHE[key] = problems
        if len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return list(problems)


def validate_manifests(objs: Sequence[Any]) -> list[list[str]]:
    """``validate_manifest`` of each object, plus the rules that need two of them: a TrainJob's
    pod names are checked against every replicated job of its runtime when that is among ``objs``."""
    results = [validate_manifest(obj) for obj in objs]
    for i, obj in enumerate(objs):
        runtime = _runtime_of(obj, objs) if _dict(obj).get("kind") == C.TRAINJOB_KIND else None
        if runtime is not None:
            results[i] = _with_runtime_pod_names(obj, runtime, results[i])
    return results


def _with_runtime_pod_names(trainjob: dict, runtime: dict, problems: list[str]) -> list[str]:
    """``problems`` of ``trainjob`` with its pod names checked against ``runtime``'s replicated jobs
    instead of the `node` job assumed without it."""
    alone = set(pod_name_problems(trainjob))
    return [p for p in problems if p not in alone] + pod_name_problems(trainjob, runtime)


def check_manifests(objs: Sequence[dict]) -> None:
    """Validate every object (``validate_manifests``); raise ManifestValidationError for the first
    invalid one.

    The error carries all the problems of that object.
    """
    for obj, problems in zip(objs, validate_manifests(objs)):
        if problems:
            raise ManifestValidationError(*_kind_and_name(obj), problems)


def _kind_and_name(obj: Any) -> tuple[str, str]:
    """The kind and name that an error names ``obj`` by, placeholders where they are not strings."""
    kind, name = _dict(obj).get("kind"), _dict(_dict(obj).get("metadata")).get("name")
    return kind if isinstance(kind, str) else "<unknown kind>", name if isinstance(name, str) else "<unnamed>"


@dataclass(frozen=True)
class _Kind:
    api_version: str
    check: Callable[[dict, _Problems], None]


_KINDS = {
    C.TRAINJOB_KIND: _Kind(C.TRAINER_API_VERSION, _check_trainjob),
    C.CLUSTER_RUNTIME_KIND: _Kind(C.TRAINER_API_VERSION, _check_runtime),
    C.RUNTIME_KIND: _Kind(C.TRAINER_API_VERSION, _check_runtime),
    "ConfigMap": _Kind("v1", _check_configmap),
    "Secret": _Kind("v1", _check_secret),
    "PersistentVolumeClaim": _Kind("v1", _check_pvc),
}


def _non_string_keys(node: Any, path: Path) -> Iterator[tuple[Path, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(key, str):
                yield from _non_string_keys(value, path + (key,))
            else:
                yield path, key
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from _non_string_keys(item, path + (i,))


def _validate(obj: Any) -> list[str]:
    out = _Problems()
    if not isinstance(obj, dict):
        out.add((), f"expected a manifest object, got {_json_type(obj)}")
    elif not _reported_non_string_keys(obj, out):
        _check_object(obj, out)
    return out.render()


def _reported_non_string_keys(obj: dict, out: _Problems) -> bool:
    """Report the keys that are not strings (nothing else can be checked with them); whether there were any."""
    bad_keys = list(_non_string_keys(obj, ()))
    for parent, key in bad_keys:
        out.add(
            parent,
            f"key {key!r} is not a string",
            "quote it (YAML reads 1, true or null keys as non-strings)",
        )
    return bool(bad_keys)


def _check_object(obj: dict, out: _Problems) -> None:
    """A manifest of string keys: its kind, apiVersion, metadata, then the checks of its kind."""
    kind = obj.get("kind")
    if not isinstance(kind, str) or kind not in _KINDS:
        out.add(("kind",), f"unknown kind {_short(kind)}", f"use one of {', '.join(_KINDS)}")
        return
    spec = _KINDS[kind]
    if obj.get("apiVersion") != spec.api_version:
        out.add(
            ("apiVersion",),
            f"{_short(obj.get('apiVersion'))} is not the apiVersion of a {kind}",
            f"use {spec.api_version}",
        )
    _check_metadata(obj, kind, out)
    spec.check(obj, out)
