"""What the namespace admits, read before a submission writes anything: its Pod Security level, ResourceQuotas
and LimitRanges, and the ServiceAccount, PriorityClass and image pull Secrets the job's pods name. The checks
themselves are pure (schema/pod_security.py, schema/namespace_fit.py, on schema/job_pods.py's pods); this
module only reads. A read RBAC denies is skipped with a warning naming the read and its verb (the admission
itself still decides), never a failure; a kind the server does not serve has nothing to enforce.

Refusals raise ``NotAdmittedError`` (nothing was written); what the pods would wait for (a quota's free part)
is a warning."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from nemo_kubeflow.cluster.client import ClusterReader
from nemo_kubeflow.constants import MANAGED_BY_LABEL, MANAGED_BY_VALUE, TRAINJOB_KIND
from nemo_kubeflow.errors import NotAdmittedError, NotFoundError, PermissionDeniedError
from nemo_kubeflow.schema import namespace_fit, pod_security
from nemo_kubeflow.schema.job_pods import JobPods, job_pods

log = logging.getLogger(__name__)


@dataclass
class Findings:
    """What the reads found: refusals (the job cannot be admitted), warnings, and the reads that were skipped."""

    refusals: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def check_admission(
    cluster: ClusterReader,
    trainjob: dict,
    runtime: Optional[dict],
    gpu_resource: str,
    read_lately: Optional[dict[str, "NamespaceRules"]] = None,
) -> Findings:
    """Check the pods of ``trainjob`` on ``runtime`` against what the namespace admits; raise ``NotAdmittedError``
    for what it refuses, log the warnings and skipped reads. ``runtime`` ``None`` (an admin's runtime that could
    not be read): there are no pods to check (said)."""
    namespace = trainjob["metadata"]["namespace"]
    if runtime is None:
        log.warning(
            "the job's runtime could not be read, so its pods were not checked against namespace %r's Pod "
            "Security level, LimitRanges, ResourceQuotas and the objects they name (the cluster still enforces them)",
            namespace,
        )
    pods = job_pods(trainjob, runtime) if runtime else []
    findings = admission_findings(
        cluster, namespace, pods, gpu_resource, admin_runtime=_is_admins(runtime), read_lately=read_lately
    )
    for line in findings.skipped + findings.warnings:
        log.warning("%s", line)
    if findings.refusals:
        raise NotAdmittedError(TRAINJOB_KIND, trainjob["metadata"]["name"], namespace, findings.refusals)
    return findings


def _is_admins(runtime: Optional[dict]) -> bool:
    """Whether ``runtime`` is one we did not render (``runtime_name``: no label of ours)."""
    labels = ((runtime or {}).get("metadata") or {}).get("labels") or {}
    return labels.get(MANAGED_BY_LABEL) != MANAGED_BY_VALUE


#: How long a process reuses a namespace's rules it read (its Pod Security label, LimitRanges, ResourceQuotas):
#: the tasks of one experiment, submitted one after the other, read them once.
RULES_FRESH_S = 10.0


@dataclass
class NamespaceRules:
    """What a namespace admits, as read: ``None`` where the read failed (said in ``skipped``)."""

    namespace: Optional[dict]
    limit_ranges: Optional[list[dict]]
    quotas: Optional[list[dict]]
    read_at: float


def admission_findings(
    cluster: ClusterReader,
    namespace: str,
    pods: list[JobPods],
    gpu_resource: str,
    admin_runtime: bool = False,
    read_lately: Optional[dict[str, NamespaceRules]] = None,
) -> Findings:
    """The reads and the checks, without raising."""
    found = Findings()
    if not pods:
        return found
    reader = _Reader(cluster, namespace, found)
    rules = _rules(reader, namespace, {} if read_lately is None else read_lately)
    _pod_security(rules.namespace, namespace, pods, found, admin_runtime)
    limit_ranges = rules.limit_ranges or []
    defaulted = namespace_fit.with_limit_range_defaults(pods, limit_ranges)
    found.refusals += namespace_fit.limit_range_problems(defaulted, limit_ranges, gpu_resource)
    fit = namespace_fit.quota_fit(defaulted, rules.quotas or [], gpu_resource)
    found.refusals += fit.refusals
    found.warnings += fit.warnings
    _named_objects(reader, namespace, pods, found)
    return found


def _rules(reader: "_Reader", namespace: str, read_lately: dict[str, NamespaceRules]) -> NamespaceRules:
    """The namespace's rules: read again when this process has none of the last ``RULES_FRESH_S`` seconds."""
    known = read_lately.get(namespace)
    if known is not None and time.monotonic() - known.read_at < RULES_FRESH_S:
        return known
    rules = NamespaceRules(
        reader.get("Namespace", namespace, None, "the namespace's Pod Security level"),
        reader.list("LimitRange", "whether the pods keep within the LimitRanges' bounds"),
        reader.list("ResourceQuota", "whether the job fits the namespace's ResourceQuotas"),
        time.monotonic(),
    )
    read_lately[namespace] = rules
    return rules


def _pod_security(
    ns: Optional[dict], namespace: str, pods: list[JobPods], found: Findings, admin_runtime: bool
) -> None:
    if ns is None:
        return
    level, version = pod_security.enforced_level(ns)
    for jp in pods:
        violations = pod_security.violations(level, jp.spec)
        if violations:
            found.refusals.append(
                f"namespace {namespace!r} enforces Pod Security {level!r} (label "
                f'{pod_security.ENFORCE_LABEL}={level}), which refuses the pods of replicated job "{jp.job}": '
                f"{pod_security.message(level, version, violations)}; fix: "
                + "; or ".join(pod_security.fixes(violations, admin_runtime))
            )


def _named_objects(reader: "_Reader", namespace: str, pods: list[JobPods], found: Findings) -> None:
    """The ServiceAccounts and PriorityClasses the pods name must exist (admission refuses the pods); the image
    pull Secrets should (the pods are created, their pulls may fail)."""
    for name in _named(pods, lambda spec: [spec.get("serviceAccountName")]):
        if reader.missing("ServiceAccount", name, namespace, "that the ServiceAccount exists"):
            found.refusals.append(
                f"ServiceAccount {name!r} does not exist in namespace {namespace!r} (error looking up service "
                f'account {namespace}/{name}: serviceaccount "{name}" not found); fix: set service_account to '
                "one that exists, or ask an admin to create it"
            )
    for name in _named(pods, lambda spec: [spec.get("priorityClassName")]):
        if reader.missing("PriorityClass", name, None, "that the PriorityClass exists"):
            found.refusals.append(
                f"PriorityClass {name!r} does not exist (no PriorityClass with name {name} was found); fix: set "
                "priority_class_name to one that exists (kubectl get priorityclasses), or leave it unset"
            )
    for name in _named(pods, lambda spec: [s.get("name") for s in spec.get("imagePullSecrets") or []]):
        if reader.missing("Secret", name, namespace, "that the image pull Secret exists"):
            found.warnings.append(
                f"image pull Secret {name!r} does not exist in namespace {namespace!r}: the pods are created, but "
                "a private image cannot be pulled without it; fix: create the Secret, or drop it from "
                "image_pull_secrets"
            )


def _named(pods: list[JobPods], names: Callable[[dict], list[Any]]) -> list[str]:
    return list(dict.fromkeys(str(n) for jp in pods for n in names(jp.spec) if n))


@dataclass
class _Reader:
    """The reads, each one skipped with a note where RBAC denies it."""

    cluster: ClusterReader
    namespace: str
    found: Findings

    def get(self, kind: str, name: str, namespace: Optional[str], what: str) -> Optional[dict]:
        try:
            return self.cluster.get(kind, name, namespace)
        except PermissionDeniedError as e:
            self._skip("get", kind, namespace, what, e)
        except NotFoundError:  # a kind the server does not serve
            pass
        return None

    def list(self, kind: str, what: str) -> Optional[list[dict]]:
        try:
            return self.cluster.list(kind, self.namespace)
        except PermissionDeniedError as e:
            self._skip("list", kind, self.namespace, what, e)
        except NotFoundError:
            pass
        return None

    def missing(self, kind: str, name: str, namespace: Optional[str], what: str) -> bool:
        """Whether the object is known not to exist: a metadata-only list by name (no Secret's data is read; a
        kind the server does not serve, or a read that failed, says nothing: ``False``)."""
        try:
            return not self.cluster.list_metadata(kind, namespace, field_selector=f"metadata.name={name}")
        except PermissionDeniedError as e:
            self._skip("list", kind, namespace, what, e)
        except NotFoundError:
            pass
        return False

    def _skip(self, verb: str, kind: str, namespace: Optional[str], what: str, error: PermissionDeniedError) -> None:
        from nemo_kubeflow.cluster.kinds import KINDS

        plural = KINDS[kind].plural
        where = f" in namespace {namespace!r}" if namespace else ""
        self.found.skipped.append(
            f"cannot {verb} {plural}{where} ({error.reason or 'Forbidden'}), so {what} was not checked before "
            f"submitting (the cluster still enforces it); ask an admin for '{verb} {plural}'{where} to have it "
            "checked"
        )
