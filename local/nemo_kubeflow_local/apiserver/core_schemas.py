"""The strict OpenAPI schemas of core Kubernetes objects that ``kubernetes-validate`` ships, of the
Kubernetes release this API server reports at ``/version`` (``constants.KUBERNETES_VERSION``): a
field added in a later release is an unknown field here, as it would be on that server.

The libraries are imported on first use.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from nemo_kubeflow_local.constants import KUBERNETES_VERSION


@lru_cache(maxsize=None)
def schema_version() -> str:
    """The schemas of ``KUBERNETES_VERSION``'s minor release (kubernetes-validate has one per minor);
    refuses to start on an older kubernetes-validate that lacks it rather than check another release."""
    from kubernetes_validate import utils as kv
    from packaging.version import Version

    wanted = Version(KUBERNETES_VERSION)
    same_minor = [v for v in kv.all_versions() if Version(v).release[:2] == wanted.release[:2]]
    if not same_minor:
        raise RuntimeError(
            f"kubernetes-validate has no schemas of Kubernetes {wanted.major}.{wanted.minor}, the "
            "release this API server emulates: upgrade kubernetes-validate"
        )
    return same_minor[-1]


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
