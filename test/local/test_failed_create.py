"""A pod the API server refuses (a quota, Pod Security, a missing ServiceAccount) is what the Job controller
says on its Job: a Warning `FailedCreate` "Error creating: <the server's message>", then it tries again, backing
off, and the pod is created once admitted; events alike are counted, not multiplied, as client-go's recorder
does."""

from __future__ import annotations

import re
import time
from typing import Callable

import pytest
from localcluster_helpers import create_runtime, create_trainjob, pods_of, runtime, trainjob, unique, wait_finished
from test_pod_admission import Send, local_sender, real_sender

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


# --- each controller's refusal, on the local cluster and on the real control plane -------------------------

#: (namespace labels, quota's hard) -> what the first refusal reads, as the real controllers say it
REFUSALS = [
    pytest.param(
        {},
        {"pods": "0"},
        (
            "Job",
            "FailedCreate",
            'Error creating: pods "tj-node-0-0-xxxxx" is forbidden: exceeded quota: objects, requested: pods=1, '
            "used: pods=0, limited: pods=0",
            "job-controller",
            "v1",
        ),
        id="pods",
    ),
    pytest.param(
        {"pod-security.kubernetes.io/enforce": "restricted"},
        {},
        (
            "Job",
            "FailedCreate",
            'Error creating: pods "tj-node-0-0-xxxxx" is forbidden: violates PodSecurity "restricted:latest": '
            'allowPrivilegeEscalation != false (container "node" must set '
            'securityContext.allowPrivilegeEscalation=false), unrestricted capabilities (container "node" must set '
            'securityContext.capabilities.drop=["ALL"]), runAsNonRoot != true (pod or container "node" must set '
            'securityContext.runAsNonRoot=true), seccompProfile (pod or container "node" must set '
            'securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")',
            "job-controller",
            "v1",
        ),
        id="pod-security",
    ),
    pytest.param(
        {},
        {"count/jobs.batch": "0"},
        (
            "JobSet",
            "JobCreationFailed",
            'job "tj-node-0" creation failed with error: jobs.batch "tj-node-0" is forbidden: exceeded quota: '
            "objects, requested: count/jobs.batch=1, used: count/jobs.batch=0, limited: count/jobs.batch=0",
            "jobset",
            "events.k8s.io",
        ),
        id="jobs",
    ),
    pytest.param(
        {},
        {"count/jobsets.jobset.x-k8s.io": "0"},
        (
            "TrainJob",
            "TrainJobResourcesCreationFailed",
            'TrainJob resources reconciliation failed: jobsets.jobset.x-k8s.io "tj" is forbidden: exceeded quota: '
            "objects, requested: count/jobsets.jobset.x-k8s.io=1, used: count/jobsets.jobset.x-k8s.io=0, "
            "limited: count/jobsets.jobset.x-k8s.io=0",
            "trainer-trainjob-controller",
            "events.k8s.io",
        ),
        id="jobsets",
    ),
]
_REASONS = ("FailedCreate", "JobCreationFailed", "TrainJobResourcesCreationFailed")


def first_refusal(send: Send, ns: str, runtime_name: str, labels: dict, hard: dict) -> tuple[str, ...]:
    if labels:
        send("PATCH", f"/api/v1/namespaces/{ns}", {"metadata": {"labels": labels}}, "application/merge-patch+json")
    if hard:
        send(
            "POST", f"/api/v1/namespaces/{ns}/resourcequotas", {"metadata": {"name": "objects"}, "spec": {"hard": hard}}
        )

        # Until the quota controller counted each resource (a custom resource's once its discovery saw the kind),
        # the real admission refuses with "status unknown for quota: ...".
        def counted() -> bool:
            status = send("GET", f"/api/v1/namespaces/{ns}/resourcequotas/objects", None)[1].get("status") or {}
            return set(hard) <= set(status.get("used") or {})

        _poll(counted, timeout=90.0)
    body = trainjob("tj", runtime_name, ["true"], num_nodes=1)
    body["spec"]["trainer"]["image"] = "busybox"
    code, answer = send("POST", f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs", body)
    assert code == 201, answer

    def refused():
        events = send("GET", f"/api/v1/namespaces/{ns}/events", None)[1]["items"]
        return next((e for e in events if e["reason"] in _REASONS), None)

    event = _poll(refused)
    message = GENERATED.sub(r'pods "\1-xxxxx"', event["message"]).replace(ns, "{ns}")
    # who signs it, and through which API (an events.k8s.io event has no firstTimestamp in the core view)
    signed = (event.get("reportingComponent"), "events.k8s.io" if event.get("firstTimestamp") is None else "v1")
    return event["involvedObject"]["kind"], event["reason"], message, *signed


def _poll(found: Callable, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not (result := found()):
        assert time.monotonic() < deadline, "not seen in time"
        time.sleep(0.2)
    return result


@pytest.mark.parametrize("labels, hard, expected", REFUSALS)
def test_each_controller_says_the_refusal_as_the_real_one(api, ns, plain_runtime, labels, hard, expected):
    assert first_refusal(local_sender(api), ns, plain_runtime, labels, hard) == expected


#: The JobSets case was recorded from the real Trainer v2.3.0 once; the real tier's kube-controller-manager never
#: counts a custom resource (`status.used` lacks `count/jobsets.jobset.x-k8s.io`: seen for minutes), so its
#: admission says "status unknown for quota: objects, ..." there instead, and the case is checked offline only.
REAL_REFUSALS = [case for case in REFUSALS if case.id != "jobsets"]


@pytest.mark.real
@pytest.mark.parametrize("labels, hard, expected", REAL_REFUSALS)
def test_the_real_controllers_say_the_same(real_control_plane, real_namespace, labels, hard, expected):
    real_control_plane.install_trainer_runtimes()
    assert first_refusal(real_sender(real_control_plane), real_namespace, "torch-distributed", labels, hard) == expected
