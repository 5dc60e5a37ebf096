"""Pure builders for the objects of one task's submission (dict in, dict out).

The TrainJob is built here, not by the Kubeflow SDK: its ``TrainerClient.train`` cannot set
``numProcPerNode`` (its ``CustomTrainerContainer`` has no such field). It is checked offline
against the Trainer CRD (validation.py) and submitted with Strict field validation through
``cluster.py``.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Optional, Sequence

from nemo_kubeflow.build.command import LaunchSpec
from nemo_kubeflow.constants import (
    EXPERIMENT_LABEL,
    JOBSET_NAME_LABEL,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    NODE_AVOIDANCE_ANNOTATION,
    NODE_AVOIDANCE_OFF,
    PRIORITY_CLASS_LABEL,
    QUEUE_LABEL,
    REPLICATED_JOB_LABEL,
    RESTART_ATTEMPT_ENV,
    RESTART_ATTEMPT_LABEL,
    TASK_LABEL,
    TIMEOUT_ALIASES,
    TIMEOUT_DEFAULTS,
    TRAINER_API_VERSION,
    TRAINER_GROUP,
    TRAINER_NODE,
    TRAINJOB_KIND,
    TRAINJOB_LABEL,
    TTL_ANNOTATION,
)
from nemo_kubeflow.errors import ConfigError
from nemo_kubeflow.parts import naming
from nemo_kubeflow.parts.escapes import literal_env
from nemo_kubeflow.parts.naming import PATCH_MANAGER
from nemo_kubeflow.parts.steps import PREFLIGHT_CONTAINER
from nemo_kubeflow.schema import compiled as schemas

if TYPE_CHECKING:
    from kubeflow_trainer_api import models as m

    from nemo_kubeflow.config.executor import KubeflowExecutor
    from nemo_kubeflow.parts.fabrics import Fabric

#: Shown instead of secret values wherever a manifest is printed or written.
MASK = "<masked>"


def common_labels(experiment_id: str, task_name: str, trainjob: str) -> dict[str, str]:
    return {
        MANAGED_BY_LABEL: MANAGED_BY_VALUE,
        EXPERIMENT_LABEL: naming.label_value(experiment_id or "none"),
        TASK_LABEL: naming.label_value(task_name or "none"),
        TRAINJOB_LABEL: trainjob,
    }


def resources_per_node(executor: KubeflowExecutor, fabric: Fabric) -> Optional[dict[str, dict[str, str]]]:
    """The TrainJob's ``resourcesPerNode``: CPU, memory, GPUs, the fabric's devices, ``extra_resources``."""
    sections: dict[str, dict[str, str]] = {"requests": {}, "limits": {}}
    for fname, (section, resource) in _CPU_MEMORY_FIELDS.items():
        if (value := getattr(executor, fname)) is not None:
            sections[section][resource] = str(value)
    # Extended resources must be requested and limited alike.
    for res, value in _extended_resources(executor, fabric).items():
        sections["requests"][res] = sections["limits"][res] = str(value)
    return {k: v for k, v in sections.items() if v} or None


def _extended_resources(executor: KubeflowExecutor, fabric: Fabric) -> dict[str, object]:
    """The extended resources per node: GPUs, the fabric's devices, ``extra_resources``."""
    # The fabric's devices (EFA, RDMA) follow the TrainJob like GPUs: a runtime whose node limits
    # name no cpu or gpu makes the Kubeflow SDK refuse it.
    gpus = {executor.gpu_resource_name: executor.gpus_per_node} if executor.gpus_per_node > 0 else {}
    return {**gpus, **fabric.resources, **executor.extra_resources}


#: The executor's CPU and memory fields: field -> (section of ``resourcesPerNode``, resource).
_CPU_MEMORY_FIELDS = {
    "cpu_request": ("requests", "cpu"),
    "cpu_limit": ("limits", "cpu"),
    "memory_request": ("requests", "memory"),
    "memory_limit": ("limits", "memory"),
}


def trainer_env(
    env: Mapping[str, str], secret_name: Optional[str], secret_keys: Sequence[str], key_refs: Mapping[str, str]
) -> list[dict]:
    """``spec.trainer.env``: plain values (literal: escaped from ``$(VAR)`` expansion), then references
    to Secret keys (values never inline)."""
    out: list[dict] = [literal_env(k, v) for k, v in env.items()]
    for key in secret_keys:
        out.append({"name": key, "valueFrom": {"secretKeyRef": {"name": secret_name, "key": key}}})
    for name, ref in key_refs.items():
        secret, _, key = ref.partition("/")
        out.append({"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}})
    return out


def restart_attempt_env() -> dict:
    """The gang attempt (JobSet's pod label) as an env var, for ft_launcher's rendezvous id."""
    return {
        "name": RESTART_ATTEMPT_ENV,
        "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{RESTART_ATTEMPT_LABEL}']"}},
    }


def runtime_patch(
    volumes: Sequence[dict],
    mounts: Sequence[dict],
    affinity: Optional[dict],
    preflight_env: Sequence[dict] = (),
    *,
    pod: Optional[Mapping[str, Any]] = None,
    metadata: Optional[Mapping[str, Any]] = None,
    node_security: Optional[Mapping[str, Any]] = None,
) -> Optional[dict]:
    """Per-task pod changes (the task's ConfigMaps, this job's anti-affinity, the task's env for the
    preflight checks) as a ``runtimePatches`` entry, so the shared runtime stays shared. With an existing
    runtime (``runtime_name``) also the executor's pod settings (``existing_runtime_pod``): ``pod`` (pod
    spec fields), ``metadata`` (the pod template's labels and annotations), ``node_security`` (the
    ``node`` container's securityContext)."""
    pod = dict(pod or {})
    if not (volumes or mounts or affinity or preflight_env or pod or metadata or node_security):
        return None
    template: dict[str, Any] = {"spec": _patched_pod_spec(pod, volumes, mounts, affinity, preflight_env, node_security)}
    if metadata:
        template = {"metadata": dict(metadata), **template}
    return _node_template_patch(template)


def _patched_pod_spec(
    pod: dict[str, Any],
    volumes: Sequence[dict],
    mounts: Sequence[dict],
    affinity: Optional[dict],
    preflight_env: Sequence[dict],
    node_security: Optional[Mapping[str, Any]],
) -> dict[str, Any]:
    """The pod spec of ``runtime_patch``: ``pod``'s fields, its volumes and mounts first."""
    pod_spec: dict[str, Any] = {}
    if volumes or pod.get("volumes"):
        pod_spec["volumes"] = [*pod.pop("volumes", []), *volumes]
    if preflight_env:
        # Trainer's webhook forbids env on `node` in patches, not on other init containers.
        pod_spec["initContainers"] = [{"name": PREFLIGHT_CONTAINER, "env": list(preflight_env)}]
    if node := _patched_node_container([*pod.pop("volumeMounts", []), *mounts], node_security):
        pod_spec["containers"] = [node]
    if affinity:
        pod_spec["affinity"] = affinity
    pod_spec.update(pod)
    return pod_spec


def _patched_node_container(mounts: list[dict], node_security: Optional[Mapping[str, Any]]) -> Optional[dict]:
    """The ``node`` container of a runtime patch: its securityContext and mounts (``None``: nothing to patch)."""
    if not (mounts or node_security):
        return None
    node: dict[str, Any] = {"name": TRAINER_NODE}
    if node_security:
        node["securityContext"] = dict(node_security)
    if mounts:
        node["volumeMounts"] = mounts
    return node


def _node_template_patch(template: dict[str, Any]) -> dict:
    """The ``runtimePatches`` entry that patches the pod ``template`` of the runtime's ``node`` job."""
    return {
        "manager": PATCH_MANAGER,
        "trainingRuntimeSpec": {
            "template": {
                "spec": {"replicatedJobs": [{"name": TRAINER_NODE, "template": {"spec": {"template": template}}}]}
            }
        },
    }


def timeout_exports(user_names: Sequence[str]) -> dict[str, str]:
    """The launch script's ``export``s of the ``TIMEOUT_DEFAULTS`` the task does not set itself.

    Names the task sets (``env_vars``, the task's env, Secret references) are left out; the others
    are exported as ``"${NAME-default}"``, so that a value from anywhere else (the image, an ``envFrom``
    Secret, the runtime or network fabric) still wins at run time.
    """
    taken = set(user_names)
    exports = {}
    for name, value in TIMEOUT_DEFAULTS.items():
        alias = TIMEOUT_ALIASES.get(name)
        if name in taken or alias in taken:
            continue
        default = f"${{{alias}-{value}}}" if alias else value
        exports[name] = f'"${{{name}-{default}}}"'
    return exports


def queue_labels(queue_name: Optional[str], priority_class: Optional[str]) -> dict[str, str]:
    """Kueue's labels on the TrainJob (its TrainJob integration reads them from the TrainJob's own metadata)."""
    labels = {}
    if queue_name:
        labels[QUEUE_LABEL] = queue_name
    if priority_class:
        labels[PRIORITY_CLASS_LABEL] = priority_class
    return labels


def same_domain_affinity(trainjob_name: str, topology_key: str) -> dict:
    """Required pod affinity among *this job's* node pods on ``topology_key``: every pod joins the
    domain of the first one placed (the scheduler lets the first pod of a self-matching term go
    anywhere). Scoped to the JobSet name and the ``node`` job, like the anti-affinity."""
    return {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {
                        "matchLabels": {JOBSET_NAME_LABEL: trainjob_name, REPLICATED_JOB_LABEL: TRAINER_NODE}
                    },
                    "topologyKey": topology_key,
                }
            ]
        }
    }


def merge_affinity(*affinities: Optional[dict]) -> Optional[dict]:
    """One ``affinity`` from parts with distinct keys (podAffinity, podAntiAffinity)."""
    merged: dict[str, Any] = {}
    for part in affinities:
        merged.update(part or {})
    return merged or None


def one_pod_per_node_affinity(trainjob_name: str) -> dict:
    """Required anti-affinity on the hostname among *this job's* pods only.

    Selecting on the JobSet name (= TrainJob name) rather than on the replicated-job
    name ``node``, which every TrainJob shares and would keep jobs off each other's nodes.
    """
    return {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {JOBSET_NAME_LABEL: trainjob_name}},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }


def _without_nulls(value: Any) -> Any:
    """``value`` without the null fields the API server drops (as the SDK models' ``to_dict`` did)."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def build_trainjob(
    *,
    name: str,
    namespace: str,
    runtime_kind: str,
    runtime_name: str,
    image: str,
    launch: LaunchSpec,
    nodes: int,
    nprocs_per_node: int,
    env: Sequence[dict],
    resources: Optional[dict],
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    patch: Optional[dict],
    active_deadline_seconds: Optional[int],
    initializer: Optional["m.TrainerV1alpha1Initializer"] = None,
    suspend: bool = True,
) -> dict:
    """The TrainJob, as a plain dict in the CRD's field order (the SDK models' order). Offline validation checks
    it against the Trainer CRD (validation.py); building it without the models spares a fresh process
    importing them (~0.5 s). ``initializer``: the SDK's own model (initializers.trainjob_initializer)."""
    trainer = {
        "args": list(launch.args),
        "command": list(launch.command),
        "env": [_without_nulls(e) for e in env] or None,
        "image": image,
        "numNodes": nodes,
        "numProcPerNode": nprocs_per_node,
        "resourcesPerNode": _trainer_resources(resources),
    }
    spec = {
        "activeDeadlineSeconds": active_deadline_seconds,
        "initializer": initializer.to_dict() if initializer is not None else None,
        "runtimePatches": [_without_nulls(patch)] if patch else None,
        "runtimeRef": {"apiGroup": TRAINER_GROUP, "kind": runtime_kind, "name": runtime_name},
        # Created suspended: the task's ConfigMaps and Secret are created next, owned by
        # the TrainJob, and only then is it resumed (or admitted by a queue).
        "suspend": suspend,
        "trainer": _set_fields(trainer),
    }
    metadata = {
        "annotations": dict(annotations) or None,
        "labels": dict(labels) or None,
        "name": name,
        "namespace": namespace,
    }
    job = {
        "apiVersion": TRAINER_API_VERSION,
        "kind": TRAINJOB_KIND,
        "metadata": _set_fields(metadata),
        "spec": _set_fields(spec),
    }
    return schemas.in_schema_order(job, schemas.root(TRAINJOB_KIND))


def _set_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """``fields`` without those that are unset (``None``): the API server drops null fields."""
    return {k: v for k, v in fields.items() if v is not None}


def _trainer_resources(resources: Optional[dict]) -> Optional[dict]:
    """``spec.trainer.resourcesPerNode`` from ``resources_per_node``'s dict (``None``: nothing requested)."""
    if not resources:
        return None
    return {section: dict(resources[section]) for section in ("limits", "requests") if resources.get(section)} or None


class SecretValues(Mapping[str, str]):
    """Secret values read on the submitting machine. ``repr`` and ``str`` show ``MASK`` for each value,
    so that no log line, exception text or traceback with locals (rich's ``show_locals``) shows one."""

    def __init__(self) -> None:
        self._values: dict[str, str] = {}

    def set(self, key: str, value: str) -> None:
        self._values[key] = value

    def __getitem__(self, key: str) -> str:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        masked = {k: MASK for k in self._values}
        return f"SecretValues({masked!r})"

    __str__ = __repr__


class SecretData(dict):
    """A Secret's ``data`` (base64 of the real values): a dict as the API client sends it, whose ``repr`` and
    ``str`` show ``MASK`` for each value (rich's traceback locals print a dict subclass through its repr)."""

    def __repr__(self) -> str:
        return repr({k: MASK for k in self})

    __str__ = __repr__


def secret_manifest(name: str, namespace: str, values: Mapping[str, str], labels: Mapping[str, str]) -> dict:
    """An Opaque Secret; ``values`` are the real values at submission, ``MASK`` otherwise."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "type": "Opaque",
        "data": SecretData((k, base64.b64encode(str(values[k]).encode()).decode()) for k in values),
    }


def masked_secret(secret: dict) -> dict:
    """The Secret as dry runs show it: keys kept, each value replaced by ``MASK``."""
    out = {k: v for k, v in secret.items() if k != "data"}
    out["stringData"] = {k: MASK for k in secret.get("data", {})}
    return out


def pvc_manifest(
    name: str,
    namespace: str,
    labels: Mapping[str, str],
    *,
    size: Optional[str],
    access_modes: Sequence[str],
    storage_class: Optional[str],
) -> dict:
    if size is None:  # the executor's checks refuse this first: never a claim of size "None"
        raise ConfigError(f"the PersistentVolumeClaim {name!r} to create has no size")
    spec: dict[str, Any] = {
        "accessModes": list(access_modes),
        "resources": {"requests": {"storage": str(size)}},
    }
    if storage_class:
        spec["storageClassName"] = storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": spec,
    }


def owner_reference(trainjob: Mapping[str, Any]) -> dict:
    """An ownerReference to a created TrainJob: Kubernetes deletes owned objects with it."""
    return {
        "apiVersion": TRAINER_API_VERSION,
        "kind": TRAINJOB_KIND,
        "name": trainjob["metadata"]["name"],
        "uid": trainjob["metadata"]["uid"],
        "controller": False,
        "blockOwnerDeletion": False,
    }


def with_owner(obj: dict, owner: dict) -> dict:
    out = {**obj, "metadata": {**obj["metadata"], "ownerReferences": [owner]}}
    return out


def ttl_annotations(executor: KubeflowExecutor) -> dict[str, str]:
    """The TrainJob annotation with the executor's ``ttl_seconds_after_finished`` (none when unset).
    Never a JobSet TTL: Trainer v2.3.0 and older build a failed job's JobSet again once its TTL
    deletes it, and rerun the job forever (trainer#3779)."""
    ttl = executor.ttl_seconds_after_finished
    return {} if ttl is None else {TTL_ANNOTATION: str(ttl)}


def node_avoidance_annotations(executor: KubeflowExecutor) -> dict[str, str]:
    """The TrainJob annotation that turns node avoidance off (none when it is on)."""
    return {} if executor.avoid_failed_nodes else {NODE_AVOIDANCE_ANNOTATION: NODE_AVOIDANCE_OFF}
