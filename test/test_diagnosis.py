"""Why is it pending, why did it fail: what status tells the user, on the local cluster."""

import time
from pathlib import Path

import nemo_run as run
import pytest
from torchx.specs import AppState, parse_app_handle

from nemo_kubeflow import KubeflowExecutor, PVCMount
from nemo_kubeflow.local import LocalCluster
from nemo_kubeflow.scheduler import create_scheduler


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    with LocalCluster(workdir=tmp_path_factory.mktemp("diagnosis")) as c:
        yield c


def submit(local, name, script="echo hi", **kw):
    executor = KubeflowExecutor(**{"container_image": "python:3.11", "nodes": 2, "shm_size": None,
                                   "kubeconfig": str(local.kubeconfig_path), **kw})
    with run.Experiment(name, executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(inline=script), name=name)
        exp.run(detach=True)
    return exp, parse_app_handle(exp.jobs[0].handle)[2]


def wait_for_message(app_id, text, timeout=30):
    scheduler = create_scheduler("t")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        desc = scheduler.describe(app_id)
        if text in desc.msg:
            return desc
        time.sleep(0.2)
    raise AssertionError(f"never saw {text!r}; last: {desc.state} {desc.msg!r}")


def test_image_that_cannot_be_pulled_ends_the_wait(local):
    executor = KubeflowExecutor(container_image="registry.invalid/team/nemo:25.02", nodes=2, shm_size=None,
                                kubeconfig=str(local.kubeconfig_path))
    started = time.monotonic()
    with run.Experiment("pull", executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(inline="echo never"), name="pull")
        exp.run(sequential=True)  # waits: must end promptly, not hang on ImagePullBackOff
    assert time.monotonic() - started < 60
    [job] = exp.jobs
    status = exp.status(return_dict=True)[job.id]
    assert status["status"] == AppState.FAILED
    desc = create_scheduler("t").describe(parse_app_handle(job.handle)[2])
    assert desc.state == AppState.FAILED
    assert "image 'registry.invalid/team/nemo:25.02' cannot be pulled" in desc.msg and "not found" in desc.msg
    assert "the TrainJob was deleted" in desc.msg
    assert not [j for j in local.objects("trainjobs", "default") if "pull" in j["metadata"]["name"]]


def test_unschedulable_gpu_request(local):
    _, app_id = submit(local, "nogpu", gpus_per_node=1)
    desc = wait_for_message(app_id, "cannot be scheduled")
    assert desc.state == AppState.PENDING
    assert "0/1 nodes are available: 1 Insufficient nvidia.com/gpu." in desc.msg
    create_scheduler("t").cancel(app_id)


def test_missing_pvc(local):
    _, app_id = submit(local, "nopvc", pvc_mounts=[PVCMount(claim_name="missing-claim", mount_path="/data")])
    desc = wait_for_message(app_id, 'persistentvolumeclaim "missing-claim" not found')
    assert desc.state == AppState.PENDING
    create_scheduler("t").cancel(app_id)


def test_missing_secret_key(local):
    _, app_id = submit(local, "nosecret", secret_key_refs={"TOKEN": "absent-secret/token"})
    desc = wait_for_message(app_id, "cannot start")
    assert desc.state == AppState.PENDING and "absent-secret" in desc.msg
    create_scheduler("t").cancel(app_id)


def test_progress_is_shown_while_waiting(local, capsys):
    _, app_id = submit(local, "progress", gpus_per_node=1)
    wait_for_message(app_id, "Insufficient nvidia.com/gpu")
    out = capsys.readouterr()
    assert "pending: node" in " ".join((out.out + out.err).split())
    create_scheduler("t").cancel(app_id)


def test_failure_summary_names_the_rank_and_saves_every_log(local):
    # Node 0 finishes first: a failed Job deletes its pods that still run, logs and all.
    script = ('for i in 1 2 3; do echo "node $PET_NODE_RANK step $i"; done\n'
              'if [ "$PET_NODE_RANK" = 1 ]; then sleep 1; exit 3; fi')
    exp, app_id = submit(local, "summary", script=script)
    desc = wait_for_message(app_id, "exited with code", timeout=60)
    assert desc.state == AppState.FAILED
    assert "node 1 (pod " in desc.msg and "exited with code 3" in desc.msg
    assert "last lines of node 1:" in desc.msg and "node 1 step 3" in desc.msg
    logs = Path(exp.jobs[0].executor.job_dir) / "logs"
    assert "node 0 step 3" in (logs / "node-0.log").read_text()
    assert "node 1 step 3" in (logs / "node-1.log").read_text()


def test_failure_summary_says_which_logs_died_with_their_pods(local):
    script = 'echo "node $PET_NODE_RANK up"\nif [ "$PET_NODE_RANK" = 1 ]; then exit 4; fi\nsleep 30'
    _, app_id = submit(local, "lostlog", script=script)
    # The Job controller deletes the failed Job's running pod shortly after the failure: wait for it.
    desc = wait_for_message(app_id, "no log for node(s) 0: their pods were deleted when the job failed", timeout=60)
    assert "exited with code 4" in desc.msg


def test_following_logs_keeps_them_next_to_the_job(local):
    exp, app_id = submit(local, "tee", script='echo "kept from node $PET_NODE_RANK"')
    scheduler = create_scheduler("t")
    for node in (0, 1):
        assert any("kept from node" in line for line in scheduler.log_iter(app_id, "tee", node, should_tail=True))
    logs = Path(exp.jobs[0].executor.job_dir) / "logs"
    assert "[node-1] kept from node 1" in (logs / "node-1.log").read_text()


def test_failed_preflight_is_named_in_the_status(local):
    _, app_id = submit(local, "preflightfail",
                       preflight='echo "checking"; echo "nccl: interface eth9 missing" >&2; exit 1')
    desc = wait_for_message(app_id, "preflight on node", timeout=60)
    assert desc.state == AppState.FAILED and "(pod " in desc.msg


def test_following_logs_continues_across_a_gang_restart(local):
    # First attempt fails (no marker yet on the shared claim), the restarted gang succeeds.
    script = ('if [ ! -f /data/attempted-$PET_NODE_RANK ]; then touch /data/attempted-$PET_NODE_RANK; '
              'echo "attempt one"; sleep 3; exit 5; fi\necho "attempt two"')
    claim = PVCMount(claim_name="restart-claim", mount_path="/data", create=True, size="1Gi")
    _, app_id = submit(local, "restart", script=script, retries=1, pvc_mounts=[claim])
    lines = list(create_scheduler("t").log_iter(app_id, "restart", 0, should_tail=True))
    text = "".join(lines)
    assert "attempt one" in text and "attempt two" in text, text
    assert "--- gang restart: following pod" in text and "(restart attempt 1)" in text
    assert create_scheduler("t").describe(app_id).state == AppState.SUCCEEDED
