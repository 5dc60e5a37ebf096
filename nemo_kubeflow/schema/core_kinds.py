"""The core kinds a submission sends besides the Trainer's: ConfigMaps, Secrets and
PersistentVolumeClaims, as the API server checks them (keys, sizes, types, access modes)."""

from __future__ import annotations

import base64
import binascii
import difflib
from typing import Any, Optional

from nemo_kubeflow import constants as C
from nemo_kubeflow.parts import naming
from nemo_kubeflow.schema.names import _DNS_SUBDOMAIN_MAX
from nemo_kubeflow.schema.problems import Path, _dict, _list, _Problems, _short
from nemo_kubeflow.schema.resources import _check_quantity
from nemo_kubeflow.schema.walk import _check_kube


def _check_data_key(key: str, path: Path, out: _Problems) -> None:
    if not naming.is_config_key(key):
        out.add(
            path,
            f"invalid key {_short(key)}: keys are letters, digits, '-', '_' and '.'"
            f" (no '/', not starting with '..', at most {_DNS_SUBDOMAIN_MAX})",
            "flatten the path, e.g. replace '/' with '__'",
        )


def _decode_base64(value: Any, path: Path, out: _Problems) -> int:
    """Size in bytes of a base64 value, or 0 after reporting it."""
    if not isinstance(value, str):
        return 0
    try:
        # Go's decoder (the API server's) ignores line breaks; Python's strict mode does not.
        return len(base64.b64decode(value.replace("\n", "").replace("\r", ""), validate=True))
    except (binascii.Error, ValueError):
        out.add(path, "not valid base64", "encode the bytes with base64 (or use data/stringData for text)")
        return 0


def _check_size(size: int, path: Path, out: _Problems, what: str) -> None:
    if size > C.CONFIGMAP_MAX_BYTES:
        out.add(
            path,
            f"{what} holds {size} bytes, over the API server's limit of {C.CONFIGMAP_MAX_BYTES} (1 MiB)",
            "split the content over several objects",
        )


def _text_size(value: Any) -> int:
    """Size in bytes of a text value (0 for a value that is no string: the schema reports it)."""
    return len(value.encode()) if isinstance(value, str) else 0


def _check_configmap(obj: dict, out: _Problems) -> None:
    _check_kube(obj, "ConfigMap", (), out, out.paths())
    data, binary = _dict(obj.get("data")), _dict(obj.get("binaryData"))
    size = _check_text_data(data, out) + _check_binary_data(binary, data, out)
    _check_size(size, ("data",) if data else ("binaryData",), out, "the ConfigMap")


def _check_text_data(data: dict, out: _Problems) -> int:
    """Check the keys of a ConfigMap's data; the size of its values."""
    for key in data:
        _check_data_key(key, ("data", key), out)
    return sum(_text_size(value) for value in data.values())


def _check_binary_data(binary: dict, data: dict, out: _Problems) -> int:
    """Check the keys and values of a ConfigMap's binaryData (no key also in ``data``); the size of its values."""
    size = 0
    for key, value in binary.items():
        _check_data_key(key, ("binaryData", key), out)
        if key in data:
            out.add(("binaryData", key), "key is also in data", "keep each key in one of data and binaryData")
        size += _decode_base64(value, ("binaryData", key), out)
    return size


#: Keys each built-in Secret type requires (k8s.io/kubernetes pkg/apis/core/validation).
_SECRET_TYPES: dict[str, tuple[str, ...]] = {
    "Opaque": (),
    "kubernetes.io/service-account-token": (),
    "kubernetes.io/dockercfg": (".dockercfg",),
    "kubernetes.io/dockerconfigjson": (".dockerconfigjson",),
    "kubernetes.io/basic-auth": (),
    "kubernetes.io/ssh-auth": ("ssh-privatekey",),
    "kubernetes.io/tls": ("tls.crt", "tls.key"),
    "bootstrap.kubernetes.io/token": (),
}


def _check_secret(obj: dict, out: _Problems) -> None:
    _check_kube(obj, "Secret", (), out, out.paths())
    sizes = _check_secret_data(_dict(obj.get("data")), _dict(obj.get("stringData")), out)
    kind = obj.get("type")
    _check_secret_type(kind, out)
    for key in _SECRET_TYPES.get(kind if isinstance(kind, str) else "Opaque", ()):
        if key not in sizes:
            out.add(("data", key), f"a {kind} Secret requires this key", f"add data[{key!r}]")


def _check_secret_data(data: dict, string_data: dict, out: _Problems) -> dict[str, int]:
    """Check the keys of data and stringData and their total size; the size of each key's value."""
    sizes: dict[str, int] = {}
    for key, value in data.items():
        _check_data_key(key, ("data", key), out)
        sizes[key] = _decode_base64(value, ("data", key), out)
    for key, value in string_data.items():
        _check_data_key(key, ("stringData", key), out)
        sizes[key] = _text_size(value)  # stringData wins on merge
    _check_size(sum(sizes.values()), ("data",) if data else ("stringData",), out, "the Secret")
    return sizes


def _check_secret_type(kind: Any, out: _Problems) -> None:
    """An unknown type is a custom one (allowed); one close to a built-in type is a typo."""
    if not isinstance(kind, str) or kind in _SECRET_TYPES:
        return
    meant = _meant_secret_type(kind)
    if meant:
        out.add(("type",), f"{_short(kind)} is not a built-in Secret type", f"did you mean {meant}?")


def _meant_secret_type(kind: str) -> Optional[str]:
    close = difflib.get_close_matches(kind, list(_SECRET_TYPES), n=1, cutoff=0.8)
    if close:
        return close[0]
    return kind.title() if kind.lower() in {t.lower() for t in _SECRET_TYPES} else None


_ACCESS_MODES = ("ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod")


def _check_pvc(obj: dict, out: _Problems) -> None:
    _check_kube(obj, "PersistentVolumeClaim", (), out, out.paths())
    schema_paths = out.paths()
    spec = _dict(obj.get("spec"))
    _check_access_modes(_list(spec.get("accessModes")), out)
    if spec.get("volumeMode") not in (None, "Filesystem", "Block"):
        out.add(
            ("spec", "volumeMode"),
            f"{_short(spec['volumeMode'])} is not a volume mode",
            "use Filesystem or Block",
        )
    resources = _dict(spec.get("resources"))
    _check_storage_requested(resources, schema_paths, out)
    _check_pvc_quantities(resources, schema_paths, out)


_STORAGE_REQUEST: Path = ("spec", "resources", "requests", "storage")


def _check_storage_requested(resources: dict, schema_paths: set[Path], out: _Problems) -> None:
    # The API server requires the storage request even for a claim bound by volumeName.
    storage = _dict(resources.get("requests")).get("storage")
    if storage is None and _STORAGE_REQUEST not in schema_paths:
        out.add(
            _STORAGE_REQUEST,
            "required: the API server rejects a claim without a storage request",
            'set e.g. "100Gi"',
        )


def _check_pvc_quantities(resources: dict, schema_paths: set[Path], out: _Problems) -> None:
    """The claim's requests and limits (the schema's type problems aside); the storage request above zero."""
    for section in ("requests", "limits"):
        for name, value in _dict(resources.get(section)).items():
            where = ("spec", "resources", section, name)
            if where not in schema_paths and _check_quantity(value, where, out) == 0 and where == _STORAGE_REQUEST:
                out.add(_STORAGE_REQUEST, "must be greater than zero", 'set e.g. "100Gi"')


def _check_access_modes(modes: list, out: _Problems) -> None:
    if not modes:
        out.add(("spec", "accessModes"), "at least one access mode is required", "set e.g. [ReadWriteOnce]")
    for i, mode in enumerate(modes):
        if isinstance(mode, str) and mode not in _ACCESS_MODES:
            out.add(
                ("spec", "accessModes", i),
                f"{_short(mode)} is not an access mode",
                "use one of " + ", ".join(_ACCESS_MODES),
            )
    _check_read_write_once_pod(modes, out)


def _check_read_write_once_pod(modes: list, out: _Problems) -> None:
    if "ReadWriteOncePod" in modes and len(modes) > modes.count("ReadWriteOncePod"):
        out.add(
            ("spec", "accessModes"),
            "ReadWriteOncePod cannot be combined with other access modes",
            "keep only ReadWriteOncePod",
        )
