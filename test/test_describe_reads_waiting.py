"""What one describe of a waiting job reads, counted at the HTTP level on a local cluster of status-only pods:
its JobSet, the pods that started or ended, and the first chunk (``limit``) of its pending pods, apart those
not placed and those starting; never every pod. What it says is what a read of every pod says."""

import pytest
from polling import wait_for
from test_diagnosis import submit
from torchx.specs import AppState

from nemo_kubeflow.cluster.client import KubernetesCluster
from nemo_kubeflow.constants import JOBSET_NAME_LABEL, TRAINJOB_KIND
from nemo_kubeflow.nemo_run.scheduler import create_scheduler
from nemo_kubeflow.observe.job_view import (
    NOT_PENDING,
    STARTING,
    UNSCHEDULED,
    WAITING_EVENTS,
    WAITING_SAMPLE,
    JobView,
    why_waiting,
)

#: More pods than a sample holds.
NODES = WAITING_SAMPLE + 4


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    from nemo_kubeflow_local import LocalCluster

    with LocalCluster(workdir=tmp_path_factory.mktemp("waiting-reads"), status_only_pods=True) as started:
        started.add_virtual_nodes("vnode-a", "vnode-b")
        yield started


def _pending(local, name):
    return sum(
        1
        for p in local.objects("pods", "default")
        if p["metadata"]["labels"].get(JOBSET_NAME_LABEL) == name and p["status"].get("phase") == "Pending"
    )


def test_describe_of_a_waiting_job_reads_a_sample_of_its_pending_pods(local):
    _, app_id = submit(local, "wait-sample", script="sleep 600", nodes=NODES, node_selector={"pool": "none"})
    name = app_id.split(":")[-1]
    wait_for(lambda: _pending(local, name) == NODES, "every pod pending", timeout=120)
    wait_for(
        lambda: "cannot be scheduled" in create_scheduler("t").describe(app_id).msg,
        "the scheduler's reason",
        timeout=60,
    )

    local.clear_requests()
    desc = create_scheduler("count").describe(app_id)
    requests = [(r.verb, r.resource, r.query) for r in local.requests]
    assert desc.state == AppState.PENDING
    assert (
        desc.msg.startswith("node 0 cannot be scheduled: ") and "didn't match Pod's node affinity/selector" in desc.msg
    ), desc.msg
    assert sorted((verb, resource) for verb, resource, _ in requests) == [
        ("get", "jobsets"),
        ("get", "trainjobs"),
        ("list", "events"),
        ("list", "pods"),
        ("list", "pods"),
        ("list", "pods"),
    ]
    pod_lists = sorted((q["fieldSelector"], q.get("limit")) for verb, resource, q in requests if resource == "pods")
    assert pod_lists == sorted(
        [(NOT_PENDING, None), (UNSCHEDULED, str(WAITING_SAMPLE)), (STARTING, str(WAITING_SAMPLE))]
    )
    assert all(
        q.get("labelSelector") == f"{JOBSET_NAME_LABEL}={name}" for _, resource, q in requests if resource == "pods"
    )
    [events] = [q for _, resource, q in requests if resource == "events"]
    assert events.get("fieldSelector") == WAITING_EVENTS

    # The sample says what every pod says; it holds no more than a sample.
    cluster = KubernetesCluster(str(local.kubeconfig_path))
    trainjob = cluster.get(TRAINJOB_KIND, name, "default")
    sampled, whole = JobView.read_waiting(cluster, trainjob), JobView.read(cluster, trainjob)
    assert len(sampled.pods) == WAITING_SAMPLE and len(whole.pods) == NODES
    assert why_waiting(sampled, NODES, AppState.PENDING) == why_waiting(whole, NODES, AppState.PENDING)
    create_scheduler("t").cancel(app_id)
