"""A container's environment, as the kubelet makes it (`makeEnvironmentVariables`): `env` in order with
`$(VAR)` references expanded, `envFrom`, and the downward API's field and resource references."""

from __future__ import annotations

import base64
import math
import os
import re
from decimal import Decimal
from typing import Optional, Protocol, Union

from nemo_kubeflow_local.apiserver import resources as R
from nemo_kubeflow_local.apiserver.resources import ResourceType
from nemo_kubeflow_local.constants import POD_IP
from nemo_kubeflow_local.events import NODE_NAME
from nemo_kubeflow_local.quantity import parse_quantity


class ContainerConfigError(Exception):
    """A referenced ConfigMap/Secret/key is missing: the container waits (CreateContainerConfigError)."""


_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: dict[str, str]) -> str:
    """`$(VAR)` expansion as the kubelet does it: unknown references stay, `$$` is a literal `$`."""
    return _VAR_REF.sub(lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


def field_ref(pod: dict, path: str) -> str:
    meta = pod["metadata"]
    if m := re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path):
        return (meta.get(m.group(1)) or {}).get(m.group(2), "")
    if path in ("metadata.labels", "metadata.annotations"):
        bag = meta.get(path.split(".")[1]) or {}
        return "\n".join(f'{k}="{v}"' for k, v in sorted(bag.items()))
    values = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": pod["spec"].get("nodeName") or NODE_NAME,
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
        "status.podIP": POD_IP,
        "status.hostIP": POD_IP,
        "status.podIPs": POD_IP,
        "status.hostIPs": POD_IP,
    }
    if path not in values:
        raise ContainerConfigError(f"unsupported fieldPath: {path}")
    return values[path]


def _resource_ref(pod: dict, container: dict, ref: dict) -> str:
    name = ref.get("containerName") or container["name"]
    target = next((c for c in pod["spec"].get("containers", []) if c["name"] == name), container)
    kind, _, resource = ref["resource"].partition(".")
    given = parse_quantity(str((target.get("resources", {}).get(kind) or {}).get(resource, "")))
    value: Union[Decimal, int]
    if given is not None:
        value = given
    else:  # unset limits report the node's allocatable
        value = (os.cpu_count() or 1) if resource == "cpu" else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    divisor = parse_quantity(str(ref.get("divisor", "1"))) or 1
    return str(max(1, math.ceil(value / divisor)) if resource == "cpu" else math.ceil(value / divisor))


class Objects(Protocol):
    """Where the kubelet reads the ConfigMaps, Secrets and claims a pod uses, and gets its projected
    service-account tokens (the TokenRequest API's part)."""

    def find(self, rt: ResourceType, namespace: str, name: str) -> Optional[dict]: ...

    def service_account_token(self, namespace: str, service_account: str, audience: str, seconds: int) -> str: ...


def _source_data(store: Objects, namespace: str, kind: str, name: str, optional: bool) -> Optional[dict[str, str]]:
    """The data of a ConfigMap or Secret (decoded), None if optional and absent."""
    rt = R.CONFIGMAPS if kind == "configmap" else R.SECRETS
    obj = store.find(rt, namespace, name)
    if obj is None:
        if optional:
            return None
        raise ContainerConfigError(f'{kind} "{name}" not found')
    if rt is R.SECRETS:
        return {k: base64.b64decode(v).decode("utf-8", "replace") for k, v in (obj.get("data") or {}).items()}
    return dict(obj.get("data") or {})


def container_env(store: Objects, pod: dict, container: dict, base: dict[str, str]) -> dict[str, str]:
    namespace = pod["metadata"].get("namespace", "default")
    env = dict(base)
    for source in container.get("envFrom") or []:
        for kind, key in (("configmap", "configMapRef"), ("secret", "secretRef")):
            if key in source:
                ref = source[key]
                data = _source_data(store, namespace, kind, ref.get("name", ""), ref.get("optional", False))
                env.update({source.get("prefix", "") + k: v for k, v in (data or {}).items()})
    for var in container.get("env") or []:
        if "valueFrom" not in var:
            env[var["name"]] = expand(var.get("value", ""), env)
            continue
        source = var["valueFrom"]
        if "fieldRef" in source:
            env[var["name"]] = field_ref(pod, source["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in source:
            env[var["name"]] = _resource_ref(pod, container, source["resourceFieldRef"])
        else:
            kind, ref = (
                ("configmap", source["configMapKeyRef"])
                if "configMapKeyRef" in source
                else ("secret", source["secretKeyRef"])
            )
            data = _source_data(store, namespace, kind, ref.get("name", ""), ref.get("optional", False))
            if data is not None and ref.get("key") in data:
                env[var["name"]] = data[ref["key"]]
            elif not ref.get("optional", False):
                label = "ConfigMap" if kind == "configmap" else "Secret"
                raise ContainerConfigError(
                    f"couldn't find key {ref.get('key')} in {label} {namespace}/{ref.get('name')}"
                )
    return env
