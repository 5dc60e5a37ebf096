"""An admin's runtime (``runtime_name``) against our runtime patch: what the patch would replace in it,
or cannot reach, each naming the executor field."""

from __future__ import annotations

from typing import Any, Iterator

from nemo_kubeflow import constants as C
from nemo_kubeflow.parts.naming import PATCH_MANAGER
from nemo_kubeflow.schema.problems import _dict, _first_with, _list, _short
from nemo_kubeflow.schema.runtimes import _pod_template

#: The executor field behind each part of our runtime patch's pod (build/render.existing_runtime_pod).
_PATCH_FIELDS = {
    "tolerations": "tolerations",
    "nodeSelector": "node_selector",
    "serviceAccountName": "service_account",
    "terminationGracePeriodSeconds": "termination_grace_period_seconds",
    "labels": "pod_labels",
    "annotations": "pod_annotations",
}
_SECURITY_FIELDS = {"runAsUser": "run_as_user", "fsGroup": "fs_group"}


def _volume_field(name: str) -> str:
    """The executor field behind a volume of our patch, by the name render.runtime_volumes gives it."""
    for prefix, fname in (("dshm", "shm_size"), ("pvc-", "pvc_mounts"), ("secret-", "secret_mounts")):
        if name.startswith(prefix):
            return fname
    return "workspace_mount_path (the task's files)"


def runtime_patch_conflicts(trainjob: dict, runtime: dict) -> list[str]:
    """What our runtime patch would replace in an admin's ``runtime`` (``runtime_name``), or cannot reach:
    Trainer merges the patch over the runtime (a strategic merge: a toleration list is replaced whole, a
    node selector key, a volume name or a mount path overwritten), so each is refused, naming the executor
    field and the runtime's value. A patch that only adds passes."""
    ours = _first_with(_list(_dict(trainjob.get("spec")).get("runtimePatches")), "manager", PATCH_MANAGER)
    if ours is None:
        return []
    name = _dict(runtime.get("metadata")).get("name")
    rjobs = _list(_dict(_dict(_dict(runtime.get("spec")).get("template")).get("spec")).get("replicatedJobs"))
    admin_job = _first_with(rjobs, "name", C.TRAINER_NODE)
    if admin_job is None:
        names = ", ".join(str(_dict(j).get("name")) for j in rjobs) or "none"
        return [
            f"runtime {name!r} has no replicated job {C.TRAINER_NODE!r} (it has: {names}): nemo_kubeflow's "
            "settings go to that job's pods; use a runtime built like Trainer's torch-distributed"
        ]
    patch_jobs = _list(
        _dict(_dict(_dict(ours.get("trainingRuntimeSpec")).get("template")).get("spec")).get("replicatedJobs")
    )
    patch_template = _pod_template(_first_with(patch_jobs, "name", C.TRAINER_NODE))
    admin_template = _pod_template(admin_job)
    conflicts = _PatchConflicts(str(name), _dict(patch_template.get("spec")), _dict(admin_template.get("spec")))
    conflicts.check_pod_metadata(_dict(patch_template.get("metadata")), _dict(admin_template.get("metadata")))
    conflicts.check_pod()
    return conflicts.problems


def _changed(ours: dict, theirs: dict) -> Iterator[tuple[Any, Any]]:
    """The keys of ``ours`` that ``theirs`` sets to another value, with ``theirs``'s value."""
    return ((key, theirs[key]) for key, value in ours.items() if key in theirs and theirs[key] != value)


class _PatchConflicts:
    """The conflicts of our patch's pod spec ``pod`` with the admin runtime's ``admin``, as messages."""

    def __init__(self, name: str, pod: dict, admin: dict) -> None:
        self.name, self.pod, self.admin = name, pod, admin
        self.problems: list[str] = []

    def replaced(self, fname: str, what: str, theirs: Any) -> None:
        self.problems.append(
            f"{fname}: runtime {self.name!r} already sets {what} to {_short(theirs, 120)}; the job's "
            f"runtime patch would replace the admin's value. Leave {fname} unset to keep it, or use a "
            "runtime without it"
        )

    def check_pod_metadata(self, ours: dict, theirs: dict) -> None:
        """The pod labels and annotations of our patch (``ours``) against the runtime's (``theirs``)."""
        for section in ("labels", "annotations"):
            for key, value in _changed(_dict(ours.get(section)), _dict(theirs.get(section))):
                self.replaced(_PATCH_FIELDS[section], f"pod {section[:-1]} {key!r}", value)

    def check_pod(self) -> None:
        self.check_tolerations()
        self.check_pod_settings()
        self.check_volumes()
        containers = {str(_dict(c).get("name")): _dict(c) for c in _list(self.admin.get("containers"))}
        for patched in _list(self.pod.get("containers")):
            self.check_container(_dict(patched), containers)

    def check_tolerations(self) -> None:
        """A patch's tolerations replace the runtime's list whole: it must repeat the runtime's."""
        missing = [t for t in _list(self.admin.get("tolerations")) if t not in _list(self.pod.get("tolerations"))]
        if self.pod.get("tolerations") and missing:
            self.problems.append(
                f"tolerations: runtime {self.name!r} has tolerations {_short(missing, 160)} and a patch replaces "
                "the whole list: add them to tolerations too, or leave tolerations unset"
            )

    def check_pod_settings(self) -> None:
        """The node selector keys, scalar fields and security context fields that our patch overwrites."""
        pod, admin = self.pod, self.admin
        for key, theirs in _changed(_dict(pod.get("nodeSelector")), _dict(admin.get("nodeSelector"))):
            self.replaced("node_selector", f"nodeSelector {key!r}", theirs)
        scalars = {key: pod[key] for key in ("serviceAccountName", "terminationGracePeriodSeconds") if key in pod}
        for key, theirs in _changed(scalars, admin):
            self.replaced(_PATCH_FIELDS[key], key, theirs)
        for key, theirs in _changed(_dict(pod.get("securityContext")), _dict(admin.get("securityContext"))):
            self.replaced(_SECURITY_FIELDS.get(key, "restricted_security"), f"securityContext.{key}", theirs)

    def check_volumes(self) -> None:
        admin_volumes = {_dict(v).get("name") for v in _list(self.admin.get("volumes"))}
        for volume in _list(self.pod.get("volumes")):
            if _dict(volume).get("name") in admin_volumes:
                self.problems.append(
                    f"{_volume_field(str(volume['name']))}: runtime {self.name!r} already has a volume named "
                    f"{volume['name']!r}, which the job's volume would replace; rename the runtime's volume"
                )

    def check_container(self, patched: dict, containers: dict[str, dict]) -> None:
        """One container of our patch against the runtime's ``containers`` by name."""
        cname = patched.get("name")
        if cname not in containers:
            self.problems.append(
                f"runtime {self.name!r} has no container {cname!r} in its {C.TRAINER_NODE!r} pods (it has: "
                f"{', '.join(containers) or 'none'}): nemo_kubeflow's mounts and settings go to it"
            )
            return
        self.check_mounts(patched, containers[cname])
        if patched.get("securityContext"):
            self.check_restricted_security(str(cname), containers)

    def check_restricted_security(self, cname: str, containers: dict[str, dict]) -> None:
        """Our patch restricts container ``cname`` only: the runtime must run no other container beside it."""
        others = [n for n in containers if n != cname] + [
            str(_dict(c).get("name")) for c in _list(self.admin.get("initContainers"))
        ]
        if others:
            self.problems.append(
                f"restricted_security: runtime {self.name!r} runs containers {', '.join(others)} beside "
                f"{cname!r}, which a runtime patch cannot restrict; make the runtime's pods pass "
                "the restricted profile itself and leave restricted_security False"
            )

    def check_mounts(self, patched: dict, theirs: dict) -> None:
        """The mount paths of our container ``patched`` that the runtime's container ``theirs`` mounts already."""
        cname = patched.get("name")
        mounts = {_dict(m).get("mountPath"): _dict(m).get("name") for m in _list(theirs.get("volumeMounts"))}
        for mount in _list(patched.get("volumeMounts")):
            path = _dict(mount).get("mountPath")
            if path in mounts:
                self.problems.append(
                    f"{_volume_field(str(mount.get('name')))}: runtime {self.name!r} already mounts volume "
                    f"{mounts[path]!r} at {path!r} in container {cname!r}; mount somewhere else"
                    + (", or set shm_size=None to keep the runtime's /dev/shm" if path == "/dev/shm" else "")
                )
