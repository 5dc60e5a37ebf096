"""The strict OpenAPI schemas of core Kubernetes objects that ``kubernetes-validate`` ships, pinned to
``constants.KUBERNETES_VERSION``: the offline validation of a submission (validation.py) and the
local cluster's API server (local/validation.py) check core objects against the same schemas.

The libraries are imported on first use: ``import nemo_kubeflow`` stays cheap.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from nemo_kubeflow.constants import KUBERNETES_VERSION


@lru_cache(maxsize=None)
def schema_version() -> str:
    """The newest schema version ``kubernetes-validate`` has that is not after ``KUBERNETES_VERSION``."""
    from kubernetes_validate import utils as kv
    from packaging.version import Version

    return [v for v in kv.all_versions() if Version(v) <= Version(KUBERNETES_VERSION)][-1]


@lru_cache(maxsize=None)
def strict_validator(kind: str, api_version: str) -> Any:
    """A JSON Schema validator of ``kind`` (``apiVersion`` ``api_version``): unknown fields are errors.

    One validator per kind, built once: ``kubernetes_validate.validate()`` re-reads its 1.3 MB
    definitions on every call and stops at the first error.
    """
    import jsonschema
    from kubernetes_validate import utils as kv
    from referencing import Registry, Resource

    version = schema_version()
    folder = f"kubernetes-json-schema/v{version}-local-strict"
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    schema = kv.schema_contents(f"{folder}/{kind.lower()}-{group_version}.json", version)
    definitions = kv.schema_contents(f"{folder}/_definitions.json", version)
    registry = Resource.from_contents(definitions) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)
