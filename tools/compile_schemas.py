"""Compile the schemas offline validation checks against into one compact data file.

    python -m tools.compile_schemas          # rewrites nemo_kubeflow/schema/schemas.json
    python -m tools.compile_schemas --check  # exit 1 if the file is out of date

Sources, all pinned (a test checks the shipped file is what this produces from them):

* The Trainer v2.3.0 CRDs, as the release publishes them in its Go module's manifests/base/crds
  (``go mod download`` from the Go module proxy, cached in GOMODCACHE; not copied into this
  repository; ``--crds DIR`` reads another folder): the
  ``openAPIV3Schema`` the API server checks TrainJobs and runtimes against, embedded JobSet and
  core types included.
* The ``kubeflow_trainer_api`` models (the SDK's, generated from Trainer's OpenAPI): the enums of
  core fields (``imagePullPolicy``...) that the CRDs' embedded core types leave out.
* ``kubernetes-validate``'s strict schemas for Kubernetes ``KUBERNETES_VERSION``: ObjectMeta (the
  API server checks every object's metadata itself), Job (the runtime's Job templates, against an
  older API server), ConfigMap, Secret and PersistentVolumeClaim.

The output is data: a table of schema nodes, each stored once and referred to by index (the pod
spec recurs across the three CRDs), without descriptions. nemo_kubeflow/schema/walk.py reads it with
one ``json.load``; importing the ~400 pydantic models or the 1.3 MB of core definitions costs a fresh
process 0.5 s and more. Node keys (all optional):

``type``
    ``object``, ``array``, ``string``, ``integer``, ``number``, ``boolean``, ``quantity`` (number or
    string) or ``int-or-string``; absent: any value.
``properties`` / ``required`` / ``additional``
    An object's fields (name -> node), the required ones, and the node of a map's values. An object
    with neither properties nor ``additional`` takes no fields (the API server prunes them), unless
    ``open`` is set (``x-kubernetes-preserve-unknown-fields``).
``items``
    The node of a list's items.
``enum`` / ``enum_soft``
    Allowed values: ``enum`` from the models and the core schemas (reported as such), ``enum_soft``
    from the CRDs (reported unless a more specific rule of nemo_kubeflow/schema/ already reported the field).
``minimum``, ``maximum``, ``minItems``, ``maxItems``, ``minLength``, ``maxLength``, ``pattern``
    The CRDs' constraints, reported like ``enum_soft``.
``format``
    ``int32`` or ``int64`` of an integer (CRDs and core schemas): the range a typed controller can read;
    the API server stores a larger number, and every reader of the kind then fails.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import typing
from pathlib import Path
from typing import Any, Optional, Union

from nemo_kubeflow.constants import KUBERNETES_VERSION

OUTPUT = Path(__file__).resolve().parent.parent / "nemo_kubeflow" / "schema" / "schemas.json"
#: Trainer release the CRDs and models are from, and the Go module that publishes its CRDs.
TRAINER_VERSION = "2.3.0"
TRAINER_MODULE = "github.com/kubeflow/trainer/v2"


class CrdsUnavailable(RuntimeError):
    """The pinned CRDs cannot be fetched here (no Go toolchain, no module proxy)."""


def trainer_crd_dir() -> Path:
    """The folder of the pinned Trainer release's CRDs: its Go module's ``manifests/base/crds``, downloaded
    (once; GOMODCACHE keeps it) from the Go module proxy."""
    command = ["go", "mod", "download", "-json", f"{TRAINER_MODULE}@v{TRAINER_VERSION}"]
    try:
        proc = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tempfile.gettempdir(),
            env={**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-modcacherw"},
        )
    except FileNotFoundError:
        raise CrdsUnavailable(
            "no Go toolchain on PATH (`go` not found): the Trainer CRDs come from its Go module"
        ) from None
    try:
        info = json.loads(proc.stdout)
    except ValueError:
        info = {"Error": (proc.stderr or proc.stdout or "no output").strip().splitlines()[-1]}
    if info.get("Error") or proc.returncode != 0:
        raise CrdsUnavailable(f"`{' '.join(command)}` failed: {info.get('Error') or proc.stderr.strip()}")
    return Path(info["Dir"]) / "manifests" / "base" / "crds"


#: kind -> (CRD file, model class name)
TRAINER_KINDS = {
    "TrainJob": ("trainer.kubeflow.org_trainjobs.yaml", "TrainerV1alpha1TrainJob"),
    "ClusterTrainingRuntime": (
        "trainer.kubeflow.org_clustertrainingruntimes.yaml",
        "TrainerV1alpha1ClusterTrainingRuntime",
    ),
    "TrainingRuntime": ("trainer.kubeflow.org_trainingruntimes.yaml", "TrainerV1alpha1TrainingRuntime"),
}
#: root name -> strict core schema file (without the version folder).
CORE_KINDS = {
    "core/Job": "job-batch-v1.json",
    "core/ConfigMap": "configmap-v1.json",
    "core/Secret": "secret-v1.json",
    "core/PersistentVolumeClaim": "persistentvolumeclaim-v1.json",
}
_OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
#: The CRDs' int-or-string fields with this pattern are quantities.
_QUANTITY_PATTERN_START = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
#: Integer formats kept: the ranges of Go's int32 and int64 (schema/walk.py checks them).
_INT_FORMATS = ("int32", "int64")
_CONSTRAINTS = ("minimum", "maximum", "minItems", "maxItems", "minLength", "maxLength", "pattern")


class _Table:
    """Nodes stored once each: identical subtrees share an index."""

    def __init__(self) -> None:
        self.nodes: list[dict] = []
        self._index: dict[str, int] = {}

    def add(self, node: dict) -> int:
        key = json.dumps(node, sort_keys=True, separators=(",", ":"))
        if key not in self._index:
            self._index[key] = len(self.nodes)
            self.nodes.append(node)
        return self._index[key]


# --- enums from the kubeflow_trainer_api models ----------------------------------------------------

_PROBE = "\x00not-a-value"


def _unwrap(annotation: Any) -> Any:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    if origin is Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return _unwrap(args[0])
    return annotation


def _is_model(annotation: Any) -> bool:
    return (
        isinstance(annotation, type)
        and hasattr(annotation, "model_fields")
        and "actual_instance" not in annotation.model_fields
    )


def _probe_enum(owner: type, attr: str, value: Any) -> Optional[list[str]]:
    """The values the model's enum validator allows for ``attr``, or None (no enum)."""
    from pydantic import ValidationError

    try:
        owner.__pydantic_validator__.validate_assignment(owner.model_construct(), attr, value)
    except ValidationError as exc:
        for err in exc.errors():
            message = str(err.get("msg", ""))
            if "must be one of" in message:
                return sorted(ast.literal_eval(message[message.index("(") :]))
    return None


class _ModelField:
    """What the models say of one field: its enum (or its items'), and the model below it."""

    def __init__(self, owner: Optional[type], attr: Optional[str], annotation: Any) -> None:
        self.owner, self.attr, self.annotation = owner, attr, _unwrap(annotation)

    def model(self) -> Optional[type]:
        return self.annotation if _is_model(self.annotation) else None

    def child(self, name: str) -> "_ModelField":
        model = self.model()
        if model is None:
            return _ModelField(None, None, None)
        for attr, field in model.model_fields.items():
            if (field.alias or attr) == name:
                return _ModelField(model, attr, field.annotation)
        return _ModelField(None, None, None)

    def inner(self, index: int) -> "_ModelField":
        """The items (``index`` 0 of a list) or values (1 of a dict) of a container field."""
        args = typing.get_args(self.annotation)
        if not args:
            return _ModelField(None, None, None)
        return _ModelField(None, None, args[min(index, len(args) - 1)])

    def enum(self) -> Optional[list[str]]:
        if self.owner is None or self.annotation is not str:
            return None
        return _probe_enum(self.owner, self.attr, _PROBE)

    def item_enum(self) -> Optional[list[str]]:
        if self.owner is None or typing.get_origin(self.annotation) is not list:
            return None
        if _unwrap(typing.get_args(self.annotation)[0]) is not str:
            return None
        return _probe_enum(self.owner, self.attr, [_PROBE])


_NO_MODEL = _ModelField(None, None, None)


# --- the CRDs ----------------------------------------------------------------------------------------


def _crd_node(schema: dict, model: _ModelField, table: _Table, enum: Optional[list] = None) -> int:
    """The node of a CRD schema; ``model`` is the models' view of the same field (for its enum)."""
    node: dict[str, Any] = {}
    kind = schema.get("type")
    if schema.get("x-kubernetes-int-or-string"):
        pattern = schema.get("pattern", "")
        node["type"] = "quantity" if pattern.startswith(_QUANTITY_PATTERN_START) else "int-or-string"
    elif kind in ("object", "array", "string", "integer", "number", "boolean"):
        node["type"] = kind
    for key in _CONSTRAINTS:
        if key in schema:
            node[key] = schema[key]
    if kind == "integer" and schema.get("format") in _INT_FORMATS:
        node["format"] = schema["format"]
    if "enum" in schema:
        node["enum_soft"] = list(schema["enum"])
    enum = enum or model.enum()
    if enum and kind == "string":
        node["enum"] = enum
    if kind == "object":
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            node["open"] = True
        properties: dict[str, int] = {}
        for name, sub in sorted(schema.get("properties", {}).items()):
            field = model.child(name)
            item_enum = field.item_enum() if sub.get("type") == "array" else None
            properties[name] = _crd_list(sub, table, item_enum) if item_enum else _crd_node(sub, field, table)
        if properties:
            node["properties"] = properties
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            node["additional"] = _crd_node(extra, model.inner(1), table)
        elif extra is True:
            node["open"] = True
        if schema.get("required"):
            node["required"] = sorted(schema["required"])
    elif kind == "array" and isinstance(schema.get("items"), dict):
        node["items"] = _crd_node(schema["items"], model.inner(0), table)
    return table.add(node)


def _crd_list(schema: dict, table: _Table, item_enum: list) -> int:
    """A list of strings whose items the models restrict to ``item_enum``."""
    node: dict[str, Any] = {"type": "array"}
    for key in _CONSTRAINTS:
        if key in schema:
            node[key] = schema[key]
    node["items"] = _crd_node(schema["items"], _NO_MODEL, table, item_enum)
    return table.add(node)


def _crd_schema(path: Path) -> dict:
    import yaml

    crd = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    [version] = crd["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]


# --- the strict core schemas ------------------------------------------------------------------------


class _Core:
    """Compiles kubernetes-validate's strict schemas (JSON Schema with ``$ref``s into one file)."""

    def __init__(self, table: _Table) -> None:
        from kubernetes_validate import utils as kv
        from packaging.version import Version

        self.kv = kv
        self.version = [v for v in kv.all_versions() if Version(v) <= Version(KUBERNETES_VERSION)][-1]
        self.folder = f"kubernetes-json-schema/v{self.version}-local-strict"
        self.definitions = kv.schema_contents(f"{self.folder}/_definitions.json", self.version)["$defs"]
        self.table = table
        self.refs: dict[str, int] = {}

    def root(self, filename: str) -> int:
        return self.node(self.kv.schema_contents(f"{self.folder}/{filename}", self.version))

    def ref(self, name: str) -> int:
        if name not in self.refs:
            self.refs[name] = -1  # the core kinds checked have no recursive types; fail loudly if one comes
            self.refs[name] = self.node(self.definitions[name])
        if self.refs[name] < 0:
            raise ValueError(f"recursive core type {name}")
        return self.refs[name]

    def node(self, schema: dict) -> int:
        if "$ref" in schema:
            return self.ref(schema["$ref"].rsplit("/", 1)[-1])
        node: dict[str, Any] = {}
        types = schema.get("type")
        types = [t for t in ([types] if isinstance(types, str) else types or []) if t != "null"]
        if "oneOf" in schema:
            options = {t for o in schema["oneOf"] for t in ([o["type"]] if isinstance(o["type"], str) else o["type"])}
            options.discard("null")
            node["type"] = {
                frozenset({"string", "number"}): "quantity",
                frozenset({"string", "integer"}): "int-or-string",
            }[frozenset(options)]
        elif len(types) == 1:
            node["type"] = types[0]
        if node.get("type") == "integer" and schema.get("format") in _INT_FORMATS:
            node["format"] = schema["format"]
        if "enum" in schema:
            node["enum"] = [v for v in schema["enum"] if v is not None]
        if "properties" in schema:
            node["properties"] = {name: self.node(sub) for name, sub in sorted(schema["properties"].items())}
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            node["additional"] = self.node(extra)
        elif extra is not False and node.get("type") == "object" and "properties" not in node:
            node["open"] = True
        if schema.get("required"):
            node["required"] = sorted(schema["required"])
        if isinstance(schema.get("items"), dict):
            node["items"] = self.node(schema["items"])
        return self.table.add(node)


# --- the file ------------------------------------------------------------------------------------------


def generate(crd_dir: Optional[Path] = None) -> str:
    """The text of schemas.json, from the CRDs in ``crd_dir`` (default: the pinned release's)."""
    from kubeflow_trainer_api import models

    crd_dir = crd_dir or trainer_crd_dir()

    table = _Table()
    core = _Core(table)
    roots: dict[str, int] = {}
    sources: dict[str, str] = {}
    meta = core.ref(_OBJECT_META)
    for kind, (filename, model_name) in TRAINER_KINDS.items():
        path = crd_dir / filename
        sources[filename] = hashlib.sha256(path.read_bytes()).hexdigest()
        schema = _crd_schema(path)
        # Every object's metadata is checked by the API server's ObjectMeta, not by the CRD (which says
        # only `type: object`).
        model = _ModelField(None, None, getattr(models, model_name))
        root = table.nodes[_crd_node(schema, model, table)]
        roots[kind] = table.add({**root, "properties": {**root["properties"], "metadata": meta}})
    for name, filename in CORE_KINDS.items():
        roots[name] = core.root(filename)
    doc = {
        "generator": "python -m tools.compile_schemas",
        "trainer_version": TRAINER_VERSION,
        "kubernetes_version": KUBERNETES_VERSION,
        "kubernetes_schemas": f"kubernetes-validate {core.version} strict",
        "crd_sha256": sources,
        "roots": roots,
        "nodes": table.nodes,
    }
    # One node per line: small diffs when a source changes.
    head = json.dumps({k: v for k, v in doc.items() if k != "nodes"}, indent=1, sort_keys=True)[:-2]
    body = ",\n".join(json.dumps(n, sort_keys=True, separators=(",", ":")) for n in table.nodes)
    return f'{head},\n "nodes": [\n{body}\n]\n}}\n'


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.compile_schemas", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the shipped file is out of date")
    parser.add_argument(
        "--crds",
        type=Path,
        help="folder with the three Trainer CRDs (default: the pinned release's, from its Go module)",
    )
    args = parser.parse_args(argv)
    try:
        text = generate(args.crds)
    except CrdsUnavailable as error:
        print(f"cannot read the Trainer CRDs: {error}; or give --crds DIR", file=sys.stderr)
        return 2
    if args.check:
        if OUTPUT.read_text() != text:
            print(f"{OUTPUT} is out of date: run python -m tools.compile_schemas", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT} ({len(text)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
