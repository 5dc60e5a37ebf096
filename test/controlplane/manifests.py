"""Read the upstream CRDs and webhook configurations from the downloaded Go modules, rewritten for loopback.

In a cluster, the controllers' webhooks and CRD conversion webhooks are reached through a Service
(`clientConfig.service`) and the CA is injected by cert-manager or the controller itself. Here there is
no Service network: every clientConfig becomes `url: https://127.0.0.1:<port><path>` with our CA.
Pure functions: paths and dicts in, dicts out.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path

import yaml


@dataclass(frozen=True)
class Upstream:
    """Where one controller keeps its manifests inside its module."""

    component: str
    #: kustomization.yaml listing the CRDs (resources) and the conversion-webhook patches (patches)
    crd_kustomization: str
    #: the generated (controller-gen) webhook configurations
    webhooks: str
    #: API groups whose webhooks we register; None: all of them
    webhook_groups: frozenset | None = None


UPSTREAMS = {
    "trainer": Upstream("trainer", "manifests/base/crds/kustomization.yaml", "manifests/base/webhook/manifests.yaml"),
    "jobset": Upstream(
        "jobset", "config/components/crd/kustomization.yaml", "config/components/webhook/manifests.yaml"
    ),
    # Kueue ships webhooks for every framework it integrates with (pods, deployments, Ray, MPI...);
    # only the ones for the integrations we enable are registered, or every pod create would be
    # sent to a webhook path that Kueue does not serve for a disabled framework.
    "kueue": Upstream(
        "kueue",
        "config/components/crd/kustomization.yaml",
        "config/components/webhook/manifests.yaml",
        webhook_groups=frozenset({"kueue.x-k8s.io", "batch", "jobset.x-k8s.io", "trainer.kubeflow.org"}),
    ),
}


def _load_all(path: Path) -> list:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def crds(module_dir: Path, upstream: Upstream, port: int, ca_pem: bytes) -> list:
    """The component's CRDs, with the conversion webhooks its kustomization patches in pointed at `port`."""
    kustomization_path = module_dir / upstream.crd_kustomization
    kustomization = yaml.safe_load(kustomization_path.read_text())
    base = kustomization_path.parent
    result = {}
    for resource in kustomization.get("resources", []):
        for doc in _load_all(base / resource):
            if doc.get("kind") == "CustomResourceDefinition":
                result[doc["metadata"]["name"]] = doc
    for patch in kustomization.get("patches", []) or kustomization.get("patchesStrategicMerge", []):
        patch_path = base / (patch["path"] if isinstance(patch, dict) else patch)
        for doc in _load_all(patch_path):
            conversion = (doc.get("spec") or {}).get("conversion")
            name = (doc.get("metadata") or {}).get("name")
            if conversion and name in result and conversion.get("strategy") == "Webhook":
                webhook = dict(conversion.get("webhook") or {})
                webhook["clientConfig"] = _client_config(webhook.get("clientConfig") or {}, port, ca_pem)
                webhook.setdefault("conversionReviewVersions", ["v1"])
                result[name]["spec"]["conversion"] = {"strategy": "Webhook", "webhook": webhook}
    return list(result.values())


def webhook_configurations(module_dir: Path, upstream: Upstream, port: int, ca_pem: bytes) -> list:
    """The component's Validating/MutatingWebhookConfigurations, with the JSON 6902 patches of the
    kustomization next to them applied (JobSet's pod webhooks only for JobSet pods, Trainer's opt-out
    label), renamed `<component>-<name>` (each upstream calls its own `validating-webhook-configuration`)
    and pointed at `port` on loopback."""
    path = module_dir / upstream.webhooks
    docs = [
        doc
        for doc in _load_all(path)
        if doc.get("kind") in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration")
    ]
    kustomization_path = path.parent / "kustomization.yaml"
    if kustomization_path.is_file():
        for patch in yaml.safe_load(kustomization_path.read_text()).get("patches", []) or []:
            target = patch.get("target") or {}
            if "path" not in patch or "kind" not in target:
                continue  # strategic-merge patches and replacements (Kueue's namespaceSelectors): not applied
            ops = yaml.safe_load((path.parent / patch["path"]).read_text())
            for doc in docs:
                if (
                    doc["kind"] == target["kind"]
                    and target.get("name", doc["metadata"]["name"]) == doc["metadata"]["name"]
                ):
                    for op in ops:
                        _json_patch(doc, op)
    result = []
    for doc in docs:
        hooks = []
        for hook in doc.get("webhooks", []):
            groups = {g for rule in hook.get("rules", []) for g in rule.get("apiGroups", [])}
            if upstream.webhook_groups is not None and not groups <= upstream.webhook_groups:
                continue
            hook = dict(hook)
            hook["clientConfig"] = _client_config(hook["clientConfig"], port, ca_pem)
            hooks.append(hook)
        if hooks:
            result.append(
                {
                    "apiVersion": doc["apiVersion"],
                    "kind": doc["kind"],
                    "metadata": {"name": f"{upstream.component}-{doc['metadata']['name']}"},
                    "webhooks": hooks,
                }
            )
    return result


def _json_patch(doc: dict, op: dict) -> None:
    """Apply one `add` or `replace` operation of a JSON patch (RFC 6902) in place."""
    if op["op"] not in ("add", "replace"):
        raise ValueError(f"unsupported JSON patch operation {op['op']!r} in an upstream kustomization")
    *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].lstrip("/").split("/")]
    node = doc
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if isinstance(node, list):
        index = len(node) if last == "-" else int(last)
        if op["op"] == "add":
            node.insert(index, op["value"])
        else:
            node[index] = op["value"]
    else:
        node[last] = op["value"]


def _client_config(client_config: dict, port: int, ca_pem: bytes) -> dict:
    path = (client_config.get("service") or {}).get("path") or "/"
    return {"url": f"https://127.0.0.1:{port}{path}", "caBundle": base64.b64encode(ca_pem).decode()}


def runtimes(trainer_module_dir: Path, names: tuple = ("torch_distributed.yaml",)) -> list:
    """Trainer's own ClusterTrainingRuntimes (manifests/base/runtimes), for tests that use them."""
    base = trainer_module_dir / "manifests" / "base" / "runtimes"
    return [doc for name in names for doc in _load_all(base / name)]


#: Where Kueue keeps the manifests of its visibility API (an aggregated API server inside its controller manager).
KUEUE_VISIBILITY = "config/components/visibility/kustomization.yaml"


def kueue_visibility(kueue_module_dir: Path) -> list:
    """The objects Kueue's install registers its visibility API with (config/components/visibility): one
    APIService per version it serves, pointing at the `visibility-server` Service in kueue-system, and that
    Service; the RoleBinding (its ServiceAccount's read of extension-apiserver-authentication) is left out: the
    stage's Kueue runs as the admin user, which reads it already."""
    kustomization_path = kueue_module_dir / KUEUE_VISIBILITY
    base = kustomization_path.parent
    return [
        doc
        for resource in yaml.safe_load(kustomization_path.read_text()).get("resources", [])
        for doc in _load_all(base / resource)
        if doc.get("kind") in ("APIService", "Service")
    ]
