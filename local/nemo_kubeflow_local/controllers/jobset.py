"""JobSet v0.12's rules, as the emulated JobSet controller and webhooks apply them: the stored spec's
defaults (`default_jobset`), the name webhook (`jobset_pod_name_errors`), the Job it creates per replica
(`build_job`) and what it remembers of a JobSet (`JobSetState`). The reconcile loop that applies them is
trainer.TrainerController: one work queue keyed by TrainJob drives Trainer, JobSet and Job, because in the
local cluster a JobSet and its Jobs only ever exist under a TrainJob (clients cannot write them).
"""

from __future__ import annotations

import copy
import hashlib
import uuid
from dataclasses import dataclass, field
from typing import Optional

from nemo_kubeflow_local import constants as C
from nemo_kubeflow_local import names
from nemo_kubeflow_local.apiserver.apierrors import FieldError
from nemo_kubeflow_local.apiserver.registry import apply_pod_template_defaults
from nemo_kubeflow_local.controllers.job import DEFAULT_BACKOFF_LIMIT, JOB_NAME_LABEL, JobState
from nemo_kubeflow_local.controllers.objects import controller_ref

JOBSET_UID_LABEL = "jobset.sigs.k8s.io/jobset-uid"


#: JobSet's validating webhook, as the API server names it in a denial.
JOBSET_WEBHOOK = "vjobset.kb.io"


def default_jobset(spec: dict) -> dict:
    """The JobSet spec as stored: the CRD's and the mutating webhook's defaults, then what Go's
    `omitempty` drops when the controller writes it (a `failurePolicy.maxRestarts` of 0)."""
    spec = copy.deepcopy(spec)
    spec.setdefault("successPolicy", {"operator": "All"})
    spec.setdefault("startupPolicy", {"startupPolicyOrder": "AnyOrder"})
    network = spec.setdefault("network", {})
    network.setdefault("enableDNSHostnames", True)
    network.setdefault("publishNotReadyAddresses", True)
    policy = spec.get("failurePolicy")
    if policy is not None:
        policy.setdefault("restartStrategy", "Recreate")
        if not policy.get("maxRestarts"):
            policy.pop("maxRestarts", None)
        for i, rule in enumerate(policy.get("rules") or []):
            rule.setdefault("name", f"failurePolicyRule{i}")
    for rjob in spec.get("replicatedJobs") or []:
        rjob.setdefault("groupName", "default")
        rjob.setdefault("replicas", 1)
        rjob["template"].setdefault("metadata", {})  # Go writes an empty ObjectMeta as {}
        job_spec = rjob["template"].setdefault("spec", {})
        job_spec.setdefault("completionMode", "Indexed")
        template = job_spec.setdefault("template", {})
        template.setdefault("metadata", {})
        pod_spec = template.setdefault("spec", {})
        pod_spec.setdefault("restartPolicy", "OnFailure")
        for container in (pod_spec.get("initContainers") or []) + (pod_spec.get("containers") or []):
            container.setdefault("resources", {})  # a struct: Go writes it even when empty
    return spec


def jobset_pod_name_errors(jobset_name: str, spec: dict) -> list[FieldError]:
    """JobSet's webhook rule on the names of the JobSet's Jobs and pods (names.jobset_name_errors)."""
    return [FieldError.invalid(e.path, e.value, e.message) for e in names.jobset_name_errors(jobset_name, spec)]


@dataclass
class JobSetState:
    trainjob_uid: str
    master_port: int
    jobset_uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    spec: Optional[dict] = None
    jobs: list[JobState] = field(default_factory=list)
    restarts: int = 0
    restarts_towards_max: int = 0
    terminal: Optional[tuple[str, str, str]] = None  # (condition type, reason, message)
    #: the JobSet was created suspended (its first Jobs are, too, until it is resumed)
    created_suspended: bool = False
    #: the JobSet's RestartingJobSet condition (status, reason, message) once it restarted
    restarting: Optional[tuple[str, str, str]] = None

    @property
    def built(self) -> dict:
        """``spec``, for the steps that run only once the JobSet is built (its Jobs exist only then)."""
        if self.spec is None:
            raise RuntimeError("the JobSet is not built yet")
        return self.spec


def build_job(jobset: dict, state: JobSetState, job: JobState) -> dict:
    """The Job the JobSet controller creates for `job`, as the API server stores it (uid `job.uid`):
    JobSet's labels and annotations on the Job and its pod template, the Job's selector and the
    API server's Job and pod template defaults."""
    spec = jobset["spec"]
    rjob = next(r for r in spec["replicatedJobs"] if r["name"] == job.rjob)
    namespace, jobset_name = jobset["metadata"]["namespace"], jobset["metadata"]["name"]
    replicas = {r["name"]: r.get("replicas", 1) for r in spec["replicatedJobs"]}
    earlier = sum(replicas[r["name"]] for r in spec["replicatedJobs"][: spec["replicatedJobs"].index(rjob)])
    group = rjob.get("groupName", "default")
    group_rjobs = [r for r in spec["replicatedJobs"] if r.get("groupName", "default") == group]
    group_earlier = sum(replicas[r["name"]] for r in group_rjobs[: group_rjobs.index(rjob)])
    jobset_meta = {
        C.JOBSET_NAME_LABEL: jobset_name,
        JOBSET_UID_LABEL: jobset["metadata"]["uid"],
        C.REPLICATED_JOB_LABEL: job.rjob,
        C.RESTART_ATTEMPT_LABEL: str(state.restarts),
        "jobset.sigs.k8s.io/replicatedjob-replicas": str(replicas[job.rjob]),
        "jobset.sigs.k8s.io/global-replicas": str(sum(replicas.values())),
        "jobset.sigs.k8s.io/job-index": str(job.index),
        "jobset.sigs.k8s.io/job-key": hashlib.sha1(f"{namespace}/{job.name}".encode()).hexdigest(),
        "jobset.sigs.k8s.io/job-global-index": str(earlier + job.index),
        "jobset.sigs.k8s.io/group-name": group,
        "jobset.sigs.k8s.io/group-replicas": str(sum(replicas[r["name"]] for r in group_rjobs)),
        "jobset.sigs.k8s.io/job-group-index": str(group_earlier + job.index),
    }
    selector = {
        "batch.kubernetes.io/controller-uid": job.uid,
        JOB_NAME_LABEL: job.name,
        "controller-uid": job.uid,
        "job-name": job.name,
    }
    job_meta = rjob["template"].get("metadata") or {}
    job_spec = copy.deepcopy(rjob["template"].get("spec") or {})
    template = job_spec.setdefault("template", {})
    template_meta = template.setdefault("metadata", {})
    template_meta["labels"] = {**(template_meta.get("labels") or {}), **jobset_meta, **selector}
    template_meta["annotations"] = {**(template_meta.get("annotations") or {}), **jobset_meta}
    pod_spec = template.setdefault("spec", {})
    pod_spec["subdomain"] = (spec.get("network") or {}).get("subdomain") or jobset_name
    apply_pod_template_defaults(pod_spec)
    job_spec.setdefault("backoffLimit", DEFAULT_BACKOFF_LIMIT)
    job_spec.setdefault("completions", 1)
    job_spec.setdefault("parallelism", 1)
    job_spec.setdefault("manualSelector", False)
    job_spec.setdefault("podReplacementPolicy", "TerminatingOrFailed")
    job_spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": job.uid}}
    job_spec["suspend"] = bool(spec.get("suspend"))
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job.name,
            "namespace": namespace,
            "labels": {**(job_meta.get("labels") or {}), **jobset_meta},
            "annotations": {**(job_meta.get("annotations") or {}), **jobset_meta},
            "ownerReferences": [controller_ref(jobset)],
        },
        "spec": job_spec,
    }
