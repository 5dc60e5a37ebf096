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
"""

from __future__ import annotations

import base64
import binascii
import difflib
import hashlib
import json
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache
from typing import Any, Callable, Iterator, Optional, Sequence, TypeGuard, Union

from nemo_kubeflow import constants as C
from nemo_kubeflow.errors import ManifestValidationError
from nemo_kubeflow.parts import naming
from nemo_kubeflow.parts.naming import PATCH_MANAGER
from nemo_kubeflow.quantity import parse_quantity
from nemo_kubeflow.schema import compiled as schemas

__all__ = ["check_manifests", "pod_name_problems", "validate_manifest", "validate_manifests"]

#: Results kept, keyed by a hash of the object; identical runtimes repeat across tasks.
_CACHE_SIZE = 512
_CACHE: OrderedDict[bytes, tuple[str, ...]] = OrderedDict()
_CACHE_LOCK = threading.Lock()

Path = tuple[Union[str, int], ...]


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


# --- problems --------------------------------------------------------------------------

_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def _fmt_path(path: Path) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN_KEY.fullmatch(part):
            out += f".{part}" if out else part
        else:
            out += f"[{json.dumps(part)}]"
    return out or "<object>"


def _sort_key(path: Path) -> tuple:
    # Indices sort numerically and before keys, so containers[10] follows containers[9].
    return tuple((1, 0, p) if isinstance(p, str) else (0, p, "") for p in path)


class _Problems:
    def __init__(self) -> None:
        self.items: list[tuple[Path, str]] = []
        #: Reported only where ``items`` has nothing at the same path: the CRDs' generic value rules
        #: (minimum, maxItems, enum...), which the specific rules of this module word better.
        self.fallbacks: list[tuple[Path, str]] = []

    def add(self, path: Path, what: str, fix: str = "") -> None:
        self.items.append((path, _message(what, fix)))

    def soft(self, path: Path, what: str, fix: str = "") -> None:
        self.fallbacks.append((path, _message(what, fix)))

    def paths(self) -> set[Path]:
        return {path for path, _ in self.items}

    def render(self) -> list[str]:
        items = self.items + _not_at(self.fallbacks, self.paths())
        unique = sorted(set(items), key=lambda item: (_sort_key(item[0]), item[1]))
        return [f"{_fmt_path(path)}: {message}" for path, message in unique]


def _message(what: str, fix: str) -> str:
    """A problem's message: ``<what is wrong>; <how to fix>``."""
    return f"{what}; {fix}" if fix else what


def _not_at(items: list[tuple[Path, str]], paths: set[Path]) -> list[tuple[Path, str]]:
    """The problems of ``items`` whose path is not among ``paths``."""
    return [item for item in items if item[0] not in paths]


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, default=repr)
    return text if len(text) <= limit else text[: limit - 3] + "..."


#: The JSON name of each type a manifest's values have, in order: bool before int (a bool is an int).
_JSON_TYPES: tuple[tuple[Union[type, tuple[type, ...]], str], ...] = (
    (type(None), "null"),
    (bool, "boolean"),
    ((int, float), "number"),
    (str, "string"),
    (list, "list"),
    (dict, "object"),
)


def _json_type(value: Any) -> str:
    for types, name in _JSON_TYPES:
        if isinstance(value, types):
            return name
    return type(value).__name__


def _close_match(key: str, choices: Sequence[str]) -> Optional[str]:
    lowered = {c.lower(): c for c in choices}
    return lowered.get(key.lower()) or next(iter(difflib.get_close_matches(key, choices, n=1, cutoff=0.6)), None)


def _did_you_mean(key: str, choices: Sequence[str], known: str = "known fields") -> str:
    """A "did you mean" for a misspelt key, else the list of valid choices when it is short."""
    choices = sorted(set(choices))
    match = _close_match(key, choices)
    if match:
        return f"did you mean {match}?"
    if not choices:
        return "remove it"
    if len(choices) <= 15:
        return f"remove it ({known}: {', '.join(choices)})"
    return "remove it"


def _dict(value: Any) -> dict:
    """The value if it is a mapping, else {} (its type problem is reported by the schema layer)."""
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _first_with(items: list, key: str, value: Any) -> Optional[dict]:
    """The first object of ``items`` whose ``key`` is ``value`` (not None), or None."""
    return next((item for item in items if _dict(item).get(key) == value), None)


def _find(node: Any, pattern: Sequence[str], path: Path) -> Iterator[tuple[Path, Any]]:
    """Yield (path, value) for every value at ``pattern``; "*" walks every item of a list."""
    if not pattern:
        yield path, node
        return
    head, rest = pattern[0], pattern[1:]
    if head == "*":
        for i, item in enumerate(_list(node)):
            yield from _find(item, rest, path + (i,))
    elif isinstance(node, dict) and node.get(head) is not None:
        yield from _find(node[head], rest, path + (head,))


# --- names, labels, annotations ---------------------------------------------------------

# Every name is checked by naming.py's helpers, which match whole strings ("abc\n" is no name).
_DNS_SUBDOMAIN_MAX = naming.DNS_SUBDOMAIN_MAX


def _suggest_name(name: str, allow_dots: bool, limit: int, letter_first: bool = False) -> str:
    """A valid name close to ``name``, for the "use e.g." hint."""
    suggestion = re.sub(r"[^a-z0-9.-]" if allow_dots else r"[^a-z0-9-]", "-", name.lower())
    if letter_first:
        suggestion = suggestion.lstrip("0123456789")
    return suggestion.strip("-.")[:limit].rstrip("-.") or "my-name"


def _check_dns_label(name: str, path: Path, out: _Problems, what: str = "name") -> None:
    if not naming.is_rfc1123_label(name):
        out.add(
            path,
            f"{what} {_short(name)} is not a DNS-1123 label (lowercase letters, digits and '-',"
            f" starting and ending with a letter or digit, at most {C.DNS_LABEL_MAX} characters)",
            f"use e.g. {_short(_suggest_name(name, False, C.DNS_LABEL_MAX))}",
        )


def _check_subdomain(name: str, path: Path, out: _Problems) -> None:
    if not naming.is_rfc1123_subdomain(name):
        out.add(
            path,
            f"{_short(name)} is not a DNS-1123 subdomain (lowercase letters, digits, '-' and '.',"
            f" starting and ending with a letter or digit, at most {_DNS_SUBDOMAIN_MAX} characters)",
            f"use e.g. {_short(_suggest_name(name, True, _DNS_SUBDOMAIN_MAX))}",
        )


def _qualified_name_error(key: str) -> Optional[str]:
    """Why ``key`` is not a Kubernetes qualified name (``[prefix/]name``), or None."""
    prefix, _, name = key.rpartition("/")
    if "/" in key and not naming.is_rfc1123_subdomain(prefix):
        return f"prefix {_short(prefix)} must be a lowercase DNS-1123 subdomain"
    if len(name) > C.DNS_LABEL_MAX:
        return f"name part {_short(name)} is longer than {C.DNS_LABEL_MAX} characters"
    if not naming.is_qualified_name_part(name):
        return (
            f"name part {_short(name)} must be alphanumeric, '-', '_' or '.',"
            " starting and ending with a letter or digit"
        )
    return None


def _check_labels_annotations(meta: dict, path: Path, out: _Problems) -> None:
    _check_labels(_dict(meta.get("labels")), path + ("labels",), out)
    _check_annotations(_dict(meta.get("annotations")), path + ("annotations",), out)


def _check_labels(labels: dict, path: Path, out: _Problems) -> None:
    for key, value in labels.items():
        why = _qualified_name_error(key)
        if why:
            out.add(path + (key,), f"invalid label key: {why}", "use e.g. example.com/my-label")
        if isinstance(value, str) and not naming.is_label_value(value):
            out.add(
                path + (key,),
                f"invalid label value {_short(value)}: {naming.LABEL_VALUE_RULE}",
                "shorten it or move it to an annotation",
            )


def _check_annotations(annotations: dict, path: Path, out: _Problems) -> None:
    for key in annotations:
        why = _qualified_name_error(key.lower())
        if why:
            out.add(path + (key,), f"invalid annotation key: {why}")
    _check_annotations_size(annotations, path, out)


def _check_annotations_size(annotations: dict, path: Path, out: _Problems) -> None:
    size = sum(len(k) + len(v) for k, v in annotations.items() if isinstance(v, str))
    if size > C.ANNOTATIONS_MAX_BYTES:
        out.add(
            path,
            f"annotations total {size} bytes, over the {C.ANNOTATIONS_MAX_BYTES}-byte limit",
            "move large values into a ConfigMap",
        )


def _check_metadata(obj: dict, kind: str, out: _Problems) -> None:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        out.add(("metadata",), "required object is missing", "set metadata.name")
        return
    path: Path = ("metadata",)
    _check_object_name(meta.get("name"), kind, path + ("name",), out)
    _check_namespace(meta.get("namespace"), kind, path + ("namespace",), out)
    _check_labels_annotations(meta, path, out)


def _check_object_name(name: Any, kind: str, path: Path, out: _Problems) -> None:
    if not isinstance(name, str) or not name:
        out.add(path, "required field is missing", f"give the {kind} a name")
    elif kind == C.TRAINJOB_KIND:
        _check_trainjob_name(name, path, out)
    else:
        _check_subdomain(name, path, out)


def _check_namespace(namespace: Any, kind: str, path: Path, out: _Problems) -> None:
    if kind == C.CLUSTER_RUNTIME_KIND:
        if namespace is not None:
            out.add(
                path,
                "a ClusterTrainingRuntime is cluster-scoped and takes no namespace",
                "remove metadata.namespace (or use a namespaced TrainingRuntime)",
            )
    elif isinstance(namespace, str):
        _check_dns_label(namespace, path, out, what="namespace")


def _check_trainjob_name(name: str, path: Path, out: _Problems) -> None:
    # The pod-name budget (a shorter limit) is checked with the spec: _check_pod_names.
    fix = f"use e.g. {_short(_suggest_name(name, False, C.DNS_LABEL_MAX, letter_first=True))}"
    if not naming.is_rfc1035_label(name, max_len=len(name)):
        out.add(
            path,
            f"{_short(name)} is not an RFC 1035 label (lowercase letters, digits and '-', starting"
            " with a letter, ending with a letter or digit; no dots), which the TrainJob CRD requires",
            fix,
        )
    if len(name) > C.DNS_LABEL_MAX:
        out.add(path, f"{len(name)} characters, over the CRD limit of {C.DNS_LABEL_MAX}", fix)


def _trainjob_shapes(trainjob: dict, runtime: Optional[dict]) -> list[naming.ReplicatedJobShape]:
    """The replicated jobs of the JobSet Trainer builds for ``trainjob``: its runtime's, or (runtime
    unknown) the trainer's ``node`` job, the one every runtime of this tool has."""
    num_nodes = _dict(_dict(trainjob.get("spec")).get("trainer")).get("numNodes")
    num_nodes = num_nodes if _is_int(num_nodes) and num_nodes > 0 else None
    if runtime is not None:
        return naming.runtime_job_shapes(runtime, num_nodes)
    return [naming.ReplicatedJobShape(C.TRAINER_NODE, completions=num_nodes or 1)]


def _check_pod_names(trainjob: dict, runtime: Optional[dict], out: _Problems) -> None:
    """JobSet's pod-name rule (naming.longest_pod_name has it and its source): the TrainJob is accepted,
    then Trainer's JobSet is refused by JobSet's webhook and the job never starts."""
    name = _dict(trainjob.get("metadata")).get("name")
    if not isinstance(name, str) or not name:
        return
    jobs = _trainjob_shapes(trainjob, runtime)
    budget = naming.jobset_name_budget(jobs)
    for job, pod in naming.longest_pod_names(name, jobs):
        out.add(
            ("metadata", "name"),
            f"TrainJob {_short(name, 70)}: pods of replicated job {job.name!r} would be named up to {len(pod)}"
            f" characters ({_short(pod[: -len(naming.POD_NAME_RANDOM_SUFFIX)] + '-<5 random>', 130)}),"
            f" over the {C.DNS_LABEL_MAX} JobSet allows: JobSet's webhook refuses the JobSet and the"
            " TrainJob never starts",
            f"shorten the TrainJob name to at most {budget} characters"
            + (f", or rename replicated job {job.name!r}" if runtime is not None else ""),
        )


def pod_name_problems(trainjob: dict, runtime: Optional[dict] = None) -> list[str]:
    """The pod-name problems of ``trainjob`` with ``runtime`` (its ClusterTrainingRuntime or
    TrainingRuntime: every replicated job; None: the trainer's ``node`` job only), as ``path: message``."""
    out = _Problems()
    _check_pod_names(trainjob, runtime, out)
    return out.render()


def _runtime_of(trainjob: dict, objs: Sequence[Any]) -> Optional[dict]:
    """The runtime among ``objs`` that ``trainjob``'s runtimeRef names, if any."""
    ref = _dict(_dict(trainjob.get("spec")).get("runtimeRef"))
    kind = ref.get("kind") or C.CLUSTER_RUNTIME_KIND
    namespace = _dict(trainjob.get("metadata")).get("namespace")
    return next((obj for obj in objs if _is_runtime(_dict(obj), kind, ref.get("name"), namespace)), None)


def _is_runtime(obj: dict, kind: Any, name: Any, namespace: Any) -> bool:
    """Whether ``obj`` is the runtime of ``kind`` named ``name`` that a TrainJob in ``namespace`` can use."""
    meta = _dict(obj.get("metadata"))
    if obj.get("kind") != kind or meta.get("name") != name:
        return False
    return kind == C.CLUSTER_RUNTIME_KIND or meta.get("namespace") in (None, namespace)


# --- quantities, resources, env ---------------------------------------------------------

#: Device keys the Kubeflow SDK recognises in the `node` container's limits
#: (kubeflow/trainer/backends/kubernetes/utils.py: get_container_devices).
_SDK_DEVICE_KEYS = ("nvidia.com/gpu", "google.com/tpu", "huawei.com/Ascend910", "cpu")
_SDK_MIG_PREFIX = "nvidia.com/mig-"
_QUANTITY_FIX = 'use a Kubernetes quantity such as "8", "500m", "64Gi" or "1e3"'


def _is_extended(name: str) -> bool:
    # The API server's IsExtendedResourceName: qualified, outside kubernetes.io.
    return "/" in name and "kubernetes.io/" not in name and not name.startswith("requests.")


def _check_quantity(value: Any, path: Path, out: _Problems) -> Optional[Decimal]:
    quantity = parse_quantity(value)
    if quantity is None:
        out.add(path, f"{_short(value)} is not a Kubernetes quantity", _QUANTITY_FIX)
    elif quantity < 0:
        out.add(path, f"{_short(value)} is negative", "use a value >= 0")
        return None
    return quantity


def _check_resources(resources: Any, path: Path, out: _Problems, partial: bool = False) -> None:
    """Check requests/limits. ``partial``: only some keys are given (TrainJob resourcesPerNode
    is merged key by key over the runtime's), so a missing counterpart is not an error."""
    requests = _checked_quantities(resources, "requests", path, out)
    limits = _checked_quantities(resources, "limits", path, out)
    for name, request in requests.items():
        _check_request_within_limit(name, request, limits.get(name), path, out, partial)


def _checked_quantities(resources: Any, section: str, path: Path, out: _Problems) -> dict[str, Decimal]:
    """The valid quantities of ``resources[section]`` by name, after reporting the invalid ones."""
    parsed: dict[str, Decimal] = {}
    for name, value in _dict(_dict(resources).get(section)).items():
        quantity = _check_resource(name, value, path + (section, name), out)
        if quantity is not None:
            parsed[name] = quantity
    return parsed


def _cannot_overcommit(name: str) -> bool:
    # Extended resources and hugepages cannot be overcommitted: the API server wants request == limit.
    return _is_extended(name) or name.startswith("hugepages-")


def _check_request_within_limit(
    name: str, request: Decimal, limit: Optional[Decimal], path: Path, out: _Problems, partial: bool
) -> None:
    if limit is None:
        if _cannot_overcommit(name) and not partial:
            out.add(
                path + ("limits", name),
                f"{name} is requested but has no limit; it cannot be overcommitted",
                f"set limits.{name} to the same value",
            )
    elif request > limit:
        out.add(
            path + ("requests", name),
            f"request {request.normalize():f} exceeds the limit {limit.normalize():f}",
            "lower the request or raise the limit",
        )
    elif _cannot_overcommit(name) and request != limit:
        out.add(
            path + ("requests", name),
            f"request must equal the limit for {name}",
            "set requests and limits to the same value (or only limits)",
        )


def _check_resource_name(name: str, where: Path, out: _Problems) -> None:
    """A resource name is standard (cpu, memory...), hugepages-<size> or a qualified, domain-prefixed name."""
    if "/" in name:
        why = _qualified_name_error(name)
        if why:
            out.add(where, f"invalid resource name: {why}")
    elif name not in C.STANDARD_RESOURCES and not name.startswith("hugepages-"):
        fix = "use nvidia.com/gpu" if "gpu" in name.lower() else "use a domain-prefixed name such as nvidia.com/gpu"
        out.add(
            where,
            f"{_short(name)} is neither a standard resource ({', '.join(C.STANDARD_RESOURCES)}) nor domain-prefixed",
            fix,
        )


def _check_resource(name: str, value: Any, where: Path, out: _Problems) -> Optional[Decimal]:
    """One request or limit: its name and quantity; the quantity, or ``None`` when it is wrong."""
    _check_resource_name(name, where, out)
    quantity = _check_quantity(value, where, out)
    if quantity is not None and _is_extended(name) and quantity != quantity.to_integral_value():
        out.add(
            where,
            f"{_short(value)} is not a whole number; {name} cannot be split",
            "request whole devices, e.g. 1",
        )
        return None
    return quantity


_ENV_SOURCES = ("configMapKeyRef", "fieldRef", "fileKeyRef", "resourceFieldRef", "secretKeyRef")


def _check_env(env: Any, path: Path, out: _Problems, trainer_env: bool = False) -> None:
    """An env list: names valid, each set once (and none Trainer reserves where ``trainer_env``), one value each."""
    seen: dict[str, int] = {}
    for i, var in enumerate(_list(env)):
        var = _dict(var)
        name = var.get("name")
        if isinstance(name, str):
            _check_env_name(name, path + (i, "name"), out, trainer_env)
            if name in seen:
                out.add(
                    path + (i, "name"),
                    f"{name} is already set at {_fmt_path(path + (seen[name],))}",
                    "keep one of them",
                )
            seen.setdefault(name, i)
        _check_env_value(var, path + (i,), out)


def _check_env_name(name: str, path: Path, out: _Problems, trainer_env: bool) -> None:
    if not naming.is_env_var_name(name):
        out.add(path, f"{_short(name)} is not a valid environment variable name", f"use {naming.ENV_VAR_NAME_RULE}")
    reserved = naming.trainer_env_problem(name) if trainer_env else None
    if reserved:
        out.add(path, reserved, "remove it")


def _check_env_value(var: dict, path: Path, out: _Problems) -> None:
    """A variable sets a value or one source in valueFrom."""
    value_from = var.get("valueFrom")
    if var.get("value") not in (None, "") and value_from is not None:
        out.add(path, "sets both value and valueFrom", "keep only one")
    if isinstance(value_from, dict):
        _check_env_source(value_from, path + ("valueFrom",), out)


def _check_env_source(value_from: dict, path: Path, out: _Problems) -> None:
    sources = [k for k in _ENV_SOURCES if value_from.get(k) is not None]
    if len(sources) != 1:
        out.add(path, f"sets {len(sources)} sources", f"set exactly one of {', '.join(_ENV_SOURCES)}")


# --- pods -------------------------------------------------------------------------------

_JOB_POD_RESTART_POLICIES = ("Never", "OnFailure")


def _check_pod_spec(pod: dict, path: Path, out: _Problems) -> None:
    if "containers" in pod and not _list(pod.get("containers")):
        out.add(path + ("containers",), "must contain at least one container", "add the container to run")
    _check_job_pod_restart_policy(pod.get("restartPolicy"), path + ("restartPolicy",), out)
    volumes = _check_pod_volumes(pod, path, out)
    names: dict[str, Path] = {}
    for section in ("initContainers", "containers"):
        for i, container in enumerate(_list(pod.get(section))):
            _check_container(_dict(container), section, path + (section, i), volumes, names, out)
    _check_resources(pod.get("resources"), path + ("resources",), out)


def _check_job_pod_restart_policy(restart: Any, path: Path, out: _Problems) -> None:
    if isinstance(restart, str) and restart not in _JOB_POD_RESTART_POLICIES:
        out.add(path, f"{restart} is not allowed in a Job's pod template", "use Never or OnFailure (or leave it unset)")


def _unique_names(items: list, path: Path, what: str, verb: str, fix: str, out: _Problems) -> dict[str, int]:
    """Check the names of ``items`` at ``path`` (``volumes``, ``replicatedJobs``): DNS labels, each given once.
    Returns the names, each with the index of its first item."""
    names: dict[str, int] = {}
    for i, item in enumerate(items):
        name = _dict(item).get("name")
        if not isinstance(name, str):
            continue
        _check_dns_label(name, path + (i, "name"), out, what=f"{what} name")
        if name in names:
            out.add(path + (i, "name"), f"{what} {name} is already {verb} at {path[-1]}[{names[name]}]", fix)
        names.setdefault(name, i)
    return names


def _check_pod_volumes(pod: dict, path: Path, out: _Problems) -> dict[str, int]:
    """Check the pod's volumes; their names, each with the index of its first declaration."""
    items = _list(pod.get("volumes"))
    volumes = _unique_names(items, path + ("volumes",), "volume", "declared", "rename or remove one of them", out)
    for i, volume in enumerate(items):
        size = _dict(_dict(volume).get("emptyDir")).get("sizeLimit")
        if size is not None and isinstance(_dict(volume).get("name"), str):
            _check_quantity(size, path + ("volumes", i, "emptyDir", "sizeLimit"), out)
    return volumes


def _check_container(
    container: dict, section: str, where: Path, volumes: dict[str, int], names: dict[str, Path], out: _Problems
) -> None:
    """One container or init container; ``names``: the container names seen so far (this one is added)."""
    name = container.get("name")
    if isinstance(name, str):
        _check_container_name(name, where + ("name",), names, out)
        names.setdefault(name, where)
    _check_container_restart_policy(container.get("restartPolicy"), section, where + ("restartPolicy",), out)
    _check_env(container.get("env"), where + ("env",), out)
    _check_resources(container.get("resources"), where + ("resources",), out)
    _check_volume_mounts(container, where, volumes, out)


def _check_container_name(name: str, path: Path, names: dict[str, Path], out: _Problems) -> None:
    """A DNS label that no other container or init container of the pod has (``names``: theirs so far)."""
    _check_dns_label(name, path, out, what="container name")
    if name in names:
        out.add(
            path,
            f"container name {name} is already used at {_fmt_path(names[name])}",
            "give every container and init container its own name",
        )


def _check_container_restart_policy(policy: Any, section: str, path: Path, out: _Problems) -> None:
    """Only init containers take a restartPolicy, and only Always (a native sidecar)."""
    if section == "containers" and policy is not None:
        out.add(
            path,
            "only init containers take a restartPolicy (native sidecars)",
            "move this container to initContainers with restartPolicy: Always",
        )
    elif section == "initContainers" and policy not in (None, "Always"):
        out.add(path, f"{_short(policy)} is not allowed", "use Always (a native sidecar) or leave it unset")


def _check_volume_mounts(container: dict, where: Path, volumes: dict[str, int], out: _Problems) -> None:
    mount_paths: dict[str, int] = {}
    for j, mount in enumerate(_list(container.get("volumeMounts"))):
        ref, mount_path = _dict(mount).get("name"), _dict(mount).get("mountPath")
        if isinstance(ref, str):
            _check_mounted_volume(ref, volumes, where + ("volumeMounts", j, "name"), out)
        if isinstance(mount_path, str):
            if mount_path in mount_paths:
                out.add(
                    where + ("volumeMounts", j, "mountPath"),
                    f"{mount_path} is already mounted at volumeMounts[{mount_paths[mount_path]}]",
                    "mount each path once",
                )
            mount_paths.setdefault(mount_path, j)


def _check_mounted_volume(ref: str, volumes: dict[str, int], path: Path, out: _Problems) -> None:
    """A mount names one of the pod's ``volumes``."""
    if ref not in volumes:
        match = _close_match(ref, list(volumes))
        out.add(
            path,
            f"no volume named {ref} in the pod's volumes",
            f"did you mean {match}?" if match else "declare it under the pod's volumes",
        )


# --- the schema layer: the compiled CRD and core schemas (schemas.json) ---------------------

#: Fields removed from the API (path from the object's root -> what to use instead).
_REMOVED_FIELDS: dict[tuple[str, ...], str] = {
    (
        "spec",
        "mlPolicy",
        "torch",
        "numProcPerNode",
    ): "removed in Trainer v2.2; set spec.trainer.numProcPerNode on the TrainJob",
    ("spec", "podTemplateOverrides"): "removed in Trainer v2.2; use spec.runtimePatches",
    ("spec", "podSpecOverrides"): "removed in Trainer v2.1; use spec.runtimePatches",
}

_EXPECTED = {
    "object": "an object",
    "array": "a list",
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "a boolean (true/false)",
    "quantity": "a quantity (number or string)",
    "int-or-string": "a value (integer or string)",
}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


#: Strict semantics, as the models' Strict types and the API server's decoder: no "8" for 8, no 8.0 for
#: an integer, no 1 for true.
_TYPE_CHECKS: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": _is_int,
    "number": _is_number,
    "boolean": lambda v: isinstance(v, bool),
    "quantity": lambda v: isinstance(v, str) or _is_number(v),
    "int-or-string": lambda v: isinstance(v, str) or _is_int(v),
}


def _integer_fix(value: Any, path: Path) -> str:
    if not isinstance(value, str):
        return ""
    return f"write {value} without quotes" if value.strip().lstrip("-").isdigit() else "set a whole number, e.g. 8"


def _string_fix(value: Any, path: Path) -> str:
    return f'quote it: "{json.dumps(value)}"' if isinstance(value, (int, float)) else ""


def _list_fix(value: Any, path: Path) -> str:
    if not isinstance(value, str):
        return ""
    if path and path[-1] in ("command", "args"):
        return 'write one item per argument, e.g. ["bash", "-c", "..."]'
    return f"write a list, e.g. [{_short(value)}]"


#: How to fix a value of the wrong type, by the schema type expected: the mistakes YAML makes easy (a quoted
#: number, an unquoted string, a command line as one string). Other types get no hint.
_TYPE_FIXES: dict[str, Callable[[Any, Path], str]] = {
    "integer": _integer_fix,
    "string": _string_fix,
    "array": _list_fix,
}


def _type_problem(kind: str, value: Any, path: Path, out: _Problems) -> None:
    fixer = _TYPE_FIXES.get(kind)
    fix = fixer(value, path) if fixer else ""
    out.add(path, f"expected {_EXPECTED[kind]}, got {_json_type(value)} {_short(value)}", fix)


@lru_cache(maxsize=None)
def _pattern(pattern: str) -> Optional[re.Pattern]:
    try:
        return re.compile(pattern)
    except re.error:  # a Go (RE2) construct Python lacks: the API server checks it
        return None


def _enum_list(values: Sequence[Any]) -> str:
    return ", ".join(v if isinstance(v, str) and v else json.dumps(v) for v in values)


def _check_constraints(value: Any, node: dict, path: Path, out: _Problems) -> None:
    """The CRDs' value rules, reported unless a rule of this module already reported the field (``soft``)."""
    _check_soft_enum(value, node, path, out)
    if _is_int(value) and node.get("format") in C.INT_FORMAT_RANGES:
        _check_int_format(value, node["format"], path, out)
    if _is_number(value):
        _check_number_constraints(value, node, path, out)
    elif isinstance(value, list):
        _check_list_constraints(value, node, path, out)
    elif isinstance(value, str):
        _check_string_constraints(value, node, path, out)


def _check_soft_enum(value: Any, node: dict, path: Path, out: _Problems) -> None:
    """The values the kubeflow_trainer_api models allow, where the CRD has no enum."""
    if "enum_soft" in node and value not in node["enum_soft"]:
        out.soft(path, f"{_short(value)} is not allowed", f"use one of {_enum_list(node['enum_soft'])}")


def _check_int_format(value: int, fmt: str, path: Path, out: _Problems) -> None:
    """An integer fits its format (int32, int64): the API server cannot store it otherwise."""
    low, high = C.INT_FORMAT_RANGES[fmt]
    if not low <= value <= high:
        out.add(
            path,
            f"{value} does not fit {fmt} ({low} to {high})",
            f"set at most {high}" if value > high else f"set at least {low}",
        )


def _check_number_constraints(value: Any, node: dict, path: Path, out: _Problems) -> None:
    if "minimum" in node and value < node["minimum"]:
        out.soft(path, f"{value} is less than {node['minimum']}", f"set at least {node['minimum']}")
    if "maximum" in node and value > node["maximum"]:
        out.soft(path, f"{value} is more than {node['maximum']}", f"set at most {node['maximum']}")


def _check_list_constraints(value: list, node: dict, path: Path, out: _Problems) -> None:
    if "maxItems" in node and len(value) > node["maxItems"]:
        out.soft(path, f"{len(value)} items, over the CRD limit of {node['maxItems']}", "remove some")
    if "minItems" in node and len(value) < node["minItems"]:
        out.soft(path, f"{len(value)} items; the CRD requires at least {node['minItems']}", "add items")


def _check_string_constraints(value: str, node: dict, path: Path, out: _Problems) -> None:
    if "maxLength" in node and len(value) > node["maxLength"]:
        out.soft(path, f"{len(value)} characters, over the CRD limit of {node['maxLength']}", "shorten it")
    if "minLength" in node and len(value) < node["minLength"]:
        out.soft(
            path,
            "must not be empty"
            if node["minLength"] == 1
            else f"shorter than the {node['minLength']} characters the CRD requires",
            "set a value",
        )
    _check_pattern(value, node, path, out)


def _check_pattern(value: str, node: dict, path: Path, out: _Problems) -> None:
    compiled = _pattern(node["pattern"]) if "pattern" in node else None
    if compiled is None or compiled.search(value):
        return
    if node.get("type") == "quantity":
        out.soft(path, f"{_short(value)} is not a Kubernetes quantity", _QUANTITY_FIX)
    else:
        out.soft(path, f"{_short(value)} does not match the CRD's pattern {node['pattern']}", "fix the value")


def _walk(value: Any, index: int, path: Path, out: _Problems, unknown: str, core: bool = False) -> None:
    """Check ``value`` against schema node ``index``: type, enum, the CRD's value rules, then each field
    (unknown ones with a "did you mean", required ones) or item. Every problem is found, each at its full
    path. ``unknown``: what an unknown field is called. ``core``: a core schema, whose map values may be
    null (the Trainer models refuse them)."""
    node = schemas.nodes()[index]
    if not _has_type_and_enum(value, node, path, out):
        return
    _check_constraints(value, node, path, out)
    if isinstance(value, dict):
        _walk_fields(value, node, path, out, unknown, core)
        _check_required(value, node, path, out)
    elif isinstance(value, list) and "items" in node:
        for i, item in enumerate(value):
            _walk(item, node["items"], path + (i,), out, unknown, core)


def _has_type_and_enum(value: Any, node: dict, path: Path, out: _Problems) -> bool:
    """Whether ``value`` has the node's type and is one of its enum values; else reports why."""
    kind = node.get("type")
    if kind is not None and not _TYPE_CHECKS[kind](value):
        _type_problem(kind, value, path, out)
        return False
    enum = node.get("enum")
    if enum is not None and value not in enum:
        out.add(path, f"{_short(value)} must be one of enum values ({_enum_list(enum)})")
        return False
    return True


def _walk_fields(value: dict, node: dict, path: Path, out: _Problems, unknown: str, core: bool) -> None:
    """Each field of an object: unknown ones reported (unless the node is open), known ones walked."""
    properties: dict[str, int] = node.get("properties", {})
    for key, item in value.items():
        child = properties.get(key, node.get("additional"))
        if child is not None:
            if _field_is_checked(item, key in properties, core):
                _walk(item, child, path + (key,), out, unknown, core)
        elif not node.get("open"):
            out.add(path + (key,), unknown, _unknown_field_fix(path, key, list(properties)))


def _field_is_checked(item: Any, declared: bool, core: bool) -> bool:
    """Whether a field's value is checked: a null field is "not set", but a null map value of a Trainer
    schema is checked (and refused, as the Trainer models refuse it)."""
    return item is not None or (not declared and not core)


def _unknown_field_fix(path: Path, key: str, known: list[str]) -> str:
    """What to do about an unknown field: what replaced it, if the API removed it, else a "did you mean"."""
    removed = _REMOVED_FIELDS.get(tuple(p for p in path if isinstance(p, str)) + (key,))
    return removed or _did_you_mean(key, known)


def _check_required(value: dict, node: dict, path: Path, out: _Problems) -> None:
    for key in node.get("required", ()):
        if value.get(key) is None:
            out.add(path + (key,), "required field is missing", f"set {key}")


def _check_model(obj: dict, kind: str, out: _Problems) -> None:
    """``obj`` against its Trainer v2.3 CRD schema (metadata: the API server's ObjectMeta)."""
    _walk(obj, schemas.root(kind), (), out, "unknown field")


def _check_kube(doc: dict, kind: str, base: Path, out: _Problems, skip: set[Path]) -> None:
    """Validate ``doc`` against the strict core schema of ``kind`` for ``KUBERNETES_VERSION``; report
    under ``base`` unless the path is in ``skip``."""
    problems = _Problems()
    _walk(
        doc,
        schemas.root(f"core/{kind}"),
        base,
        problems,
        f"unknown field in Kubernetes {C.KUBERNETES_VERSION}",
        core=True,
    )
    out.items.extend(_not_at(problems.items, skip))
    out.fallbacks.extend(_not_at(problems.fallbacks, skip))


# --- kinds ------------------------------------------------------------------------------


def _check_trainjob(obj: dict, out: _Problems) -> None:
    _check_model(obj, C.TRAINJOB_KIND, out)
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        out.add(("spec",), "required object is missing", "set spec.runtimeRef and spec.trainer")
        return
    path: Path = ("spec",)
    _check_runtime_ref(_dict(spec.get("runtimeRef")), path + ("runtimeRef",), out)
    _check_trainer(_dict(spec.get("trainer")), path + ("trainer",), out)
    _check_at_least_one(
        spec.get("activeDeadlineSeconds"),
        path + ("activeDeadlineSeconds",),
        out,
        "set a positive number of seconds or leave it unset",
    )
    _check_managed_by(spec.get("managedBy"), path + ("managedBy",), out)
    for step in ("dataset", "model"):
        _check_initializer(_dict(_dict(spec.get("initializer")).get(step)), path + ("initializer", step), out)
    _check_runtime_patches(spec.get("runtimePatches"), path + ("runtimePatches",), out)
    _check_pod_names(obj, None, out)


def _check_at_least_one(value: Any, path: Path, out: _Problems, fix: str = "set at least 1") -> None:
    """Counts (nodes, processes, seconds) that the CRDs require to be at least 1."""
    if _is_int(value) and value < 1:
        out.add(path, f"{value} is less than 1", fix)


def _check_managed_by(managed_by: Any, path: Path, out: _Problems) -> None:
    allowed = C.TRAINJOB_MANAGED_BY_VALUES
    if isinstance(managed_by, str) and managed_by not in allowed:
        out.add(
            path, f"{_short(managed_by)} is not allowed by the CRD", f"use {' or '.join(allowed)}, or leave it unset"
        )


def _check_runtime_ref_name(name: Any, path: Path, out: _Problems) -> None:
    if name == "":
        out.add(path, "must not be empty", "name the runtime to run, e.g. torch-distributed")
    elif isinstance(name, str):
        _check_subdomain(name, path, out)


def _check_runtime_ref(ref: dict, path: Path, out: _Problems) -> None:
    _check_runtime_ref_name(ref.get("name"), path + ("name",), out)
    kind, group = ref.get("kind"), ref.get("apiGroup")
    if isinstance(kind, str) and kind not in (C.CLUSTER_RUNTIME_KIND, C.RUNTIME_KIND):
        out.add(
            path + ("kind",),
            f"{_short(kind)} is not a runtime kind",
            f"use {C.CLUSTER_RUNTIME_KIND} or {C.RUNTIME_KIND}",
        )
    if isinstance(group, str) and group != C.TRAINER_GROUP:
        out.add(
            path + ("apiGroup",),
            f"{_short(group)} is not the Trainer API group",
            f"use {C.TRAINER_GROUP} or leave it unset",
        )


def _check_trainer(trainer: dict, tpath: Path, out: _Problems) -> None:
    for field in ("numNodes", "numProcPerNode"):
        _check_at_least_one(trainer.get(field), tpath + (field,), out)
    for field, limit in (
        ("command", C.TRAINER_ARGV_MAX_ITEMS),
        ("args", C.TRAINER_ARGV_MAX_ITEMS),
        ("env", C.TRAINER_ENV_MAX_ITEMS),
    ):
        if len(_list(trainer.get(field))) > limit:
            out.add(
                tpath + (field,),
                f"{len(trainer[field])} items, over the CRD limit of {limit}",
                "move the rest into a script",
            )
    _check_env(trainer.get("env"), tpath + ("env",), out, trainer_env=True)
    _check_resources(trainer.get("resourcesPerNode"), tpath + ("resourcesPerNode",), out, partial=True)


def _check_initializer(init: dict, ipath: Path, out: _Problems) -> None:
    uri = init.get("storageUri")
    if isinstance(uri, str) and uri and not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*://.+", uri):
        out.add(ipath + ("storageUri",), f"{_short(uri)} is not a URI", "use scheme://..., e.g. hf://org/model")
    _check_env(init.get("env"), ipath + ("env",), out)


_INITIALIZER_CONTAINERS = ("dataset-initializer", "model-initializer")
#: From a replicated job to its pod spec.
_POD_SPEC_PATH: tuple[str, ...] = ("template", "spec", "template", "spec")


def _check_runtime_patches(patches: Any, path: Path, out: _Problems) -> None:
    patches = _list(patches)
    if len(patches) > 16:
        out.add(path, f"{len(patches)} patches, over the CRD limit of 16", "merge patches that share a manager")
    managers: dict[str, int] = {}
    for i, patch in enumerate(patches):
        manager = _dict(patch).get("manager")
        if isinstance(manager, str):
            _check_patch_manager(manager, path + (i, "manager"), out)
            if manager in managers:
                out.add(
                    path + (i, "manager"),
                    f"manager {manager} is already used by runtimePatches[{managers[manager]}]",
                    "merge the two patches",
                )
            managers.setdefault(manager, i)
        _check_patch_env(_dict(patch), path + (i,), out)


def _check_patch_manager(manager: str, path: Path, out: _Problems) -> None:
    prefix, slash, rest = manager.partition("/")
    if not slash or not rest or not naming.is_rfc1123_subdomain(prefix):
        out.add(path, f"{_short(manager)} is not a domain-prefixed path", "use e.g. example.com/my-tool")


def _patch_containers(patch: dict, path: Path) -> Iterator[tuple[Path, Any]]:
    """The init containers and containers of a runtime patch's replicated jobs, each with its path."""
    jobs = _dict(_dict(patch.get("trainingRuntimeSpec")).get("template")).get("spec")
    for section in ("initContainers", "containers"):
        yield from _find(
            jobs,
            ("replicatedJobs", "*", *_POD_SPEC_PATH, section, "*"),
            path + ("trainingRuntimeSpec", "template", "spec"),
        )


def _check_patch_env(patch: dict, path: Path, out: _Problems) -> None:
    """The Trainer webhook refuses env on the node and initializer containers in a patch: their env comes
    from the TrainJob's spec."""
    for cpath, container in _patch_containers(patch, path):
        name = _dict(container).get("name")
        if name in (C.TRAINER_NODE, *_INITIALIZER_CONTAINERS) and _dict(container).get("env") is not None:
            fix = "use spec.trainer.env" if name == C.TRAINER_NODE else "use spec.initializer env"
            out.add(cpath + ("env",), f"the Trainer webhook rejects env on the {name} container in runtimePatches", fix)


#: Enums the runtime CRD enforces and the models do not (paths under the runtime's spec).
_RUNTIME_ENUMS: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    (("mlPolicy", "mpi", "mpiImplementation"), ("OpenMPI", "")),
    (("podGroupPolicy", "volcano", "networkTopology", "mode"), ("hard", "soft")),
    (
        ("template", "spec", "failurePolicy", "restartStrategy"),
        ("Recreate", "BlockingRecreate", "InPlaceRestart"),
    ),
    (
        ("template", "spec", "failurePolicy", "rules", "*", "action"),
        (
            "FailJobSet",
            "RestartJobSet",
            "RestartJobSetAndIgnoreMaxRestarts",
            "RestartJob",
            "RestartJobAndIgnoreMaxRestarts",
        ),
    ),
    (("template", "spec", "replicatedJobs", "*", "dependsOn", "*", "status"), ("Ready", "Complete")),
    (("template", "spec", "startupPolicy", "startupPolicyOrder"), ("AnyOrder", "InOrder")),
    (("template", "spec", "successPolicy", "operator"), ("All", "Any")),
    (
        ("template", "spec", "volumeClaimPolicies", "*", "retentionPolicy", "whenDeleted"),
        ("Delete", "Retain"),
    ),
)
#: Places where JobSet expects the name of one of the runtime's replicated jobs.
_RJOB_REFERENCES = (
    ("template", "spec", "failurePolicy", "rules", "*", "targetReplicatedJobs", "*"),
    ("template", "spec", "successPolicy", "targetReplicatedJobs", "*"),
    ("template", "spec", "replicatedJobs", "*", "dependsOn", "*", "name"),
)
_POLICIES = ("torch", "mpi", "jax", "xgboost", "flux")


def _check_runtime(obj: dict, out: _Problems) -> None:
    kind = obj["kind"]
    _check_model(obj, kind, out)
    schema_paths = out.paths()
    _check_framework_label(_dict(_dict(obj.get("metadata")).get("labels")), out)
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        out.add(("spec",), "required object is missing", "set spec.mlPolicy and spec.template")
        return
    path: Path = ("spec",)
    _check_runtime_enums(spec, path, out)
    _check_ml_policy(spec.get("mlPolicy"), path + ("mlPolicy",), out)

    jobset = _dict(_dict(spec.get("template")).get("spec"))
    jpath = path + ("template", "spec")
    rjobs = _list(jobset.get("replicatedJobs"))
    _check_jobset_settings(jobset, rjobs, jpath, out)
    _check_replicated_job_names(spec, rjobs, path, out)
    _check_replicated_jobs(rjobs, jpath + ("replicatedJobs",), out, schema_paths)
    _check_failure_policies(jobset, rjobs, jpath, out)
    _check_env_injection(_dict(spec.get("mlPolicy")), rjobs, path + ("mlPolicy",), out)


def _check_framework_label(labels: dict, out: _Problems) -> None:
    if C.FRAMEWORK_LABEL not in labels:
        out.add(
            ("metadata", "labels", C.FRAMEWORK_LABEL),
            "label is missing; the Kubeflow SDK refuses runtimes without it",
            f"add {C.FRAMEWORK_LABEL}: torch",
        )


def _check_runtime_enums(spec: dict, path: Path, out: _Problems) -> None:
    for pattern, allowed in _RUNTIME_ENUMS:
        for where, value in _find(spec, pattern, path):
            if isinstance(value, str) and value not in allowed:
                out.add(where, f"{_short(value)} is not allowed", "use one of " + _enum_list(allowed))


def _check_jobset_settings(jobset: dict, rjobs: list, jpath: Path, out: _Problems) -> None:
    """The runtime's JobSet settings the webhook refuses: no jobs, two startup orders, a TTL out of range,
    a namespace in a claim template."""
    if not rjobs:
        out.add(
            jpath + ("replicatedJobs",),
            "must list at least one replicated job",
            "add the `node` job (see the torch-distributed runtime)",
        )
    _check_startup_order(jobset, rjobs, jpath, out)
    _check_jobset_ttl(jobset.get("ttlSecondsAfterFinished"), jpath + ("ttlSecondsAfterFinished",), out)
    _check_claim_template_namespaces(jobset, jpath, out)


def _check_startup_order(jobset: dict, rjobs: list, jpath: Path, out: _Problems) -> None:
    in_order = _dict(jobset.get("startupPolicy")).get("startupPolicyOrder") == "InOrder"
    if in_order and any(_dict(j).get("dependsOn") for j in rjobs):
        out.add(
            jpath + ("startupPolicy",),
            "startupPolicyOrder InOrder and replicatedJobs[].dependsOn are mutually exclusive",
            "use one of them",
        )


def _check_jobset_ttl(ttl: Any, path: Path, out: _Problems) -> None:
    if _is_int(ttl) and not 0 <= ttl <= C.JOBSET_TTL_MAX:
        out.add(
            path,
            f"{ttl} is out of range (JobSet: 0 to {C.JOBSET_TTL_MAX} seconds)",
            "give the seconds after which JobSet deletes a finished JobSet and its pods, e.g. 86400, or remove it",
        )


def _check_claim_template_namespaces(jobset: dict, jpath: Path, out: _Problems) -> None:
    for where, template in _find(jobset, ("volumeClaimPolicies", "*", "templates", "*"), jpath):
        if _dict(_dict(template).get("metadata")).get("namespace"):
            out.add(where + ("metadata", "namespace"), "volumeClaimPolicies templates take no namespace", "remove it")


def _check_replicated_job_names(spec: dict, rjobs: list, path: Path, out: _Problems) -> None:
    """The replicated jobs' names, each once, and every reference to one (dependsOn, envInjection...)."""
    names = _unique_names(
        rjobs,
        path + ("template", "spec", "replicatedJobs"),
        "replicated job",
        "defined",
        "give each replicated job its own name",
        out,
    )
    for pattern in _RJOB_REFERENCES:
        for where, ref in _find(spec, pattern, path):
            if isinstance(ref, str) and ref not in names:
                out.add(
                    where,
                    f"no replicated job named {ref}",
                    _did_you_mean(ref, list(names), known="replicated jobs"),
                )


#: JobSet v0.12 failurePolicy rule names (jobset_types.go).
_FAILURE_RULE_NAME = re.compile(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?")  # with fullmatch
#: The Job API's podFailurePolicy exit-code operators (batch/v1; the schema checks the actions).
_EXIT_CODE_OPERATORS = ("In", "NotIn")


def _check_failure_policies(jobset: dict, rjobs: list, jpath: Path, out: _Problems) -> None:
    """What the JobSet webhook and the Job API refuse in failure rules (beyond the schema)."""
    _check_failure_rule_names(
        _list(_dict(jobset.get("failurePolicy")).get("rules")), jpath + ("failurePolicy", "rules"), out
    )
    for r, rjob in enumerate(rjobs):
        _check_pod_failure_policy(rjob, jpath + ("replicatedJobs", r), out)


def _check_failure_rule_names(rules: list, path: Path, out: _Problems) -> None:
    """JobSet's failurePolicy rule names: its pattern, each name once."""
    seen: dict[str, int] = {}
    for i, rule in enumerate(rules):
        name = _dict(rule).get("name")
        if not isinstance(name, str):
            continue
        if not _FAILURE_RULE_NAME.fullmatch(name):
            out.add(
                path + (i, "name"),
                f"{_short(name)} is not a valid rule name (JobSet: ^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$)",
                "start with a letter; use letters, digits, '_', ',' or ':'",
            )
        elif name in seen:
            out.add(
                path + (i, "name"),
                f"rule {name} is already defined at rules[{seen[name]}]",
                "give each rule its own name",
            )
        seen.setdefault(name, i)


def _check_pod_failure_policy(rjob: Any, rpath: Path, out: _Problems) -> None:
    """One replicated job's podFailurePolicy, as the Job API checks it."""
    policy = _dict(_dict(_dict(rjob).get("template")).get("spec")).get("podFailurePolicy")
    if not isinstance(policy, dict):
        return
    ppath = rpath + ("template", "spec", "podFailurePolicy")
    pod_spec = _pod_spec(rjob)
    restart = pod_spec.get("restartPolicy", "OnFailure")
    if restart != "Never":
        out.add(
            rpath + _POD_SPEC_PATH + ("restartPolicy",),
            f"is {_short(restart)} (JobSet's default is OnFailure), but a Job with a podFailurePolicy needs Never",
            "set restartPolicy: Never in the pod template",
        )
    containers = set(_container_names(pod_spec))
    for k, rule in enumerate(_list(policy.get("rules"))):
        _check_pod_failure_rule(_dict(rule), ppath + ("rules", k), containers, out)


def _check_pod_failure_rule(rule: dict, path: Path, containers: set, out: _Problems) -> None:
    if ("onExitCodes" in rule) == ("onPodConditions" in rule):
        out.add(path, "must set exactly one of onExitCodes and onPodConditions", "split it into two rules")
    codes = _dict(rule.get("onExitCodes"))
    if codes:
        _check_exit_codes(codes, path + ("onExitCodes",), containers, out)


def _check_exit_codes(codes: dict, cpath: Path, containers: set, out: _Problems) -> None:
    if codes.get("operator") not in _EXIT_CODE_OPERATORS:
        out.add(cpath + ("operator",), f"{_short(codes.get('operator'))} is not allowed", "use In or NotIn")
    _check_exit_code_container(codes.get("containerName"), containers, cpath + ("containerName",), out)
    _check_exit_code_values(_list(codes.get("values")), codes.get("operator"), cpath + ("values",), out)


def _check_exit_code_container(container: Any, containers: set, path: Path, out: _Problems) -> None:
    """A rule's containerName, if set, names a container or init container of the pod template."""
    if container is not None and container not in containers:
        out.add(
            path,
            f"no container named {_short(container)} in the pod template",
            _did_you_mean(str(container), sorted(n for n in containers if n), known="containers"),
        )


def _check_exit_code_values(values: list, operator: Any, path: Path, out: _Problems) -> None:
    """The Job API's rules for onExitCodes.values (the schema reports values that are not integers)."""
    if not values or len(values) > 255:
        out.add(path, "must list 1 to 255 exit codes", "list the exit codes the rule matches")
        return
    if all(_is_int(v) for v in values):
        _check_integer_exit_codes(values, operator, path, out)


def _check_integer_exit_codes(values: list[int], operator: Any, path: Path, out: _Problems) -> None:
    if operator == "In" and 0 in values:
        out.add(path, "contains 0 with operator In (the Job API refuses it)", "remove 0")
    if values != sorted(set(values)):
        out.add(path, "must be sorted without duplicates (the Job API refuses it)", f"write {sorted(set(values))}")


def _check_ml_policy(policy: Any, path: Path, out: _Problems) -> None:
    if policy is None:
        out.add(
            path,
            "required by the Kubeflow SDK, which refuses runtimes without it",
            "add mlPolicy: {numNodes: 1, torch: {}}",
        )
        return
    policy = _dict(policy)
    chosen = [p for p in _POLICIES if policy.get(p) is not None]
    if len(chosen) > 1:
        out.add(path, f"sets {' and '.join(chosen)}; the CRD allows only one policy", "keep one of them")
    _check_at_least_one(policy.get("numNodes"), path + ("numNodes",), out)
    for name in ("mpi", "flux"):
        _check_at_least_one(_dict(policy.get(name)).get("numProcPerNode"), path + (name, "numProcPerNode"), out)
    _check_settingless_policies(policy, path, out)


def _check_settingless_policies(policy: dict, path: Path, out: _Problems) -> None:
    for name in ("jax", "xgboost"):
        # The CRD declares these as objects without properties: the server prunes every key.
        for key in _dict(policy.get(name)):
            out.add(
                path + (name, key),
                f"unknown field; {name} takes no settings in Trainer v2.3",
                f"use {name}: {{}}",
            )


def _job_labels(rjob: Any) -> dict:
    return _dict(_dict(_dict(_dict(rjob).get("template")).get("metadata")).get("labels"))


def _pod_template(rjob: Any) -> dict:
    return _dict(_dict(_dict(_dict(rjob).get("template")).get("spec")).get("template"))


def _pod_spec(rjob: Any) -> dict:
    return _dict(_pod_template(rjob).get("spec"))


def _container_names(pod_spec: dict) -> list:
    """The names of the pod's containers and init containers (None where a container has none)."""
    return [_dict(c).get("name") for c in _list(pod_spec.get("containers")) + _list(pod_spec.get("initContainers"))]


def _check_replicated_jobs(rjobs: list, path: Path, out: _Problems, schema_paths: set[Path]) -> None:
    """Each replicated job, then the one trainer job among them (labelled as such)."""
    trainer_jobs = [
        i for i, rjob in enumerate(rjobs) if _check_replicated_job(_dict(rjob), path + (i,), out, schema_paths)
    ]
    if trainer_jobs:
        _check_one_trainer_job(trainer_jobs, path, out)
        _check_trainer_job(rjobs[trainer_jobs[0]], path + (trainer_jobs[0],), out)
    elif rjobs:
        _no_trainer_job(rjobs, path, out)


def _check_one_trainer_job(trainer_jobs: list[int], path: Path, out: _Problems) -> None:
    """One replicated job only may be labelled as the trainer: each after the first is reported."""
    for extra in trainer_jobs[1:]:
        out.add(
            path + (extra, "template", "metadata", "labels", C.ANCESTOR_LABEL),
            f"replicatedJobs[{trainer_jobs[0]}] is already the trainer job",
            "label exactly one replicated job as the trainer",
        )


def _check_trainer_job(rjob: dict, rpath: Path, out: _Problems) -> None:
    """The replicated job labelled as the trainer: named ``node``, with a ``node`` container."""
    if rjob.get("name") != C.TRAINER_NODE:
        out.add(
            rpath + ("name",),
            f"the trainer job must be named {C.TRAINER_NODE}: PET_MASTER_ADDR and the SDK's pod selector assume it",
            f"rename it to {C.TRAINER_NODE}",
        )
    containers = _list(_pod_spec(rjob).get("containers"))
    node = _first_with(containers, "name", C.TRAINER_NODE)
    if node is None:
        out.add(
            rpath + _POD_SPEC_PATH + ("containers",),
            f"no container named {C.TRAINER_NODE}; Trainer applies spec.trainer (image, command, env,"
            " resources) to it and the webhook requires it",
            f"name the training container {C.TRAINER_NODE}",
        )
        return
    _check_node_container(node, rpath + _POD_SPEC_PATH + ("containers", containers.index(node)), out)


def _check_replicated_job(rjob: dict, rpath: Path, out: _Problems, schema_paths: set[Path]) -> bool:
    """One replicated job: its replicas, labels, pod spec and Job schema; whether it is the trainer job."""
    template = _dict(rjob.get("template"))
    ancestor = _job_labels(rjob).get(C.ANCESTOR_LABEL)
    replicas = rjob.get("replicas")
    if ancestor is not None and _is_int(replicas) and replicas != 1:
        out.add(
            rpath + ("replicas",),
            f"is {_short(replicas)}, but jobs labelled {C.ANCESTOR_LABEL} must have one replica (Trainer webhook)",
            "set replicas: 1 or leave it unset; scale with numNodes",
        )
    _check_labels_annotations(_dict(template.get("metadata")), rpath + ("template", "metadata"), out)
    _check_labels_annotations(
        _dict(_pod_template(rjob).get("metadata")),
        rpath + ("template", "spec", "template", "metadata"),
        out,
    )
    _check_pod_spec(_pod_spec(rjob), rpath + _POD_SPEC_PATH, out)
    if isinstance(template.get("spec"), dict):
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": _dict(template.get("metadata")),
            "spec": template["spec"],
        }
        _check_kube(job, "Job", rpath + ("template",), out, schema_paths)
    return ancestor == C.ANCESTOR_TRAINER


def _no_trainer_job(rjobs: list, path: Path, out: _Problems) -> None:
    misplaced = any(C.ANCESTOR_LABEL in _dict(_dict(_pod_template(j).get("metadata")).get("labels")) for j in rjobs)
    where = (
        "on the Job template (replicatedJobs[].template.metadata.labels), not the pod template"
        if misplaced
        else "to the job that runs training"
    )
    out.add(
        path,
        f"no replicated job is labelled {C.ANCESTOR_LABEL}: {C.ANCESTOR_TRAINER};"
        " Trainer cannot tell where spec.trainer goes",
        f"add the label {where}",
    )


def _check_node_container(node: dict, npath: Path, out: _Problems) -> None:
    """The trainer job's ``node`` container, as the Kubeflow SDK reads it."""
    if not node.get("image"):
        out.add(
            npath + ("image",),
            f"the {C.TRAINER_NODE} container has no image; the Kubeflow SDK refuses such runtimes",
            "set a default image",
        )
    _check_node_devices(_dict(_dict(node.get("resources")).get("limits")), npath + ("resources", "limits"), out)


def _check_node_devices(limits: dict, path: Path, out: _Problems) -> None:
    """The ``node`` container's limits name a device the Kubeflow SDK knows (get_container_devices): one of
    its keys or a single MIG profile."""
    mig = [k for k in limits if k.startswith(_SDK_MIG_PREFIX)]
    if limits and not mig and not any(k in limits for k in _SDK_DEVICE_KEYS):
        out.add(
            path,
            f"none of {', '.join(_SDK_DEVICE_KEYS)} or {_SDK_MIG_PREFIX}*;"
            " the Kubeflow SDK raises 'Unknown device type' for this runtime",
            "add the GPU count (nvidia.com/gpu) or cpu to the limits",
        )
    elif len(mig) > 1:
        out.add(
            path, f"several MIG types ({', '.join(mig)}); the Kubeflow SDK supports one", "request a single MIG profile"
        )


def _check_env_injection(policy: dict, rjobs: list, path: Path, out: _Problems) -> None:
    targets = _dict(_dict(policy.get("torch")).get("envInjection")).get("targets")
    jobs = {j["name"]: j for j in rjobs if isinstance(j, dict) and isinstance(j.get("name"), str)}
    for i, target in enumerate(_list(targets)):
        _check_injection_target(_dict(target), jobs, path + ("torch", "envInjection", "targets", i), out)


def _check_injection_target(target: dict, jobs: dict[str, dict], tpath: Path, out: _Problems) -> None:
    """One envInjection target: a replicated job of the runtime (``jobs``) and some of its containers."""
    job_name, job = target.get("jobName"), None
    if isinstance(job_name, str):
        job = jobs.get(job_name)
        if job is None:
            out.add(
                tpath + ("jobName",),
                f"no replicated job named {job_name}",
                _did_you_mean(job_name, list(jobs), known="replicated jobs"),
            )
    _check_injection_containers(_list(target.get("containerNames")), job_name, job, tpath + ("containerNames",), out)


def _check_injection_containers(names: list, job_name: Any, job: Optional[dict], path: Path, out: _Problems) -> None:
    """A target's containerNames: never ``node``; containers or init containers of ``job`` when it exists."""
    available = _container_names(_pod_spec(job))
    for j, name in enumerate(names):
        if name == C.TRAINER_NODE:
            out.add(
                path + (j,),
                f"{C.TRAINER_NODE} always gets the PET_* variables and the CRD forbids it here",
                "remove it",
            )
        elif job is not None and isinstance(name, str) and name not in available:
            out.add(
                path + (j,),
                f"job {job_name} has no container or init container named {name}",
                _did_you_mean(name, [n for n in available if isinstance(n, str)], known="containers"),
            )


def _check_data_key(key: str, path: Path, out: _Problems) -> None:
    if not naming.is_config_key(key):
        out.add(
            path,
            f"invalid key {_short(key)}: keys are letters, digits, '-', '_' and '.'"
            f" (no '/', not starting with '..', at most {_DNS_SUBDOMAIN_MAX})",
            "flatten the path, e.g. replace '/' with '__'",
        )


def _decode_base64(value: Any, path: Path, out: _Problems) -> int:
    """Size in bytes of a base64 value, or 0 after reporting it."""
    if not isinstance(value, str):
        return 0
    try:
        # Go's decoder (the API server's) ignores line breaks; Python's strict mode does not.
        return len(base64.b64decode(value.replace("\n", "").replace("\r", ""), validate=True))
    except (binascii.Error, ValueError):
        out.add(path, "not valid base64", "encode the bytes with base64 (or use data/stringData for text)")
        return 0


def _check_size(size: int, path: Path, out: _Problems, what: str) -> None:
    if size > C.CONFIGMAP_MAX_BYTES:
        out.add(
            path,
            f"{what} holds {size} bytes, over the API server's limit of {C.CONFIGMAP_MAX_BYTES} (1 MiB)",
            "split the content over several objects",
        )


def _text_size(value: Any) -> int:
    """Size in bytes of a text value (0 for a value that is no string: the schema reports it)."""
    return len(value.encode()) if isinstance(value, str) else 0


def _check_configmap(obj: dict, out: _Problems) -> None:
    _check_kube(obj, "ConfigMap", (), out, out.paths())
    data, binary = _dict(obj.get("data")), _dict(obj.get("binaryData"))
    size = _check_text_data(data, out) + _check_binary_data(binary, data, out)
    _check_size(size, ("data",) if data else ("binaryData",), out, "the ConfigMap")


def _check_text_data(data: dict, out: _Problems) -> int:
    """Check the keys of a ConfigMap's data; the size of its values."""
    for key in data:
        _check_data_key(key, ("data", key), out)
    return sum(_text_size(value) for value in data.values())


def _check_binary_data(binary: dict, data: dict, out: _Problems) -> int:
    """Check the keys and values of a ConfigMap's binaryData (no key also in ``data``); the size of its values."""
    size = 0
    for key, value in binary.items():
        _check_data_key(key, ("binaryData", key), out)
        if key in data:
            out.add(("binaryData", key), "key is also in data", "keep each key in one of data and binaryData")
        size += _decode_base64(value, ("binaryData", key), out)
    return size


#: Keys each built-in Secret type requires (k8s.io/kubernetes pkg/apis/core/validation).
_SECRET_TYPES: dict[str, tuple[str, ...]] = {
    "Opaque": (),
    "kubernetes.io/service-account-token": (),
    "kubernetes.io/dockercfg": (".dockercfg",),
    "kubernetes.io/dockerconfigjson": (".dockerconfigjson",),
    "kubernetes.io/basic-auth": (),
    "kubernetes.io/ssh-auth": ("ssh-privatekey",),
    "kubernetes.io/tls": ("tls.crt", "tls.key"),
    "bootstrap.kubernetes.io/token": (),
}


def _check_secret(obj: dict, out: _Problems) -> None:
    _check_kube(obj, "Secret", (), out, out.paths())
    sizes = _check_secret_data(_dict(obj.get("data")), _dict(obj.get("stringData")), out)
    kind = obj.get("type")
    _check_secret_type(kind, out)
    for key in _SECRET_TYPES.get(kind if isinstance(kind, str) else "Opaque", ()):
        if key not in sizes:
            out.add(("data", key), f"a {kind} Secret requires this key", f"add data[{key!r}]")


def _check_secret_data(data: dict, string_data: dict, out: _Problems) -> dict[str, int]:
    """Check the keys of data and stringData and their total size; the size of each key's value."""
    sizes: dict[str, int] = {}
    for key, value in data.items():
        _check_data_key(key, ("data", key), out)
        sizes[key] = _decode_base64(value, ("data", key), out)
    for key, value in string_data.items():
        _check_data_key(key, ("stringData", key), out)
        sizes[key] = _text_size(value)  # stringData wins on merge
    _check_size(sum(sizes.values()), ("data",) if data else ("stringData",), out, "the Secret")
    return sizes


def _check_secret_type(kind: Any, out: _Problems) -> None:
    """An unknown type is a custom one (allowed); one close to a built-in type is a typo."""
    if not isinstance(kind, str) or kind in _SECRET_TYPES:
        return
    meant = _meant_secret_type(kind)
    if meant:
        out.add(("type",), f"{_short(kind)} is not a built-in Secret type", f"did you mean {meant}?")


def _meant_secret_type(kind: str) -> Optional[str]:
    close = difflib.get_close_matches(kind, list(_SECRET_TYPES), n=1, cutoff=0.8)
    if close:
        return close[0]
    return kind.title() if kind.lower() in {t.lower() for t in _SECRET_TYPES} else None


_ACCESS_MODES = ("ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod")


def _check_pvc(obj: dict, out: _Problems) -> None:
    _check_kube(obj, "PersistentVolumeClaim", (), out, out.paths())
    schema_paths = out.paths()
    spec = _dict(obj.get("spec"))
    _check_access_modes(_list(spec.get("accessModes")), out)
    if spec.get("volumeMode") not in (None, "Filesystem", "Block"):
        out.add(
            ("spec", "volumeMode"),
            f"{_short(spec['volumeMode'])} is not a volume mode",
            "use Filesystem or Block",
        )
    resources = _dict(spec.get("resources"))
    _check_storage_requested(resources, schema_paths, out)
    _check_pvc_quantities(resources, schema_paths, out)


_STORAGE_REQUEST: Path = ("spec", "resources", "requests", "storage")


def _check_storage_requested(resources: dict, schema_paths: set[Path], out: _Problems) -> None:
    # The API server requires the storage request even for a claim bound by volumeName.
    storage = _dict(resources.get("requests")).get("storage")
    if storage is None and _STORAGE_REQUEST not in schema_paths:
        out.add(
            _STORAGE_REQUEST,
            "required: the API server rejects a claim without a storage request",
            'set e.g. "100Gi"',
        )


def _check_pvc_quantities(resources: dict, schema_paths: set[Path], out: _Problems) -> None:
    """The claim's requests and limits (the schema's type problems aside); the storage request above zero."""
    for section in ("requests", "limits"):
        for name, value in _dict(resources.get(section)).items():
            where = ("spec", "resources", section, name)
            if where not in schema_paths and _check_quantity(value, where, out) == 0 and where == _STORAGE_REQUEST:
                out.add(_STORAGE_REQUEST, "must be greater than zero", 'set e.g. "100Gi"')


def _check_access_modes(modes: list, out: _Problems) -> None:
    if not modes:
        out.add(("spec", "accessModes"), "at least one access mode is required", "set e.g. [ReadWriteOnce]")
    for i, mode in enumerate(modes):
        if isinstance(mode, str) and mode not in _ACCESS_MODES:
            out.add(
                ("spec", "accessModes", i),
                f"{_short(mode)} is not an access mode",
                "use one of " + ", ".join(_ACCESS_MODES),
            )
    _check_read_write_once_pod(modes, out)


def _check_read_write_once_pod(modes: list, out: _Problems) -> None:
    if "ReadWriteOncePod" in modes and len(modes) > modes.count("ReadWriteOncePod"):
        out.add(
            ("spec", "accessModes"),
            "ReadWriteOncePod cannot be combined with other access modes",
            "keep only ReadWriteOncePod",
        )


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


# --- an admin's runtime and our runtime patch (runtime_name) ------------------------------------

#: The executor field behind each part of our runtime patch's pod (build/render.existing_runtime_pod).
_PATCH_FIELDS = {
    "tolerations": "tolerations",
    "nodeSelector": "node_selector",
    "serviceAccountName": "service_account",
    "terminationGracePeriodSeconds": "termination_grace_period_seconds",
    "labels": "pod_labels",
    "annotations": "pod_annotations",
}
_SECURITY_FIELDS = {"runAsUser": "run_as_user", "fsGroup": "fs_group"}


def _volume_field(name: str) -> str:
    """The executor field behind a volume of our patch, by the name render.runtime_volumes gives it."""
    for prefix, fname in (("dshm", "shm_size"), ("pvc-", "pvc_mounts"), ("secret-", "secret_mounts")):
        if name.startswith(prefix):
            return fname
    return "workspace_mount_path (the task's files)"


def runtime_patch_conflicts(trainjob: dict, runtime: dict) -> list[str]:
    """What our runtime patch would replace in an admin's ``runtime`` (``runtime_name``), or cannot reach:
    Trainer merges the patch over the runtime (a strategic merge: a toleration list is replaced whole, a
    node selector key, a volume name or a mount path overwritten), so each is refused, naming the executor
    field and the runtime's value. A patch that only adds passes."""
    ours = _first_with(_list(_dict(trainjob.get("spec")).get("runtimePatches")), "manager", PATCH_MANAGER)
    if ours is None:
        return []
    name = _dict(runtime.get("metadata")).get("name")
    rjobs = _list(_dict(_dict(_dict(runtime.get("spec")).get("template")).get("spec")).get("replicatedJobs"))
    admin_job = _first_with(rjobs, "name", C.TRAINER_NODE)
    if admin_job is None:
        names = ", ".join(str(_dict(j).get("name")) for j in rjobs) or "none"
        return [
            f"runtime {name!r} has no replicated job {C.TRAINER_NODE!r} (it has: {names}): nemo_kubeflow's "
            "settings go to that job's pods; use a runtime built like Trainer's torch-distributed"
        ]
    patch_jobs = _list(
        _dict(_dict(_dict(ours.get("trainingRuntimeSpec")).get("template")).get("spec")).get("replicatedJobs")
    )
    patch_template = _pod_template(_first_with(patch_jobs, "name", C.TRAINER_NODE))
    admin_template = _pod_template(admin_job)
    conflicts = _PatchConflicts(str(name), _dict(patch_template.get("spec")), _dict(admin_template.get("spec")))
    conflicts.check_pod_metadata(_dict(patch_template.get("metadata")), _dict(admin_template.get("metadata")))
    conflicts.check_pod()
    return conflicts.problems


def _changed(ours: dict, theirs: dict) -> Iterator[tuple[Any, Any]]:
    """The keys of ``ours`` that ``theirs`` sets to another value, with ``theirs``'s value."""
    return ((key, theirs[key]) for key, value in ours.items() if key in theirs and theirs[key] != value)


class _PatchConflicts:
    """The conflicts of our patch's pod spec ``pod`` with the admin runtime's ``admin``, as messages."""

    def __init__(self, name: str, pod: dict, admin: dict) -> None:
        self.name, self.pod, self.admin = name, pod, admin
        self.problems: list[str] = []

    def replaced(self, fname: str, what: str, theirs: Any) -> None:
        self.problems.append(
            f"{fname}: runtime {self.name!r} already sets {what} to {_short(theirs, 120)}; the job's "
            f"runtime patch would replace the admin's value. Leave {fname} unset to keep it, or use a "
            "runtime without it"
        )

    def check_pod_metadata(self, ours: dict, theirs: dict) -> None:
        """The pod labels and annotations of our patch (``ours``) against the runtime's (``theirs``)."""
        for section in ("labels", "annotations"):
            for key, value in _changed(_dict(ours.get(section)), _dict(theirs.get(section))):
                self.replaced(_PATCH_FIELDS[section], f"pod {section[:-1]} {key!r}", value)

    def check_pod(self) -> None:
        self.check_tolerations()
        self.check_pod_settings()
        self.check_volumes()
        containers = {str(_dict(c).get("name")): _dict(c) for c in _list(self.admin.get("containers"))}
        for patched in _list(self.pod.get("containers")):
            self.check_container(_dict(patched), containers)

    def check_tolerations(self) -> None:
        """A patch's tolerations replace the runtime's list whole: it must repeat the runtime's."""
        missing = [t for t in _list(self.admin.get("tolerations")) if t not in _list(self.pod.get("tolerations"))]
        if self.pod.get("tolerations") and missing:
            self.problems.append(
                f"tolerations: runtime {self.name!r} has tolerations {_short(missing, 160)} and a patch replaces "
                "the whole list: add them to tolerations too, or leave tolerations unset"
            )

    def check_pod_settings(self) -> None:
        """The node selector keys, scalar fields and security context fields that our patch overwrites."""
        pod, admin = self.pod, self.admin
        for key, theirs in _changed(_dict(pod.get("nodeSelector")), _dict(admin.get("nodeSelector"))):
            self.replaced("node_selector", f"nodeSelector {key!r}", theirs)
        scalars = {key: pod[key] for key in ("serviceAccountName", "terminationGracePeriodSeconds") if key in pod}
        for key, theirs in _changed(scalars, admin):
            self.replaced(_PATCH_FIELDS[key], key, theirs)
        for key, theirs in _changed(_dict(pod.get("securityContext")), _dict(admin.get("securityContext"))):
            self.replaced(_SECURITY_FIELDS.get(key, "restricted_security"), f"securityContext.{key}", theirs)

    def check_volumes(self) -> None:
        admin_volumes = {_dict(v).get("name") for v in _list(self.admin.get("volumes"))}
        for volume in _list(self.pod.get("volumes")):
            if _dict(volume).get("name") in admin_volumes:
                self.problems.append(
                    f"{_volume_field(str(volume['name']))}: runtime {self.name!r} already has a volume named "
                    f"{volume['name']!r}, which the job's volume would replace; rename the runtime's volume"
                )

    def check_container(self, patched: dict, containers: dict[str, dict]) -> None:
        """One container of our patch against the runtime's ``containers`` by name."""
        cname = patched.get("name")
        if cname not in containers:
            self.problems.append(
                f"runtime {self.name!r} has no container {cname!r} in its {C.TRAINER_NODE!r} pods (it has: "
                f"{', '.join(containers) or 'none'}): nemo_kubeflow's mounts and settings go to it"
            )
            return
        self.check_mounts(patched, containers[cname])
        if patched.get("securityContext"):
            self.check_restricted_security(str(cname), containers)

    def check_restricted_security(self, cname: str, containers: dict[str, dict]) -> None:
        """Our patch restricts container ``cname`` only: the runtime must run no other container beside it."""
        others = [n for n in containers if n != cname] + [
            str(_dict(c).get("name")) for c in _list(self.admin.get("initContainers"))
        ]
        if others:
            self.problems.append(
                f"restricted_security: runtime {self.name!r} runs containers {', '.join(others)} beside "
                f"{cname!r}, which a runtime patch cannot restrict; make the runtime's pods pass "
                "the restricted profile itself and leave restricted_security False"
            )

    def check_mounts(self, patched: dict, theirs: dict) -> None:
        """The mount paths of our container ``patched`` that the runtime's container ``theirs`` mounts already."""
        cname = patched.get("name")
        mounts = {_dict(m).get("mountPath"): _dict(m).get("name") for m in _list(theirs.get("volumeMounts"))}
        for mount in _list(patched.get("volumeMounts")):
            path = _dict(mount).get("mountPath")
            if path in mounts:
                self.problems.append(
                    f"{_volume_field(str(mount.get('name')))}: runtime {self.name!r} already mounts volume "
                    f"{mounts[path]!r} at {path!r} in container {cname!r}; mount somewhere else"
                    + (", or set shm_size=None to keep the runtime's /dev/shm" if path == "/dev/shm" else "")
                )
