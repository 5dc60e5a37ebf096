"""The Pod Security Standards' ``baseline`` and ``restricted`` checks, run offline on a pod spec, each violation
in the words of Kubernetes' PodSecurity admission (``allowPrivilegeEscalation != false (container "node" must
set securityContext.allowPrivilegeEscalation=false)``) and with the executor field that fixes it.

Checked: host namespaces, privileged, capabilities, hostPath and other restricted volume types, host ports,
seccomp profiles, procMount, sysctls, privilege escalation, running as root. Not checked (our pods never set
them; an admin's runtime that does is still refused by the admission itself, in its own words): AppArmor and
SELinux options, Windows host processes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from nemo_kubeflow.schema.job_pods import containers, dict_items
from nemo_kubeflow.schema.problems import _dict

#: The Pod Security levels, most to least restrictive, and the namespace labels that enforce one.
LEVELS = ("restricted", "baseline", "privileged")
ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
ENFORCE_VERSION_LABEL = "pod-security.kubernetes.io/enforce-version"

#: The capabilities ``baseline`` lets a container add (Docker's defaults).
_BASELINE_CAPABILITIES = frozenset(
    "AUDIT_WRITE CHOWN DAC_OVERRIDE FOWNER FSETID KILL MKNOD NET_BIND_SERVICE SETFCAP SETGID SETPCAP SETUID "
    "SYS_CHROOT".split()
)
#: The volume types ``restricted`` allows.
_RESTRICTED_VOLUMES = frozenset(
    ("configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret")
)
_SAFE_SYSCTLS = frozenset(
    (
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    )
)

#: The fixes, by what they fix.
RESTRICTED_FIX = "set restricted_security=True (the executor then sets it on every container it renders)"
PRIVILEGE_FIX = (
    "drop what needs it (network_fabric='none', or a runtime_name/runtime_template whose pods do not need it), "
    "or run in a namespace that enforces a laxer Pod Security level"
)
RUN_AS_USER_FIX = "set run_as_user to a non-zero user id (or leave it unset with restricted_security=True)"


@dataclass(frozen=True)
class Violation:
    """One check the pod fails: its reason and detail as PodSecurity admission words them, and the fix."""

    check: str
    reason: str
    detail: str
    fix: str

    def __str__(self) -> str:
        return f"{self.reason} ({self.detail})"


def violations(level: str, pod: dict) -> list[Violation]:
    """What ``pod`` (a pod spec) violates at Pod Security ``level``, in the admission's order (the baseline
    checks that restricted keeps, by check id, then restricted's own, by check id); [] at ``privileged`` or
    an unknown level."""
    if level not in ("baseline", "restricted"):
        return []
    checks = [(check_id, _BASELINE[check_id]) for check_id in sorted(_BASELINE)]
    if level == "restricted":
        replaced = {r for overrides, _ in _RESTRICTED.values() for r in overrides}
        checks = [c for c in checks if c[0] not in replaced]
        checks += [(check_id, _RESTRICTED[check_id][1]) for check_id in sorted(_RESTRICTED)]
    return [v for check_id, check in checks if (v := check(check_id, pod)) is not None]


def enforced_level(namespace: dict) -> tuple[str, str]:
    """The Pod Security level a namespace enforces and its version (``privileged``, ``latest`` when unlabelled;
    an unknown level is kept as written and enforces nothing this module knows)."""
    labels = _dict(_dict(namespace.get("metadata")).get("labels"))
    return str(labels.get(ENFORCE_LABEL, "privileged")), str(labels.get(ENFORCE_VERSION_LABEL, "latest"))


def message(level: str, version: str, found: list[Violation]) -> str:
    """The admission's own sentence: ``violates PodSecurity "restricted:latest": <reason (detail)>, ...``."""
    return f'violates PodSecurity "{level}:{version}": ' + ", ".join(str(v) for v in found)


#: What a fix adds on an admin's runtime (``runtime_name``): its own containers keep their own settings.
ADMIN_RUNTIME_NOTE = (
    "on an admin's runtime (runtime_name) the executor sets only the node container's and the pod's: "
    "another container the message names needs the runtime's owner to set it"
)


def fixes(found: list[Violation], admin_runtime: bool = False) -> list[str]:
    """The distinct fixes of ``found``, in order; with ``admin_runtime``, what the executor cannot fix there."""
    return list(dict.fromkeys(v.fix for v in found)) + ([ADMIN_RUNTIME_NOTE] if admin_runtime else [])


# ------------------------------------------------------------------------------------------- the checks
# Each takes (check id, pod spec) and returns its Violation, or None when the pod passes it.


def _security(item: dict) -> dict:
    return _dict(item.get("securityContext"))


def _names(what: str, names: list[str]) -> str:
    """``container "a"`` or ``containers "a", "b"`` (the admission's way of listing)."""
    quoted = ", ".join(f'"{n}"' for n in names)
    return f"{what}s {quoted}" if len(names) > 1 else f"{what} {quoted}"


def _quoted(values: list[Any]) -> str:
    return ", ".join(f'"{v}"' for v in values)


def _violating(pod: dict, bad: Callable[[dict], bool]) -> list[str]:
    return [str(c.get("name")) for c in containers(pod) if bad(c)]


def _host_namespaces(check: str, pod: dict) -> Optional[Violation]:
    set_ = [f"{key}=true" for key in ("hostNetwork", "hostPID", "hostIPC") if pod.get(key) is True]
    return Violation(check, "host namespaces", ", ".join(set_), PRIVILEGE_FIX) if set_ else None


def _containers_must(check: str, reason: str, names: list[str], rule: str, fix: str) -> Optional[Violation]:
    """The violation of the containers ``names`` (None when there are none): ``containers "a", "b" <rule>``."""
    return Violation(check, reason, f"{_names('container', names)} {rule}", fix) if names else None


def _privileged(check: str, pod: dict) -> Optional[Violation]:
    bad = _violating(pod, lambda c: _security(c).get("privileged") is True)
    return _containers_must(check, "privileged", bad, "must not set securityContext.privileged=true", PRIVILEGE_FIX)


def _added(container: dict) -> list[str]:
    return [str(c) for c in _dict(_security(container).get("capabilities")).get("add") or []]


def _added_beyond(pod: dict, allowed: frozenset[str]) -> list[str]:
    """For each container that adds capabilities beyond ``allowed``: which, in the admission's words."""
    details = []
    for c in containers(pod):
        extra = [cap for cap in _added(c) if cap not in allowed]
        if extra:
            details.append(
                f"{_names('container', [str(c.get('name'))])} must not include {_quoted(extra)} in "
                "securityContext.capabilities.add"
            )
    return details


def _capabilities_baseline(check: str, pod: dict) -> Optional[Violation]:
    details = _added_beyond(pod, _BASELINE_CAPABILITIES)
    return Violation(check, "non-default capabilities", "; ".join(details), PRIVILEGE_FIX) if details else None


def _capabilities_restricted(check: str, pod: dict) -> Optional[Violation]:
    no_drop = _violating(pod, lambda c: "ALL" not in (_dict(_security(c).get("capabilities")).get("drop") or []))
    details = []
    if no_drop:
        details.append(f'{_names("container", no_drop)} must set securityContext.capabilities.drop=["ALL"]')
    added = _added_beyond(pod, frozenset(("NET_BIND_SERVICE",)))
    details += added
    if not details:
        return None
    return Violation(check, "unrestricted capabilities", "; ".join(details), PRIVILEGE_FIX if added else RESTRICTED_FIX)


def _volume_types(volume: dict) -> list[str]:
    return [k for k in volume if k != "name"]


def _host_path_volumes(check: str, pod: dict) -> Optional[Violation]:
    bad = [str(v.get("name")) for v in dict_items(pod.get("volumes")) if "hostPath" in v]
    return Violation(check, "hostPath volumes", _names("volume", bad), PRIVILEGE_FIX) if bad else None


def _restricted_volumes(check: str, pod: dict) -> Optional[Violation]:
    bad = {
        str(v.get("name")): [t for t in _volume_types(v) if t not in _RESTRICTED_VOLUMES]
        for v in dict_items(pod.get("volumes"))
    }
    bad = {name: types for name, types in bad.items() if types}
    if not bad:
        return None
    types = list(dict.fromkeys(t for ts in bad.values() for t in ts))
    verb = "use restricted volume types" if len(bad) > 1 or len(types) > 1 else "uses restricted volume type"
    return Violation(
        check, "restricted volume types", f"{_names('volume', list(bad))} {verb} {_quoted(types)}", PRIVILEGE_FIX
    )


def _host_ports(check: str, pod: dict) -> Optional[Violation]:
    ports: list[str] = []
    bad = []
    for c in containers(pod):
        used = [str(p.get("hostPort")) for p in dict_items(c.get("ports")) if p.get("hostPort")]
        if used:
            bad.append(str(c.get("name")))
            ports += used
    if not bad:
        return None
    verb = "use hostPorts" if len(bad) > 1 or len(ports) > 1 else "uses hostPort"
    return Violation(check, "hostPort", f"{_names('container', bad)} {verb} {', '.join(ports)}", PRIVILEGE_FIX)


def _seccomp_type(item: dict) -> Optional[str]:
    return _dict(_security(item).get("seccompProfile")).get("type")


def _seccomp_baseline(check: str, pod: dict) -> Optional[Violation]:
    details = []
    if _seccomp_type(pod) == "Unconfined":
        details.append('pod must not set securityContext.seccompProfile.type to "Unconfined"')
    bad = _violating(pod, lambda c: _seccomp_type(c) == "Unconfined")
    if bad:
        details.append(f'{_names("container", bad)} must not set securityContext.seccompProfile.type to "Unconfined"')
    return Violation(check, "seccompProfile", "; ".join(details), PRIVILEGE_FIX) if details else None


def _seccomp_restricted(check: str, pod: dict) -> Optional[Violation]:
    allowed = ("RuntimeDefault", "Localhost")
    pod_type = _seccomp_type(pod)
    details = []
    if pod_type is not None and pod_type not in allowed:
        details.append(f'pod must not set securityContext.seccompProfile.type to "{pod_type}"')
    wrong = [c for c in containers(pod) if _seccomp_type(c) is not None and _seccomp_type(c) not in allowed]
    for c in wrong:
        details.append(
            f"{_names('container', [str(c.get('name'))])} must not set securityContext.seccompProfile.type to "
            f'"{_seccomp_type(c)}"'
        )
    if pod_type is None:
        unset = _violating(pod, lambda c: _seccomp_type(c) is None)
        if unset:
            details.append(
                f"pod or {_names('container', unset)} must set securityContext.seccompProfile.type to "
                '"RuntimeDefault" or "Localhost"'
            )
    return Violation(check, "seccompProfile", "; ".join(details), RESTRICTED_FIX) if details else None


def _proc_mount(check: str, pod: dict) -> Optional[Violation]:
    bad = [c for c in containers(pod) if _security(c).get("procMount") not in (None, "Default")]
    mounts = _quoted(list(dict.fromkeys(str(_security(c).get("procMount")) for c in bad)))
    names = [str(c.get("name")) for c in bad]
    return _containers_must(
        check, "procMount", names, f"must not set securityContext.procMount to {mounts}", PRIVILEGE_FIX
    )


def _sysctls(check: str, pod: dict) -> Optional[Violation]:
    bad = [str(s.get("name")) for s in dict_items(_security(pod).get("sysctls")) if s.get("name") not in _SAFE_SYSCTLS]
    return Violation(check, "forbidden sysctls", ", ".join(bad), PRIVILEGE_FIX) if bad else None


def _allow_privilege_escalation(check: str, pod: dict) -> Optional[Violation]:
    bad = _violating(pod, lambda c: _security(c).get("allowPrivilegeEscalation") is not False)
    rule = "must set securityContext.allowPrivilegeEscalation=false"
    return _containers_must(check, "allowPrivilegeEscalation != false", bad, rule, RESTRICTED_FIX)


def _run_as_non_root(check: str, pod: dict) -> Optional[Violation]:
    pod_value = _security(pod).get("runAsNonRoot")
    details = []
    if pod_value is False:
        details.append("pod must not set securityContext.runAsNonRoot=false")
    explicit_false = _violating(pod, lambda c: _security(c).get("runAsNonRoot") is False)
    if explicit_false:
        details.append(f"{_names('container', explicit_false)} must not set securityContext.runAsNonRoot=false")
    if pod_value is not True:
        unset = _violating(pod, lambda c: _security(c).get("runAsNonRoot") is None)
        if unset:
            details.append(f"pod or {_names('container', unset)} must set securityContext.runAsNonRoot=true")
    return Violation(check, "runAsNonRoot != true", "; ".join(details), RESTRICTED_FIX) if details else None


def _run_as_user(check: str, pod: dict) -> Optional[Violation]:
    details = []
    if _security(pod).get("runAsUser") == 0:
        details.append("pod must not set runAsUser=0")
    bad = _violating(pod, lambda c: _security(c).get("runAsUser") == 0)
    if bad:
        details.append(f"{_names('container', bad)} must not set runAsUser=0")
    return Violation(check, "runAsUser=0", "; ".join(details), RUN_AS_USER_FIX) if details else None


_Check = Callable[[str, dict], Optional[Violation]]

#: The baseline checks, by the admission's check id (its order).
_BASELINE: dict[str, _Check] = {
    "capabilities_baseline": _capabilities_baseline,
    "hostNamespaces": _host_namespaces,
    "hostPathVolumes": _host_path_volumes,
    "hostPorts": _host_ports,
    "privileged": _privileged,
    "procMount": _proc_mount,
    "seccompProfile_baseline": _seccomp_baseline,
    "sysctls": _sysctls,
}
#: The checks restricted adds, each with the baseline checks it replaces.
_RESTRICTED: dict[str, tuple[tuple[str, ...], _Check]] = {
    "allowPrivilegeEscalation": ((), _allow_privilege_escalation),
    "capabilities_restricted": (("capabilities_baseline",), _capabilities_restricted),
    "restrictedVolumes": (("hostPathVolumes",), _restricted_volumes),
    "runAsNonRoot": ((), _run_as_non_root),
    "runAsUser": ((), _run_as_user),
    "seccompProfile_restricted": (("seccompProfile_baseline",), _seccomp_restricted),
}
