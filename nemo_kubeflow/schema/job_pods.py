"""The pods a TrainJob will have, worked out offline as Trainer and JobSet make them: each replicated job of the
runtime, its pod template with the TrainJob's ``runtimePatches`` merged in (lists of named items by name) and
the ``trainer`` settings on the ``node`` container, how many pods it runs at once and which jobs run together.
What admission checks (Pod Security, quotas, LimitRanges) are run on: schema/pod_security.py,
schema/namespace_fit.py."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Optional

from nemo_kubeflow.constants import TRAINER_NODE
from nemo_kubeflow.schema.problems import _dict

#: The key that names an item in each list a patch merges by item (strategic merge's patch keys).
_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "volumes": "name",
    "env": "name",
    "volumeMounts": "mountPath",
    "replicatedJobs": "name",
    "imagePullSecrets": "name",
}


@dataclass(frozen=True)
class JobPods:
    """One replicated job's pods: its name, the pod spec every pod of it gets, how many run at once, and the
    replicated jobs it starts after (JobSet's ``dependsOn``: their pods are done by then)."""

    job: str
    spec: dict
    count: int
    after: tuple[str, ...] = ()


def job_pods(trainjob: dict, runtime: dict) -> list[JobPods]:
    """The pods of ``trainjob`` on ``runtime`` (the rendered runtime, or an admin's read from the cluster)."""
    spec = _merged_runtime_spec(trainjob, runtime)
    trainer = _dict(_dict(trainjob.get("spec")).get("trainer"))
    nodes = trainer.get("numNodes") or _dict(spec.get("mlPolicy")).get("numNodes") or 1
    found = []
    for rjob in dict_items(_dict(_dict(spec.get("template")).get("spec")).get("replicatedJobs")):
        name = str(rjob.get("name", ""))
        job_spec = _dict(_dict(rjob.get("template")).get("spec"))
        pod = copy.deepcopy(_dict(_dict(job_spec.get("template")).get("spec")))
        per_job = int(nodes) if name == TRAINER_NODE else int(job_spec.get("parallelism") or 1)
        if name == TRAINER_NODE:
            _apply_trainer(pod, trainer)
        after = tuple(str(d.get("name")) for d in dict_items(rjob.get("dependsOn")))
        found.append(JobPods(name, pod, int(rjob.get("replicas") or 1) * per_job, after))
    return found


def running_together(pods: list[JobPods]) -> list[list[JobPods]]:
    """The groups of replicated jobs whose pods run at the same time: those that start at once (no
    ``dependsOn``), then each one that starts after others (their pods have finished, and count no more)."""
    first = [p for p in pods if not p.after]
    return ([first] if first else []) + [[p] for p in pods if p.after]


def _merged_runtime_spec(trainjob: dict, runtime: dict) -> dict:
    """The runtime's spec with the TrainJob's ``runtimePatches`` merged in, in order."""
    spec = copy.deepcopy(_dict(runtime.get("spec")))
    for patch in dict_items(_dict(trainjob.get("spec")).get("runtimePatches")):
        spec = merge(spec, _dict(_dict(patch).get("trainingRuntimeSpec")))
    return spec


def merge(base: Any, patch: Any, key: Optional[str] = None) -> Any:
    """``patch`` merged into ``base``: maps key by key, lists of named items item by item (``_MERGE_KEYS``),
    anything else replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = merge(base.get(k), v, k) if k in base else copy.deepcopy(v)
        return out
    merge_key = _MERGE_KEYS.get(key or "")
    if merge_key and isinstance(base, list) and isinstance(patch, list):
        items = {_dict(i).get(merge_key): i for i in base}
        for item in patch:
            name = _dict(item).get(merge_key)
            items[name] = merge(items[name], item) if name in items else copy.deepcopy(item)
        return list(items.values())
    return copy.deepcopy(patch)


def _apply_trainer(pod: dict, trainer: dict) -> None:
    """The TrainJob's ``trainer`` settings on the ``node`` container, as Trainer sets them."""
    for container in dict_items(pod.get("containers")):
        if container.get("name") != TRAINER_NODE:
            continue
        for field in ("image", "command", "args"):
            if field in trainer:
                container[field] = copy.deepcopy(trainer[field])
        if "env" in trainer:
            container["env"] = merge(container.get("env") or [], trainer["env"], "env")
        if "resourcesPerNode" in trainer:
            container["resources"] = copy.deepcopy(trainer["resourcesPerNode"])


def containers(pod: dict) -> list[dict]:
    """The pod's init containers and containers, in that order."""
    return [*dict_items(pod.get("initContainers")), *dict_items(pod.get("containers"))]


def dict_items(value: Any) -> list[dict]:
    """The mappings of a list (anything else: [], as for an item that is not one: the schema checks say so)."""
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []
