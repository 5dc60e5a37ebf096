"""What the API server checks before admission: decoding (unknown fields, types) and the
built-in validation of object metadata, ConfigMaps, Secrets and Pods.

Unknown fields are found by comparing the request with what the typed models keep:
the `kubeflow_trainer_api` models for Trainer objects (what the CRD schema prunes) and the
strict JSON schemas shipped with `kubernetes_validate` for core objects, of the Kubernetes version
this API server reports (core_schemas.py). Names follow apimachinery's rules (names.py).
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any, Optional

import pydantic
from kubeflow_trainer_api import models as trainer_models

from nemo_kubeflow_local import constants as C
from nemo_kubeflow_local import names as name_rules
from nemo_kubeflow_local.apiserver import kueue_schema
from nemo_kubeflow_local.apiserver import resources as R
from nemo_kubeflow_local.apiserver.apierrors import ApiError, FieldError, bad_request, invalid
from nemo_kubeflow_local.apiserver.core_schemas import strict_validator
from nemo_kubeflow_local.apiserver.resources import ResourceType

Path = tuple  # keys and list indexes from the object root


def format_path(path: Path) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


# --- unknown fields ------------------------------------------------------------------------------

_TRAINER_MODELS = {
    R.TRAINJOBS.key: trainer_models.TrainerV1alpha1TrainJob,
    R.RUNTIMES.key: trainer_models.TrainerV1alpha1TrainingRuntime,
    R.CLUSTER_RUNTIMES.key: trainer_models.TrainerV1alpha1ClusterTrainingRuntime,
}


def _dropped(given: Any, kept: Any, path: Path) -> list[Path]:
    """Keys of `given` that the model's output lost. Values may differ (quantities become
    floats, defaults appear): only missing keys count, and None values are ignored."""
    found: list[Path] = []
    if isinstance(given, dict) and isinstance(kept, dict):
        for key, value in given.items():
            if value is None:
                continue
            if key not in kept:
                found.append(path + (key,))
            else:
                found.extend(_dropped(value, kept[key], path + (key,)))
    elif isinstance(given, list) and isinstance(kept, list) and len(given) == len(kept):
        for i, (a, b) in enumerate(zip(given, kept)):
            found.extend(_dropped(a, b, path + (i,)))
    return found


_JSON_TYPES = {dict: "object", list: "array", str: "string", bool: "bool", int: "number", float: "number"}


def _json_type(value: Any) -> str:
    return "null" if value is None else _JSON_TYPES.get(type(value), "value")


def decode(rt: ResourceType, obj: dict) -> list[Path]:
    """Decode like the API server: raise for type errors, return the unknown fields' paths."""
    if rt.is_custom and not rt.is_trainer:
        return kueue_schema.unknown_fields(rt, obj)
    model = _TRAINER_MODELS.get(rt.key)
    if model is not None:
        try:
            kept = model.from_dict(obj).to_dict()
        except pydantic.ValidationError as error:
            raise _custom_type_error(rt, obj, model, error) from None
        return _dropped(obj, kept, ())
    unknown: list[Path] = []
    decode_errors: list[str] = []
    required: list[FieldError] = []
    for issue in strict_validator(rt.kind, rt.api_version).iter_errors(obj):
        path = tuple(issue.absolute_path)
        if issue.validator == "additionalProperties":
            allowed = set(issue.schema.get("properties", {}))
            unknown.extend(path + (key,) for key in issue.instance if key not in allowed)
        elif issue.validator == "required":
            missing = re.findall(r"'([^']+)' is a required property", issue.message)
            required.extend(FieldError.required(format_path(path + (m,))) for m in missing)
        elif issue.validator in ("type", "oneOf"):
            expected = issue.validator_value if issue.validator == "type" else "string"
            expected = next((t for t in expected if t != "null"), "value") if isinstance(expected, list) else expected
            decode_errors.append(
                f"json: cannot unmarshal {_json_type(issue.instance)} into Go struct field "
                f"{rt.kind}.{format_path(tuple(p for p in path if isinstance(p, str)))} of type {expected}"
            )
    if decode_errors:
        raise bad_request(f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: {decode_errors[0]}')
    if required:
        raise invalid(rt, (obj.get("metadata") or {}).get("name", ""), required)
    return sorted(set(unknown), key=format_path)


_PYDANTIC_TYPES = {
    "int": "integer",
    "string": "string",
    "bool": "boolean",
    "list": "array",
    "dict": "object",
    "float": "number",
    "model": "object",
}


def _custom_type_error(rt: ResourceType, obj: dict, model: Any, error: pydantic.ValidationError) -> ApiError:
    """A CRD schema type error: `spec.x: Invalid value: "string": spec.x in body must be of type integer: "string"`."""
    try:
        model.model_validate(obj)
        details = error.errors()
    except pydantic.ValidationError as full:  # model_validate keeps the whole path, from_dict does not
        details = [e for e in full.errors() if "Quantity" not in e["msg"]] or error.errors()
    errors = []
    for detail in details:
        path = format_path(tuple(detail["loc"]))
        given = _json_type(detail.get("input"))
        kind = detail["type"].split("_")[0]
        if kind in _PYDANTIC_TYPES:
            message = f'{path} in body must be of type {_PYDANTIC_TYPES[kind]}: "{given}"'
        else:
            message = f"{path} in body: {detail['msg']}"
        errors.append(FieldError.invalid(path, given, message))
    return invalid(rt, (obj.get("metadata") or {}).get("name", ""), errors)


def prune(obj: dict, paths: list[Path]) -> None:
    """Drop unknown fields (what `fieldValidation=Warn|Ignore` does)."""
    for path in sorted(paths, key=len, reverse=True):
        parent = obj
        for part in path[:-1]:
            parent = parent[part]
        parent.pop(path[-1], None)


# --- names and metadata (k8s.io/apimachinery/pkg/util/validation) ---------------------------------


def _metadata_errors(rt: ResourceType, meta: dict) -> list[FieldError]:
    errors: list[FieldError] = []
    name = meta.get("name", "")
    if not name:
        errors.append(FieldError.required("metadata.name", "name or generateName is required"))
    else:
        check = name_rules.dns1123_label_errors if rt is R.NAMESPACES else name_rules.dns1123_subdomain_errors
        errors.extend(FieldError.invalid("metadata.name", name, msg) for msg in check(name))
    for key, value in (meta.get("labels") or {}).items():
        errors.extend(FieldError.invalid("metadata.labels", key, msg) for msg in name_rules.qualified_name_errors(key))
        if isinstance(value, str):
            errors.extend(
                FieldError.invalid("metadata.labels", value, msg) for msg in name_rules.label_value_errors(value)
            )
    for key in meta.get("annotations") or {}:
        errors.extend(
            FieldError.invalid("metadata.annotations", key, msg)
            for msg in name_rules.qualified_name_errors(key.lower())
        )
    size = sum(len(k) + len(v or "") for k, v in (meta.get("annotations") or {}).items())
    if size > C.ANNOTATIONS_MAX_BYTES:
        errors.append(FieldError.too_long("metadata.annotations", C.ANNOTATIONS_MAX_BYTES))
    return errors


# --- ConfigMaps and Secrets ------------------------------------------------------------------------


def _config_key_errors(bag: str, key: str) -> list[FieldError]:
    return [FieldError.invalid(f"{bag}[{key}]", key, m) for m in name_rules.config_key_errors(key)]


def _configmap_errors(obj: dict) -> list[FieldError]:
    errors: list[FieldError] = []
    data, binary = obj.get("data") or {}, obj.get("binaryData") or {}
    total = 0
    for key, value in data.items():
        errors.extend(_config_key_errors("data", key))
        if key in binary:
            errors.append(FieldError.invalid(f"data[{key}]", key, "duplicate of key present in binaryData"))
        total += len((value or "").encode())
    for key, value in binary.items():
        errors.extend(_config_key_errors("binaryData", key))
        total += len(_b64decode(value or "", "ConfigMap"))
    if total > C.CONFIGMAP_MAX_BYTES:
        errors.append(FieldError.too_long("[]", C.CONFIGMAP_MAX_BYTES))
    return errors


def _b64decode(value: str, kind: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(
            f'{kind} in version "v1" cannot be handled as a {kind}: illegal base64 data at input byte 0'
        ) from None


def normalize_secret(obj: dict) -> None:
    """Merge `stringData` into base64 `data` (the server never stores stringData)."""
    string_data = obj.pop("stringData", None) or {}
    if string_data:
        obj["data"] = {
            **(obj.get("data") or {}),
            **{k: base64.b64encode(v.encode()).decode() for k, v in string_data.items()},
        }
    obj.setdefault("type", "Opaque")


def _secret_errors(obj: dict) -> list[FieldError]:
    errors: list[FieldError] = []
    total = 0
    for key, value in (obj.get("data") or {}).items():
        errors.extend(_config_key_errors("data", key))
        total += len(_b64decode(value or "", "Secret"))
    if total > C.CONFIGMAP_MAX_BYTES:
        errors.append(FieldError.too_long("data", C.CONFIGMAP_MAX_BYTES))
    return errors


# --- Pods ----------------------------------------------------------------------------------------------

_RESTART_POLICIES = ("Always", "OnFailure", "Never")


def pod_spec_errors(spec: dict, path: str = "spec") -> list[FieldError]:
    """The parts of ValidatePodSpec a runtime template most often gets wrong."""
    errors: list[FieldError] = []
    volumes = set()
    for i, volume in enumerate(spec.get("volumes") or []):
        name = volume.get("name", "")
        if name in volumes:
            errors.append(FieldError.duplicate(f"{path}.volumes[{i}].name", name))
        volumes.add(name)
        errors.extend(
            FieldError.invalid(f"{path}.volumes[{i}].name", name, m) for m in name_rules.dns1123_label_errors(name)
        )
    if not spec.get("containers"):
        errors.append(FieldError.required(f"{path}.containers"))
    names: set[str] = set()
    for bag in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(bag) or []):
            where = f"{path}.{bag}[{i}]"
            name = container.get("name", "")
            if not name:
                errors.append(FieldError.required(f"{where}.name"))
            elif name in names:
                errors.append(FieldError.duplicate(f"{where}.name", name))
            else:
                errors.extend(
                    FieldError.invalid(f"{where}.name", name, m) for m in name_rules.dns1123_label_errors(name)
                )
            names.add(name)
            if not container.get("image"):
                errors.append(FieldError.required(f"{where}.image"))
            mount_paths: set[str] = set()
            for j, mount in enumerate(container.get("volumeMounts") or []):
                if mount.get("name") not in volumes:
                    errors.append(FieldError.not_found(f"{where}.volumeMounts[{j}].name", mount.get("name", "")))
                mount_path = mount.get("mountPath", "")
                if not mount_path:
                    errors.append(FieldError.required(f"{where}.volumeMounts[{j}].mountPath"))
                elif mount_path in mount_paths:
                    errors.append(
                        FieldError.invalid(f"{where}.volumeMounts[{j}].mountPath", mount_path, "must be unique")
                    )
                mount_paths.add(mount_path)
            for j, env in enumerate(container.get("env") or []):
                if not env.get("name"):
                    errors.append(FieldError.required(f"{where}.env[{j}].name"))
                else:
                    errors.extend(
                        FieldError.invalid(f"{where}.env[{j}].name", env["name"], m)
                        for m in name_rules.relaxed_env_var_name_errors(env["name"])
                    )
                sources = [
                    k
                    for k in ("fieldRef", "resourceFieldRef", "configMapKeyRef", "secretKeyRef")
                    if (env.get("valueFrom") or {}).get(k)
                ]
                if env.get("valueFrom") is not None and len(sources) != 1:
                    errors.append(
                        FieldError.invalid(
                            f"{where}.env[{j}].valueFrom",
                            "",
                            "may not have more than one field specified at a time"
                            if sources
                            else "must specify one of: `fieldRef`, `resourceFieldRef`, `configMapKeyRef` or "
                            "`secretKeyRef`",
                        )
                    )
    policy = spec.get("restartPolicy", "Always")
    if policy not in _RESTART_POLICIES:
        errors.append(
            FieldError(
                f"{path}.restartPolicy", "Unsupported value", 'supported values: "Always", "OnFailure", "Never"', policy
            )
        )
    return errors


# --- entry point ---------------------------------------------------------------------------------------


def validate(rt: ResourceType, obj: dict, old: Optional[dict] = None) -> list[FieldError]:
    """Built-in validation of a decoded, defaulted object (create when `old` is None, else update)."""
    errors = _metadata_errors(rt, obj["metadata"])
    if rt is R.CONFIGMAPS:
        errors.extend(_configmap_errors(obj))
        if old is not None and old.get("immutable"):
            for field in ("data", "binaryData", "immutable"):
                if obj.get(field) != old.get(field):
                    errors.append(FieldError.forbidden(field, "field is immutable when `immutable` is set"))
    elif rt is R.SECRETS:
        errors.extend(_secret_errors(obj))
        if old is not None and obj.get("type") != old.get("type"):
            errors.append(FieldError.invalid("type", obj.get("type"), "field is immutable"))
    elif rt is R.PODS:
        errors.extend(pod_spec_errors(obj.get("spec") or {}))
        if old is not None and _pod_spec_without_images(obj) != _pod_spec_without_images(old):
            errors.append(
                FieldError.forbidden(
                    "spec",
                    "pod updates may not change fields other than `spec.containers[*].image`, "
                    "`spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, `spec.tolerations` (only "
                    "additions to existing tolerations) or `spec.terminationGracePeriodSeconds`",
                )
            )
    return errors


def _pod_spec_without_images(pod: dict) -> dict:
    spec = {
        k: v
        for k, v in (pod.get("spec") or {}).items()
        if k not in ("activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds")
    }
    for bag in ("containers", "initContainers"):
        spec[bag] = [{k: v for k, v in c.items() if k != "image"} for c in spec.get(bag) or []]
    return spec
