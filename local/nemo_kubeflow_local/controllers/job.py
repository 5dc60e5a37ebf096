"""The Job controller's rules (batch/v1, Kubernetes 1.36), as the emulated one applies them: what it
remembers of a Job (`JobState`), the pod it creates per completion index (`build_pod`), the
`podFailurePolicy` match, its conditions and its compressed index lists. The reconcile loop is
trainer.TrainerController (see controllers/jobset.py for why one loop drives the three controllers).
"""

from __future__ import annotations

import copy
import uuid
from dataclasses import dataclass, field
from typing import Optional

from nemo_kubeflow_local import constants as C
from nemo_kubeflow_local.apiserver.registry import apply_pod_defaults
from nemo_kubeflow_local.controllers.objects import controller_ref
from nemo_kubeflow_local.timeutil import now_rfc3339, set_condition

#: JobSet's pod webhook copies the pod's priority into this label.
PRIORITY_LABEL = "jobset.sigs.k8s.io/priority"


JOB_NAME_LABEL = "batch.kubernetes.io/job-name"


#: Where the Job controller's JOB_COMPLETION_INDEX reads the completion index from (the label).
JOB_COMPLETION_INDEX_FIELD = f"metadata.labels['{C.COMPLETION_INDEX_LABEL}']"


#: The Job controller's finalizer on its pods, removed once it has counted the finished pod.
JOB_TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"


DEFAULT_BACKOFF_LIMIT = 6


@dataclass
class JobState:
    """One Job of a replicated job: indexed pods, backoffLimit."""

    name: str
    rjob: str
    index: int
    completions: int
    backoff_limit: int
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    created: bool = False
    failed_pods: set = field(default_factory=set)
    #: pods deleted because the Job was suspended: they end Failed, but count as no failure
    suspended_pods: set = field(default_factory=set)
    succeeded: set = field(default_factory=set)
    retry_at: float = 0.0
    #: pod creations the API server refused in a row (admission: a quota, Pod Security, ...), for the back-off
    refused_creates: int = 0
    #: (reason, message) once the Job met a failure criterion (condition FailureTarget): the Job controller
    #: deletes its running pods, and adds the terminal Failed condition (``failure``) only once none of its
    #: pods is terminating (Kubernetes 1.31 on, "Terminal Job conditions"); JobSet waits for that one.
    failure_target: Optional[tuple[str, str]] = None
    failure: Optional[tuple[str, str]] = None  # (reason, message) once the Job failed (condition Failed)
    failed_at: float = 0.0  # when it met the failure criterion
    #: its pods being deleted that have not ended yet (``status.terminating``)
    terminating: int = 0
    complete: bool = False
    ready: bool = False
    active: int = 0
    ready_pods: int = 0
    #: uids of the pods the Job controller deleted when the Job failed: the real one counts them as failed too,
    #: once (not again when such a pod then ends Failed)
    failed_on_finish: set = field(default_factory=set)
    #: created suspended, then resumed (the real JobSet creates its first Jobs while it is suspended)
    resumed: bool = False
    start_time: Optional[str] = None
    completion_time: Optional[str] = None
    obj: Optional[dict] = None  # the Job object, once created

    @property
    def finished(self) -> bool:
        return self.complete or self.failure is not None

    @property
    def stopping(self) -> bool:
        """Failing, its pods not all ended yet: no new pod, no terminal condition."""
        return self.failure_target is not None and self.failure is None


def pod_failure_policy_match(job_spec: dict, pod: dict) -> Optional[tuple[str, str]]:
    """(action, message) of the first ``podFailurePolicy`` rule matching a failed pod (the Job
    controller's order: rules in order; an exit-code rule looks at each container's exit code)."""
    meta, status = pod["metadata"], pod.get("status") or {}
    for index, rule in enumerate((job_spec.get("podFailurePolicy") or {}).get("rules") or []):
        action = rule.get("action")
        codes = rule.get("onExitCodes")
        if codes:
            sidecars = {
                c["name"]
                for c in (pod.get("spec") or {}).get("initContainers") or []
                if c.get("restartPolicy") == "Always"
            }
            statuses = list(status.get("containerStatuses") or []) + [
                s for s in status.get("initContainerStatuses") or [] if s.get("name") not in sidecars
            ]
            for container in statuses:
                if codes.get("containerName") and container.get("name") != codes["containerName"]:
                    continue
                code = ((container.get("state") or {}).get("terminated") or {}).get("exitCode")
                if code is None or code == 0:
                    continue
                if (code in codes.get("values", [])) == (codes.get("operator") == "In"):
                    return action, (
                        f"Container {container['name']} for pod {meta['namespace']}/{meta['name']} "
                        f"failed with exit code {code} matching {action} rule at index {index}"
                    )
        for wanted in rule.get("onPodConditions") or []:
            if any(
                c.get("type") == wanted.get("type") and c.get("status") == wanted.get("status", "True")
                for c in status.get("conditions") or []
            ):
                return action, (
                    f"Pod {meta['namespace']}/{meta['name']} has condition {wanted['type']} matching "
                    f"{action} rule at index {index}"
                )
    return None


def set_job_condition(conditions: list[dict], type_: str, status: str, reason: str, message: str) -> None:
    """A Job condition: like other conditions, plus the lastProbeTime the Job controller writes."""
    existing = next((c for c in conditions if c["type"] == type_), None)
    if existing is not None and (existing["status"], existing["reason"], existing["message"]) == (
        status,
        reason,
        message,
    ):
        return
    now = now_rfc3339()
    set_condition(conditions, type_, status, reason, message)
    condition = next(c for c in conditions if c["type"] == type_)
    condition["lastProbeTime"] = now


def completed_indexes(indexes: set) -> str:
    """The Job controller's compressed list of indexes: runs of three or more as `first-last`
    ("0-3,5,6"), a pair as two numbers."""
    runs: list[list[int]] = []
    for index in sorted(indexes):
        if runs and index == runs[-1][1] + 1:
            runs[-1][1] = index
        else:
            runs.append([index, index])
    parts = []
    for first, last in runs:
        parts.append(str(first) if first == last else f"{first},{last}" if last == first + 1 else f"{first}-{last}")
    return ",".join(parts)


def set_job_suspend(job: dict, uid: str, suspended: bool) -> Optional[dict]:
    if job["metadata"]["uid"] != uid or job["spec"].get("suspend") == suspended:
        return None
    job["spec"]["suspend"] = suspended
    return job


def build_pod(job: dict, index: int) -> dict:
    """The pod the Job controller creates for completion `index` of `job` (a stored Job), as the API
    server and JobSet's pod webhook leave it."""
    template = copy.deepcopy(job["spec"]["template"])
    metadata = template.get("metadata") or {}
    pod_spec = template.get("spec") or {}
    name = job["metadata"]["name"]
    pod_spec["hostname"] = f"{name}-{index}"
    for container in (pod_spec.get("initContainers") or []) + pod_spec.get("containers", []):
        env = container.setdefault("env", [])
        if not any(e.get("name") == "JOB_COMPLETION_INDEX" for e in env):
            env.append(
                {"name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef": {"fieldPath": JOB_COMPLETION_INDEX_FIELD}}}
            )
    pod: dict = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": f"{name}-{index}-",  # the API server names it, after its mutating admission
            "namespace": job["metadata"]["namespace"],
            "labels": {**(metadata.get("labels") or {}), C.COMPLETION_INDEX_LABEL: str(index)},
            "annotations": {**(metadata.get("annotations") or {}), C.COMPLETION_INDEX_ANNOTATION: str(index)},
            "finalizers": [JOB_TRACKING_FINALIZER],
            "ownerReferences": [controller_ref(job)],
        },
        "spec": pod_spec,
    }
    apply_pod_defaults(pod)
    return pod


def label_priority(pod: dict) -> None:
    """JobSet's pod webhook (a mutating webhook: after the Priority plugin set the pod's priority)."""
    pod["metadata"]["labels"][PRIORITY_LABEL] = str(pod["spec"]["priority"])
