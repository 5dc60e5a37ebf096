"""Test hooks: injected faults, RBAC denials and the request log."""

from __future__ import annotations

import json
import time

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
