"""The core pod and container checks of the API server: restart policies, unique names, volumes and
their mounts."""

from __future__ import annotations

from typing import Any

from nemo_kubeflow.schema.names import _check_dns_label
from nemo_kubeflow.schema.problems import Path, _close_match, _dict, _fmt_path, _list, _Problems, _short
from nemo_kubeflow.schema.resources import _check_env, _check_quantity, _check_resources

_JOB_POD_RESTART_POLICIES = ("Never", "OnFailure")


def _check_pod_spec(pod: dict, path: Path, out: _Problems) -> None:
    if "containers" in pod and not _list(pod.get("containers")):
        out.add(path + ("containers",), "must contain at least one container", "add the container to run")
    _check_job_pod_restart_policy(pod.get("restartPolicy"), path + ("restartPolicy",), out)
    volumes = _check_pod_volumes(pod, path, out)
    names: dict[str, Path] = {}
    for section in ("initContainers", "containers"):
        for i, container in enumerate(_list(pod.get(section))):
            _check_container(_dict(container), section, path + (section, i), volumes, names, out)
    _check_resources(pod.get("resources"), path + ("resources",), out)


def _check_job_pod_restart_policy(restart: Any, path: Path, out: _Problems) -> None:
    if isinstance(restart, str) and restart not in _JOB_POD_RESTART_POLICIES:
        out.add(path, f"{restart} is not allowed in a Job's pod template", "use Never or OnFailure (or leave it unset)")


def _unique_names(items: list, path: Path, what: str, verb: str, fix: str, out: _Problems) -> dict[str, int]:
    """Check the names of ``items`` at ``path`` (``volumes``, ``replicatedJobs``): DNS labels, each given once.
    Returns the names, each with the index of its first item."""
    names: dict[str, int] = {}
    for i, item in enumerate(items):
        name = _dict(item).get("name")
        if not isinstance(name, str):
            continue
        _check_dns_label(name, path + (i, "name"), out, what=f"{what} name")
        if name in names:
            out.add(path + (i, "name"), f"{what} {name} is already {verb} at {path[-1]}[{names[name]}]", fix)
        names.setdefault(name, i)
    return names


def _check_pod_volumes(pod: dict, path: Path, out: _Problems) -> dict[str, int]:
    """Check the pod's volumes; their names, each with the index of its first declaration."""
    items = _list(pod.get("volumes"))
    volumes = _unique_names(items, path + ("volumes",), "volume", "declared", "rename or remove one of them", out)
    for i, volume in enumerate(items):
        size = _dict(_dict(volume).get("emptyDir")).get("sizeLimit")
        if size is not None and isinstance(_dict(volume).get("name"), str):
            _check_quantity(size, path + ("volumes", i, "emptyDir", "sizeLimit"), out)
    return volumes


def _check_container(
    container: dict, section: str, where: Path, volumes: dict[str, int], names: dict[str, Path], out: _Problems
) -> None:
    """One container or init container; ``names``: the container names seen so far (this one is added)."""
    name = container.get("name")
    if isinstance(name, str):
        _check_container_name(name, where + ("name",), names, out)
        names.setdefault(name, where)
    _check_container_restart_policy(container.get("restartPolicy"), section, where + ("restartPolicy",), out)
    _check_env(container.get("env"), where + ("env",), out)
    _check_resources(container.get("resources"), where + ("resources",), out)
    _check_volume_mounts(container, where, volumes, out)


def _check_container_name(name: str, path: Path, names: dict[str, Path], out: _Problems) -> None:
    """A DNS label that no other container or init container of the pod has (``names``: theirs so far)."""
    _check_dns_label(name, path, out, what="container name")
    if name in names:
        out.add(
            path,
            f"container name {name} is already used at {_fmt_path(names[name])}",
            "give every container and init container its own name",
        )


def _check_container_restart_policy(policy: Any, section: str, path: Path, out: _Problems) -> None:
    """Only init containers take a restartPolicy, and only Always (a native sidecar)."""
    if section == "containers" and policy is not None:
        out.add(
            path,
            "only init containers take a restartPolicy (native sidecars)",
            "move this container to initContainers with restartPolicy: Always",
        )
    elif section == "initContainers" and policy not in (None, "Always"):
        out.add(path, f"{_short(policy)} is not allowed", "use Always (a native sidecar) or leave it unset")


def _check_volume_mounts(container: dict, where: Path, volumes: dict[str, int], out: _Problems) -> None:
    mount_paths: dict[str, int] = {}
    for j, mount in enumerate(_list(container.get("volumeMounts"))):
        ref, mount_path = _dict(mount).get("name"), _dict(mount).get("mountPath")
        if isinstance(ref, str):
            _check_mounted_volume(ref, volumes, where + ("volumeMounts", j, "name"), out)
        if isinstance(mount_path, str):
            if mount_path in mount_paths:
                out.add(
                    where + ("volumeMounts", j, "mountPath"),
                    f"{mount_path} is already mounted at volumeMounts[{mount_paths[mount_path]}]",
                    "mount each path once",
                )
            mount_paths.setdefault(mount_path, j)


def _check_mounted_volume(ref: str, volumes: dict[str, int], path: Path, out: _Problems) -> None:
    """A mount names one of the pod's ``volumes``."""
    if ref not in volumes:
        match = _close_match(ref, list(volumes))
        out.add(
            path,
            f"no volume named {ref} in the pod's volumes",
            f"did you mean {match}?" if match else "declare it under the pod's volumes",
        )
