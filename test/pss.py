"""A test oracle for the Kubernetes Pod Security Standards (baseline and restricted profiles).

Mirrors the rules of https://kubernetes.io/docs/concepts/security/pod-security-standards/
for the fields our runtimes can contain. Returns the violations, [] when the pod passes.
"""

BASELINE_CAPS = {
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
}
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def _containers(spec):
    return list(spec.get("containers") or []) + list(spec.get("initContainers") or [])


def baseline(spec: dict) -> list[str]:
    problems = []
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            problems.append(f"{key}: true")
    for vol in spec.get("volumes") or []:
        if "hostPath" in vol:
            problems.append(f"volume {vol['name']}: hostPath")
    pod_seccomp = ((spec.get("securityContext") or {}).get("seccompProfile") or {}).get("type")
    if pod_seccomp == "Unconfined":
        problems.append("pod seccompProfile Unconfined")
    for c in _containers(spec):
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            problems.append(f"container {c['name']}: privileged")
        added = set((sc.get("capabilities") or {}).get("add") or []) - BASELINE_CAPS
        if added:
            problems.append(f"container {c['name']}: adds capabilities {sorted(added)}")
        if any(p.get("hostPort") for p in c.get("ports") or []):
            problems.append(f"container {c['name']}: hostPort")
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
            problems.append(f"container {c['name']}: seccompProfile Unconfined")
    return problems


def restricted(spec: dict) -> list[str]:
    problems = baseline(spec)
    pod_sc = spec.get("securityContext") or {}
    for vol in spec.get("volumes") or []:
        kinds = set(vol) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            problems.append(f"volume {vol['name']}: type {sorted(kinds)} not allowed")
    if pod_sc.get("runAsUser") == 0:
        problems.append("pod runAsUser 0")
    for c in _containers(spec):
        sc = c.get("securityContext") or {}
        name = c["name"]
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"container {name}: allowPrivilegeEscalation must be false")
        if not (sc.get("runAsNonRoot") or (pod_sc.get("runAsNonRoot") and sc.get("runAsNonRoot") is not False)):
            problems.append(f"container {name}: runAsNonRoot must be true")
        if sc.get("runAsUser") == 0:
            problems.append(f"container {name}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"container {name}: seccompProfile must be RuntimeDefault or Localhost")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            problems.append(f"container {name}: must drop ALL capabilities")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            problems.append(f"container {name}: may add only NET_BIND_SERVICE")
    return problems
