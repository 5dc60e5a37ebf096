"""A pod the API server refuses (a quota, Pod Security, a missing ServiceAccount) is what the Job controller
says on its Job: a Warning `FailedCreate` "Error creating: <the server's message>", then it tries again, backing
off, and the pod is created once admitted; events alike are counted, not multiplied, as client-go's recorder
does."""

from __future__ import annotations

import re
import time

import pytest
from localcluster_helpers import create_runtime, create_trainjob, pods_of, runtime, trainjob, unique, wait_finished

from nemo_kubeflow_local.apiserver import resources as R
from nemo_kubeflow_local.apiserver.store import Store
from nemo_kubeflow_local.events import EventRecorder

GENERATED = re.compile(r'pods "([a-z0-9-]+)-[bcdfghjklmnpqrstvwxz2456789]{5}"')


@pytest.fixture(scope="module")
def plain_runtime(custom) -> str:
    name = unique("admitted")
    create_runtime(custom, runtime(name))
    return name


def _failed_creates(core, ns: str, minimum: int = 1, timeout: float = 20.0) -> list:
    deadline = time.monotonic() + timeout
    while True:
        events = [e for e in core.list_namespaced_event(ns).items if e.reason == "FailedCreate" and e.type == "Warning"]
        if sum(e.count or 1 for e in events) >= minimum or time.monotonic() > deadline:
            return sorted(events, key=lambda e: e.first_timestamp)
        time.sleep(0.1)


def test_a_pod_over_the_quota_waits_on_a_failed_create_and_starts_when_the_quota_frees(
    cluster, core, custom, ns, plain_runtime
):
    core.create_namespaced_resource_quota(ns, {"metadata": {"name": "one-pod"}, "spec": {"hard": {"pods": "1"}}})
    create_trainjob(custom, ns, trainjob("gang", plain_runtime, ["bash", "-c", "sleep 0.5"], num_nodes=2))
    [first, *_] = _failed_creates(core, ns)
    assert (first.involved_object.kind, first.involved_object.name, first.source.component) == (
        "Job",
        "gang-node-0",
        "job-controller",
    )
    assert GENERATED.sub(r'pods "\1-xxxxx"', first.message) == (
        'Error creating: pods "gang-node-0-1-xxxxx" is forbidden: exceeded quota: one-pod, requested: pods=1, '
        "used: pods=1, limited: pods=1"
    )
    # the first pod ends, the quota frees, the refused one is created at the next try
    assert wait_finished(cluster, custom, ns, "gang", timeout=30)["status"]["conditions"][-1]["type"] == "Complete"
    assert len(pods_of(core, ns, "gang")) == 2
    assert core.read_namespaced_resource_quota("one-pod", ns).status.used == {"pods": "0"}


def test_a_pod_security_refusal_is_on_the_job_at_the_first_try_and_nothing_runs(
    cluster, core, custom, ns, plain_runtime
):
    core.patch_namespace(ns, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})
    create_trainjob(custom, ns, trainjob("unsafe", plain_runtime, ["true"], num_nodes=1))
    [event, *_] = _failed_creates(core, ns)
    assert GENERATED.sub(r'pods "\1-xxxxx"', event.message).startswith(
        'Error creating: pods "unsafe-node-0-0-xxxxx" is forbidden: violates PodSecurity "restricted:latest": '
        'allowPrivilegeEscalation != false (container "node" must set securityContext.allowPrivilegeEscalation=false)'
    )
    assert pods_of(core, ns, "unsafe") == []


def test_the_same_refusal_again_counts_on_one_event(cluster, core, custom, ns):
    name = unique("account")
    create_runtime(custom, runtime(name, pod_extra={"serviceAccountName": "trainer"}))
    create_trainjob(custom, ns, trainjob("nobody", name, ["true"], num_nodes=1))
    # A mutating plugin's refusal names the generateName, so each try says the same: one event, counted.
    [event] = _failed_creates(core, ns, minimum=2)
    assert event.message == (
        f'Error creating: pods "nobody-node-0-0-" is forbidden: error looking up service account {ns}/trainer: '
        'serviceaccount "trainer" not found'
    )
    assert event.count >= 2 and event.last_timestamp >= event.first_timestamp
    core.create_namespaced_service_account(ns, {"metadata": {"name": "trainer"}})
    assert wait_finished(cluster, custom, ns, "nobody", timeout=30)["status"]["conditions"][-1]["type"] == "Complete"


def test_alike_events_with_different_messages_are_combined_from_the_tenth():
    store = Store()
    store.create(R.NAMESPACES, {"metadata": {"name": "team"}})
    recorder = EventRecorder(store)
    job = {"kind": "Job", "apiVersion": "batch/v1", "metadata": {"name": "j", "namespace": "team", "uid": "u"}}
    for attempt in range(30):
        recorder.record(
            job, "Warning", "FailedCreate", f'Error creating: pods "j-0-{attempt}" is forbidden', "job-controller"
        )
    events = sorted(store.list(R.EVENTS, "team")[0], key=lambda e: e["metadata"]["name"])  # made in order
    assert [e["count"] for e in events] == [1] * 9 + [21]
    assert events[-1]["message"] == '(combined from similar events): Error creating: pods "j-0-29" is forbidden'
