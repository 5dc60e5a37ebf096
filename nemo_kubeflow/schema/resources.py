"""Quantities, resources and env, as the API server and the Kubeflow SDK check them: requests within
limits, resource names, env names and their sources."""

from __future__ import annotations

from decimal import Decimal
from typing import Any, Optional

from nemo_kubeflow import constants as C
from nemo_kubeflow.parts import naming
from nemo_kubeflow.quantity import parse_quantity
from nemo_kubeflow.schema.names import _qualified_name_error
from nemo_kubeflow.schema.problems import Path, _dict, _fmt_path, _list, _Problems, _short

#: Device keys the Kubeflow SDK recognises in the `node` container's limits
#: (kubeflow/trainer/backends/kubernetes/utils.py: get_container_devices).
_SDK_DEVICE_KEYS = ("nvidia.com/gpu", "google.com/tpu", "huawei.com/Ascend910", "cpu")
_SDK_MIG_PREFIX = "nvidia.com/mig-"
_QUANTITY_FIX = 'use a Kubernetes quantity such as "8", "500m", "64Gi" or "1e3"'


def _is_extended(name: str) -> bool:
    # The API server's IsExtendedResourceName: qualified, outside kubernetes.io.
    return "/" in name and "kubernetes.io/" not in name and not name.startswith("requests.")


def _check_quantity(value: Any, path: Path, out: _Problems) -> Optional[Decimal]:
    quantity = parse_quantity(value)
    if quantity is None:
        out.add(path, f"{_short(value)} is not a Kubernetes quantity", _QUANTITY_FIX)
    elif quantity < 0:
        out.add(path, f"{_short(value)} is negative", "use a value >= 0")
        return None
    return quantity


def _check_resources(resources: Any, path: Path, out: _Problems, partial: bool = False) -> None:
    """Check requests/limits. ``partial``: only some keys are given (TrainJob resourcesPerNode
    is merged key by key over the runtime's), so a missing counterpart is not an error."""
    requests = _checked_quantities(resources, "requests", path, out)
    limits = _checked_quantities(resources, "limits", path, out)
    for name, request in requests.items():
        _check_request_within_limit(name, request, limits.get(name), path, out, partial)


def _checked_quantities(resources: Any, section: str, path: Path, out: _Problems) -> dict[str, Decimal]:
    """The valid quantities of ``resources[section]`` by name, after reporting the invalid ones."""
    parsed: dict[str, Decimal] = {}
    for name, value in _dict(_dict(resources).get(section)).items():
        quantity = _check_resource(name, value, path + (section, name), out)
        if quantity is not None:
            parsed[name] = quantity
    return parsed


def _cannot_overcommit(name: str) -> bool:
    # Extended resources and hugepages cannot be overcommitted: the API server wants request == limit.
    return _is_extended(name) or name.startswith("hugepages-")


def _check_request_within_limit(
    name: str, request: Decimal, limit: Optional[Decimal], path: Path, out: _Problems, partial: bool
) -> None:
    if limit is None:
        if _cannot_overcommit(name) and not partial:
            out.add(
                path + ("limits", name),
                f"{name} is requested but has no limit; it cannot be overcommitted",
                f"set limits.{name} to the same value",
            )
    elif request > limit:
        out.add(
            path + ("requests", name),
            f"request {request.normalize():f} exceeds the limit {limit.normalize():f}",
            "lower the request or raise the limit",
        )
    elif _cannot_overcommit(name) and request != limit:
        out.add(
            path + ("requests", name),
            f"request must equal the limit for {name}",
            "set requests and limits to the same value (or only limits)",
        )


def _check_resource_name(name: str, where: Path, out: _Problems) -> None:
    """A resource name is standard (cpu, memory...), hugepages-<size> or a qualified, domain-prefixed name."""
    if "/" in name:
        why = _qualified_name_error(name)
        if why:
            out.add(where, f"invalid resource name: {why}")
    elif name not in C.STANDARD_RESOURCES and not name.startswith("hugepages-"):
        fix = "use nvidia.com/gpu" if "gpu" in name.lower() else "use a domain-prefixed name such as nvidia.com/gpu"
        out.add(
            where,
            f"{_short(name)} is neither a standard resource ({', '.join(C.STANDARD_RESOURCES)}) nor domain-prefixed",
            fix,
        )


def _check_resource(name: str, value: Any, where: Path, out: _Problems) -> Optional[Decimal]:
    """One request or limit: its name and quantity; the quantity, or ``None`` when it is wrong."""
    _check_resource_name(name, where, out)
    quantity = _check_quantity(value, where, out)
    if quantity is not None and _is_extended(name) and quantity != quantity.to_integral_value():
        out.add(
            where,
            f"{_short(value)} is not a whole number; {name} cannot be split",
            "request whole devices, e.g. 1",
        )
        return None
    return quantity


_ENV_SOURCES = ("configMapKeyRef", "fieldRef", "fileKeyRef", "resourceFieldRef", "secretKeyRef")


def _check_env(env: Any, path: Path, out: _Problems, trainer_env: bool = False) -> None:
    """An env list: names valid, each set once (and none Trainer reserves where ``trainer_env``), one value each."""
    seen: dict[str, int] = {}
    for i, var in enumerate(_list(env)):
        var = _dict(var)
        name = var.get("name")
        if isinstance(name, str):
            _check_env_name(name, path + (i, "name"), out, trainer_env)
            if name in seen:
                out.add(
                    path + (i, "name"),
                    f"{name} is already set at {_fmt_path(path + (seen[name],))}",
                    "keep one of them",
                )
            seen.setdefault(name, i)
        _check_env_value(var, path + (i,), out)


def _check_env_name(name: str, path: Path, out: _Problems, trainer_env: bool) -> None:
    if not naming.is_env_var_name(name):
        out.add(path, f"{_short(name)} is not a valid environment variable name", f"use {naming.ENV_VAR_NAME_RULE}")
    reserved = naming.trainer_env_problem(name) if trainer_env else None
    if reserved:
        out.add(path, reserved, "remove it")


def _check_env_value(var: dict, path: Path, out: _Problems) -> None:
    """A variable sets a value or one source in valueFrom."""
    value_from = var.get("valueFrom")
    if var.get("value") not in (None, "") and value_from is not None:
        out.add(path, "sets both value and valueFrom", "keep only one")
    if isinstance(value_from, dict):
        _check_env_source(value_from, path + ("valueFrom",), out)


def _check_env_source(value_from: dict, path: Path, out: _Problems) -> None:
    sources = [k for k in _ENV_SOURCES if value_from.get(k) is not None]
    if len(sources) != 1:
        out.add(path, f"sets {len(sources)} sources", f"set exactly one of {', '.join(_ENV_SOURCES)}")
