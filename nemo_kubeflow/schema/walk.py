"""The schema layer: an object walked against its compiled CRD or core schema (schemas.json), with Strict
semantics: unknown fields, types, required fields, enums, and the schemas' value constraints."""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any, Callable, Optional, Sequence

from nemo_kubeflow import constants as C
from nemo_kubeflow.schema import compiled as schemas
from nemo_kubeflow.schema.problems import Path, _did_you_mean, _is_int, _json_type, _not_at, _Problems, _short
from nemo_kubeflow.schema.resources import _QUANTITY_FIX

#: Fields removed from the API (path from the object's root -> what to use instead).
_REMOVED_FIELDS: dict[tuple[str, ...], str] = {
    (
        "spec",
        "mlPolicy",
        "torch",
        "numProcPerNode",
    ): "removed in Trainer v2.2; set spec.trainer.numProcPerNode on the TrainJob",
    ("spec", "podTemplateOverrides"): "removed in Trainer v2.2; use spec.runtimePatches",
    ("spec", "podSpecOverrides"): "removed in Trainer v2.1; use spec.runtimePatches",
}

_EXPECTED = {
    "object": "an object",
    "array": "a list",
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "a boolean (true/false)",
    "quantity": "a quantity (number or string)",
    "int-or-string": "a value (integer or string)",
}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


#: Strict semantics, as the models' Strict types and the API server's decoder: no "8" for 8, no 8.0 for
#: an integer, no 1 for true.
_TYPE_CHECKS: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": _is_int,
    "number": _is_number,
    "boolean": lambda v: isinstance(v, bool),
    "quantity": lambda v: isinstance(v, str) or _is_number(v),
    "int-or-string": lambda v: isinstance(v, str) or _is_int(v),
}


def _integer_fix(value: Any, path: Path) -> str:
    if not isinstance(value, str):
        return ""
    return f"write {value} without quotes" if value.strip().lstrip("-").isdigit() else "set a whole number, e.g. 8"


def _string_fix(value: Any, path: Path) -> str:
    return f'quote it: "{json.dumps(value)}"' if isinstance(value, (int, float)) else ""


def _list_fix(value: Any, path: Path) -> str:
    if not isinstance(value, str):
        return ""
    if path and path[-1] in ("command", "args"):
        return 'write one item per argument, e.g. ["bash", "-c", "..."]'
    return f"write a list, e.g. [{_short(value)}]"


#: How to fix a value of the wrong type, by the schema type expected: the mistakes YAML makes easy (a quoted
#: number, an unquoted string, a command line as one string). Other types get no hint.
_TYPE_FIXES: dict[str, Callable[[Any, Path], str]] = {
    "integer": _integer_fix,
    "string": _string_fix,
    "array": _list_fix,
}


def _type_problem(kind: str, value: Any, path: Path, out: _Problems) -> None:
    fixer = _TYPE_FIXES.get(kind)
    fix = fixer(value, path) if fixer else ""
    out.add(path, f"expected {_EXPECTED[kind]}, got {_json_type(value)} {_short(value)}", fix)


@lru_cache(maxsize=None)
def _pattern(pattern: str) -> Optional[re.Pattern]:
    try:
        return re.compile(pattern)
    except re.error:  # a Go (RE2) construct Python lacks: the API server checks it
        return None


def _enum_list(values: Sequence[Any]) -> str:
    return ", ".join(v if isinstance(v, str) and v else json.dumps(v) for v in values)


def _check_constraints(value: Any, node: dict, path: Path, out: _Problems) -> None:
    """The CRDs' value rules, reported unless a rule of this module already reported the field (``soft``)."""
    _check_soft_enum(value, node, path, out)
    if _is_int(value) and node.get("format") in C.INT_FORMAT_RANGES:
        _check_int_format(value, node["format"], path, out)
    if _is_number(value):
        _check_number_constraints(value, node, path, out)
    elif isinstance(value, list):
        _check_list_constraints(value, node, path, out)
    elif isinstance(value, str):
        _check_string_constraints(value, node, path, out)


def _check_soft_enum(value: Any, node: dict, path: Path, out: _Problems) -> None:
    """The values the kubeflow_trainer_api models allow, where the CRD has no enum."""
    if "enum_soft" in node and value not in node["enum_soft"]:
        out.soft(path, f"{_short(value)} is not allowed", f"use one of {_enum_list(node['enum_soft'])}")


def _check_int_format(value: int, fmt: str, path: Path, out: _Problems) -> None:
    """An integer fits its format (int32, int64): the API server cannot store it otherwise."""
    low, high = C.INT_FORMAT_RANGES[fmt]
    if not low <= value <= high:
        out.add(
            path,
            f"{value} does not fit {fmt} ({low} to {high})",
            f"set at most {high}" if value > high else f"set at least {low}",
        )


def _check_number_constraints(value: Any, node: dict, path: Path, out: _Problems) -> None:
    if "minimum" in node and value < node["minimum"]:
        out.soft(path, f"{value} is less than {node['minimum']}", f"set at least {node['minimum']}")
    if "maximum" in node and value > node["maximum"]:
        out.soft(path, f"{value} is more than {node['maximum']}", f"set at most {node['maximum']}")


def _check_list_constraints(value: list, node: dict, path: Path, out: _Problems) -> None:
    if "maxItems" in node and len(value) > node["maxItems"]:
        out.soft(path, f"{len(value)} items, over the CRD limit of {node['maxItems']}", "remove some")
    if "minItems" in node and len(value) < node["minItems"]:
        out.soft(path, f"{len(value)} items; the CRD requires at least {node['minItems']}", "add items")


def _check_string_constraints(value: str, node: dict, path: Path, out: _Problems) -> None:
    if "maxLength" in node and len(value) > node["maxLength"]:
        out.soft(path, f"{len(value)} characters, over the CRD limit of {node['maxLength']}", "shorten it")
    if "minLength" in node and len(value) < node["minLength"]:
        out.soft(
            path,
            "must not be empty"
            if node["minLength"] == 1
            else f"shorter than the {node['minLength']} characters the CRD requires",
            "set a value",
        )
    _check_pattern(value, node, path, out)


def _check_pattern(value: str, node: dict, path: Path, out: _Problems) -> None:
    compiled = _pattern(node["pattern"]) if "pattern" in node else None
    if compiled is None or compiled.search(value):
        return
    if node.get("type") == "quantity":
        out.soft(path, f"{_short(value)} is not a Kubernetes quantity", _QUANTITY_FIX)
    else:
        out.soft(path, f"{_short(value)} does not match the CRD's pattern {node['pattern']}", "fix the value")


def _walk(value: Any, index: int, path: Path, out: _Problems, unknown: str, core: bool = False) -> None:
    """Check ``value`` against schema node ``index``: type, enum, the CRD's value rules, then each field
    (unknown ones with a "did you mean", required ones) or item. Every problem is found, each at its full
    path. ``unknown``: what an unknown field is called. ``core``: a core schema, whose map values may be
    null (the Trainer models refuse them)."""
    node = schemas.nodes()[index]
    if not _has_type_and_enum(value, node, path, out):
        return
    _check_constraints(value, node, path, out)
    if isinstance(value, dict):
        _walk_fields(value, node, path, out, unknown, core)
        _check_required(value, node, path, out)
    elif isinstance(value, list) and "items" in node:
        for i, item in enumerate(value):
            _walk(item, node["items"], path + (i,), out, unknown, core)


def _has_type_and_enum(value: Any, node: dict, path: Path, out: _Problems) -> bool:
    """Whether ``value`` has the node's type and is one of its enum values; else reports why."""
    kind = node.get("type")
    if kind is not None and not _TYPE_CHECKS[kind](value):
        _type_problem(kind, value, path, out)
        return False
    enum = node.get("enum")
    if enum is not None and value not in enum:
        out.add(path, f"{_short(value)} must be one of enum values ({_enum_list(enum)})")
        return False
    return True


def _walk_fields(value: dict, node: dict, path: Path, out: _Problems, unknown: str, core: bool) -> None:
    """Each field of an object: unknown ones reported (unless the node is open), known ones walked."""
    properties: dict[str, int] = node.get("properties", {})
    for key, item in value.items():
        child = properties.get(key, node.get("additional"))
        if child is not None:
            if _field_is_checked(item, key in properties, core):
                _walk(item, child, path + (key,), out, unknown, core)
        elif not node.get("open"):
            out.add(path + (key,), unknown, _unknown_field_fix(path, key, list(properties)))


def _field_is_checked(item: Any, declared: bool, core: bool) -> bool:
    """Whether a field's value is checked: a null field is "not set", but a null map value of a Trainer
    schema is checked (and refused, as the Trainer models refuse it)."""
    return item is not None or (not declared and not core)


def _unknown_field_fix(path: Path, key: str, known: list[str]) -> str:
    """What to do about an unknown field: what replaced it, if the API removed it, else a "did you mean"."""
    removed = _REMOVED_FIELDS.get(tuple(p for p in path if isinstance(p, str)) + (key,))
    return removed or _did_you_mean(key, known)


def _check_required(value: dict, node: dict, path: Path, out: _Problems) -> None:
    for key in node.get("required", ()):
        if value.get(key) is None:
            out.add(path + (key,), "required field is missing", f"set {key}")


def _check_model(obj: dict, kind: str, out: _Problems) -> None:
    """``obj`` against its Trainer v2.3 CRD schema (metadata: the API server's ObjectMeta)."""
    _walk(obj, schemas.root(kind), (), out, "unknown field")


def _check_kube(doc: dict, kind: str, base: Path, out: _Problems, skip: set[Path]) -> None:
    """Validate ``doc`` against the strict core schema of ``kind`` for ``KUBERNETES_VERSION``; report
    under ``base`` unless the path is in ``skip``."""
    problems = _Problems()
    _walk(
        doc,
        schemas.root(f"core/{kind}"),
        base,
        problems,
        f"unknown field in Kubernetes {C.KUBERNETES_VERSION}",
        core=True,
    )
    out.items.extend(_not_at(problems.items, skip))
    out.fallbacks.extend(_not_at(problems.fallbacks, skip))
