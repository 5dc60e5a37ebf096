"""The TrainJob: its spec as the CRD's CEL rules and the Trainer webhook check it (runtimeRef, trainer,
initializer, runtimePatches)."""

from __future__ import annotations

import re
from typing import Any, Iterator

from nemo_kubeflow import constants as C
from nemo_kubeflow.parts import naming
from nemo_kubeflow.schema.names import _check_pod_names, _check_subdomain
from nemo_kubeflow.schema.problems import Path, _dict, _find, _is_int, _list, _Problems, _short
from nemo_kubeflow.schema.resources import _check_env, _check_resources
from nemo_kubeflow.schema.walk import _check_model


def _check_trainjob(obj: dict, out: _Problems) -> None:
    _check_model(obj, C.TRAINJOB_KIND, out)
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        out.add(("spec",), "required object is missing", "set spec.runtimeRef and spec.trainer")
        return
    path: Path = ("spec",)
    _check_runtime_ref(_dict(spec.get("runtimeRef")), path + ("runtimeRef",), out)
    _check_trainer(_dict(spec.get("trainer")), path + ("trainer",), out)
    _check_at_least_one(
        spec.get("activeDeadlineSeconds"),
        path + ("activeDeadlineSeconds",),
        out,
        "set a positive number of seconds or leave it unset",
    )
    _check_managed_by(spec.get("managedBy"), path + ("managedBy",), out)
    for step in ("dataset", "model"):
        _check_initializer(_dict(_dict(spec.get("initializer")).get(step)), path + ("initializer", step), out)
    _check_runtime_patches(spec.get("runtimePatches"), path + ("runtimePatches",), out)
    _check_pod_names(obj, None, out)


def _check_at_least_one(value: Any, path: Path, out: _Problems, fix: str = "set at least 1") -> None:
    """Counts (nodes, processes, seconds) that the CRDs require to be at least 1."""
    if _is_int(value) and value < 1:
        out.add(path, f"{value} is less than 1", fix)


def _check_managed_by(managed_by: Any, path: Path, out: _Problems) -> None:
    allowed = C.TRAINJOB_MANAGED_BY_VALUES
    if isinstance(managed_by, str) and managed_by not in allowed:
        out.add(
            path, f"{_short(managed_by)} is not allowed by the CRD", f"use {' or '.join(allowed)}, or leave it unset"
        )


def _check_runtime_ref_name(name: Any, path: Path, out: _Problems) -> None:
    if name == "":
        out.add(path, "must not be empty", "name the runtime to run, e.g. torch-distributed")
    elif isinstance(name, str):
        _check_subdomain(name, path, out)


def _check_runtime_ref(ref: dict, path: Path, out: _Problems) -> None:
    _check_runtime_ref_name(ref.get("name"), path + ("name",), out)
    kind, group = ref.get("kind"), ref.get("apiGroup")
    if isinstance(kind, str) and kind not in (C.CLUSTER_RUNTIME_KIND, C.RUNTIME_KIND):
        out.add(
            path + ("kind",),
            f"{_short(kind)} is not a runtime kind",
            f"use {C.CLUSTER_RUNTIME_KIND} or {C.RUNTIME_KIND}",
        )
    if isinstance(group, str) and group != C.TRAINER_GROUP:
        out.add(
            path + ("apiGroup",),
            f"{_short(group)} is not the Trainer API group",
            f"use {C.TRAINER_GROUP} or leave it unset",
        )


def _check_trainer(trainer: dict, tpath: Path, out: _Problems) -> None:
    for field in ("numNodes", "numProcPerNode"):
        _check_at_least_one(trainer.get(field), tpath + (field,), out)
    for field, limit in (
        ("command", C.TRAINER_ARGV_MAX_ITEMS),
        ("args", C.TRAINER_ARGV_MAX_ITEMS),
        ("env", C.TRAINER_ENV_MAX_ITEMS),
    ):
        if len(_list(trainer.get(field))) > limit:
            out.add(
                tpath + (field,),
                f"{len(trainer[field])} items, over the CRD limit of {limit}",
                "move the rest into a script",
            )
    _check_env(trainer.get("env"), tpath + ("env",), out, trainer_env=True)
    _check_resources(trainer.get("resourcesPerNode"), tpath + ("resourcesPerNode",), out, partial=True)


def _check_initializer(init: dict, ipath: Path, out: _Problems) -> None:
    uri = init.get("storageUri")
    if isinstance(uri, str) and uri and not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*://.+", uri):
        out.add(ipath + ("storageUri",), f"{_short(uri)} is not a URI", "use scheme://..., e.g. hf://org/model")
    _check_env(init.get("env"), ipath + ("env",), out)


_INITIALIZER_CONTAINERS = ("dataset-initializer", "model-initializer")
#: From a replicated job to its pod spec.
_POD_SPEC_PATH: tuple[str, ...] = ("template", "spec", "template", "spec")


def _check_runtime_patches(patches: Any, path: Path, out: _Problems) -> None:
    patches = _list(patches)
    if len(patches) > 16:
        out.add(path, f"{len(patches)} patches, over the CRD limit of 16", "merge patches that share a manager")
    managers: dict[str, int] = {}
    for i, patch in enumerate(patches):
        manager = _dict(patch).get("manager")
        if isinstance(manager, str):
            _check_patch_manager(manager, path + (i, "manager"), out)
            if manager in managers:
                out.add(
                    path + (i, "manager"),
                    f"manager {manager} is already used by runtimePatches[{managers[manager]}]",
                    "merge the two patches",
                )
            managers.setdefault(manager, i)
        _check_patch_env(_dict(patch), path + (i,), out)


def _check_patch_manager(manager: str, path: Path, out: _Problems) -> None:
    prefix, slash, rest = manager.partition("/")
    if not slash or not rest or not naming.is_rfc1123_subdomain(prefix):
        out.add(path, f"{_short(manager)} is not a domain-prefixed path", "use e.g. example.com/my-tool")


def _patch_containers(patch: dict, path: Path) -> Iterator[tuple[Path, Any]]:
    """The init containers and containers of a runtime patch's replicated jobs, each with its path."""
    jobs = _dict(_dict(patch.get("trainingRuntimeSpec")).get("template")).get("spec")
    for section in ("initContainers", "containers"):
        yield from _find(
            jobs,
            ("replicatedJobs", "*", *_POD_SPEC_PATH, section, "*"),
            path + ("trainingRuntimeSpec", "template", "spec"),
        )


def _check_patch_env(patch: dict, path: Path, out: _Problems) -> None:
    """The Trainer webhook refuses env on the node and initializer containers in a patch: their env comes
    from the TrainJob's spec."""
    for cpath, container in _patch_containers(patch, path):
        name = _dict(container).get("name")
        if name in (C.TRAINER_NODE, *_INITIALIZER_CONTAINERS) and _dict(container).get("env") is not None:
            fix = "use spec.trainer.env" if name == C.TRAINER_NODE else "use spec.initializer env"
            out.add(cpath + ("env",), f"the Trainer webhook rejects env on the {name} container in runtimePatches", fix)
