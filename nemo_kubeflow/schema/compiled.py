"""The compiled schemas (schemas.json, written by ``python -m tools.compile_schemas``).

One table of schema nodes for the Trainer v2.3 CRDs and the strict core schemas; schemagen's
docstring describes a node. validation.py checks manifests against them; manifests.py lays out
the TrainJob's typed fields in the schema's order, the order the SDK's models wrote them in.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from typing import Any, Optional, Sequence

FILE = os.path.join(os.path.dirname(__file__), "schemas.json")


@lru_cache(maxsize=None)
def data() -> dict:
    """schemas.json: ~35 kB, read in about a millisecond (the models it replaces took 0.5 s and more)."""
    with open(FILE, encoding="utf-8") as f:
        return json.load(f)


def nodes() -> list[dict]:
    return data()["nodes"]


def root(name: str) -> int:
    """The node of ``name``: a Trainer kind (``TrainJob``...) or ``core/<Kind>`` (``core/Job``...)."""
    return data()["roots"][name]


def node_at(name: str, path: Sequence[str]) -> Optional[int]:
    """The node at ``path`` (field names; ``*`` for a list's items) under root ``name``, or None."""
    index = root(name)
    for part in path:
        node = nodes()[index]
        child = node.get("items") if part == "*" else node.get("properties", {}).get(part, node.get("additional"))
        if child is None:
            return None
        index = child
    return index


def in_schema_order(value: Any, index: Optional[int]) -> Any:
    """``value`` with the fields of every typed object in the schema's (alphabetical) order, maps in their
    own order, and fields the schema does not know last (validation reports them)."""
    if index is None:
        return value
    node = nodes()[index]
    if isinstance(value, dict):
        return _fields_in_schema_order(value, node)
    if isinstance(value, list):
        return [in_schema_order(item, node.get("items")) for item in value]
    return value


def _fields_in_schema_order(value: dict, node: dict) -> dict:
    """An object's fields: the node's properties in its order, then the others (map keys) in the object's."""
    properties: dict[str, int] = node.get("properties", {})
    known = [k for k in properties if k in value]
    ordered = known + [k for k in value if k not in properties]
    return {k: in_schema_order(value[k], properties.get(k, node.get("additional"))) for k in ordered}
