"""ClusterTrainingRuntimes and TrainingRuntimes as the Trainer webhook and the CRDs' CEL rules check them:
the JobSet's settings, replicated jobs, failure policies, the ML policy and env injection."""

from __future__ import annotations

import re
from typing import Any, Optional

from nemo_kubeflow import constants as C
from nemo_kubeflow.schema.names import _check_labels_annotations
from nemo_kubeflow.schema.pods import _check_pod_spec, _unique_names
from nemo_kubeflow.schema.problems import (
    Path,
    _dict,
    _did_you_mean,
    _find,
    _first_with,
    _is_int,
    _list,
    _Problems,
    _short,
)
from nemo_kubeflow.schema.resources import _SDK_DEVICE_KEYS, _SDK_MIG_PREFIX
from nemo_kubeflow.schema.trainjob import _POD_SPEC_PATH, _check_at_least_one
from nemo_kubeflow.schema.walk import _check_kube, _check_model, _enum_list

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
