"""What the cluster's own rules refused on the way from a TrainJob to its pods, read from the Warning events a
waiting look already holds (``job_view.WAITING_EVENTS``: no request of its own). Pure.

Each object of the chain is created by the controller above it, and a refusal is recorded as a Warning event on
the object that could not make the next one: Trainer's on the TrainJob (a JobSet it cannot build), JobSet's on
the JobSet (a Job it cannot create), the Job controller's ``FailedCreate`` on each Job (``<jobset>-<replicated
job>-<index>``: a pod that a ResourceQuota, Pod Security admission, a LimitRange, the ServiceAccount admission,
a ValidatingAdmissionPolicy or a webhook refused). The controller tries again and nothing above it changes, so
the TrainJob alone says "waiting for pods".

``chain_refusal`` says the newest refusal that still holds (the object below is still missing), in the
admission's own words with the fix (``refusal_fix``): waiting (not fatal) where it may free up (a quota in use),
fatal where the job can never start as submitted (its pods break a rule of the namespace).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Optional, Sequence

from nemo_kubeflow.constants import JOBSET_KIND, TRAINJOB_KIND
from nemo_kubeflow.observe.events import event_object, event_text, event_time
from nemo_kubeflow.observe.pod_states import restart_attempt, step_of
from nemo_kubeflow.observe.restarts import jobset_restarts
from nemo_kubeflow.observe.status import nested
from nemo_kubeflow.quantity import parse_quantity

#: The Job controller's reason for a pod it could not create.
FAILED_CREATE = "FailedCreate"
#: JobSet's reason for a Job it could not create (its other Warnings, e.g. ``RestartJobSetAction`` at a gang
#: restart, say no refusal).
JOB_NOT_CREATED = "JobCreationFailed"
#: What the Job controller puts before the API server's answer.
_CREATING = "Error creating: "
#: What the event recorder puts before a message it stands for more than ten similar events.
_COMBINED = "(combined from similar events): "
#: A refused pod's name: its Job's ``generateName`` and the API server's five random characters, new at each try
#: (said as ``*``, so that a look says the same while the refusal lasts).
_GENERATED = re.compile(r'pods "([^"]+)-[a-z0-9]{5}" is forbidden')
_QUOTA = re.compile(
    r"exceeded quota: (?P<quota>[^,]+), requested: (?P<requested>\S+), used: \S+, limited: (?P<limited>\S+)"
)
_PSA = re.compile(r'violates PodSecurity "(?P<level>[a-z]+):')
_SERVICE_ACCOUNT = re.compile(r'serviceaccount "(?P<name>[^"]+)" not found')
_POLICY = re.compile(r"ValidatingAdmissionPolicy '(?P<name>[^']+)'")
_WEBHOOK = re.compile(r'admission webhook "(?P<name>[^"]+)" denied the request')
#: LimitRanger's words for a pod out of a LimitRange's bounds (``maximum cpu usage per Container is 1, but limit
#: is 2``, ``minimum memory usage per Pod is ...``, ``cpu max limit to request ratio per Container is 2, ...``).
_LIMIT_RANGE = ("maximum ", "minimum ", "max limit to request ratio")


@dataclass(frozen=True)
class Refusal:
    """A refusal of the chain that still holds: what it says (with the fix), and whether the job can never
    start as submitted."""

    message: str
    fatal: bool
    #: When it was last recorded (RFC 3339, to the second).
    when: str


def _last_seen(event: dict) -> str:
    """When an event was last recorded: a series' last observation (events.k8s.io, as JobSet and Trainer record
    them: ``eventTime`` is the first), else the event's own time."""
    return nested(event, "series", "lastObservedTime") or event_time(event)


def _second(time: str) -> str:
    """An event's or an object's time to the second (events.k8s.io times carry microseconds)."""
    return time[:19]


def _warnings_about(events: Sequence[dict], kind: str, names: Sequence[str], since: str) -> list[dict]:
    """The Warning events about the objects of ``kind`` named in ``names``, recorded at or after ``since``."""
    return [
        e
        for e in events
        if e.get("type") == "Warning"
        and event_object(e).get("kind") == kind
        and event_object(e).get("name") in names
        and _second(_last_seen(e)) >= _second(since)
    ]


def _job_pods(pods: Sequence[dict], replicated_job: str, attempt: int) -> list[dict]:
    """The pods at hand of a replicated job's current attempt, not being deleted."""
    return [
        p
        for p in pods
        if step_of(p) == replicated_job
        and (restart_attempt(p) or 0) == attempt
        and not nested(p, "metadata", "deletionTimestamp")
    ]


def _pods_missing(pods: Sequence[dict], replicated_job: dict, attempt: int, refused_at: str) -> bool:
    """Whether a replicated job's refused pods are still missing: fewer of its current attempt's pods than it asks
    for, and none of any attempt created after the refusal (a sample of the pending pods may hold fewer than
    exist: a pod created since the refusal says it has passed)."""
    spec = nested(replicated_job, "template", "spec", default={})
    wanted = (replicated_job.get("replicas") or 1) * (spec.get("parallelism") or spec.get("completions") or 1)
    step = replicated_job.get("name", "")
    have = _job_pods(pods, step, attempt)
    # Of any attempt: a refusal that an earlier attempt's pods came after had passed before a gang restart.
    made = [p for p in pods if step_of(p) == step]
    newest = max((_second(nested(p, "metadata", "creationTimestamp", default="")) for p in made), default="")
    return len(have) < wanted and newest <= _second(refused_at)


def chain_refusal(
    events: Sequence[dict], trainjob: dict, jobset: Optional[dict], pods: Sequence[dict]
) -> Optional[Refusal]:
    """The newest refusal of the chain TrainJob -> JobSet -> Jobs -> pods that still holds (None when none
    does): Trainer's Warning about the TrainJob while there is no JobSet, JobSet's ``JobCreationFailed`` about the
    JobSet while it has no pods, the Job controller's ``FailedCreate`` about one of its Jobs while that Job's pods
    are missing."""
    meta = trainjob["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    if jobset is None:
        found = _warnings_about(events, TRAINJOB_KIND, [name], meta.get("creationTimestamp", ""))
        return _refusal(max(found, key=_last_seen), "", namespace, 0) if found else None
    since, attempt = nested(jobset, "metadata", "creationTimestamp", default=""), jobset_restarts(jobset)
    refusals = []
    jobs = nested(jobset, "spec", "replicatedJobs", default=[])
    for replicated in jobs:
        job_names = [f"{name}-{replicated.get('name')}-{i}" for i in range(replicated.get("replicas") or 1)]
        failed = [e for e in _warnings_about(events, "Job", job_names, since) if e.get("reason") == FAILED_CREATE]
        if failed and _pods_missing(pods, replicated, attempt, _last_seen(newest := max(failed, key=_last_seen))):
            who = f"the Job controller cannot create the {replicated.get('name')} pods"
            refusals.append(_refusal(newest, who, namespace, _pod_count(replicated)))
    on_jobset = [e for e in _warnings_about(events, JOBSET_KIND, [name], since) if e.get("reason") == JOB_NOT_CREATED]
    if on_jobset and not any(_job_pods(pods, r.get("name", ""), attempt) for r in jobs):
        refusals.append(_refusal(max(on_jobset, key=_last_seen), f"JobSet {name} cannot create its Jobs", namespace, 0))
    return max(refusals, key=lambda r: r.when) if refusals else None


def _pod_count(replicated_job: dict) -> int:
    spec = nested(replicated_job, "template", "spec", default={})
    return (replicated_job.get("replicas") or 1) * (spec.get("parallelism") or 1)


def _refusal(event: dict, who: str, namespace: str, pods: int) -> Refusal:
    """The refusal an event records: who could not create what (the object and the event's reason; ``who`` ""
    for Trainer's Warning about the TrainJob itself), the
    admission's own words, and the fix (``refusal_fix``); ``pods``: how many pods the refused Job asks for
    (0: not a Job's pods)."""
    text = _GENERATED.sub(r'pods "\1-*" is forbidden', _words(event_text(event)))
    about = event_object(event)
    fix, fatal = refusal_fix(text, namespace, pods)
    reason = event.get("reason") or "Warning"
    # Trainer's Warning about the TrainJob is shown as it is ("Reason: message"): the object is the job itself.
    head = f"{who} ({about.get('kind')} {about.get('name')}, {reason}): {text}" if who else f"{reason}: {text}"
    return Refusal(f"{head}; {fix}", fatal, _second(_last_seen(event)))


def _words(text: str) -> str:
    """The API server's answer in an event: without the Job controller's ``Error creating: `` and the event
    recorder's ``(combined from similar events): `` before it."""
    for prefix in (_COMBINED, _CREATING):
        text = text[len(prefix) :] if text.startswith(prefix) else text
    return text


def refusal_fix(text: str, namespace: str, pods: int = 0) -> tuple[str, bool]:
    """What to do about a refusal, from the admission's words, and whether the job can never start as submitted
    (fatal): a quota in use frees up (not fatal); a Pod Security level, a LimitRange's bounds, a missing
    ServiceAccount, a quota that needs requests set, a policy's or webhook's denial do not change while the job
    waits. Anything else (a webhook that cannot be reached, a namespace being deleted) is not fatal."""
    if quota := _QUOTA.search(text):
        return _quota_fix(quota, namespace, pods), False
    if "failed quota:" in text and "must specify" in text:
        return (
            "fix: set the requests and limits the quota names (cpu_request, memory_request, cpu_limit, "
            "memory_limit) and submit again",
            True,
        )
    if psa := _PSA.search(text):
        return _pod_security_fix(psa.group("level"), namespace), True
    if account := _SERVICE_ACCOUNT.search(text):
        return (
            f"fix: create ServiceAccount {account.group('name')} in namespace {namespace}, or set service_account "
            "to one that exists, and submit again",
            True,
        )
    if "per " in text and any(bound in text for bound in _LIMIT_RANGE):
        return (
            "fix: keep cpu_request, cpu_limit, memory_request and memory_limit within the namespace's LimitRange "
            f"(`kubectl describe limitrange -n {namespace}`) and submit again",
            True,
        )
    if policy := _POLICY.search(text):
        return (
            f"fix: change what the policy's message asks for and submit again (`kubectl get "
            f"validatingadmissionpolicy {policy.group('name')} -o yaml` shows its rules)",
            True,
        )
    if webhook := _WEBHOOK.search(text):
        return (
            f"fix: change what the message of the admission webhook {webhook.group('name')} asks for (a policy of "
            "your platform team: Kyverno, Gatekeeper...) and submit again",
            True,
        )
    return f"fix: see `kubectl get events -n {namespace} --field-selector type=Warning`", False


def _pod_security_fix(level: str, namespace: str) -> str:
    enforced = f"namespace {namespace} enforces the Pod Security level {level!r}"
    if level == "restricted":
        return (
            f"{enforced}; fix: set restricted_security=True (and run_as_user for an image whose user is root) "
            "and submit again"
        )
    return (
        f"{enforced}; fix: drop what the {level!r} level forbids (host paths, host network, privileged "
        "containers, added capabilities: network_fabric and pod_overrides may add them) and submit again"
    )


def _quota_fix(quota: re.Match, namespace: str, pods: int) -> str:
    """What a quota in use asks: the job's whole ask against the quota's limit, and what frees it."""
    name, requested, limited = quota.group("quota"), quota.group("requested"), quota.group("limited")
    limits = dict(_pairs(limited))
    asks = [(key, value, _times(value, pods)) for key, value in _pairs(requested)]
    whole = ", ".join(f"{key}={total}" for key, _, total in asks) if pods > 1 else ""
    never = [
        key
        for key, value, total in asks
        if (limit := parse_quantity(limits.get(key))) is not None
        and (ask := parse_quantity(total if pods > 1 else value)) is not None
        and ask > limit
    ]
    facts = [f"the job's {pods} pods ask {whole} in all" if whole else ""]
    if never:
        facts.append(
            f"more {', '.join(never)} than quota {name} allows: it starts only once the quota is raised or the job "
            "asks for less"
        )
    else:
        facts.append(f"it waits until pods of namespace {namespace} free quota {name}")
    facts.append(
        f"fix: ask for less (cpu_request, memory_request, gpus_per_node, nodes) or a larger quota "
        f"(`kubectl describe resourcequota {name} -n {namespace}` shows what is used)"
    )
    return "; ".join(fact for fact in facts if fact)


def _pairs(text: str) -> list[tuple[str, str]]:
    """``requests.cpu=1,requests.memory=2Gi`` -> [(key, value)]."""
    return [tuple(pair.split("=", 1)) for pair in text.split(",") if "=" in pair]  # type: ignore[misc]


def _times(value: str, count: int) -> str:
    """A quantity times ``count``, in its own unit (``500m`` x 2 = ``1000m``)."""
    match = re.match(r"^(\d+(?:\.\d+)?)(.*)$", value)
    if not match:
        return value
    total = Decimal(match.group(1)) * count
    return f"{total.normalize():f}{match.group(2)}"
