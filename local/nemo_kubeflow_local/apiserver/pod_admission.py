"""Pod admission as kube-apiserver v1.36 runs it on every pod create, whoever creates the pod (a client over
HTTP, or the emulated Job controller: `create_pod` is the one way a pod is stored).

In the real server's order: the mutating phase (LimitRanger's defaults, the ServiceAccount's lookup, the
Priority plugin's class), then the pod's validation, then the validating phase (LimitRanger's bounds,
PodSecurity, ValidatingAdmissionPolicies, ResourceQuota last, which counts the pod into `status.used`). A
refusal is `pods "NAME" is forbidden: ...` (403; a policy's validation says its own code), NAME being the
`generateName` in the mutating phase, which runs before the name is generated, as for real.

Ported from Kubernetes v1.36 (`plugin/pkg/admission/{limitranger,serviceaccount,priority,resourcequota}`,
`pkg/quota/v1/evaluator/core/pods.go`, `staging/src/k8s.io/pod-security-admission/policy`,
`staging/src/k8s.io/apiserver/pkg/admission/plugin/policy/validating`); the messages were checked against the
real server (test/local/test_pod_admission.py, `-m real`). What is not emulated is listed in
docs/local-cluster.md: quota scopes, PodSecurity's exemptions, warn and audit modes and its rarer checks, policy
params and the authorizer.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any, Callable, Optional

from nemo_kubeflow_local.apiserver import resources as R
from nemo_kubeflow_local.apiserver.apierrors import REASONS, ApiError, FieldError
from nemo_kubeflow_local.apiserver.selectors import label_matcher
from nemo_kubeflow_local.apiserver.store import Store
from nemo_kubeflow_local.quantity import format_quantity, is_binary, parse_quantity

LIMIT_RANGER_ANNOTATION = "kubernetes.io/limit-ranger"
PSA_PREFIX = "pod-security.kubernetes.io/"
PSA_LEVELS = ("privileged", "baseline", "restricted")
_PSA_VERSION = re.compile(r"latest|v1\.(0|[1-9][0-9]*)")


def _generate_name(pod: dict, generate: Callable[[], str]) -> None:
    meta = pod["metadata"]
    if not meta.get("name") and meta.get("generateName"):
        meta["name"] = meta["generateName"] + generate()


def create_pod(
    store: Store,
    pod: dict,
    generate_suffix: Callable[[], str],
    *,
    validate_spec: Callable[[dict], None] = lambda pod: None,
    mutated: Callable[[dict], None] = lambda pod: None,
    dry_run: bool = False,
) -> tuple[dict, list[str]]:
    """Admit and store `pod` (defaults applied, name maybe not yet generated): (the stored pod, warnings).
    `validate_spec` is the API server's own validation, run between the phases; `mutated` runs after the
    mutating phase (a mutating webhook's part: JobSet's pod webhook). Raises ApiError when refused."""
    with store.lock:  # the quota's check and the pod's count are one step, as the quota's update is for real
        mutate(store, pod)
        mutated(pod)
        _generate_name(pod, generate_suffix)
        validate_spec(pod)
        warnings, counted = validate(store, pod)
        if dry_run:
            return pod, warnings
        created = store.create(R.PODS, pod)
        for quota in _quotas(store, created["metadata"]["namespace"]):  # counted in, as the quota admission does
            hard = (quota.get("spec") or {}).get("hard") or {}
            _write_status(
                store,
                quota["metadata"]["namespace"],
                quota["metadata"]["name"],
                hard,
                counted[quota["metadata"]["name"]],
            )
        return created, warnings


def _forbidden(pod: dict, message: str, code: int = 403, reason: str = "", causes: bool = False) -> ApiError:
    meta = pod["metadata"]
    name = meta.get("name") or meta.get("generateName") or "Unknown"
    text = f'pods "{name}" is forbidden: {message}'
    details: dict[str, Any] = {"name": name, "kind": "pods"}
    if causes:
        details["causes"] = [{"message": message}]
    return ApiError(code, text, reason=reason or REASONS.get(code, "Forbidden"), details=details)


# --- the mutating phase ---------------------------------------------------------------------------------


def mutate(store: Store, pod: dict) -> None:
    namespace = pod["metadata"]["namespace"]
    _limit_range_defaults(store, namespace, pod)
    spec = pod["spec"]
    account = spec.get("serviceAccountName") or "default"
    if store.find(R.SERVICEACCOUNTS, namespace, account) is None:
        raise _forbidden(
            pod, f'error looking up service account {namespace}/{account}: serviceaccount "{account}" not found'
        )
    _priority(store, pod)


def _priority(store: Store, pod: dict) -> None:
    spec = pod["spec"]
    name = spec.get("priorityClassName")
    if name:
        found = store.find(R.PRIORITYCLASSES, "", name)
        if found is None:
            raise _forbidden(pod, f"no PriorityClass with name {name} was found")
        spec["priority"] = found.get("value", 0)
        spec["preemptionPolicy"] = found.get("preemptionPolicy") or "PreemptLowerPriority"
        return
    default = next((pc for pc in store.stored_list(R.PRIORITYCLASSES, None)[0] if pc.get("globalDefault")), None)
    if default is not None:
        spec["priorityClassName"] = default["metadata"]["name"]
        spec["priority"] = default.get("value", 0)
        spec["preemptionPolicy"] = default.get("preemptionPolicy") or spec.get("preemptionPolicy")


def default_limit_range(limit_range: dict) -> None:
    """SetDefaults_LimitRangeItem: a Container item's `default` from its `max`, `defaultRequest` from `default`
    then from `min` (stored so)."""
    for item in (limit_range.get("spec") or {}).get("limits") or []:
        if item.get("type") != "Container":
            continue
        default = item.setdefault("default", {})
        request = item.setdefault("defaultRequest", {})
        for key, value in (item.get("max") or {}).items():
            default.setdefault(key, value)
        for key, value in default.items():
            request.setdefault(key, value)
        for key, value in (item.get("min") or {}).items():
            request.setdefault(key, value)
        for field in ("default", "defaultRequest"):
            if not item[field]:
                del item[field]


def _limit_ranges(store: Store, namespace: str) -> list[dict]:
    return sorted(store.stored_list(R.LIMITRANGES, namespace)[0], key=lambda lr: lr["metadata"]["name"])


def _containers(spec: dict) -> list[tuple[str, dict]]:
    return [("container", c) for c in spec.get("containers") or []] + [
        ("init container", c) for c in spec.get("initContainers") or []
    ]


def _limit_range_defaults(store: Store, namespace: str, pod: dict) -> None:
    for limit_range in _limit_ranges(store, namespace):
        limits: dict = {}
        requests: dict = {}
        for item in limit_range["spec"].get("limits") or []:
            if item.get("type") == "Container":
                requests.update(item.get("defaultRequest") or {})
                limits.update(item.get("default") or {})
        notes: list[str] = []
        for kind, container in _containers(pod["spec"]):
            resources = container.setdefault("resources", {})
            set_limits = sorted(k for k in limits if k not in (resources.get("limits") or {}))
            set_requests = sorted(k for k in requests if k not in (resources.get("requests") or {}))
            if set_limits:
                resources["limits"] = {**(resources.get("limits") or {}), **{k: limits[k] for k in set_limits}}
            if set_requests:
                resources["requests"] = {
                    **(resources.get("requests") or {}),
                    **{k: requests[k] for k in set_requests},
                }
            if set_requests:
                notes.append(f"{', '.join(set_requests)} request for {kind} {container.get('name')}")
            if set_limits:
                notes.append(f"{', '.join(set_limits)} limit for {kind} {container.get('name')}")
        if notes:
            pod["metadata"].setdefault("annotations", {})[LIMIT_RANGER_ANNOTATION] = "LimitRanger plugin set: " + (
                "; ".join(notes)
            )


# --- the validating phase ---------------------------------------------------------------------------------


def validate(store: Store, pod: dict) -> tuple[list[str], dict[str, Usage]]:
    """The validating plugins in order: the warnings of policies bound with `Warn`, and the quotas' use with the
    pod counted in."""
    namespace = pod["metadata"]["namespace"]
    errors = _limit_range_errors(store, namespace, pod)
    if errors:
        raise _forbidden(pod, errors[0] if len(errors) == 1 else f"[{', '.join(errors)}]")
    ns = store.find(R.NAMESPACES, "", namespace) or {"metadata": {}}
    violation = pod_security_violation(ns, pod)
    if violation:
        raise _forbidden(pod, violation)
    warnings = _policies(store, ns, pod)
    return warnings, _quota(store, namespace, pod)


def _q(value: Any) -> Decimal:
    parsed = parse_quantity(value)
    return parsed if parsed is not None else Decimal(0)


def _text(value: Any) -> str:
    """A quantity as Go's String() prints the one given."""
    parsed = parse_quantity(value)
    return format_quantity(parsed, is_binary(value)) if parsed is not None else str(value)


def _sum_resources(spec: dict, field: str) -> dict[str, tuple[Decimal, bool]]:
    """A pod's requests or limits: its containers' summed, each init container's if larger (podRequests)."""
    total: dict[str, tuple[Decimal, bool]] = {}
    for container in spec.get("containers") or []:
        for key, value in ((container.get("resources") or {}).get(field) or {}).items():
            before = total.get(key)
            total[key] = (_q(value) + (before[0] if before else 0), before[1] if before else is_binary(value))
    for container in spec.get("initContainers") or []:
        for key, value in ((container.get("resources") or {}).get(field) or {}).items():
            if key not in total or _q(value) > total[key][0]:
                total[key] = (_q(value), is_binary(value))
    for key, value in (spec.get("overhead") or {}).items():
        before = total.get(key)
        total[key] = (_q(value) + (before[0] if before else 0), before[1] if before else is_binary(value))
    return total


def _bound_errors(kind: str, item: dict, requests: dict[str, str], limits: dict[str, str]) -> list[str]:
    errors = []
    for key, enforced in sorted((item.get("min") or {}).items()):
        if key not in requests:
            errors.append(f"minimum {key} usage per {kind} is {_text(enforced)}.  No request is specified")
        elif _q(requests[key]) < _q(enforced):
            errors.append(f"minimum {key} usage per {kind} is {_text(enforced)}, but request is {requests[key]}")
        elif key in limits and _q(limits[key]) < _q(enforced):
            errors.append(f"minimum {key} usage per {kind} is {_text(enforced)}, but limit is {limits[key]}")
    for key, enforced in sorted((item.get("max") or {}).items()):
        if key not in limits:
            errors.append(f"maximum {key} usage per {kind} is {_text(enforced)}.  No limit is specified")
        elif _q(limits[key]) > _q(enforced):
            errors.append(f"maximum {key} usage per {kind} is {_text(enforced)}, but limit is {limits[key]}")
        elif key in requests and _q(requests[key]) > _q(enforced):
            errors.append(f"maximum {key} usage per {kind} is {_text(enforced)}, but request is {requests[key]}")
    for key, enforced in sorted((item.get("maxLimitRequestRatio") or {}).items()):
        head = f"{key} max limit to request ratio per {kind} is {_text(enforced)}"
        if key not in requests or _q(requests[key]) == 0:
            errors.append(f"{head}, but no request is specified or request is 0")
        elif key not in limits or _q(limits[key]) == 0:
            errors.append(f"{head}, but no limit is specified or limit is 0")
        elif _q(limits[key]) / _q(requests[key]) > _q(enforced):
            errors.append(f"{head}, but provided ratio is {float(_q(limits[key]) / _q(requests[key])):f}")
    return errors


def _limit_range_errors(store: Store, namespace: str, pod: dict) -> list[str]:
    errors: list[str] = []
    spec = pod["spec"]
    for limit_range in _limit_ranges(store, namespace):
        for item in limit_range["spec"].get("limits") or []:
            if item.get("type") == "Container":
                for _, container in _containers(spec):
                    resources = container.get("resources") or {}
                    requests = {k: _text(v) for k, v in (resources.get("requests") or {}).items()}
                    limits = {k: _text(v) for k, v in (resources.get("limits") or {}).items()}
                    errors += _bound_errors("Container", item, requests, limits)
            elif item.get("type") == "Pod":
                requests = {k: format_quantity(*v) for k, v in _sum_resources(spec, "requests").items()}
                limits = {k: format_quantity(*v) for k, v in _sum_resources(spec, "limits").items()}
                errors += _bound_errors("Pod", item, requests, limits)
    return errors


# --- PodSecurity ------------------------------------------------------------------------------------------


def namespace_label_errors(namespace: dict) -> list[FieldError]:
    """PodSecurity's check of a namespace's `pod-security.kubernetes.io/*` labels (422 on a bad one)."""
    errors = []
    for key, value in sorted(((namespace.get("metadata") or {}).get("labels") or {}).items()):
        mode = key[len(PSA_PREFIX) :] if key.startswith(PSA_PREFIX) else ""
        path = f"metadata.labels[{key}]"
        if mode in ("enforce", "audit", "warn") and value not in PSA_LEVELS:
            errors.append(FieldError.invalid(path, value, "must be one of privileged, baseline, restricted"))
        elif mode in ("enforce-version", "audit-version", "warn-version") and not _PSA_VERSION.fullmatch(value):
            errors.append(FieldError.invalid(path, value, 'must be "latest" or "v1.x"'))
    return errors


def _quote(names: list[str]) -> str:
    return ", ".join(f'"{n}"' for n in names)


def _many(singular: str, plural: str, count: int) -> str:
    return singular if count == 1 else plural


def _who(names: list[str]) -> str:
    return f"{_many('container', 'containers', len(names))} {_quote(names)}"


def _result(reason: str, *details: Any) -> Optional[tuple[str, str]]:
    """A check's (reason, detail) from its details that apply (the others are falsy), None when none does."""
    found = [d for d in details if d]
    return (reason, "; ".join(found)) if found else None


def _uses(who: str, count: int, noun: tuple[str, str], values: list[str], *, quoted: bool) -> str:
    """`container "node" uses hostPort 80`, `volumes "a", "b" use restricted volume type "hostPath"`."""
    listed = _quote(values) if quoted else ", ".join(values)
    return f"{who} {_many('uses', 'use', count)} {_many(*noun, len(values))} {listed}"


def _visit(spec: dict) -> list[dict]:
    return list(spec.get("initContainers") or []) + list(spec.get("containers") or [])


def _context(container: dict) -> dict:
    return container.get("securityContext") or {}


#: What the baseline profile lets a container add, and the volume types the restricted one allows. The emulator
#: keeps its own copy of these Pod Security Standards facts (it grades the product, which has its own).
_DEFAULT_CAPABILITIES = frozenset(
    "AUDIT_WRITE CHOWN DAC_OVERRIDE FOWNER FSETID KILL MKNOD NET_BIND_SERVICE SETFCAP SETGID SETPCAP SETUID SYS_CHROOT".split()
)
_RESTRICTED_VOLUME_TYPES = frozenset(
    "configMap csi downwardAPI emptyDir ephemeral image persistentVolumeClaim projected secret".split()
)


def _offenders(items: list[dict], values_of: Callable[[dict], list[str]]) -> tuple[list[str], list[str]]:
    """The names of the items (containers, volumes) with offending values, and those values (sorted, once each)."""
    names, values = [], set()
    for item in items:
        found = values_of(item)
        if found:
            names.append(item["name"])
            values.update(found)
    return names, sorted(values)


def _capabilities_baseline(spec: dict) -> Optional[tuple[str, str]]:
    bad, caps = _offenders(
        _visit(spec),
        lambda c: [
            a for a in (_context(c).get("capabilities") or {}).get("add") or [] if a not in _DEFAULT_CAPABILITIES
        ],
    )
    detail = f"{_who(bad)} must not include {_quote(caps)} in securityContext.capabilities.add"
    return ("non-default capabilities", detail) if bad else None


def _host_namespaces(spec: dict) -> Optional[tuple[str, str]]:
    used = [f"{field}=true" for field in ("hostNetwork", "hostPID", "hostIPC") if spec.get(field)]
    return ("host namespaces", ", ".join(used)) if used else None


def _host_path_volumes(spec: dict) -> Optional[tuple[str, str]]:
    bad = [v["name"] for v in spec.get("volumes") or [] if "hostPath" in v]
    return ("hostPath volumes", f"{_many('volume', 'volumes', len(bad))} {_quote(bad)}") if bad else None


def _host_ports(spec: dict) -> Optional[tuple[str, str]]:
    bad, ports = _offenders(
        _visit(spec), lambda c: [str(p["hostPort"]) for p in c.get("ports") or [] if p.get("hostPort")]
    )
    return ("hostPort", _uses(_who(bad), len(bad), ("hostPort", "hostPorts"), ports, quoted=False)) if bad else None


def _privileged(spec: dict) -> Optional[tuple[str, str]]:
    bad = [c["name"] for c in _visit(spec) if _context(c).get("privileged")]
    return ("privileged", f"{_who(bad)} must not set securityContext.privileged=true") if bad else None


def _seccomp_baseline(spec: dict) -> Optional[tuple[str, str]]:
    setters = []
    if ((spec.get("securityContext") or {}).get("seccompProfile") or {}).get("type") == "Unconfined":
        setters.append("pod")
    bad = [c["name"] for c in _visit(spec) if (_context(c).get("seccompProfile") or {}).get("type") == "Unconfined"]
    if bad:
        setters.append(_who(bad))
    if not setters:
        return None
    return "seccompProfile", f'{" and ".join(setters)} must not set securityContext.seccompProfile.type to "Unconfined"'


def _allow_privilege_escalation(spec: dict) -> Optional[tuple[str, str]]:
    bad = [c["name"] for c in _visit(spec) if _context(c).get("allowPrivilegeEscalation") is not False]
    if not bad:
        return None
    return "allowPrivilegeEscalation != false", f"{_who(bad)} must set securityContext.allowPrivilegeEscalation=false"


def _capabilities_restricted(spec: dict) -> Optional[tuple[str, str]]:
    missing_drop, adding, caps = [], [], set()
    for c in _visit(spec):
        capabilities = _context(c).get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            missing_drop.append(c["name"])
        added = [a for a in capabilities.get("add") or [] if a != "NET_BIND_SERVICE"]
        if added:
            adding.append(c["name"])
            caps.update(added)
    return _result(
        "unrestricted capabilities",
        missing_drop and f'{_who(missing_drop)} must set securityContext.capabilities.drop=["ALL"]',
        adding and f"{_who(adding)} must not include {_quote(sorted(caps))} in securityContext.capabilities.add",
    )


def _restricted_volumes(spec: dict) -> Optional[tuple[str, str]]:
    bad, kinds = _offenders(
        spec.get("volumes") or [], lambda v: [k for k in v if k != "name" and k not in _RESTRICTED_VOLUME_TYPES]
    )
    who = f"{_many('volume', 'volumes', len(bad))} {_quote(bad)}"
    kind = ("restricted volume type", "restricted volume types")
    return ("restricted volume types", _uses(who, len(bad), kind, kinds, quoted=True)) if bad else None


def _run_as_non_root(spec: dict) -> Optional[tuple[str, str]]:
    pod_value = (spec.get("securityContext") or {}).get("runAsNonRoot")
    setters = ["pod"] if pod_value is False else []
    explicit = [c["name"] for c in _visit(spec) if _context(c).get("runAsNonRoot") is False]
    implicit = [c["name"] for c in _visit(spec) if _context(c).get("runAsNonRoot") is None and pod_value is not True]
    if explicit:
        setters.append(_who(explicit))
    return _result(
        "runAsNonRoot != true",
        setters and f"{' and '.join(setters)} must not set securityContext.runAsNonRoot=false",
        implicit and f"pod or {_who(implicit)} must set securityContext.runAsNonRoot=true",
    )


def _run_as_user(spec: dict) -> Optional[tuple[str, str]]:
    setters = ["pod"] if (spec.get("securityContext") or {}).get("runAsUser") == 0 else []
    bad = [c["name"] for c in _visit(spec) if _context(c).get("runAsUser") == 0]
    if bad:
        setters.append(_who(bad))
    return ("runAsUser=0", f"{' and '.join(setters)} must not set runAsUser=0") if setters else None


def _seccomp_restricted(spec: dict) -> Optional[tuple[str, str]]:
    allowed = ("RuntimeDefault", "Localhost")
    pod_type = ((spec.get("securityContext") or {}).get("seccompProfile") or {}).get("type")
    setters: list[str] = []
    values: set[str] = set()
    if pod_type is not None and pod_type not in allowed:
        setters.append("pod")
        values.add(pod_type)
    explicit: list[str] = []
    implicit: list[str] = []
    for c in _visit(spec):
        kind = (_context(c).get("seccompProfile") or {}).get("type")
        if kind is None:
            if pod_type not in allowed:
                implicit.append(c["name"])
        elif kind not in allowed:
            explicit.append(c["name"])
            values.add(kind)
    if explicit:
        setters.append(_who(explicit))
    return _result(
        "seccompProfile",
        setters
        and f"{' and '.join(setters)} must not set securityContext.seccompProfile.type to {_quote(sorted(values))}",
        implicit
        and f'pod or {_who(implicit)} must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost"',
    )


Check = Callable[[dict], Optional[tuple[str, str]]]
#: Each level's checks in the order the real registry runs them: by check ID, the restricted ones after the
#: baseline ones, a restricted check replacing the baseline one it overrides.
_BASELINE: tuple[Check, ...] = (
    _capabilities_baseline,
    _host_namespaces,
    _host_path_volumes,
    _host_ports,
    _privileged,
    _seccomp_baseline,
)
_RESTRICTED: tuple[Check, ...] = (
    _host_namespaces,
    _host_ports,
    _privileged,
    _allow_privilege_escalation,
    _capabilities_restricted,
    _restricted_volumes,
    _run_as_non_root,
    _run_as_user,
    _seccomp_restricted,
)


def pod_security_violation(namespace: dict, pod: dict) -> str:
    """`violates PodSecurity "restricted:latest": ...` for a pod its namespace's enforced level refuses, else ""."""
    labels = (namespace.get("metadata") or {}).get("labels") or {}
    level = labels.get(PSA_PREFIX + "enforce", "privileged")
    if level not in ("baseline", "restricted"):
        return ""
    version = labels.get(PSA_PREFIX + "enforce-version") or "latest"
    found = [result for check in (_BASELINE if level == "baseline" else _RESTRICTED) if (result := check(pod["spec"]))]
    if not found:
        return ""
    details = ", ".join(f"{reason} ({detail})" if detail else reason for reason, detail in found)
    return f'violates PodSecurity "{level}:{version}": {details}'


# --- ValidatingAdmissionPolicy ----------------------------------------------------------------------------


def policy_errors(policy: dict) -> list[FieldError]:
    """What the local cluster cannot evaluate in a policy: refused at its creation, loudly, not ignored later."""
    spec = policy.get("spec") or {}
    errors = []
    if spec.get("paramKind"):
        errors.append(
            FieldError.forbidden(
                "spec.paramKind", "the local cluster does not evaluate policies with params (not emulated)"
            )
        )
    for i, validation in enumerate(spec.get("validations") or []):
        for field in ("expression", "messageExpression"):
            if validation.get(field) and "authorizer" in validation[field]:
                errors.append(
                    FieldError.forbidden(
                        f"spec.validations[{i}].{field}",
                        "the local cluster does not emulate the authorizer in CEL expressions",
                    )
                )
    return errors


def _rule_matches(rule: dict, pod: dict) -> bool:
    def has(field: str, value: str) -> bool:
        listed = rule.get(field) or []
        return "*" in listed or value in listed

    return (
        has("apiGroups", "") and has("apiVersions", "v1") and has("resources", "pods") and has("operations", "CREATE")
    )


def _resources_match(match: Optional[dict], namespace: dict, pod: dict, rules_needed: bool) -> bool:
    match = match or {}
    rules = match.get("resourceRules")
    if rules is not None or rules_needed:
        if not any(_rule_matches(rule, pod) for rule in rules or []):
            return False
    for rule in match.get("excludeResourceRules") or []:
        if _rule_matches(rule, pod):
            return False
    for field, obj in (("namespaceSelector", namespace), ("objectSelector", pod)):
        selector = match.get(field)
        if selector and not _selector_matches(selector, (obj.get("metadata") or {}).get("labels") or {}):
            return False
    return True


def _selector_matches(selector: dict, labels: dict) -> bool:
    terms = [f"{k}={v}" for k, v in (selector.get("matchLabels") or {}).items()]
    for expr in selector.get("matchExpressions") or []:
        key, operator, values = expr["key"], expr["operator"], expr.get("values") or []
        if operator == "In":
            terms.append(f"{key} in ({','.join(values)})")
        elif operator == "NotIn":
            terms.append(f"{key} notin ({','.join(values)})")
        elif operator == "Exists":
            terms.append(key)
        elif operator == "DoesNotExist":
            terms.append(f"!{key}")
    return label_matcher(",".join(terms) or None)({"metadata": {"labels": labels}})


def _cel(expression: str, activation: dict) -> Any:
    import celpy  # the CEL evaluator (cel-python): imported when a policy is first evaluated

    environment = celpy.Environment()
    program = environment.program(environment.compile(expression))
    return program.evaluate(activation)


def _activation(namespace: dict, pod: dict, variables: list[dict]) -> dict:
    import celpy

    values: dict[str, Any] = {
        "object": celpy.json_to_cel(pod),
        "oldObject": None,
        "params": None,
        "namespaceObject": celpy.json_to_cel(namespace),
        "request": celpy.json_to_cel(
            {
                "operation": "CREATE",
                "namespace": pod["metadata"]["namespace"],
                "name": pod["metadata"].get("name", ""),
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "userInfo": {"username": "nemo-kubeflow-local"},
            }
        ),
    }
    # Each variable may use the ones before it (`variables.<name>`), as for real.
    computed = celpy.celtypes.MapType({})
    for variable in variables:
        computed[celpy.celtypes.StringType(variable["name"])] = _cel(
            variable["expression"], {**values, "variables": computed}
        )
    values["variables"] = computed
    return values


def _policies(store: Store, namespace: dict, pod: dict) -> list[str]:
    warnings: list[str] = []
    policies = {p["metadata"]["name"]: p for p in store.stored_list(R.VALIDATING_POLICIES, None)[0]}
    for binding in sorted(
        store.stored_list(R.VALIDATING_POLICY_BINDINGS, None)[0], key=lambda b: b["metadata"]["name"]
    ):
        bspec = binding.get("spec") or {}
        policy = policies.get(bspec.get("policyName", ""))
        if policy is None:
            continue
        spec = policy.get("spec") or {}
        if not _resources_match(spec.get("matchConstraints"), namespace, pod, True):
            continue
        if not _resources_match(bspec.get("matchResources"), namespace, pod, False):
            continue
        denial = _evaluate(policy, binding, namespace, pod)
        if denial is None:
            continue
        actions = bspec.get("validationActions") or []
        if "Warn" in actions:
            warnings.append(
                f"Validation failed for ValidatingAdmissionPolicy '{policy['metadata']['name']}' with "
                f"binding '{binding['metadata']['name']}': {denial[0]}"
            )
        if "Deny" in actions:
            message = (
                f"ValidatingAdmissionPolicy '{policy['metadata']['name']}' with binding "
                f"'{binding['metadata']['name']}' denied request: {denial[0]}"
            )
            code = {"Forbidden": 403, "Unauthorized": 401, "RequestEntityTooLarge": 413}.get(denial[1], 422)
            raise _forbidden(pod, message, code, denial[1], causes=True)
    return warnings


def _evaluate(policy: dict, binding: dict, namespace: dict, pod: dict) -> Optional[tuple[str, str]]:
    """(message, reason) of the first validation that fails, None when all pass (or a match condition does not
    match)."""
    spec = policy.get("spec") or {}
    fail_closed = spec.get("failurePolicy", "Fail") == "Fail"
    try:
        activation = _activation(namespace, pod, spec.get("variables") or [])
        for condition in spec.get("matchConditions") or []:
            if not bool(_cel(condition["expression"], activation)):
                return None
    except Exception as error:  # noqa: BLE001 - a CEL error is the policy's failure, as for real
        return (f"expression evaluation failed: {error}", "Invalid") if fail_closed else None
    for validation in spec.get("validations") or []:
        expression = validation.get("expression", "")
        try:
            passed = _cel(expression, activation)
            if isinstance(passed, Exception):
                raise passed
        except Exception as error:  # noqa: BLE001
            if fail_closed:
                return f"expression '{expression}' resulted in error: {error}", validation.get("reason") or "Invalid"
            continue
        if bool(passed):
            continue
        message = validation.get("message") or f"failed expression: {expression.strip()}"
        if validation.get("messageExpression"):
            try:
                text = str(_cel(validation["messageExpression"], activation))
                message = text.strip() or message
            except Exception:  # noqa: BLE001 - the static message stands, as for real
                pass
        return message, validation.get("reason") or "Invalid"
    return None


# --- ResourceQuota ----------------------------------------------------------------------------------------

_COMPUTE = ("cpu", "memory", "ephemeral-storage")
#: The resources a quota on cpu or memory makes every container name (the evaluator's validationSet).
_MUST_SPECIFY = ("cpu", "memory", "requests.cpu", "requests.memory", "limits.cpu", "limits.memory")


def _terminal(pod: dict) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def pod_usage(pod: dict) -> dict[str, tuple[Decimal, bool]]:
    """What a pod counts against quotas (PodUsageFunc): `count/pods` always, the rest while it is not terminal."""
    usage: dict[str, tuple[Decimal, bool]] = {"count/pods": (Decimal(1), False)}
    if _terminal(pod):
        return usage
    usage["pods"] = (Decimal(1), False)
    requests, limits = _sum_resources(pod["spec"], "requests"), _sum_resources(pod["spec"], "limits")
    for name in _COMPUTE:
        if name in requests:
            usage[name] = usage[f"requests.{name}"] = requests[name]
        if name in limits:
            usage[f"limits.{name}"] = limits[name]
    for name, value in requests.items():
        if name.startswith("hugepages-"):
            usage[name] = usage[f"requests.{name}"] = value
        elif "/" in name and not name.startswith("kubernetes.io/") and not name.startswith("requests."):
            usage[f"requests.{name}"] = value  # an extended resource: quota'd as requests.<name> only
    return usage


#: A stored pod's usage by (uid, generation, phase): what it counts changes with them only (a namespace's pods are
#: counted at each pod admitted there while a quota applies).
_USAGE_CACHE: dict[tuple, dict[str, tuple[Decimal, bool]]] = {}


def _stored_pod_usage(pod: dict) -> dict[str, tuple[Decimal, bool]]:
    meta = pod["metadata"]
    key = (meta.get("uid"), meta.get("generation"), (pod.get("status") or {}).get("phase"))
    usage = _USAGE_CACHE.get(key)
    if usage is None:
        if len(_USAGE_CACHE) > 65536:
            _USAGE_CACHE.clear()
        usage = _USAGE_CACHE[key] = pod_usage(pod)
    return usage


def _quotas(store: Store, namespace: str) -> list[dict]:
    quotas = store.stored_list(R.RESOURCEQUOTAS, namespace)[0]
    return sorted((q for q in quotas if not (q.get("spec") or {}).get("scopes")), key=lambda q: q["metadata"]["name"])


def _counted(key: str) -> Optional[R.ResourceType]:
    """The kind an object-count quota (`count/jobs.batch`, `count/configmaps`) counts; pods are counted apart."""
    if not key.startswith("count/") or key == "count/pods":
        return None
    try:
        rt = R.by_name(key[len("count/") :])
    except KeyError:
        return None
    return rt if rt.namespaced and rt.storage is None and rt.qualified == key[len("count/") :] else None


def _used(store: Store, namespace: str, hard: dict) -> dict[str, tuple[Decimal, bool]]:
    used: dict[str, tuple[Decimal, bool]] = {}
    for key in hard:
        rt = _counted(key)
        if rt is not None:
            used[key] = (Decimal(len(store.stored_list(rt, namespace)[0])), False)
    for pod in store.stored_list(R.PODS, namespace)[0]:
        for name, (value, binary) in _stored_pod_usage(pod).items():
            if name in hard:
                before = used.get(name)
                used[name] = (value + (before[0] if before else 0), before[1] if before else binary)
    return used


def _pretty(values: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(values.items()))


Usage = dict[str, tuple[Decimal, bool]]  # resource -> (amount, written in binary units)


def _quota(store: Store, namespace: str, pod: dict) -> dict[str, Usage]:
    """Refuse what a quota does not admit; return each quota's use with the pod counted in (by the quota's name)."""
    counted: dict[str, Usage] = {}
    usage = pod_usage(pod)
    for quota in _quotas(store, namespace):
        name = quota["metadata"]["name"]
        hard = (quota.get("spec") or {}).get("hard") or {}
        missing: dict[str, list[str]] = {}
        for resource in sorted(set(hard) & set(_MUST_SPECIFY)):
            section, _, base = resource.rpartition(".")
            for container in _visit(pod["spec"]):
                given = (container.get("resources") or {}).get(section or "requests") or {}
                if base not in given:
                    missing.setdefault(resource, []).append(container["name"])
        if missing:
            text = "; ".join(f"{r} for: {','.join(sorted(set(c)))}" for r, c in sorted(missing.items()))
            raise _forbidden(pod, f"failed quota: {name}: must specify {text}")
        used = _used(store, namespace, hard)
        exceeded = sorted(
            r for r in hard if r in usage and usage[r][0] + used.get(r, (Decimal(0), False))[0] > _q(hard[r])
        )
        if exceeded:
            requested = {r: format_quantity(*usage[r]) for r in exceeded}
            now = {r: format_quantity(*used.get(r, (Decimal(0), False))) for r in exceeded}
            limited = {r: _text(hard[r]) for r in exceeded}
            raise _forbidden(
                pod,
                f"exceeded quota: {name}, requested: {_pretty(requested)}, used: {_pretty(now)}, "
                f"limited: {_pretty(limited)}",
            )
        counted[name] = {
            r: (used.get(r, (Decimal(0), False))[0] + usage[r][0], used.get(r, usage[r])[1]) if r in usage else used[r]
            for r in hard
            if r in usage or r in used
        }
    return counted


def create_counted(
    store: Store, rt: R.ResourceType, obj: dict, uid: Optional[str] = None, dry_run: bool = False
) -> dict:
    """Store a new namespaced object (not a pod) past the object-count quotas of its namespace
    (`count/jobs.batch`): `jobs.batch "NAME" is forbidden: exceeded quota: ...` when one is full."""
    meta = obj["metadata"]
    key = f"count/{rt.qualified}"
    with store.lock:
        quotas = [q for q in _quotas(store, meta["namespace"]) if key in ((q.get("spec") or {}).get("hard") or {})]
        for quota in quotas:
            hard = _text(quota["spec"]["hard"][key])
            used = len(store.stored_list(rt, meta["namespace"])[0])
            if used + 1 > _q(hard):
                name = meta.get("name", "")
                details = {"name": name, "group": rt.group, "kind": rt.plural} if rt.group else None
                raise ApiError(
                    403,
                    f'{rt.qualified} "{name}" is forbidden: exceeded quota: {quota["metadata"]["name"]}, requested: '
                    f"{key}=1, used: {key}={used}, limited: {key}={hard}",
                    details=details or {"name": name, "kind": rt.plural},
                )
        if dry_run:
            return obj
        created = store.create(rt, obj, uid=uid)
        if quotas:
            sync_quotas(store, meta["namespace"])
        return created


def sync_quotas(store: Store, namespace: str) -> None:
    """The quota controller's part: each quota's `status.hard` (its spec's) and `status.used` (every resource
    it names, 0 when nothing uses it), from the namespace's pods now."""
    for quota in store.stored_list(R.RESOURCEQUOTAS, namespace)[0]:
        hard = (quota.get("spec") or {}).get("hard") or {}
        _write_status(store, namespace, quota["metadata"]["name"], hard, _used(store, namespace, hard))


def _write_status(store: Store, namespace: str, name: str, hard: dict, used: Usage) -> None:
    status = {
        "hard": {k: _text(v) for k, v in hard.items()},
        "used": {k: format_quantity(*used.get(k, (Decimal(0), False))) for k in hard},
    }

    def change(stored: dict) -> Optional[dict]:
        return None if stored.get("status") == status else {**stored, "status": status}

    store.mutate(R.RESOURCEQUOTAS, namespace, name, change)
