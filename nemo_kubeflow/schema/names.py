"""Names, labels and annotations, as the API server checks them: object names and namespaces, the
TrainJob's name and the names of its pods (JobSet's pod-name rule, against its runtime)."""

from __future__ import annotations

import re
from typing import Any, Optional, Sequence

from nemo_kubeflow import constants as C
from nemo_kubeflow.parts import naming
from nemo_kubeflow.schema.problems import Path, _dict, _is_int, _Problems, _short

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
