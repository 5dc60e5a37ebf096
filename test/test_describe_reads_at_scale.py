"""What one describe of a running job reads, counted at the HTTP level on a local cluster of status-only pods
(``LocalCluster(status_only_pods=True)``: the Job emulation makes the pods, no process runs them): the
TrainJob, its JobSet and the pods that are not running, never every running pod; and what it shows when a
pod fails (the gang restart and its cause) does not get poorer for it. Of a failed job: its JobSet, the metadata
of the pods still running (the Job controller deletes them) and the other pods in full."""

import pytest
from polling import wait_for
from test_diagnosis import submit
from torchx.specs import AppState

from nemo_kubeflow.cluster.client import KubernetesCluster
from nemo_kubeflow.constants import COMPLETION_INDEX_LABEL, JOBSET_NAME_LABEL, TRAINJOB_KIND
from nemo_kubeflow.nemo_run.scheduler import create_scheduler
from nemo_kubeflow.observe.job_view import NOT_RUNNING, RUNNING, JobView
from nemo_kubeflow.observe.rank_failure import why_failed

NODES = 12


def status_only_cluster(tmp_path_factory, nodes=NODES):
    """A local cluster of its own whose pods are status-only, on ``nodes`` virtual nodes."""
    from nemo_kubeflow_local import LocalCluster

    with LocalCluster(workdir=tmp_path_factory.mktemp("status-only"), status_only_pods=True) as started:
        started.add_virtual_nodes(*(f"vnode-{i:02d}" for i in range(nodes)))
        yield started


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    yield from status_only_cluster(tmp_path_factory)


def _pods(local, name):
    return [p for p in local.objects("pods", "default") if p["metadata"]["labels"].get(JOBSET_NAME_LABEL) == name]


def _running(local, name, count):
    return sum(1 for p in _pods(local, name) if p["status"].get("phase") == "Running") >= count


def _describe(local, app_id):
    """One describe by a new scheduler: (response, [(verb, resource, query)] of its requests about this job;
    the log followers of earlier tests' schedulers may still read their jobs' pods meanwhile)."""
    name = app_id.split(":")[-1]
    local.clear_requests()
    desc = create_scheduler("count").describe(app_id)
    return desc, [
        (r.verb, r.resource, r.query)
        for r in local.requests
        if name in (r.name or "") + r.query.get("labelSelector", "")
    ]


def test_status_only_pods_are_bound_to_virtual_nodes_and_run(local):
    _, app_id = submit(local, "so-run", script="sleep 600", nodes=NODES)
    name = app_id.split(":")[-1]
    wait_for(lambda: _running(local, name, NODES), "every pod running", timeout=120)
    pods = _pods(local, name)
    assert len({p["spec"]["nodeName"] for p in pods}) == NODES  # one per virtual node, the least loaded first
    for pod in pods:
        assert all(c["type"] != "Ready" or c["status"] == "True" for c in pod["status"]["conditions"])
        assert [cs["state"].get("running") is not None for cs in pod["status"]["containerStatuses"]] == [True] * len(
            pod["spec"]["containers"]
        )
    local.end_pods(f"{JOBSET_NAME_LABEL}={name}", 0)
    wait_for(lambda: create_scheduler("t").describe(app_id).state == AppState.SUCCEEDED, "complete", timeout=60)


def test_pods_no_node_fits_wait_with_the_schedulers_reason(local):
    _, app_id = submit(local, "so-pend", script="sleep 600", node_selector={"pool": "none"})
    wait_for(
        lambda: "didn't match Pod's node affinity/selector" in create_scheduler("t").describe(app_id).msg,
        "the scheduler's reason",
        timeout=60,
    )


def test_describe_of_a_running_job_reads_no_running_pod(local):
    _, app_id = submit(local, "so-reads", script="sleep 600", nodes=NODES, retries=2)
    name = app_id.split(":")[-1]
    wait_for(lambda: _running(local, name, NODES), "every pod running", timeout=120)
    wait_for(lambda: create_scheduler("t").describe(app_id).state == AppState.RUNNING, "running", timeout=60)

    desc, requests = _describe(local, app_id)
    assert desc.state == AppState.RUNNING
    # The TrainJob, its JobSet, the pods that are not running; and, with no trainerStatus, for rank 0's progress
    # line (observe/progress_view.py): node 0's pod by its metadata, and its log's last lines.
    assert sorted((verb, resource) for verb, resource, _ in requests) == [
        ("get", "jobsets"),
        ("get", "pods/log"),
        ("get", "trainjobs"),
        ("list", "pods"),
        ("list", "pods"),
    ]
    [pod_list] = [query for verb, resource, query in requests if resource == "pods" and query.get("fieldSelector")]
    assert pod_list.get("fieldSelector") == "status.phase!=Running"
    assert pod_list.get("labelSelector") == f"{JOBSET_NAME_LABEL}={name}"
    [node_zero] = [query for verb, resource, query in requests if resource == "pods" and not query.get("fieldSelector")]
    assert node_zero.get("labelSelector", "").endswith(f"{COMPLETION_INDEX_LABEL}=0"), node_zero
    counts = {(c.verb, c.resource): c.bytes for c in local.api_counters()}
    assert counts  # the server counted what it sent

    # A node fails: JobSet restarts the gang; the look says so, with the failed node, from what it reads.
    local.end_pods(f"{JOBSET_NAME_LABEL}={name},{COMPLETION_INDEX_LABEL}=3", 5)
    desc = wait_for(
        lambda: (d := create_scheduler("t").describe(app_id)) and "1 gang restart so far" in d.msg and d,
        "the gang restart in the status",
        timeout=120,
    )
    wait_for(lambda: _running(local, name, NODES), "the new attempt running", timeout=120)
    desc, requests = _describe(local, app_id)
    assert "1 gang restart so far" in desc.msg, desc.msg
    assert "attempt 0:" in desc.msg and "exit" in desc.msg, desc.msg  # the cause, from the Job's failure
    assert ("list", "jobs") in [(verb, resource) for verb, resource, _ in requests]  # its current Job: metadata only
    assert [
        q.get("fieldSelector") for verb, resource, q in requests if resource == "pods" and "fieldSelector" in q
    ] == ["status.phase!=Running"]  # no list of every pod
    local.end_pods(f"{JOBSET_NAME_LABEL}={name}", 0)


def test_describe_of_a_failed_job_reads_no_running_pod_in_full(local):
    _, app_id = submit(local, "fail-reads", script="sleep 600", nodes=NODES, retries=0)
    name = app_id.split(":")[-1]
    wait_for(lambda: _running(local, name, NODES), "every pod running", timeout=120)
    local.end_pods(f"{JOBSET_NAME_LABEL}={name},{COMPLETION_INDEX_LABEL}=2", 3)
    wait_for(lambda: create_scheduler("t").describe(app_id).state == AppState.FAILED, "failed", timeout=120)

    local.clear_requests()
    desc = create_scheduler("count").describe(app_id)
    requests = [
        (r.verb, r.resource, r.query)
        for r in local.requests
        if name in (r.name or "") + r.query.get("labelSelector", "")
    ]
    assert desc.state == AppState.FAILED and "node 2" in desc.msg and "exited with code 3" in desc.msg, desc.msg
    assert sorted((verb, resource) for verb, resource, _ in requests) == [
        ("get", "jobsets"),
        ("get", "pods/log"),
        ("get", "trainjobs"),
        ("list", "pods"),
        ("list", "pods"),
    ]
    assert sorted(q["fieldSelector"] for _, resource, q in requests if resource == "pods") == sorted(
        [RUNNING, NOT_RUNNING]
    )

    # What it says is what every pod says (the pods still there: none runs any more, or some do).
    cluster = KubernetesCluster(str(local.kubeconfig_path))
    trainjob = cluster.get(TRAINJOB_KIND, name, "default")
    condition = next(c["message"] for c in trainjob["status"]["conditions"] if c["type"] == "Failed")
    wait_for(
        lambda: (
            why_failed(JobView.read_failed(cluster, trainjob), condition)
            == why_failed(JobView.read(cluster, trainjob), condition)
        ),
        "the same message",
        timeout=30,
    )
    create_scheduler("t").cancel(app_id)
