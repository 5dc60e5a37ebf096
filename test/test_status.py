"""The TrainJob -> AppState table (status.py's docstring), row by row."""

import pytest
from torchx.specs import AppState

from nemo_kubeflow.status import job_status


def tj(conditions=(), jobs=None, nodes=2, deleting=False):
    job = {"metadata": {"name": "j"}, "spec": {"trainer": {"numNodes": nodes}}, "status": {"conditions": list(conditions)}}
    if jobs is not None:
        job["status"]["jobsStatus"] = [{"name": "node", **jobs}]
    if deleting:
        job["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return job


def cond(ctype, reason="", message="", status="True"):
    return {"type": ctype, "status": status, "reason": reason, "message": message}


@pytest.mark.parametrize("job, state, text", [
    (None, AppState.CANCELLED, "no longer exists"),
    (tj([cond("Complete", "JobSetCompleted", "done")]), AppState.SUCCEEDED, "done"),
    (tj([cond("Failed", "JobSetFailed", "pod j-node-0-1 exited with code 7")]), AppState.FAILED, "code 7"),
    (tj([cond("Failed", "DeadlineExceeded", "active deadline")]), AppState.FAILED, "DeadlineExceeded"),
    (tj(deleting=True), AppState.CANCELLED, "being deleted"),
    (tj([cond("Suspended", "Suspended", "queued")]), AppState.PENDING, "suspended"),
    # jobsStatus counts Jobs (one Job of N pods here), not pods.
    (tj([cond("Suspended", "Resumed", status="False")], jobs={"active": 1, "ready": 1}), AppState.RUNNING, ""),
    (tj(jobs={"active": 1, "ready": 0}), AppState.PENDING, "waiting for all 2 nodes to be ready"),
    # A pod failed mid gang-restart: no Failed condition yet, so not a failure.
    (tj(jobs={"active": 1, "ready": 1, "failed": 1}), AppState.RUNNING, ""),
    (tj(), AppState.SUBMITTED, "waiting for pods"),
])
def test_status_table(job, state, text):
    status = job_status(job, name="ns/j")
    assert status.state == state
    assert text in status.message


def pod(index, name, code=None, finished="2026-01-01T00:00:01Z", reason="Error"):
    cs = {"name": "node", "state": {"running": {}}}
    if code is not None:
        cs["state"] = {"terminated": {"exitCode": code, "reason": reason, "finishedAt": finished}}
    return {"metadata": {"name": name, "labels": {"batch.kubernetes.io/job-completion-index": str(index)}},
            "status": {"containerStatuses": [cs]}}


def test_failure_detail_names_the_first_failed_node():
    from nemo_kubeflow.status import failure_detail

    pods = [pod(0, "j-node-0-0-a", 137, "2026-01-01T00:00:05Z", "OOMKilled"),
            pod(1, "j-node-0-1-b", 3, "2026-01-01T00:00:02Z"), pod(2, "j-node-0-2-c")]
    assert failure_detail(pods) == "node 1 (pod j-node-0-1-b) exited with code 3"
    assert failure_detail(pods[:1]) == "node 0 (pod j-node-0-0-a) was killed by signal 9 (OOMKilled)"
    assert failure_detail([pod(0, "ok", 0)]) == ""


def test_initializer_progress():
    from nemo_kubeflow.status import initializer_progress

    def p(step, phase):
        return {"metadata": {"labels": {"jobset.sigs.k8s.io/replicatedjob-name": step}}, "status": {"phase": phase}}

    assert initializer_progress([p("model-initializer", "Pending"), p("dataset-initializer", "Running")]) == \
        "initializing: dataset-initializer Running, model-initializer Pending"
    assert initializer_progress([p("node", "Running")]) == ""
