"""What a namespace's admission reads, served as kube-apiserver serves it: ServiceAccounts (a `default` one in
each new namespace), ResourceQuotas (with their status), LimitRanges, PriorityClasses, ValidatingAdmissionPolicies
and their bindings, webhook configurations; their discovery and OpenAPI; the namespace's labels."""

from __future__ import annotations

import pytest
from kubernetes import client

ADMISSION = "admissionregistration.k8s.io"

POD_RULE = {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}


def _get(api: client.ApiClient, path: str) -> dict:
    return api.call_api(path, "GET", auth_settings=["BearerToken"], response_type="object", _return_http_data_only=True)


def test_a_new_namespace_has_its_default_service_account_and_keeps_its_pod_security_labels(cluster, core, ns):
    assert [sa.metadata.name for sa in core.list_namespaced_service_account(ns).items] == ["default"]
    core.create_namespaced_service_account(ns, {"metadata": {"name": "trainer"}})
    assert core.read_namespaced_service_account("trainer", ns).metadata.name == "trainer"
    labels = {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
    }
    core.patch_namespace(ns, {"metadata": {"labels": labels}})
    assert core.read_namespace(ns).metadata.labels == {"kubernetes.io/metadata.name": ns, **labels}


def test_quotas_limit_ranges_and_priority_classes_are_served_with_their_status(cluster, api, core, ns):
    core.create_namespaced_resource_quota(ns, {"metadata": {"name": "team"}, "spec": {"hard": {"requests.cpu": "2"}}})
    core.create_namespaced_limit_range(
        ns, {"metadata": {"name": "bounds"}, "spec": {"limits": [{"type": "Container", "max": {"cpu": "4"}}]}}
    )
    assert core.read_namespaced_resource_quota("team", ns).spec.hard == {"requests.cpu": "2"}
    assert [lr.metadata.name for lr in core.list_namespaced_limit_range(ns).items] == ["bounds"]
    core.patch_namespaced_resource_quota_status(
        "team", ns, {"status": {"hard": {"requests.cpu": "2"}, "used": {"requests.cpu": "0"}}}
    )
    assert core.read_namespaced_resource_quota_status("team", ns).status.used == {"requests.cpu": "0"}
    scheduling = client.SchedulingV1Api(api)
    name = f"{ns}-high"
    scheduling.create_priority_class({"metadata": {"name": name}, "value": 1000, "description": "high"})
    try:
        assert scheduling.read_priority_class(name).value == 1000
    finally:
        scheduling.delete_priority_class(name)


def test_policies_and_webhook_configurations_are_served_cluster_wide(cluster, api, ns):
    admission = client.AdmissionregistrationV1Api(api)
    policy, binding = f"{ns}-policy", f"{ns}-binding"
    admission.create_validating_admission_policy(
        {
            "metadata": {"name": policy},
            "spec": {
                "matchConstraints": {"resourceRules": [POD_RULE]},
                "validations": [{"expression": "false", "message": "never"}],
            },
        }
    )
    admission.create_validating_admission_policy_binding(
        {"metadata": {"name": binding}, "spec": {"policyName": policy, "validationActions": ["Deny"]}}
    )
    admission.create_validating_webhook_configuration({"metadata": {"name": f"{ns}-v"}, "webhooks": []})
    admission.create_mutating_webhook_configuration({"metadata": {"name": f"{ns}-m"}, "webhooks": []})
    try:
        assert admission.read_validating_admission_policy(policy).spec.validations[0].message == "never"
        assert admission.read_validating_admission_policy_binding(binding).spec.policy_name == policy
        assert f"{ns}-v" in [w.metadata.name for w in admission.list_validating_webhook_configuration().items]
        assert f"{ns}-m" in [w.metadata.name for w in admission.list_mutating_webhook_configuration().items]
    finally:
        admission.delete_validating_admission_policy_binding(binding)
        admission.delete_validating_admission_policy(policy)
        admission.delete_validating_webhook_configuration(f"{ns}-v")
        admission.delete_mutating_webhook_configuration(f"{ns}-m")


@pytest.mark.parametrize(
    "group_version, resources",
    [
        ("v1", {"serviceaccounts", "resourcequotas", "resourcequotas/status", "limitranges"}),
        ("scheduling.k8s.io/v1", {"priorityclasses"}),
        (
            f"{ADMISSION}/v1",
            {
                "validatingadmissionpolicies",
                "validatingadmissionpolicies/status",
                "validatingadmissionpolicybindings",
                "validatingwebhookconfigurations",
                "mutatingwebhookconfigurations",
            },
        ),
    ],
)
def test_discovery_and_openapi_list_them(api, group_version, resources):
    listed = _get(api, "/api/v1" if group_version == "v1" else f"/apis/{group_version}")
    assert resources <= {r["name"] for r in listed["resources"]}
    index = _get(api, "/openapi/v3")["paths"]
    assert ("api/v1" if group_version == "v1" else f"apis/{group_version}") in index
