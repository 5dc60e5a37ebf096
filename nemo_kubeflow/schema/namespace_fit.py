"""Whether a job's pods fit its namespace's ResourceQuotas and LimitRanges, offline (objects in, findings out),
as the LimitRanger and ResourceQuota admission plugins decide for each pod the Job controller creates.

LimitRanges first, as admission runs them: their defaults fill what a container does not set (a request a
container does not set is its limit, the API server's own default), then each ``Container`` and ``Pod`` item's
``min``, ``max`` and ``maxLimitRequestRatio`` (in the plugin's words: ``maximum cpu usage per Container is 2,
but limit is 4``). Then every ResourceQuota whose scopes match the pods, against the replicated jobs whose pods
run at once (job_pods.running_together): refused when they ask more than its ``hard`` (a gang would wait for
ever for pods the quota never admits), or when a container sets no cpu/memory that the quota counts ("must
specify"); warned when they ask more than is free now (``hard`` - ``used``: they wait until other pods end)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Optional

from nemo_kubeflow.constants import TRAINER_NODE
from nemo_kubeflow.quantity import format_quantity, parse_quantity
from nemo_kubeflow.schema.job_pods import JobPods, containers, running_together
from nemo_kubeflow.schema.problems import _dict

Amounts = dict[str, Decimal]

#: The quota keys that every container must set when a quota counts them (the quota's "must specify").
_MUST_SPECIFY = {
    "cpu": "requests",
    "memory": "requests",
    "requests.cpu": "requests",
    "requests.memory": "requests",
    "limits.cpu": "limits",
    "limits.memory": "limits",
}
#: The executor field that sets each (section, resource) of the node container.
_FIELDS = {
    ("requests", "cpu"): "cpu_request",
    ("limits", "cpu"): "cpu_limit",
    ("requests", "memory"): "memory_request",
    ("limits", "memory"): "memory_limit",
}


@dataclass
class Fit:
    """What the namespace's policies say of the job: ``refusals`` (it cannot be admitted as configured) and
    ``warnings`` (admitted, but waits), each naming the policy object, the numbers and the fix."""

    refusals: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class QuotaLine:
    """One resource of one quota, against the job: for doctor's report."""

    quota: str
    resource: str
    hard: Decimal
    used: Decimal
    asked: Decimal

    def __str__(self) -> str:
        return (
            f"ResourceQuota {self.quota}: {self.resource} used {format_quantity(self.used)} of "
            f"{format_quantity(self.hard)}; one job asks {format_quantity(self.asked)}"
        )


def field_for(section: str, resource: str, gpu_resource: str) -> str:
    """The executor field that sets ``resource`` in ``section`` (requests/limits) of the node pods."""
    if (section, resource) in _FIELDS:
        return _FIELDS[(section, resource)]
    if resource == gpu_resource:
        return "gpus_per_node"
    return f"extra_resources[{resource!r}]"


# ------------------------------------------------------------------------------------------ LimitRanges


def with_limit_range_defaults(pods: list[JobPods], limit_ranges: list[dict]) -> list[JobPods]:
    """``pods`` as admission leaves them: each container's missing requests set from its limits, then the
    ``Container`` items' ``default`` (limits) and ``defaultRequest`` filled in where the container sets none."""
    items = [i for lr in limit_ranges for i in _items(lr) if i.get("type") == "Container"]
    out = []
    for jp in pods:
        pod = _copy_pod(jp.spec)
        for c in containers(pod):
            _fill_container(c, items)
        out.append(JobPods(jp.job, pod, jp.count, jp.after))
    return out


def _fill_container(container: dict, items: list[dict]) -> None:
    resources = container.setdefault("resources", {})
    limits, requests = resources.setdefault("limits", {}), resources.setdefault("requests", {})
    for name, value in list(limits.items()):
        requests.setdefault(name, value)
    for item in items:
        default, default_request = _item_defaults(item)
        for name, value in default.items():
            limits.setdefault(name, value)
        for name, value in default_request.items():
            requests.setdefault(name, value)


def _item_defaults(item: dict) -> tuple[dict, dict]:
    """A ``Container`` item's default limits and requests, with the API server's defaults of a LimitRange
    (default from max, defaultRequest from default, then from min)."""
    default = {**_dict(item.get("max")), **_dict(item.get("default"))}
    request = {**_dict(item.get("min")), **default, **_dict(item.get("defaultRequest"))}
    return default, request


def limit_range_problems(pods: list[JobPods], limit_ranges: list[dict], gpu_resource: str) -> list[str]:
    """What each LimitRange refuses of ``pods`` (after its defaults: ``with_limit_range_defaults``)."""
    problems: list[str] = []
    for lr in limit_ranges:
        name = _dict(lr.get("metadata")).get("name")
        for item in _items(lr):
            kind = str(item.get("type"))
            for jp in pods:
                for container, who, requests, limits in _subjects(kind, jp):
                    for text, section, resource in _bounds(kind, item, requests, limits):
                        setting = setting_of(container, section, resource, gpu_resource)
                        problems.append(
                            f"LimitRange {name!r} ({kind}): {text} ({who}); fix: {setting}, within its bounds "
                            f"(min {_bound(item, 'min', resource)}, max {_bound(item, 'max', resource)})"
                        )
    return list(dict.fromkeys(problems))


def setting_of(container: str, section: str, resource: str, gpu_resource: str) -> str:
    """How to change ``resource`` in ``section`` of ``container``: the node's executor field, the preflight
    step, or an admin's runtime's container."""
    if container == TRAINER_NODE:
        return f"set {field_for(section, resource, gpu_resource)}"
    if container == "preflight":
        return "set preflight=False (its container sets only the devices it checks), or ask an admin for a default"
    return f"change container {container!r} of the runtime (runtime_name, runtime_template), or ask an admin"


def _subjects(kind: str, jp: JobPods) -> list[tuple[str, str, Amounts, Amounts]]:
    """What a LimitRange item of ``kind`` is checked on: (container, who, requests, limits) of each container,
    or of the pod as a whole (the node container's fields change it)."""
    where = f'replicated job "{jp.job}"'
    if kind == "Container":
        return [
            (
                str(c.get("name")),
                f'container "{c.get("name")}" of {where}',
                _amounts(c, "requests"),
                _amounts(c, "limits"),
            )
            for c in containers(jp.spec)
        ]
    if kind == "Pod":
        pod = (TRAINER_NODE, f"the pods of {where}", pod_amounts(jp.spec, "requests"), pod_amounts(jp.spec, "limits"))
        return [pod]
    return []


#: A LimitRange's bounds: (its field, the plugin's word, the side it must stay on, the amounts it checks first).
_BOUNDS = (("min", "minimum", -1, "requests"), ("max", "maximum", 1, "limits"))


def _bounds(kind: str, item: dict, requests: Amounts, limits: Amounts) -> list[tuple[str, str, str]]:
    """Each bound of ``item`` that ``requests``/``limits`` break: (the plugin's words, section, resource)."""
    amounts = {"requests": requests, "limits": limits}
    found = []
    for key, word, side, first in _BOUNDS:
        for resource, bound in _quantities(item.get(key)).items():
            said = f"{word} {resource} usage per {kind} is {_q(bound)}"
            if resource not in amounts[first]:
                found.append((f"{said}.  No {first[:-1]} is specified", first, resource))
                continue
            for section in (first, "limits" if first == "requests" else "requests"):
                value = amounts[section].get(resource)
                if value is not None and (value - bound) * side > 0:
                    found.append((f"{said}, but {section[:-1]} is {_q(value)}", section, resource))
                    break  # one finding per bound, as the plugin gives
    for resource, ratio in _quantities(item.get("maxLimitRequestRatio")).items():
        found += _ratio(kind, resource, ratio, requests.get(resource), limits.get(resource))
    return found


def _ratio(
    kind: str, resource: str, ratio: Decimal, request: Optional[Decimal], limit: Optional[Decimal]
) -> list[tuple[str, str, str]]:
    said = f"{resource} max limit to request ratio per {kind} is {_q(ratio)}"
    if limit is None:
        return []
    if not request:
        return [(f"{said}, but no request is specified or request is 0", "requests", resource)]
    if limit / request > ratio:
        return [(f"{said}, but provided ratio is {float(limit / request):f}", "limits", resource)]
    return []


def _bound(item: dict, which: str, resource: str) -> str:
    value = _quantities(item.get(which)).get(resource)
    return _q(value) if value is not None else "none"


# ------------------------------------------------------------------------------------------ ResourceQuotas


def quota_fit(pods: list[JobPods], quotas: list[dict], gpu_resource: str) -> Fit:
    """The ResourceQuotas against ``pods`` (LimitRange defaults applied): refusals and warnings."""
    fit = Fit()
    for quota in quotas:
        name = _dict(quota.get("metadata")).get("name")
        hard = _quantities(_dict(quota.get("spec")).get("hard"))
        used = _quantities(_dict(quota.get("status")).get("used"))
        for group in running_together(pods):
            matching = [jp for jp in group if _in_scope(quota, jp.spec)]
            if not matching:
                continue
            fit.refusals += _unspecified(name, hard, matching, gpu_resource)
            _check_amounts(fit, name, hard, used, matching, gpu_resource)
    fit.refusals = list(dict.fromkeys(fit.refusals))
    fit.warnings = list(dict.fromkeys(fit.warnings))
    return fit


def quota_lines(pods: list[JobPods], quotas: list[dict]) -> list[QuotaLine]:
    """Each quota's resources that the job's pods count against: used, hard, and what one job asks (the most
    of the groups of pods that run at once)."""
    lines = []
    for quota in quotas:
        name = str(_dict(quota.get("metadata")).get("name"))
        hard = _quantities(_dict(quota.get("spec")).get("hard"))
        used = _quantities(_dict(quota.get("status")).get("used"))
        for key, limit in hard.items():
            asks = [_asked(key, [jp for jp in group if _in_scope(quota, jp.spec)]) for group in running_together(pods)]
            counted = [a for a in asks if a is not None]
            if counted:
                lines.append(QuotaLine(name, key, limit, used.get(key, Decimal(0)), max(counted)))
    return lines


def _check_amounts(fit: Fit, name: Any, hard: Amounts, used: Amounts, pods: list[JobPods], gpu_resource: str) -> None:
    for key, limit in hard.items():
        asked = _asked(key, pods)
        if not asked:
            continue
        who = ", ".join(f'{jp.count} pod(s) of replicated job "{jp.job}"' for jp in pods)
        if asked > limit:
            fit.refusals.append(
                f"ResourceQuota {name!r}: the job's pods that run at once ({who}) ask {key}={_q(asked)}, more than "
                f"its hard limit {key}={_q(limit)}: the quota would never admit them all; fix: "
                f"{_quota_fix(key, gpu_resource)}, or ask an admin to raise the quota"
            )
        elif asked > limit - used.get(key, Decimal(0)):
            free = max(limit - used.get(key, Decimal(0)), Decimal(0))
            fit.warnings.append(
                f"ResourceQuota {name!r}: the job's pods ({who}) ask {key}={_q(asked)}, more than is free now "
                f"({_q(free)} of {_q(limit)}; {_q(used.get(key, Decimal(0)))} used): they wait until other pods "
                f"in the namespace end; fix: wait, or {_quota_fix(key, gpu_resource)}"
            )


def _quota_fix(key: str, gpu_resource: str) -> str:
    if key in ("pods", "count/pods"):
        return "lower nodes"
    section, _, resource = key.partition(".") if key.startswith(("requests.", "limits.")) else ("requests", "", key)
    return f"lower {field_for(section, resource, gpu_resource)} or nodes"


def _unspecified(name: Any, hard: Amounts, pods: list[JobPods], gpu_resource: str) -> list[str]:
    """A quota that counts cpu/memory refuses a pod whose containers do not all set it (after the defaults)."""
    problems = []
    for key in hard:
        section = _MUST_SPECIFY.get(key)
        if section is None:
            continue
        resource = key.split(".")[-1]
        for jp in pods:
            missing = [str(c.get("name")) for c in containers(jp.spec) if resource not in _amounts(c, section)]
            if missing:
                fixes = "; ".join(dict.fromkeys(setting_of(c, section, resource, gpu_resource) for c in missing))
                problems.append(
                    f"ResourceQuota {name!r} counts {key}, so every container must set it: failed quota: {name}: "
                    f'must specify {key} for: {",".join(missing)} (replicated job "{jp.job}"); fix: {fixes} '
                    "(or ask an admin for a LimitRange default)"
                )
    return problems


def _asked(key: str, pods: list[JobPods]) -> Optional[Decimal]:
    """What ``pods`` ask of quota resource ``key`` together, ``None`` when pods do not count against it."""
    if not pods:
        return None
    if key in ("pods", "count/pods"):
        return Decimal(sum(jp.count for jp in pods))
    section, resource = _quota_resource(key)
    if section is None:
        return None
    return sum((pod_amounts(jp.spec, section).get(resource, Decimal(0)) * jp.count for jp in pods), Decimal(0))


def _quota_resource(key: str) -> tuple[Optional[str], str]:
    """(section, resource) of a pod compute quota key (``requests.cpu``, ``cpu``, ``limits.memory``,
    ``requests.nvidia.com/gpu``); (None, key) for one about other objects (storage, counts)."""
    for prefix in ("requests", "limits"):
        if key.startswith(prefix + "."):
            resource = key[len(prefix) + 1 :]
            return (prefix, resource) if resource != "storage" else (None, key)
    if key in ("cpu", "memory", "ephemeral-storage") or key.startswith("hugepages-"):
        return "requests", key
    return None, key


def _in_scope(quota: dict, pod: dict) -> bool:
    """Whether the quota's scopes and scope selector take in ``pod``."""
    spec = _dict(quota.get("spec"))
    scopes: list[tuple[Any, Any, list]] = [(s, "Exists", []) for s in spec.get("scopes") or []]
    scopes += [
        (e.get("scopeName"), e.get("operator"), e.get("values") or [])
        for e in _dict(spec.get("scopeSelector")).get("matchExpressions") or []
        if isinstance(e, dict)
    ]
    return all(_scope_matches(scope, op, values, pod) for scope, op, values in scopes)


def _scope_matches(scope: Any, operator: Any, values: list, pod: dict) -> bool:
    best_effort = not any(_amounts(c, s) for c in containers(pod) for s in ("requests", "limits"))
    facts = {
        "Terminating": pod.get("activeDeadlineSeconds") is not None,
        "NotTerminating": pod.get("activeDeadlineSeconds") is None,
        "BestEffort": best_effort,
        "NotBestEffort": not best_effort,
    }
    if scope in facts:
        return facts[scope]
    if scope == "PriorityClass":
        priority = pod.get("priorityClassName")
        return {
            "In": priority in values,
            "NotIn": priority not in values,
            "Exists": priority is not None,
            "DoesNotExist": priority is None,
        }.get(str(operator), False)
    return False  # CrossNamespacePodAffinity, VolumeAttributesClass: our pods have neither


# ------------------------------------------------------------------------------------------ amounts


def pod_amounts(pod: dict, section: str) -> Amounts:
    """What a pod asks in ``section`` (requests/limits), as Kubernetes adds it up: its containers and sidecars
    (init containers that keep running), or an init container with the sidecars started before it, whichever
    is more, plus the pod's overhead."""
    total: Amounts = {}
    sidecars: Amounts = {}
    peak: Amounts = {}
    for c in pod.get("initContainers") or []:
        if not isinstance(c, dict):
            continue
        if c.get("restartPolicy") == "Always":
            sidecars = _add(sidecars, _amounts(c, section))
        else:
            peak = _max(peak, _add(sidecars, _amounts(c, section)))
    for c in pod.get("containers") or []:
        if isinstance(c, dict):
            total = _add(total, _amounts(c, section))
    total = _max(_add(total, sidecars), peak)
    return _add(total, _quantities(pod.get("overhead")))


def _amounts(container: dict, section: str) -> Amounts:
    return _quantities(_dict(_dict(container.get("resources")).get(section)))


def _quantities(values: Any) -> Amounts:
    out = {}
    for name, text in _dict(values).items():
        value = parse_quantity(text)
        if value is not None:
            out[str(name)] = value
    return out


def _add(a: Amounts, b: Amounts) -> Amounts:
    return {k: a.get(k, Decimal(0)) + b.get(k, Decimal(0)) for k in {**a, **b}}


def _max(a: Amounts, b: Amounts) -> Amounts:
    return {k: max(a.get(k, Decimal(0)), b.get(k, Decimal(0))) for k in {**a, **b}}


def _q(value: Decimal) -> str:
    return format_quantity(value)


def _items(limit_range: dict) -> list[dict]:
    return [i for i in _dict(limit_range.get("spec")).get("limits") or [] if isinstance(i, dict)]


def _copy_pod(pod: dict) -> dict:
    return copy.deepcopy(pod)
