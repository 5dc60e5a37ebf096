"""``nemo-kubeflow doctor``: what a cluster offers an executor configuration, checked before the first job.

Each check prints one line: ``ok``, ``warn`` (a feature is unavailable, or something could not be
looked at) or ``FAIL`` (a job cannot run as configured), each warn and FAIL with its fix. The exit code
is 1 when any check failed, else 0. Every look is a read, or a server-side dry run (nothing is written);
a look that fails says so and is never read as a state. The configuration is checked first; a kubeconfig
that cannot be read or a server that does not answer is one FAIL; every run ends, in a verdict line,
within ``DOCTOR_WITHIN_S`` seconds of requests.
"""

from __future__ import annotations

import argparse
import functools
import re
from dataclasses import dataclass
from typing import Any, Callable, Optional

from nemo_kubeflow.cluster.client import KubernetesCluster
from nemo_kubeflow.cluster.versions import (
    format_version,
    jobset_ttl,
    keeps_failed_jobs_failed,
    trainer_version,
    ttl_loop_problem,
)
from nemo_kubeflow.constants import (
    CLUSTER_RUNTIME_KIND,
    CLUSTER_RUNTIME_PLURAL,
    CLUSTERQUEUE_KIND,
    JOBSET_GROUP,
    JOBSET_VERSION,
    KUEUE_GROUP,
    KUEUE_V1BETA1_UNSERVED_SINCE,
    KUEUE_V1BETA2_SINCE,
    KUEUE_VERSIONS,
    LOCALQUEUE_KIND,
    RUNTIME_PLURAL,
    TRAINER_FOR_KUEUE_017,
    TRAINER_GROUP,
    TRAINER_UPGRADE_THROUGH,
    TRAINER_VERSION,
    TRAINJOB_PLURAL,
)
from nemo_kubeflow.errors import (
    ClusterError,
    ClusterUnreachableError,
    ConfigError,
    DeadlineExceededError,
    KubeconfigError,
    NemoKubeflowError,
)

#: The Pod Security Standards levels, least to most permissive, and the namespace label that enforces one.
POD_SECURITY_LEVELS = ("restricted", "baseline", "privileged")
POD_SECURITY_ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"

#: The API server must answer doctor's first request (its tries and waits together) within this many seconds.
ANSWER_WITHIN_S = 10
#: All of doctor's requests together end within this many seconds (the first's included): doctor is bounded.
DOCTOR_WITHIN_S = 30

#: The fix of an unreachable cluster or an unreadable kubeconfig.
#: What the TLS handshake's failure says when the kubeconfig's CA does not sign the server's certificate.
_TLS_FAILURE = "CERTIFICATE_VERIFY_FAILED"
TLS_FIX = (
    "the kubeconfig's cluster certificate-authority(-data) is not the CA that signed the API server's "
    "certificate (a rotated CA, or another cluster's kubeconfig): get the cluster's current kubeconfig"
)
REACH_FIX = (
    "check the kubeconfig path (--kubeconfig, the executor's kubeconfig=, $KUBECONFIG) and its context "
    "(--context), the server address in it, your network/VPN, and that the cluster is up (kubectl cluster-info)"
)


@dataclass(frozen=True)
class Right:
    """A verb the product uses, and what a user without it cannot do."""

    verb: str
    resource: str
    group: str = ""
    subresource: str = ""
    cluster_scoped: bool = False
    #: What is unavailable without it.
    disables: str = ""
    #: Without it no job can be submitted (with this executor configuration).
    required: bool = False
    #: The other way out of a missing required right (a setting to drop), for its fix.
    instead: str = ""

    def __str__(self) -> str:
        what = f"{self.resource}/{self.subresource}" if self.subresource else self.resource
        return f"{self.verb} {what}" + (f".{self.group}" if self.group else "")


def rights(executor: Any) -> list[Right]:
    """The rights the product uses with this executor configuration, each with what it serves."""
    queued = bool(executor.queue_name)
    runtime_plural = CLUSTER_RUNTIME_PLURAL if executor.runtime_kind == CLUSTER_RUNTIME_KIND else RUNTIME_PLURAL
    cluster_runtime = executor.runtime_kind == CLUSTER_RUNTIME_KIND
    found = [
        Right("create", TRAINJOB_PLURAL, TRAINER_GROUP, disables="submitting jobs", required=True),
        Right(
            "get", TRAINJOB_PLURAL, TRAINER_GROUP, disables="job status (exp.status, the attached wait)", required=True
        ),
        Right(
            "patch",
            TRAINJOB_PLURAL,
            TRAINER_GROUP,
            required=not queued,
            disables="resuming a submitted job (it is created suspended), moving a job off a failed node",
        ),
        Right("delete", TRAINJOB_PLURAL, TRAINER_GROUP, disables="cancel, rollback of a failed submission, gc"),
        Right("list", TRAINJOB_PLURAL, TRAINER_GROUP, disables="gc"),
        Right(
            "create",
            "configmaps",
            disables="submitting jobs (the code and launch script travel in ConfigMaps)",
            required=True,
        ),
        Right(
            "create",
            "secrets",
            disables="secret_env_vars (their values are sent as a Secret)",
            required=bool(executor.secret_env_vars),
            instead="drop secret_env_vars (secret_env_from or secret_key_refs use Secrets that exist)",
        ),
        Right("create", "persistentvolumeclaims", disables="volumes the executor creates (pvcs with a size)"),
        Right(
            "create",
            runtime_plural,
            TRAINER_GROUP,
            cluster_scoped=cluster_runtime,
            required=executor.runtime_name is None,
            disables="rendered runtimes: set runtime_kind='TrainingRuntime' (namespaced) or runtime_name",
        ),
        Right(
            "get",
            runtime_plural,
            TRAINER_GROUP,
            cluster_scoped=cluster_runtime,
            disables="checking runtime_name before submitting (a missing runtime fails only at the job)",
        ),
        Right("list", "pods", disables="describe's diagnosis (why a job waits or failed), logs, node avoidance"),
        Right(
            "get",
            "pods",
            subresource="log",
            disables="logs (exp.logs, nemo experiment logs), the failed rank's last lines in status",
        ),
        Right("list", "events", disables="why a pod waits (image pulls, scheduling), node avoidance"),
        Right("delete", "jobsets", JOBSET_GROUP, disables="moving a job off a failed node (avoid_failed_nodes)"),
        Right(
            "list",
            "nodes",
            cluster_scoped=True,
            disables="checking a moved job still fits, this command's GPU node check",
        ),
    ]
    if queued:
        found += [
            Right("get", "localqueues", KUEUE_GROUP, disables="checking queue_name before submitting"),
            Right("list", "workloads", KUEUE_GROUP, disables="Kueue's reason why a queued job waits"),
        ]
    return found


class Report:
    def __init__(self, out: Callable[[str], None] = print) -> None:
        self.failed = 0
        self.warned = 0
        self._out = out

    def ok(self, text: str) -> None:
        self._out(f"ok    {text}")

    def warn(self, text: str, fix: str) -> None:
        self.warned += 1
        self._say("warn  ", text, fix)

    def fail(self, text: str, fix: str) -> None:
        self.failed += 1
        self._say("FAIL  ", text, fix)

    def _say(self, tag: str, text: str, fix: str) -> None:
        self._out(f"{tag}{text}; fix: {fix}")

    def conclude(self) -> int:
        """Print the verdict and the count of warnings; the exit code (1 when a check failed)."""
        if self.failed:
            self._out(f"{self.failed} check(s) failed: a job cannot run as configured; {self.warned} warning(s)")
            return 1
        self._out(f"a job can run; {self.warned} warning(s)")
        return 0


def _read(what: str, report: Report, look: Callable[[], Any]) -> tuple[bool, Any]:
    """(True, the answer), or (False, None) with a warning that the look failed. A server that stopped
    answering (``ClusterUnreachableError``) ends the checks: raised."""
    try:
        return True, look()
    except ClusterUnreachableError:
        raise
    except ClusterError as e:
        report.warn(
            f"{what}: could not look ({e})",
            "with 'forbidden' ask an admin for the right to read it, else what the message names",
        )
        return False, None


def check_apis(cluster: KubernetesCluster, report: Report) -> dict[str, tuple[str, ...]]:
    served: dict[str, tuple[str, ...]] = {}
    for group, wanted, what in (
        (TRAINER_GROUP, TRAINER_VERSION, "Kubeflow Trainer"),
        (JOBSET_GROUP, JOBSET_VERSION, "JobSet"),
    ):
        _check_api(cluster, report, served, group, wanted, what)
    looked, versions = _read(f"Kueue API ({KUEUE_GROUP})", report, lambda: cluster.served_versions(KUEUE_GROUP))
    if looked:
        served[KUEUE_GROUP] = versions
        _report_kueue_versions(report, versions)
    return served


def _check_api(
    cluster: KubernetesCluster, report: Report, served: dict[str, tuple[str, ...]], group: str, wanted: str, what: str
) -> None:
    """Whether ``group`` serves the version ``wanted`` (``what``: the project that installs it); the versions
    it serves go into ``served`` when they could be read."""
    looked, versions = _read(f"{what} API ({group})", report, functools.partial(cluster.served_versions, group))
    if not looked:
        return
    served[group] = versions
    if wanted in versions:
        report.ok(f"{what} API served: {group}/{wanted}")
    else:
        report.fail(
            f"{what} API {group}/{wanted} is not served (served: {', '.join(versions) or 'none'})",
            f"install {what} (Trainer v2.3 installs JobSet with it)",
        )


def _report_kueue_versions(report: Report, versions: tuple[str, ...]) -> None:
    """Whether Kueue is installed, and in which of its served versions nemo_kubeflow reads it."""
    used = next((v for v in KUEUE_VERSIONS if v in versions), None)
    if not versions:
        report.ok("Kueue is not installed (queue_name unavailable)")
    elif used is None:
        report.warn(
            f"Kueue serves {', '.join(versions)}, none of which nemo_kubeflow reads ({', '.join(KUEUE_VERSIONS)})",
            f"upgrade Kueue to {KUEUE_V1BETA2_SINCE} or later",
        )
    elif "v1beta1" not in versions:
        report.ok(
            f"Kueue serves {', '.join(versions)} (v1beta1 unserved, as Kueue "
            f"{KUEUE_V1BETA1_UNSERVED_SINCE}+ ships): read in {used}"
        )
    else:
        report.ok(f"Kueue serves {', '.join(versions)}: read in {used}")


def check_trainer(cluster: KubernetesCluster, report: Report, served: dict[str, tuple[str, ...]]) -> Optional[tuple]:
    version, why = trainer_version(cluster)
    if version is None:
        report.warn(
            f"Trainer version unknown: {why}",
            "install Trainer with its manifests or Helm chart (they publish the version), or ask an admin",
        )
        return None
    report.ok(f"Trainer {format_version(version)}")
    _report_known_bad(report, version, served)
    return version


def _report_known_bad(report: Report, version: tuple, served: dict[str, tuple[str, ...]]) -> None:
    """What this Trainer version is known to get wrong: its upgrade path, with Kueue, with a JobSet TTL."""
    if version < TRAINER_UPGRADE_THROUGH:
        report.warn(
            f"Trainer {format_version(version)} predates v2.3: clusters on v2.0 to v2.2 must upgrade "
            "through v2.3 before any later version",
            "upgrade Trainer to v2.3 first",
        )
    if served.get(KUEUE_GROUP) and version < TRAINER_FOR_KUEUE_017:
        report.fail(
            f"Kueue is installed and Trainer is {format_version(version)}: Kueue v0.17 and later need "
            f"Trainer {format_version(TRAINER_FOR_KUEUE_017)} or later (TrainJob runtimePatches)",
            "upgrade Trainer",
        )
    if not keeps_failed_jobs_failed(version):
        report.ok(
            f"Trainer {format_version(version)} reruns a failed job whose JobSet is deleted (trainer#3779): "
            "nemo_kubeflow sends no JobSet TTL; ttl_seconds_after_finished works with gc --expired"
        )


def check_crd_fields(cluster: KubernetesCluster, report: Report, version: Optional[tuple]) -> None:
    """Whether the TrainJob CRD has runtimePatches (read from the CRD, which needs a cluster right; else
    from the version)."""
    looked, crd = _read(
        "TrainJob CRD", report, lambda: cluster.get("CustomResourceDefinition", f"{TRAINJOB_PLURAL}.{TRAINER_GROUP}")
    )
    if not looked or crd is None:
        _report_patches_by_version(report, version)
    elif _has_runtime_patches(crd):
        report.ok("TrainJob CRD has spec.runtimePatches")
    else:
        report.fail("the TrainJob CRD has no spec.runtimePatches (Trainer before v2.2)", "upgrade Trainer")


def _report_patches_by_version(report: Report, version: Optional[tuple]) -> None:
    """The CRD could not be read: whether the Trainer version has TrainJob runtimePatches."""
    if version is None:
        report.warn(
            "whether the TrainJob CRD has spec.runtimePatches is unknown (the CRD could not be read, "
            "the Trainer version is unknown); the dry run below tries a TrainJob",
            "ask an admin for the right to read CustomResourceDefinitions, or which Trainer version is installed",
        )
    elif version < TRAINER_FOR_KUEUE_017:
        report.fail(f"Trainer {format_version(version)} has no TrainJob runtimePatches", "upgrade Trainer")
    else:
        report.ok(
            f"TrainJob spec.runtimePatches: served by Trainer {format_version(version)} (the CRD itself "
            "could not be read)"
        )


def _has_runtime_patches(crd: dict) -> bool:
    """Whether the TrainJob CRD's schema of the version we send has ``spec.runtimePatches``."""
    from nemo_kubeflow.observe.status import nested

    versions = {v.get("name"): v for v in nested(crd, "spec", "versions", default=[])}
    spec = nested(
        versions.get(TRAINER_VERSION), "schema", "openAPIV3Schema", "properties", "spec", "properties", default={}
    )
    return "runtimePatches" in spec


def check_rights(cluster: KubernetesCluster, report: Report, executor: Any, namespace: str) -> None:
    for right in rights(executor):
        looked, allowed = _read(
            f"may {right}",
            report,
            functools.partial(
                cluster.may,
                right.verb,
                right.resource,
                group=right.group,
                subresource=right.subresource,
                namespace=None if right.cluster_scoped else namespace,
            ),
        )
        if looked:
            _report_right(report, right, allowed, "" if right.cluster_scoped else f" in {namespace}")


def _report_right(report: Report, right: Right, allowed: bool, where: str) -> None:
    """ok when ``allowed``; else FAIL for a right every job needs, warn (what is unavailable) for another."""
    if allowed:
        report.ok(f"may {right}{where}")
    elif right.required:
        instead = f", or {right.instead}" if right.instead else ""
        report.fail(f"may not {right}{where}: no {right.disables}", f"ask an admin for RBAC: {right}{where}{instead}")
    else:
        report.warn(
            f"may not {right}{where}: unavailable: {right.disables}",
            f"ask an admin for RBAC: {right}{where}, if you need it",
        )


def needed_pod_security(executor: Any) -> tuple[str, str]:
    """The least Pod Security level the job's pods pass, and why."""
    from nemo_kubeflow.parts import fabrics

    privileges = fabrics.build_fabric(executor).privileges()
    if privileges:
        return "privileged", f"the {fabrics.fabric_name(executor)} fabric needs {', '.join(privileges)}"
    if getattr(executor, "restricted_security", False):
        return "restricted", "restricted_security=True"
    return "baseline", "default pods (no host namespaces, host paths or added capabilities)"


def check_pod_security(cluster: KubernetesCluster, report: Report, executor: Any, namespace: str) -> None:
    from nemo_kubeflow.observe.status import nested

    level, why = needed_pod_security(executor)
    looked, ns = _read(f"namespace {namespace}", report, lambda: cluster.get("Namespace", namespace))
    if not looked:
        report.warn(
            f"Pod Security of namespace {namespace} unknown; the pods need {level!r} ({why})",
            f"ask an admin for RBAC: get namespaces, or which {POD_SECURITY_ENFORCE_LABEL} level {namespace} has",
        )
        return
    if ns is None:
        report.fail(f"namespace {namespace} does not exist", "create it, or set the executor's namespace")
        return
    enforced = nested(ns, "metadata", "labels", default={}).get(POD_SECURITY_ENFORCE_LABEL, "privileged")
    if _admits(enforced, level):
        if not _report_pod_security_violations(cluster, report, executor, namespace, ns):
            report.ok(f"namespace {namespace} enforces Pod Security {enforced!r}; the pods need {level!r} ({why})")
    else:
        report.fail(
            f"namespace {namespace} enforces Pod Security {enforced!r}, the pods need {level!r} ({why})",
            _pod_security_fix(level),
        )


def _report_pod_security_violations(
    cluster: KubernetesCluster, report: Report, executor: Any, namespace: str, ns: dict
) -> bool:
    """The Pod Security Standards' checks of the namespace's level on the job's pods (as the submission runs
    them): a FAIL per replicated job whose pods break it, in PodSecurity admission's words. Whether any did."""
    from nemo_kubeflow.schema import pod_security

    level, version = pod_security.enforced_level(ns)
    if level not in ("baseline", "restricted"):
        return False
    failed = False
    for jp in _job_pods(cluster, report, executor, namespace) or []:
        found = pod_security.violations(level, jp.spec)
        if found:
            failed = True
            report.fail(
                f'namespace {namespace} refuses the pods of replicated job "{jp.job}": '
                f"{pod_security.message(level, version, found)}",
                "; or ".join(pod_security.fixes(found, admin_runtime=executor.runtime_name is not None)),
            )
    return failed


def _pod_security_fix(level: str) -> str:
    """How to admit pods that need Pod Security ``level``."""
    also = "" if level == "privileged" else ", or restricted_security=True for 'restricted'"
    return f"a namespace labelled {POD_SECURITY_ENFORCE_LABEL}={level} (or laxer){also}"


def _admits(enforced: str, level: str) -> bool:
    """Whether a namespace enforcing Pod Security level ``enforced`` admits pods that need ``level`` (a level
    Kubernetes does not know enforces nothing we can tell: admitted)."""
    if enforced not in POD_SECURITY_LEVELS:
        return True
    return POD_SECURITY_LEVELS.index(enforced) >= POD_SECURITY_LEVELS.index(level)


def check_queue(
    cluster: KubernetesCluster, report: Report, executor: Any, namespace: str, served: dict[str, tuple[str, ...]]
) -> None:
    queue = executor.queue_name
    if not queue:
        return
    if not served.get(KUEUE_GROUP):
        report.fail(f"queue_name={queue!r} but Kueue is not installed", "install Kueue, or leave queue_name unset")
        return
    cluster_queue = _check_local_queue(cluster, report, queue, namespace)
    if cluster_queue is not None:
        _check_cluster_queue(cluster, report, queue, cluster_queue)


def _check_cluster_queue(cluster: KubernetesCluster, report: Report, queue: str, cluster_queue: str) -> None:
    """The ClusterQueue the LocalQueue ``queue`` sends jobs to exists and is active."""
    from nemo_kubeflow.observe.status import nested

    looked, found = _read(
        f"ClusterQueue {cluster_queue}", report, lambda: cluster.get(CLUSTERQUEUE_KIND, cluster_queue)
    )
    if not looked:
        return
    if found is None:
        report.fail(
            f"LocalQueue {queue} sends jobs to ClusterQueue {cluster_queue!r}, which does not exist",
            "ask an admin to create it",
        )
        return
    active = _active_condition(found)
    if nested(active, "status") == "True":
        report.ok(f"LocalQueue {queue} -> ClusterQueue {cluster_queue} (active)")
    else:
        why = f"{active.get('reason')}: {active.get('message')}" if active else "no Active condition"
        report.fail(f"ClusterQueue {cluster_queue} is not active ({why})", "ask an admin to fix the ClusterQueue")


def _active_condition(cluster_queue: dict) -> Optional[dict]:
    from nemo_kubeflow.observe.status import nested

    return next(
        (c for c in nested(cluster_queue, "status", "conditions", default=[]) if c.get("type") == "Active"), None
    )


def _check_local_queue(cluster: KubernetesCluster, report: Report, queue: str, namespace: str) -> Optional[str]:
    """Check the LocalQueue ``queue``: it exists and is not stopped. Its ClusterQueue's name; ``None`` when the
    LocalQueue could not be read or does not exist (said)."""
    looked, local_queue = _read(f"LocalQueue {queue}", report, lambda: cluster.get(LOCALQUEUE_KIND, queue, namespace))
    if not looked:
        return None
    if local_queue is None:
        report.fail(
            f"no LocalQueue {queue!r} in namespace {namespace}", "ask an admin for the LocalQueue, or fix queue_name"
        )
        return None
    spec = local_queue.get("spec") or {}
    if spec.get("stopPolicy", "None") != "None":
        report.fail(
            f"LocalQueue {queue} is stopped (stopPolicy {spec['stopPolicy']}): jobs wait",
            "ask an admin to set its stopPolicy to None",
        )
    return spec.get("clusterQueue", "")


def check_runtime(
    cluster: KubernetesCluster,
    report: Report,
    executor: Any,
    namespace: str,
    version: Optional[tuple],
    why_unknown: str,
) -> None:
    name = executor.runtime_name
    if name is None:
        report.ok(f"runtime: rendered by nemo_kubeflow as a {executor.runtime_kind} (no JobSet TTL)")
        return
    kind = executor.runtime_kind
    looked, runtime = _read(
        f"{kind} {name}", report, lambda: cluster.get(kind, name, None if kind == CLUSTER_RUNTIME_KIND else namespace)
    )
    if not looked:
        return
    if runtime is None:
        report.fail(f"runtime_name={name!r}: no {kind} of that name", "fix runtime_name, or leave it unset")
        return
    _report_runtime_ttl(report, f"{kind} {name}", runtime, version, why_unknown)


def _report_runtime_ttl(report: Report, what: str, runtime: dict, version: Optional[tuple], why_unknown: str) -> None:
    """The named runtime (``what``: kind and name) exists: FAIL when its JobSet TTL makes a failed job run
    again forever on this Trainer."""
    problem = ttl_loop_problem(runtime, version, why_unknown)
    if problem:
        report.fail(
            problem,
            "remove the JobSet ttlSecondsAfterFinished from that runtime (use the executor's "
            "ttl_seconds_after_finished with gc --expired), or upgrade Trainer to v2.4.0 or later",
        )
        return
    ttl = jobset_ttl(runtime)
    report.ok(f"runtime {what} exists" + (f" (JobSet TTL {ttl}, safe on this Trainer)" if ttl else ""))


def check_nodes(cluster: KubernetesCluster, report: Report, executor: Any) -> None:
    looked, nodes = _read("nodes", report, lambda: cluster.list("Node", None))
    if not looked:
        return
    gpus, resource, selector = executor.gpus_per_node, executor.gpu_resource_name, dict(executor.node_selector)
    fitting = [n["metadata"]["name"] for n in nodes if _fits(n, gpus, resource, selector)]
    what = _node_offer(gpus, resource, selector)
    needed = executor.nodes if gpus else 1  # CPU pods may share a node
    if not nodes:
        report.warn(
            "the cluster lists no nodes (a local cluster without node agents?): the GPU and node "
            "selector check found nothing to look at",
            "on a real cluster, ask an admin why no nodes are listed; on the local cluster, nothing to do",
        )
    elif len(fitting) >= needed:
        report.ok(f"{len(fitting)} node(s) offer {what} (the job needs {needed})")
    else:
        report.fail(
            f"{len(fitting)} node(s) offer {what}; the job needs {needed}",
            "fix gpus_per_node, gpu_resource_name or node_selector, or add nodes",
        )


def _node_offer(gpus: int, resource: str, selector: dict[str, str]) -> str:
    """What a node must offer the job's pod, in words."""
    return (f"{gpus} {resource}" if gpus else "room for a CPU pod") + (f", labels {selector}" if selector else "")


def _fits(node: dict, gpus: int, resource: str, selector: dict[str, str]) -> bool:
    """Whether ``node`` has the ``selector`` labels and offers ``gpus`` of ``resource`` (any node, without GPUs)."""
    from nemo_kubeflow.observe.status import nested

    if not _has_labels(node, selector):
        return False
    offered = str(nested(node, "status", "allocatable", default={}).get(resource, "0"))
    return gpus == 0 or (offered.isdigit() and int(offered) >= gpus)


def _has_labels(node: dict, selector: dict[str, str]) -> bool:
    labels = node["metadata"].get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


def check_namespace_fit(cluster: KubernetesCluster, report: Report, executor: Any, namespace: str) -> None:
    """The namespace's LimitRanges (their bounds) and ResourceQuotas (used/hard of each resource, and what one
    job of this configuration asks) against the job's pods; FAIL for what the submission would refuse."""
    from nemo_kubeflow.schema import namespace_fit

    pods = _job_pods(cluster, report, executor, namespace)
    if pods is None:
        return
    looked, limit_ranges = _read(f"LimitRanges in {namespace}", report, lambda: cluster.list("LimitRange", namespace))
    if looked:
        _report_limit_ranges(report, namespace, limit_ranges)
        pods = namespace_fit.with_limit_range_defaults(pods, limit_ranges)
        for problem in namespace_fit.limit_range_problems(pods, limit_ranges, executor.gpu_resource_name):
            report.fail(*problem.split("; fix: ", 1))
    looked, quotas = _read(f"ResourceQuotas in {namespace}", report, lambda: cluster.list("ResourceQuota", namespace))
    if looked:
        _report_quotas(report, namespace, pods, quotas, executor.gpu_resource_name)


def _job_pods(cluster: KubernetesCluster, report: Report, executor: Any, namespace: str) -> Optional[list]:
    """The pods of one job of this configuration (with ``runtime_name``, on that runtime as read); ``None``
    (said) when they cannot be known."""
    from nemo_kubeflow.cli.render import render_submission
    from nemo_kubeflow.schema.job_pods import job_pods

    try:
        sub = render_submission(executor, ["true"], name="doctor", experiment_id="doctor_0")
    except NemoKubeflowError:
        return None  # the dry run below says why
    runtime = sub.runtime
    if runtime is None:
        kind, name = executor.runtime_kind, executor.runtime_name
        where = None if kind == CLUSTER_RUNTIME_KIND else namespace
        looked, runtime = _read(f"{kind} {name}", report, lambda: cluster.get(kind, name, where))
        if not looked or runtime is None:
            return None  # said: by _read, or by the runtime check above
    return job_pods(sub.trainjob, runtime)


def _report_limit_ranges(report: Report, namespace: str, limit_ranges: list[dict]) -> None:
    if not limit_ranges:
        report.ok(f"no LimitRanges in {namespace}")
    for lr in limit_ranges:
        for item in lr.get("spec", {}).get("limits") or []:
            bounds = ", ".join(
                f"{key} {', '.join(f'{r}={v}' for r, v in sorted(item[key].items()))}"
                for key in ("min", "max", "default", "defaultRequest", "maxLimitRequestRatio")
                if item.get(key)
            )
            report.ok(f"LimitRange {lr['metadata']['name']} ({item.get('type')}): {bounds or 'no bounds'}")


def _report_quotas(report: Report, namespace: str, pods: list, quotas: list[dict], gpu_resource: str) -> None:
    """Each quota's headroom against one job: ok when it fits what is free, warn when it waits for more, FAIL
    when it asks more than the quota's hard limit (or sets no cpu/memory that a quota counts)."""
    from nemo_kubeflow.schema import namespace_fit

    if not quotas:
        report.ok(f"no ResourceQuotas in {namespace}")
        return
    for line in namespace_fit.quota_lines(pods, quotas):
        if line.asked > line.hard:
            report.fail(
                f"{line}: more than its hard limit",
                "lower what one job asks (nodes, resources), or ask an admin to raise the quota",
            )
        elif line.asked > line.hard - line.used:
            report.warn(f"{line}: more than is free now (the job waits)", "wait for other jobs to end, or ask less")
        else:
            report.ok(str(line))
    for refusal in namespace_fit.quota_fit(pods, quotas, gpu_resource).refusals:
        if "must specify" in refusal:
            report.fail(*refusal.split("; fix: ", 1))


#: The policy engines' kinds doctor lists (cluster-scoped, admissionregistration.k8s.io), and their plurals.
_POLICY_KINDS = {
    "ValidatingWebhookConfiguration": "validatingwebhookconfigurations",
    "MutatingWebhookConfiguration": "mutatingwebhookconfigurations",
    "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
    "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
}


def check_policies(cluster: KubernetesCluster, report: Report, namespace: str) -> None:
    """The policy engines that take part in creating a job's objects in ``namespace``: admission webhooks
    (Kyverno, Gatekeeper and others register as these) and bound ValidatingAdmissionPolicies, as facts. Kinds
    that could not be listed are one warning naming them: never read as "none"."""
    from nemo_kubeflow.observe.status import nested
    from nemo_kubeflow.schema import policy_match

    looked, ns = _read(f"namespace {namespace}", report, lambda: cluster.get("Namespace", namespace))
    if not looked or ns is None:
        return
    listed: dict[str, list[dict]] = {}
    unlisted: list[str] = []
    for kind in _POLICY_KINDS:
        try:
            listed[kind] = cluster.list(kind, None)
        except ClusterUnreachableError:
            raise
        except ClusterError as e:
            unlisted.append(f"{_POLICY_KINDS[kind]} ({e.reason or e.status})")
    labels = nested(ns, "metadata", "labels", default={})
    found = [
        m
        for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration")
        for m in policy_match.matching_webhooks(kind, listed.get(kind, []), labels)
    ] + policy_match.matching_policies(
        listed.get("ValidatingAdmissionPolicy", []), listed.get("ValidatingAdmissionPolicyBinding", []), labels
    )
    for match in found:
        report.ok(f"admission: {match} in {namespace}")
    if unlisted:
        report.warn(
            f"admission: could not list {', '.join(unlisted)}: the policy engines that may refuse a job's objects "
            f"in {namespace} are unknown{' beyond those above' if found else ''}",
            "ask an admin for a ClusterRole with list on those admissionregistration.k8s.io resources, or which "
            "webhooks and policies apply to the namespace",
        )
    elif not found:
        report.ok(f"admission: no webhook or ValidatingAdmissionPolicy matches a job's objects in {namespace}")


def check_dry_run(cluster: KubernetesCluster, report: Report, executor: Any, namespace: str) -> None:
    """A server-side dry run of the job's runtime (when rendered) and TrainJob: CRD schemas, Trainer's
    webhooks (and JobSet's through the runtime's JobSet template)."""
    from nemo_kubeflow.cli.render import render_submission

    try:
        sub = render_submission(executor, ["true"], name="doctor", experiment_id="doctor_0")
    except NemoKubeflowError as e:  # e.g. a runtime_template that cannot be read or rendered
        report.fail(f"cannot render the job: {_first_clause(e)}", "fix the setting or template the message names")
        return
    objects = ([sub.runtime] if sub.runtime is not None else []) + [sub.trainjob]
    for obj in objects:
        what = f"{obj['kind']} {obj['metadata']['name']}"
        try:
            cluster.create(obj, dry_run=True)
        except ClusterUnreachableError:
            raise
        except ClusterError as e:
            # A TrainJob whose rendered runtime is not there yet: the runtime is created at submission.
            _report_refused_dry_run(report, what, e, runtime_pending=obj is sub.trainjob and sub.runtime is not None)
            continue
        report.ok(f"dry run of {what}: accepted (schema and webhooks)")


def _report_refused_dry_run(report: Report, what: str, error: ClusterError, runtime_pending: bool) -> None:
    """What a dry run the server refused says: exists already, a webhook down, the rendered runtime not yet
    created (``runtime_pending``), not allowed, or a refusal to fix."""
    if error.status == 409:
        report.ok(f"dry run of {what}: exists already")
        return
    text = error.server_message or str(error)
    if _webhook_unanswered(error, text):
        report.fail(
            f"dry run of {what}: a webhook did not answer ({text})",
            "check the Trainer/JobSet controller pods and their webhook Services",
        )
    elif runtime_pending and "not found" in text.lower():
        report.ok(f"dry run of {what}: Trainer's webhook answered (the rendered runtime is created at submission)")
    elif error.status == 403 and "admission webhook" not in text:
        report.warn(f"dry run of {what}: not allowed ({text})", f"ask an admin for RBAC: create {what.split()[0]}")
    else:
        report.fail(f"dry run of {what} refused: {text}", "fix what the message names")


def _webhook_unanswered(error: ClusterError, text: str) -> bool:
    """Whether a refusal (``text``: the server's message) says that a webhook could not be called, or the
    server failed (5xx)."""
    return "failed calling webhook" in text or (error.status or 0) >= 500


def run_doctor(
    executor: Any,
    *,
    namespace: Optional[str] = None,
    kubeconfig: Optional[str] = None,
    context: Optional[str] = None,
    out: Callable[[str], None] = print,
) -> int:
    """Check the cluster for ``executor``; 0 when a job can run, 1 otherwise. The configuration is checked
    first, then whether the cluster answers (each one FAIL line, then the verdict); every request ends within
    ``DOCTOR_WITHIN_S`` seconds, the first within ``ANSWER_WITHIN_S``."""
    report = Report(out)
    if check_config(report, executor):
        namespace = namespace or executor.namespace
        cluster = KubernetesCluster(kubeconfig or executor.kubeconfig, context or executor.kube_context)
        try:
            with cluster.deadline(DOCTOR_WITHIN_S):
                if check_reach(cluster, report):
                    _check_cluster(cluster, report, executor, namespace)
        except ClusterUnreachableError as e:
            _report_stopped(report, cluster, e)
    return report.conclude()


def _check_cluster(cluster: KubernetesCluster, report: Report, executor: Any, namespace: str) -> None:
    served = check_apis(cluster, report)
    version = check_trainer(cluster, report, served)
    _, why_unknown = trainer_version(cluster) if version is None else (None, "")
    check_crd_fields(cluster, report, version)
    check_rights(cluster, report, executor, namespace)
    check_pod_security(cluster, report, executor, namespace)
    check_queue(cluster, report, executor, namespace, served)
    check_runtime(cluster, report, executor, namespace, version, why_unknown)
    check_nodes(cluster, report, executor)
    check_namespace_fit(cluster, report, executor, namespace)
    check_policies(cluster, report, namespace)
    check_dry_run(cluster, report, executor, namespace)


def check_config(report: Report, executor: Any) -> bool:
    """Whether the executor configuration is valid; each problem a FAIL naming its field (before any look at
    the cluster)."""
    try:
        executor.validate()
        return True
    except ConfigError as e:
        problems = [p.strip()[2:] for p in str(e).splitlines() if p.strip().startswith("- ")] or [str(e)]
    for problem in problems:
        report_config_problem(report, problem)
    return False


def report_config_problem(report: Report, problem: str) -> None:
    """A configuration problem (it names its field first) as a FAIL with its fix."""
    field = re.match(r"[A-Za-z_]\w*", problem)
    name = field.group(0) if field else "the field"
    report.fail(
        f"configuration: {problem}",
        f"give {name} a valid value (--set {name}=..., or in the executor file or factory)",
    )


def check_reach(cluster: KubernetesCluster, report: Report) -> bool:
    """Whether the kubeconfig loads and the API server answers one request within ``ANSWER_WITHIN_S``; else
    one FAIL saying which."""
    try:
        with cluster.deadline(ANSWER_WITHIN_S):
            cluster.served_versions(TRAINER_GROUP)
        return True
    except KubeconfigError as e:
        report.fail(f"cannot read the kubeconfig: {_first_clause(e)}", REACH_FIX)
    except ClusterUnreachableError as e:
        report.fail(f"cannot reach the cluster: {_unanswered(cluster, e, ANSWER_WITHIN_S)}", REACH_FIX)
    except ClusterError as e:
        if _TLS_FAILURE in str(e):
            # No answer came: the kubeconfig's CA does not sign the server's certificate (a status-0 error).
            report.fail(f"cannot trust the API server's certificate: {_first_clause(e)}", TLS_FIX)
        else:
            report.fail(
                f"the API server refused doctor's first request: {_first_clause(e)}",
                "check the credentials of the kubeconfig's user (expired token?) and its context",
            )
    return False


def _report_stopped(report: Report, cluster: KubernetesCluster, error: ClusterUnreachableError) -> None:
    """The server stopped answering midway (or doctor ran out of ``DOCTOR_WITHIN_S``): one FAIL."""
    report.fail(
        f"the cluster stopped answering: {_unanswered(cluster, error, DOCTOR_WITHIN_S)}; the checks above are "
        "all that were made",
        "check that the API server is healthy (kubectl get --raw /readyz), then run doctor again",
    )


def _unanswered(cluster: KubernetesCluster, error: ClusterUnreachableError, seconds: float) -> str:
    host = getattr(cluster.api_client.configuration, "host", "?")
    how = "" if isinstance(error, DeadlineExceededError) else " (it refused or dropped the connection)"
    return f"the API server at {host} did not answer within {seconds:g} s{how}"


def _first_clause(error: Exception) -> str:
    """An error's message up to its own advice (after the first '; '): doctor gives the fix."""
    return str(error).split("; ")[0]


def cmd_doctor(args: argparse.Namespace) -> int:
    from nemo_kubeflow.cli.executor_config import load_executor

    try:
        executor = load_executor(args.factory, args.executor_file, args.set)
    except ConfigError as e:  # a --set or file the executor cannot be built from: before any cluster check
        report = Report()
        report.fail(
            f"configuration: {_first_clause(e)}", "correct the --set, factory or executor file the message names"
        )
        return report.conclude()
    if args.namespace:
        executor.namespace = args.namespace
    return run_doctor(executor, namespace=args.namespace, kubeconfig=args.kubeconfig, context=args.context)
