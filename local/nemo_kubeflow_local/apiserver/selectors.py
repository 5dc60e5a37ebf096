"""Label and field selectors, parsed the way k8s.io/apimachinery parses them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Optional

from nemo_kubeflow_local.apiserver.apierrors import bad_request

_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_VALUE = r"[A-Za-z0-9]?(?:[-A-Za-z0-9_.]*[A-Za-z0-9])?"
_SET = re.compile(rf"^({_KEY})\s+(in|notin)\s*\(\s*([^()]*)\)$")
_CMP = re.compile(rf"^({_KEY})\s*(==|!=|=)\s*({_VALUE})$")
_EXISTS = re.compile(rf"^(!?)\s*({_KEY})$")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!"
    values: frozenset[str] = frozenset()

    def matches(self, labels: dict[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        # "!=" and "notin" also match objects without the label, as in Kubernetes.
        return not present or value not in self.values


def _split(selector: str) -> list[str]:
    """Split on the commas that are not inside `( )`."""
    parts, depth, current = [], 0, ""
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def parse_label_selector(selector: Optional[str]) -> list[Requirement]:
    reqs = []
    for part in _split(selector or ""):
        if m := _SET.match(part):
            values = frozenset(v.strip() for v in m.group(3).split(",") if v.strip())
            reqs.append(Requirement(m.group(1), m.group(2), values))
        elif m := _CMP.match(part):
            op = "=" if m.group(2) in ("=", "==") else "!="
            reqs.append(Requirement(m.group(1), op, frozenset([m.group(3)])))
        elif m := _EXISTS.match(part):
            reqs.append(Requirement(m.group(2), "!" if m.group(1) else "exists"))
        else:
            raise bad_request(f"unable to parse requirement: found '{part}', expected: in, notin, =, ==, !=, gt, lt")
    return reqs


def label_matcher(selector: Optional[str]) -> Callable[[dict], bool]:
    reqs = parse_label_selector(selector)
    return lambda obj: all(r.matches((obj.get("metadata") or {}).get("labels") or {}) for r in reqs)


#: Field selectors each resource supports besides metadata.name / metadata.namespace.
FIELD_LABELS = {
    "pods": {
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "status.phase",
        "status.podIP",
    },
    "events": {
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    },
    "secrets": {"type"},
    "namespaces": {"status.phase"},
}


def _field_value(obj: dict, path: str) -> str:
    if path == "source":
        return str((obj.get("source") or {}).get("component", ""))
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)


def field_matcher(selector: Optional[str], plural: str) -> Callable[[dict], bool]:
    terms = []
    allowed = {"metadata.name", "metadata.namespace"} | FIELD_LABELS.get(plural, set())
    for part in _split(selector or ""):
        m = re.match(r"^([A-Za-z.]+)\s*(==|!=|=)\s*(.*)$", part)
        if not m:
            raise bad_request(f"invalid selector: '{selector}'; can't understand '{part}'")
        if m.group(1) not in allowed:
            raise bad_request(f"field label not supported: {m.group(1)}")
        terms.append((m.group(1), m.group(2) != "!=", m.group(3)))
    return lambda obj: all((_field_value(obj, path) == value) == equal for path, equal, value in terms)
