"""The Trainer API as the cluster enforces it: CRD defaults and CEL rules (422 Invalid) and the
Trainer validating webhooks (403 Forbidden, "admission webhook ... denied the request").

Rules and messages follow Trainer v2.3.0: the CRDs (`x-kubernetes-validations`), `pkg/webhooks/`
and the `Validate` methods of the torch and jobset plugins.
"""

from __future__ import annotations

import re
from typing import Any, Optional

from nemo_kubeflow_local import constants as C
from nemo_kubeflow_local.apiserver import kueue_schema
from nemo_kubeflow_local.apiserver import resources as R
from nemo_kubeflow_local.apiserver.apierrors import ApiError, FieldError, webhook_denied
from nemo_kubeflow_local.apiserver.resources import ResourceType
from nemo_kubeflow_local.apiserver.store import Store
from nemo_kubeflow_local.names import DNS1035_LABEL_FORMAT
from nemo_kubeflow_local.timeutil import now_rfc3339

TRAINJOB_WEBHOOK = "validator.trainjob.trainer.kubeflow.org"
RUNTIME_WEBHOOKS = {
    R.RUNTIMES.key: "validator.trainingruntime.trainer.kubeflow.org",
    R.CLUSTER_RUNTIMES.key: "validator.clustertrainingruntime.trainer.kubeflow.org",
}
#: The ancestor label value -> the container that job must have (trainingruntime_webhook.go).
_ANCESTOR_CONTAINERS = {
    "trainer": C.TRAINER_NODE,
    "model-initializer": "model-initializer",
    "dataset-initializer": "dataset-initializer",
}
_POLICIES = ("torch", "mpi", "jax", "xgboost", "flux")


# --- defaults (CRD `default:` values and the TrainJob defaulting webhook) -------------------------------


def apply_defaults(rt: ResourceType, obj: dict) -> None:
    spec = obj.get("spec")
    if not isinstance(spec, dict) or not rt.is_trainer:
        return
    if rt is R.TRAINJOBS:
        ref = spec.get("runtimeRef")
        if isinstance(ref, dict):
            ref.setdefault("apiGroup", C.TRAINER_GROUP)
            ref.setdefault("kind", C.CLUSTER_RUNTIME_KIND)
        spec.setdefault("suspend", False)
        spec.setdefault("managedBy", C.TRAINJOB_CONTROLLER)
        for patch in spec.get("runtimePatches") or []:
            patch.setdefault("time", now_rfc3339())
        return
    if isinstance(spec.get("mlPolicy"), dict):
        spec["mlPolicy"].setdefault("numNodes", 1)
    jobset = ((spec.get("template") or {}).get("spec")) or {}
    if isinstance(jobset.get("failurePolicy"), dict):
        jobset["failurePolicy"].setdefault("restartStrategy", "Recreate")
    for rjob in jobset.get("replicatedJobs") or []:
        rjob.setdefault("replicas", 1)
        rjob.setdefault("groupName", "default")


# --- CRD schema and CEL rules (422) --------------------------------------------------------------
# A failed CEL rule prints the JSON type of the value ("object") where other errors print the value.


def crd_errors(rt: ResourceType, obj: dict, old: Optional[dict]) -> list[FieldError]:
    if not rt.is_trainer:
        return kueue_schema.crd_errors(rt, obj)
    if rt is R.TRAINJOBS:
        return _trainjob_crd_errors(obj, old)
    return _runtime_crd_errors(obj)


def _trainjob_crd_errors(obj: dict, old: Optional[dict]) -> list[FieldError]:
    errors: list[FieldError] = []
    name = obj["metadata"].get("name", "")
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [FieldError.required("spec")]
    ref = spec.get("runtimeRef")
    if not isinstance(ref, dict):
        errors.append(FieldError.required("spec.runtimeRef"))
    elif not ref.get("name"):
        errors.append(
            FieldError.invalid(
                "spec.runtimeRef.name",
                ref.get("name", ""),
                "spec.runtimeRef.name in body should be at least 1 chars long",
            )
        )
    if spec.get("activeDeadlineSeconds") is not None and spec["activeDeadlineSeconds"] < 1:
        errors.append(
            FieldError.invalid(
                "spec.activeDeadlineSeconds",
                spec["activeDeadlineSeconds"],
                "spec.activeDeadlineSeconds in body should be greater than or equal to 1",
            )
        )
    if spec.get("managedBy") not in C.TRAINJOB_MANAGED_BY_VALUES:
        errors.append(
            FieldError.invalid(
                "spec.managedBy",
                "string",
                "ManagedBy must be trainer.kubeflow.org/trainjob-controller or kueue.x-k8s.io/multikueue if set",
            )
        )
    trainer = spec.get("trainer") or {}
    for field, limit in (
        ("command", C.TRAINER_ARGV_MAX_ITEMS),
        ("args", C.TRAINER_ARGV_MAX_ITEMS),
        ("env", C.TRAINER_ENV_MAX_ITEMS),
    ):
        if len(trainer.get(field) or []) > limit:
            errors.append(
                FieldError(f"spec.trainer.{field}", "Too many", f"must have at most {limit} items", len(trainer[field]))
            )
    seen: set[str] = set()
    for i, env in enumerate(trainer.get("env") or []):
        if env.get("name") in seen:
            errors.append(FieldError.duplicate(f"spec.trainer.env[{i}]", {"name": env.get("name")}))
        seen.add(env.get("name"))
    if len(trainer.get("image") or "") > 500:
        errors.append(FieldError("spec.trainer.image", "Too long", "may not be more than 500 bytes", show_value=False))
    # Trainer HEAD adds this CEL rule; v2.3.0 passes 0 through to PET_NPROC_PER_NODE.
    if trainer.get("numProcPerNode") is not None and trainer["numProcPerNode"] < 1:
        errors.append(
            FieldError.invalid(
                "spec.trainer.numProcPerNode",
                trainer["numProcPerNode"],
                "spec.trainer.numProcPerNode in body should be greater than or equal to 1",
            )
        )
    managers = [p.get("manager") for p in spec.get("runtimePatches") or []]
    for i, manager in enumerate(managers):
        if manager in managers[:i]:
            errors.append(FieldError.duplicate(f"spec.runtimePatches[{i}]", {"manager": manager}))
    if len(managers) > 16:
        errors.append(FieldError("spec.runtimePatches", "Too many", "must have at most 16 items", len(managers)))
    if not re.fullmatch(DNS1035_LABEL_FORMAT, name):  # the CRD's CEL rule: matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')
        errors.append(FieldError.invalid("", "object", "metadata.name must match RFC 1035 DNS label format"))
    if len(name) > C.DNS_LABEL_MAX:
        errors.append(FieldError.invalid("", "object", "metadata.name must be no more than 63 characters"))
    if old is not None:
        old_spec = old.get("spec") or {}
        for field, json_type in (
            ("runtimeRef", "object"),
            ("initializer", "object"),
            ("trainer", "object"),
            ("activeDeadlineSeconds", "integer"),
            ("managedBy", "string"),
        ):
            if spec.get(field) != old_spec.get(field):
                errors.append(FieldError.invalid(f"spec.{field}", json_type, "field is immutable"))
    return errors


def _runtime_crd_errors(obj: dict) -> list[FieldError]:
    errors: list[FieldError] = []
    spec = obj.get("spec") or {}
    policy = spec.get("mlPolicy") or {}
    if sum(1 for p in _POLICIES if p in policy) > 1:
        errors.append(FieldError.invalid("spec.mlPolicy", "object", "Only one of the policy can be configured"))
    targets = (((policy.get("torch") or {}).get("envInjection")) or {}).get("targets") or []
    for i, target in enumerate(targets):
        if C.TRAINER_NODE in (target.get("containerNames") or []):
            errors.append(
                FieldError.invalid(
                    f"spec.mlPolicy.torch.envInjection.targets[{i}].containerNames",
                    "array",
                    "containerNames must not include the main node container because PET_* envs are always injected "
                    "into it",
                )
            )
    jobset = ((spec.get("template") or {}).get("spec")) or {}
    if (jobset.get("startupPolicy") or {}).get("startupPolicyOrder") == "InOrder" and any(
        "dependsOn" in rjob for rjob in jobset.get("replicatedJobs") or []
    ):
        errors.append(
            FieldError.invalid(
                "spec.template.spec", "object", "StartupPolicy and DependsOn APIs are mutually exclusive"
            )
        )
    return errors


# --- webhooks (403) ------------------------------------------------------------------------------------


def resolve_runtime(store: Store, trainjob: dict) -> tuple[Optional[dict], str]:
    """The runtime a TrainJob names, or (None, why) the way the Trainer's client words it."""
    ref = trainjob["spec"]["runtimeRef"]
    group_kind = f"{ref.get('kind', '')}.{ref.get('apiGroup', '')}"
    if ref.get("apiGroup") != C.TRAINER_GROUP or ref.get("kind") not in (C.CLUSTER_RUNTIME_KIND, C.RUNTIME_KIND):
        return None, f"unsupported runtime: {group_kind}"
    rt = R.RUNTIMES if ref["kind"] == C.RUNTIME_KIND else R.CLUSTER_RUNTIMES
    runtime = store.find(rt, trainjob["metadata"]["namespace"], ref["name"])
    if runtime is None:
        return None, f'{rt.qualified} "{ref["name"]}" not found'
    return runtime, ""


def find_container(runtime: dict, job_name: str, container_name: str) -> Optional[dict]:
    """`Info.FindContainerByPodSetName`: containers first, then init containers."""
    for rjob in ((runtime.get("spec") or {}).get("template") or {}).get("spec", {}).get("replicatedJobs") or []:
        if rjob.get("name") != job_name:
            continue
        pod = rjob.get("template", {}).get("spec", {}).get("template", {}).get("spec", {})
        for container in (pod.get("containers") or []) + (pod.get("initContainers") or []):
            if container.get("name") == container_name:
                return container
    return None


def admit(store: Store, rt: ResourceType, obj: dict, old: Optional[dict]) -> list[str]:
    """Run the validating webhook for `obj`; returns its warnings, raises 403 when it denies."""
    if not rt.is_trainer:
        return []
    if rt is R.TRAINJOBS:
        return _admit_trainjob(store, obj, old)
    if obj["metadata"].get("labels", {}).get("trainer.kubeflow.org/webhook-validation") == "disabled":
        return []
    errors = _replicated_job_errors(obj)
    if errors:
        raise webhook_denied(RUNTIME_WEBHOOKS[rt.key], errors)
    return []


def _replicated_job_errors(runtime: dict) -> list[FieldError]:
    errors = []
    rjobs = (((runtime.get("spec") or {}).get("template") or {}).get("spec") or {}).get("replicatedJobs") or []
    for i, rjob in enumerate(rjobs):
        ancestor = ((rjob.get("template") or {}).get("metadata") or {}).get("labels", {}).get(C.ANCESTOR_LABEL)
        if ancestor not in _ANCESTOR_CONTAINERS:
            continue
        path = f"spec.template.spec.replicatedJobs[{i}]"
        if rjob.get("replicas", 1) != 1:
            errors.append(FieldError.invalid(f"{path}.replicas", rjob.get("replicas"), "always must be 1"))
        containers = rjob.get("template", {}).get("spec", {}).get("template", {}).get("spec", {}).get("containers")
        if not any(c.get("name") == _ANCESTOR_CONTAINERS[ancestor] for c in containers or []):
            errors.append(
                FieldError.invalid(
                    f"{path}.template.spec.template.spec.containers",
                    containers or [],
                    f"must contain the required container for the ancestor: {ancestor}",
                )
            )
    return errors


def _admit_trainjob(store: Store, trainjob: dict, old: Optional[dict]) -> list[str]:
    runtime, why = resolve_runtime(store, trainjob)
    ref = trainjob["spec"]["runtimeRef"]
    if runtime is None:
        if why.startswith("unsupported"):
            raise ApiError(403, f'admission webhook "{TRAINJOB_WEBHOOK}" denied the request: {why}')
        cluster = ref["kind"] == C.CLUSTER_RUNTIME_KIND
        raise webhook_denied(
            TRAINJOB_WEBHOOK,
            [
                FieldError.invalid(
                    "spec.RuntimeRef" if cluster else "spec.runtimeRef",
                    ref,
                    f"{why}: specified {'clusterTrainingRuntime' if cluster else 'trainingRuntime'} must be created "
                    "before the TrainJob is created",
                )
            ],
        )
    errors: list[FieldError] = []
    spec = trainjob["spec"]
    torch = ((runtime.get("spec") or {}).get("mlPolicy") or {}).get("torch")
    if torch is not None:
        for target in ((torch.get("envInjection") or {}).get("targets")) or []:
            for name in target.get("containerNames") or []:
                if find_container(runtime, target.get("jobName", ""), name) is None:
                    errors.append(
                        FieldError.invalid(
                            "spec.runtimeRef",
                            target,
                            f'envInjection target podSet "{target.get("jobName", "")}" container "{name}" not found '
                            "in runtime template",
                        )
                    )
        reserved = sorted({e.get("name") for e in (spec.get("trainer") or {}).get("env") or []} & set(C.PET_ENV_NAMES))
        if spec.get("trainer") is not None and reserved:
            errors.append(
                FieldError.invalid(
                    "spec.trainer.env",
                    spec["trainer"]["env"],
                    f"must not have reserved envs, invalid envs configured: [{' '.join(reserved)}]",
                )
            )
    errors.extend(_runtime_patch_errors(runtime, spec.get("runtimePatches") or []))
    if old is not None:
        errors.extend(_suspended_only_patch_errors(store, trainjob, old))
    if errors:
        raise webhook_denied(TRAINJOB_WEBHOOK, errors)
    return []


def _runtime_patch_errors(runtime: dict, patches: list[dict]) -> list[FieldError]:
    """jobset plugin `Validate`: patches may only touch jobs and containers the runtime has."""
    errors: list[FieldError] = []
    path = "spec.runtimePatches"
    rjobs = {
        rjob.get("name"): rjob
        for rjob in (((runtime.get("spec") or {}).get("template") or {}).get("spec") or {}).get("replicatedJobs") or []
    }
    for patch in patches:
        manager = patch.get("manager", "")
        prefix, _, rest = manager.partition("/")
        if not rest or "." not in prefix:
            errors.append(
                FieldError.invalid(f"{path}.manager", manager, 'must be a domain-prefixed path (such as "acme.io/foo")')
            )
        template_spec = ((((patch.get("trainingRuntimeSpec") or {}).get("template")) or {}).get("spec")) or {}
        for rjob_patch in template_spec.get("replicatedJobs") or []:
            rjob = rjobs.get(rjob_patch.get("name"))
            if rjob is None:
                errors.append(
                    FieldError.invalid(
                        path, patches, "must not have replicated job that doesn't exist in the runtime job template"
                    )
                )
                continue
            pod = rjob.get("template", {}).get("spec", {}).get("template", {}).get("spec", {})
            names = {c.get("name") for c in (pod.get("containers") or []) + (pod.get("initContainers") or [])}
            pod_patch = (
                (((rjob_patch.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec")
            ) or {}
            for container in pod_patch.get("initContainers") or []:
                if container.get("name") not in names:
                    errors.append(
                        FieldError.invalid(
                            path,
                            patches,
                            f"must not have initContainer that doesn't exist in the runtime job {rjob_patch['name']}",
                        )
                    )
            for container in pod_patch.get("containers") or []:
                if container.get("name") not in names:
                    errors.append(
                        FieldError.invalid(
                            path,
                            patches,
                            f"must not have container that doesn't exist in the runtime job {rjob_patch['name']}",
                        )
                    )
                elif container.get("env") and container["name"] in (
                    "dataset-initializer",
                    "model-initializer",
                    C.TRAINER_NODE,
                ):
                    errors.append(
                        FieldError.invalid(
                            path,
                            patches,
                            "must not have envs for the dataset-initializer, model-initializer, node containers",
                        )
                    )
    return errors


def _suspended_only_patch_errors(store: Store, obj: dict, old: dict) -> list[FieldError]:
    """runtimePatches may change only while the TrainJob is suspended before or after the update,
    and not while a replicated job of its JobSet is still active (a Job with a pod running that is
    not being deleted: the emulated JobSet keeps no replicatedJobsStatus, so its pods tell)."""
    spec, old_spec = obj.get("spec") or {}, old.get("spec") or {}
    if _patches_without_time(spec) == _patches_without_time(old_spec):
        return []
    if not (spec.get("suspend") or old_spec.get("suspend")):
        return [
            FieldError.forbidden(
                "spec.runtimePatches",
                "RuntimePatches can only be modified when the TrainJob is suspended before or after the update",
            )
        ]
    meta = obj["metadata"]
    active = sorted(
        {
            (p["metadata"].get("labels") or {}).get(C.REPLICATED_JOB_LABEL, "")
            for p in store.list(
                R.PODS,
                meta.get("namespace"),
                lambda p: (
                    (p["metadata"].get("labels") or {}).get(C.JOBSET_NAME_LABEL) == meta["name"]
                    and not p["metadata"].get("deletionTimestamp")
                    and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
                ),
            )[0]
        }
    )
    return [
        FieldError.forbidden(
            "spec.runtimePatches",
            f"RuntimePatches cannot be modified when the JobSet's ReplicatedJob {name} is still active",
        )
        for name in active
    ]


def _patches_without_time(spec: dict) -> list[Any]:
    return [{k: v for k, v in p.items() if k != "time"} for p in spec.get("runtimePatches") or []]
