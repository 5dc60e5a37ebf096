"""The OpenAPI v3 documents at ``/openapi/v3``: one per group-version the server serves, named as kube-apiserver
names them (``api/v1``, ``apis/<group>/<version>``), Kueue's once per served version (``kueue_versions``).

Only what kubectl reads before ``apply`` and ``create``: for each kind, its PATCH operation with the
``fieldValidation`` parameter. Seeing that, kubectl leaves validation to the server (``fieldValidation=Strict``,
the same checks as our other clients get) instead of validating with schemas; a group-version missing from the
index makes kubectl fall back to ``/openapi/v2`` (not served) and refuse the object. Each kind also has its schema
in ``components.schemas`` (named as kube-apiserver names it: ``io.x-k8s.kueue.v1beta1.ClusterQueue``), which gives
its top-level fields only, and for Kueue's kinds the fields of the spec as that version names them (versions.py),
without their types: ``kubectl explain`` lists them.
"""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Optional

from nemo_kubeflow_local import constants as C
from nemo_kubeflow_local.apiserver import kueue_schema
from nemo_kubeflow_local.apiserver import resources as R
from nemo_kubeflow_local.apiserver.resources import ResourceType
from nemo_kubeflow_local.apiserver.versions import from_storage

PREFIX = "/openapi/v3"


def gv_path(group: str, version: str) -> str:
    """A group-version's path, as in its URLs and in the OpenAPI index: ``api/v1``, ``apis/<group>/<version>``."""
    return f"apis/{group}/{version}" if group else f"api/{version}"


def schema_name(rt: ResourceType, version: str) -> str:
    """kube-apiserver's name of a kind's schema: a CRD's group reversed (``io.x-k8s.kueue.v1beta1.Workload``), a
    built-in's under ``io.k8s.api`` (``io.k8s.api.core.v1.Pod``, ``io.k8s.api.batch.v1.Job``)."""
    if rt.is_custom:
        prefix = ".".join(reversed(rt.group.split(".")))
    else:
        prefix = "io.k8s.api." + (rt.group.split(".")[0] or "core")
    return f"{prefix}.{version}.{rt.kind}"


def _as_version(kind: str, section: str, names: list[str], version: str) -> list[str]:
    """Stored (v1beta2) field names of a section as ``version`` names them: through the conversion itself."""
    converted = from_storage(kind, {section: {name: {} for name in names}}, version)[section]
    return sorted(converted)


#: A field whose schema is not given here (any value): not empty, which `kubectl explain` refuses; it shows the
#: description (and guesses <Object>).
_ANY = {"description": "Its schema is not served by the local cluster.", "x-kubernetes-preserve-unknown-fields": True}


def _schema(rt: ResourceType, version: str) -> dict:
    gvk = {"group": rt.group, "version": version, "kind": rt.kind}
    properties: dict[str, dict] = {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
    }
    if rt.group == C.KUEUE_GROUP:
        top, spec = kueue_schema.fields(rt)
        properties.update({name: dict(_ANY) for name in top if name not in properties})
        if spec:
            properties["spec"] = {
                "type": "object",
                "properties": {name: dict(_ANY) for name in _as_version(rt.kind, "spec", spec, version)},
            }
        if "status" in properties:
            properties["status"] = {"type": "object"}
    return {"type": "object", "properties": properties, "x-kubernetes-group-version-kind": [gvk]}


def _patch(rt: ResourceType, version: str) -> dict:
    return {
        "x-kubernetes-action": "patch",
        "x-kubernetes-group-version-kind": {"group": rt.group, "version": version, "kind": rt.kind},
        "parameters": [
            {"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": True}}
            for name in ("dryRun", "fieldManager", "fieldValidation")
        ],
        "responses": {
            "200": {
                "description": "OK",
                "content": {
                    "application/json": {"schema": {"$ref": f"#/components/schemas/{schema_name(rt, version)}"}}
                },
            }
        },
    }


@functools.lru_cache(maxsize=None)
def documents(kueue_versions: tuple[str, ...], server_version: str) -> dict[str, dict]:
    """The documents by group-version path, for a server that serves ``kueue_versions`` (the stored objects as
    each) and reports ``server_version`` (``info.version``)."""
    docs: dict[str, dict] = {}
    for rt in R.ALL:
        for version in kueue_versions if rt.group == C.KUEUE_GROUP else (rt.version,):
            gv = gv_path(rt.group, version)
            doc = docs.setdefault(
                gv,
                {
                    "openapi": "3.0.0",
                    "info": {"title": "Kubernetes", "version": server_version},
                    "paths": {},
                    "components": {"schemas": {}},
                },
            )
            scope = "/namespaces/{namespace}" if rt.namespaced else ""
            doc["paths"][f"/{gv}{scope}/{rt.plural}/{{name}}"] = {"patch": _patch(rt, version)}
            doc["components"]["schemas"][schema_name(rt, version)] = _schema(rt, version)
    return docs


def index(kueue_versions: tuple[str, ...], server_version: str) -> dict:
    """``GET /openapi/v3``: each document's URL, with a hash of its content (clients cache by it)."""
    paths = {}
    for gv, doc in documents(kueue_versions, server_version).items():
        digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32].upper()
        paths[gv] = {"serverRelativeURL": f"{PREFIX}/{gv}?hash={digest}"}
    return {"paths": paths}


def answer(path: str, kueue_versions: tuple[str, ...], server_version: str) -> Optional[dict]:
    """The index or a document a path names (None for a path not under ``/openapi/v3`` or an unknown one)."""
    if path == PREFIX:
        return index(kueue_versions, server_version)
    if path.startswith(PREFIX + "/"):
        return documents(kueue_versions, server_version).get(path[len(PREFIX) + 1 :])
    return None
