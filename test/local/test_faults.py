"""Test hooks: injected faults, RBAC denials and the request log."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest
import urllib3
from kubernetes.client import ApiException


def _cm(name: str) -> dict:
    return {"metadata": {"name": name}}


def test_injected_status(cluster, core, ns):
    handle = cluster.inject_fault(verb="create", resource="configmaps", status=500)
    with pytest.raises(ApiException) as error:
        core.create_namespaced_config_map(ns, _cm("a"))
    body = json.loads(error.value.body)
    assert (error.value.status, body["reason"], body["kind"]) == (500, "InternalError", "Status")
    assert handle.fired == 1
    core.create_namespaced_config_map(ns, _cm("a"))  # fired once, then gone


def test_nth_request_fails(cluster, core, ns):
    core.create_namespaced_config_map(ns, _cm("a"))
    cluster.inject_fault(verb="get", resource="configmaps", nth=2, status=503, message="try later")
    core.read_namespaced_config_map("a", ns)
    with pytest.raises(ApiException) as error:
        core.read_namespaced_config_map("a", ns)
    assert error.value.status == 503 and json.loads(error.value.body)["message"] == "try later"
    core.read_namespaced_config_map("a", ns)


def test_nth_counts_every_request_without_filters(cluster, core, ns):
    cluster.inject_fault(nth=3, status=500)
    core.list_namespaced_config_map(ns)
    core.list_namespaced_pod(ns)
    with pytest.raises(ApiException):
        core.list_namespaced_secret(ns)


def test_retry_after(cluster, core, ns):
    # On a POST: urllib3 itself retries idempotent requests that carry Retry-After (as with a real server).
    cluster.inject_fault(verb="create", resource="configmaps", status=429, retry_after=3, times=2)
    for _ in range(2):
        with pytest.raises(ApiException) as error:
            core.create_namespaced_config_map(ns, _cm("a"))
        assert error.value.status == 429 and error.value.headers["Retry-After"] == "3"
        body = json.loads(error.value.body)
        assert body["reason"] == "TooManyRequests" and body["details"]["retryAfterSeconds"] == 3
    core.create_namespaced_config_map(ns, _cm("a"))


def test_dropped_connection(cluster, core, ns):
    cluster.clear_requests()
    cluster.inject_fault(verb="create", resource="configmaps", name=None, drop_connection=True)
    with pytest.raises(urllib3.exceptions.ProtocolError):  # POST is not retried by urllib3
        core.create_namespaced_config_map(ns, _cm("a"))
    dropped = cluster.wait_for(lambda: [r for r in cluster.requests if r.verb == "create"])
    assert [(r.resource, r.namespace, r.status_code) for r in dropped] == [("configmaps", ns, None)]
    core.create_namespaced_config_map(ns, _cm("a"))


def test_delay(cluster, core, ns):
    cluster.inject_fault(verb="list", resource="configmaps", delay=0.5)
    started = time.monotonic()
    core.list_namespaced_config_map(ns)  # only slow: a delay alone does not fail
    assert time.monotonic() - started >= 0.5


def test_fault_by_name_and_remove(cluster, core, ns):
    core.create_namespaced_config_map(ns, _cm("a"))
    core.create_namespaced_config_map(ns, _cm("b"))
    handle = cluster.inject_fault(verb="get", name="b", status=404, times=100)
    core.read_namespaced_config_map("a", ns)
    with pytest.raises(ApiException):
        core.read_namespaced_config_map("b", ns)
    handle.remove()
    core.read_namespaced_config_map("b", ns)


def test_deny(cluster, core, ns):
    cluster.deny("create", "configmaps", ns)
    with pytest.raises(ApiException) as error:
        core.create_namespaced_config_map(ns, _cm("a"))
    body = json.loads(error.value.body)
    assert error.value.status == 403 and body["reason"] == "Forbidden"
    assert body["message"] == (
        f'configmaps is forbidden: User "nemo-kubeflow-local" cannot create resource '
        f'"configmaps" in API group "" in the namespace "{ns}"'
    )
    core.list_namespaced_config_map(ns)  # other verbs still allowed
    cluster.deny("get", "pods/log")
    with pytest.raises(ApiException) as error:
        core.read_namespaced_pod_log("p", ns)
    assert json.loads(error.value.body)["message"] == (
        f'pods "p" is forbidden: User "nemo-kubeflow-local" cannot get resource "pods/log" in API group "" in the '
        f'namespace "{ns}"'
    )
    cluster.allow_all()
    core.create_namespaced_config_map(ns, _cm("a"))


#: What kube-apiserver answers a SelfSubjectAccessReview with neither resource nor non-resource attributes
#: (the kind in the message is the one the request wrote: none here).
NEITHER_ATTRIBUTES = (
    422,
    "Invalid",
    '.authorization.k8s.io "" is invalid: spec.resourceAttributes: Invalid value: null: '
    "exactly one of nonResourceAttributes or resourceAttributes must be specified",
)


def _pb(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (payloads under 128 bytes)."""
    return bytes([number << 3 | 2, len(payload)]) + payload


def _access_review(cluster, body: bytes, content_type: str) -> tuple[int, dict]:
    request = urllib.request.Request(
        cluster.url + "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        data=body,
        method="POST",
        headers={
            "Content-Type": content_type,
            "Accept": "application/json",
            "Authorization": f"Bearer {cluster._token}",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=5, context=cluster.ssl_context()) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_access_reviews_in_protobuf_as_kubectl_sends_them_and_in_json(cluster, ns):
    cluster.deny("create", "pods", ns)
    fields = {"namespace": 1, "verb": 2, "group": 3, "version": 4, "resource": 5, "subresource": 6, "name": 7}

    def protobuf(attributes: dict) -> bytes:  # k8s.io/api authorization/v1 generated.proto, in runtime.Unknown
        resource_attributes = b"".join(_pb(fields[key], value.encode()) for key, value in attributes.items())
        review = _pb(2, _pb(1, resource_attributes))  # SelfSubjectAccessReview.spec.resourceAttributes
        type_meta = _pb(1, b"authorization.k8s.io/v1") + _pb(2, b"SelfSubjectAccessReview")
        return b"k8s\x00" + _pb(1, type_meta) + _pb(2, review)

    for verb, allowed in (("create", False), ("list", True)):
        attributes = {"namespace": ns, "verb": verb, "resource": "pods"}
        code, body = _access_review(cluster, protobuf(attributes), "application/vnd.kubernetes.protobuf")
        assert (code, body["kind"], body["spec"]["resourceAttributes"]) == (201, "SelfSubjectAccessReview", attributes)
        assert body["status"]["allowed"] is allowed
    code, body = _access_review(
        cluster,
        json.dumps({"spec": {"resourceAttributes": {"namespace": ns, "verb": "create", "resource": "pods"}}}).encode(),
        "application/json",
    )
    assert (code, body["status"]["allowed"]) == (201, False)
    code, body = _access_review(
        cluster,
        json.dumps({"spec": {"nonResourceAttributes": {"path": "/healthz", "verb": "get"}}}).encode(),
        "application/json",
    )
    assert (code, body["status"]["allowed"]) == (201, True)
    code, body = _access_review(cluster, json.dumps({"spec": {}}).encode(), "application/json")
    assert (code, body["reason"], body["message"]) == NEITHER_ATTRIBUTES
    code, body = _access_review(cluster, b"k8s\x00\x0a\xff", "application/vnd.kubernetes.protobuf")
    assert (code, body["reason"]) == (400, "BadRequest")


@pytest.mark.real
def test_the_real_api_server_answers_access_reviews_the_same(real_control_plane, real_namespace):
    from test_pod_admission import real_sender

    send = real_sender(real_control_plane)
    path = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
    code, body = send("POST", path, {"spec": {}})
    assert (code, body["reason"], body["message"]) == NEITHER_ATTRIBUTES
    code, body = send("POST", path, {"spec": {"nonResourceAttributes": {"path": "/healthz", "verb": "get"}}})
    assert (code, body["status"]["allowed"]) == (201, True)
    attributes = {"namespace": real_namespace, "verb": "create", "resource": "pods"}
    code, body = send("POST", path, {"spec": {"resourceAttributes": attributes}})
    assert (code, body["spec"]["resourceAttributes"], body["status"]["allowed"]) == (201, attributes, True)


def test_request_log(cluster, core, ns):
    cluster.clear_requests()
    core.create_namespaced_config_map(ns, _cm("a"))
    core.patch_namespaced_config_map("a", ns, {"data": {"k": "v"}})
    core.list_namespaced_config_map(ns, label_selector="x=y")
    core.delete_namespaced_config_map("a", ns)
    assert [(r.method, r.verb, r.resource, r.namespace, r.name, r.status_code) for r in cluster.requests] == [
        ("POST", "create", "configmaps", ns, None, 201),
        ("PATCH", "patch", "configmaps", ns, "a", 200),
        ("GET", "list", "configmaps", ns, None, 200),
        ("DELETE", "delete", "configmaps", ns, "a", 200),
    ]
    assert cluster.requests[2].query == {"labelSelector": "x=y"}
