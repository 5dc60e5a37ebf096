"""`describe` only reads; the repair step (the attached wait, `nemo-kubeflow watch`) writes. Counted over HTTP
on the local cluster: the verbs of the requests one describe sends, in each state a job can be in."""

import time

import pytest
from kubernetes import client
from polling import wait_for
from test_diagnosis import submit
from test_resilience import two_running_pods, waiting_nodes
from torchx.specs import AppState

from nemo_kubeflow import constants as C
from nemo_kubeflow.nemo_run.scheduler import create_scheduler
from nemo_kubeflow.nemo_run.status_answers import ANSWER_REUSE_S

READS = {"get", "list"}


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """A local cluster of this module's own, scheduling onto three virtual nodes (one can be lost)."""
    from nemo_kubeflow_local import LocalCluster

    with LocalCluster(workdir=tmp_path_factory.mktemp("describe-reads")) as started:
        started.add_virtual_nodes("node-a", "node-b", "node-c")
        yield started


def verbs_of_describe(local, app_id, scheduler=None):
    """The response of one describe, and the verbs of every request the API server received meanwhile."""
    local.clear_requests()
    desc = (scheduler or create_scheduler("count")).describe(app_id)
    return desc, sorted({f"{r.verb} {r.resource}" for r in local.requests})


def trainjob(local, name):
    return next((j for j in local.objects("trainjobs", "default") if j["metadata"]["name"] == name), None)


def test_describe_sends_only_gets_and_lists_in_every_state(local, tmp_path):
    seen = {}
    # running
    _, running = submit(local, "rd-run", script="sleep 60")
    wait_for(lambda: create_scheduler("t").describe(running).state == AppState.RUNNING, "running", timeout=60)
    # pending: no node has a GPU
    _, pending = submit(local, "rd-pend", gpus_per_node=1)
    wait_for(
        lambda: "Insufficient nvidia.com/gpu" in create_scheduler("t").describe(pending).msg, "pending", timeout=60
    )
    # failed
    _, failed = submit(local, "rd-fail", script='echo "node $PET_NODE_RANK"; exit 3')
    wait_for(lambda: create_scheduler("t").describe(failed).state == AppState.FAILED, "failed", timeout=60)
    # unstartable: the registry has no such image
    _, unstartable = submit(local, "rd-pull", container_image="registry.invalid/team/nemo:25.02")
    wait_for(lambda: "cannot be pulled" in create_scheduler("t").describe(unstartable).msg, "unstartable", timeout=60)
    waiting = create_scheduler("waiting")  # a scheduler that looked before: its memory does not make it write

    def count(*app_ids):
        for app_id in app_ids:
            for scheduler in (None, waiting, waiting):
                desc, verbs = verbs_of_describe(local, app_id, scheduler)
                seen[app_id] = desc
                assert verbs and {v.split()[0] for v in verbs} <= READS, (app_id, verbs)
                time.sleep(ANSWER_REUSE_S)  # the same status query again reads nothing: below

    count(running, pending, failed, unstartable)
    assert seen[running].state == AppState.RUNNING and seen[pending].state == AppState.PENDING
    for app_id in (running, pending):
        create_scheduler("t").cancel(app_id)
    # node lost: a move off the node is due
    marker = tmp_path / "done"
    _, script = waiting_nodes(local, marker)
    _, lost_job = submit(local, "rd-lost", script=script, retries=2)
    name = lost_job.split(":", 1)[1]
    core = client.CoreV1Api(local.api_client())
    pods = wait_for(lambda: two_running_pods(core, "default", name), "two running pods", timeout=120)
    lost = next(p.spec.node_name for p in pods if p.metadata.labels[C.COMPLETION_INDEX_LABEL] == "0")
    assert local.lose_node(lost)
    wait_for(lambda: "to be moved" in create_scheduler("t").describe(lost_job).msg, "a move to be due", timeout=120)

    count(lost_job)
    assert seen[failed].state == AppState.FAILED and "exited with code 3" in seen[failed].msg
    # Recommended, not done: the unstartable job is still there, and the lost node's job was not touched.
    assert seen[unstartable].state == AppState.FAILED and "it can never start as configured" in seen[unstartable].msg
    assert trainjob(local, unstartable.split(":", 1)[1]) is not None
    assert f"avoiding node {lost}" in seen[lost_job].msg and "to be moved" in seen[lost_job].msg
    job = trainjob(local, name)
    assert not job["spec"].get("suspend") and C.NODE_AVOIDANCE_ANNOTATION not in job["metadata"].get("annotations", {})
    for watch in waiting._watches.values():
        if watch.keeper is not None:
            watch.keeper.stop()

    # The repair step applies them, and names what it did.
    repairer = create_scheduler("repair")
    desc, repaired = repairer.look_after(unstartable)
    assert desc.state == AppState.FAILED and "the TrainJob was deleted" in desc.msg, desc.msg
    assert repaired and repaired[0].startswith(f"deleted TrainJob {unstartable.replace(':', '/')}: it can never start")
    assert trainjob(local, unstartable.split(":", 1)[1]) is None
    # Remembered in the app record: a new process's describe reports it, with one GET.
    desc, verbs = verbs_of_describe(local, unstartable)
    assert desc.state == AppState.FAILED and "the TrainJob was deleted" in desc.msg and verbs == ["get trainjobs"]

    lines = []
    moved = wait_for(
        lambda: (
            (lines.extend(repairer.look_after(lost_job)[1]) or True)
            and (running_now := two_running_pods(core, "default", name))
            and all(p.spec.node_name != lost for p in running_now)
        ),
        "the job to move",
        timeout=180,
    )
    assert moved and any(f"avoiding node {lost} after its pod" in line for line in lines), lines
    marker.write_text("")
    wait_for(lambda: repairer.look_after(lost_job)[0].state == AppState.SUCCEEDED, "the moved job to end", timeout=120)


def test_the_same_status_query_twice_in_a_row_reads_once_and_a_cancel_is_never_hidden(local, nemorun_home):
    """NeMo-Run's ``Experiment.status`` asks each task's state twice in a row: the second is answered without a
    read; after a cancel by any scheduler of the process, or a moment later, the next query reads."""
    from nemo_run.run.experiment import Experiment

    exp, app_id = submit(local, "rd-twice", script="sleep 60")
    wait_for(lambda: create_scheduler("t").describe(app_id).state == AppState.RUNNING, "running", timeout=60)
    local.clear_requests()
    [status] = Experiment.from_id(exp._id).status(return_dict=True).values()
    assert status["status"] == AppState.RUNNING
    name = app_id.split(":", 1)[1]
    trainjob_reads = [r for r in local.requests if r.resource == "trainjobs" and r.name == name]
    assert len(trainjob_reads) == 1, trainjob_reads

    scheduler = create_scheduler("twice")
    first, _ = verbs_of_describe(local, app_id, scheduler)
    again, verbs = verbs_of_describe(local, app_id, scheduler)
    assert verbs == [] and (again.state, again.msg) == (first.state, first.msg)
    time.sleep(ANSWER_REUSE_S)
    _, verbs = verbs_of_describe(local, app_id, scheduler)
    assert "get trainjobs" in verbs
    scheduler.describe(app_id)
    create_scheduler("other").cancel(app_id)  # as NeMo-Run cancels: through another runner's scheduler
    after, verbs = verbs_of_describe(local, app_id, scheduler)
    assert "get trainjobs" in verbs and after.state == AppState.CANCELLED, (after, verbs)
