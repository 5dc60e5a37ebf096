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
    from nemo_kubeflow.diagnosis import failure_detail

    pods = [pod(0, "j-node-0-0-a", 137, "2026-01-01T00:00:05Z", "OOMKilled"),
            pod(1, "j-node-0-1-b", 3, "2026-01-01T00:00:02Z"), pod(2, "j-node-0-2-c")]
    assert failure_detail(pods) == "node 1 (pod j-node-0-1-b) exited with code 3"
    assert failure_detail(pods[:1]) == "node 0 (pod j-node-0-0-a) was killed by signal 9 (OOMKilled)"
    assert failure_detail([pod(0, "ok", 0)]) == ""


def test_initializer_progress():
    from nemo_kubeflow.diagnosis import initializer_progress

    def p(step, phase):
        return {"metadata": {"labels": {"jobset.sigs.k8s.io/replicatedjob-name": step}}, "status": {"phase": phase}}

    assert initializer_progress([p("model-initializer", "Pending"), p("dataset-initializer", "Running")]) == \
        "initializing: dataset-initializer Running, model-initializer Pending"
    assert initializer_progress([p("node", "Running")]) == ""


ROOT_CAUSE_WITH_RECORD = """\
[rank2]:[W1123 ProcessGroup.cpp] warning
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-23_22:49:33
  host      : node-1
  rank      : 5 (local_rank: 1)
  exitcode  : 1 (pid: 14259)
  error_file: /tmp/torchelastic_x/none_y/attempt_0/1/error.json
  traceback : Traceback (most recent call last):
    File "/nemo_run/code/train.py", line 9, in main
      loss = step(batch)
  ValueError: loss is nan at step 12
  
============================================================"""


def test_rank_failure_from_an_error_file_traceback():
    """With @record, torchrun prints the worker's error file: its exception is the root cause."""
    from nemo_kubeflow.diagnosis import read_rank_failure

    why = read_rank_failure(ROOT_CAUSE_WITH_RECORD.splitlines(), 1)
    assert (why.rank, why.local_rank, why.exitcode) == (5, 1, 1)
    assert why.headline(2) == "rank 5 on node 2: ValueError: loss is nan at step 12"
    assert why.traceback[-1] == "ValueError: loss is nan at step 12"


def test_rank_failure_picks_the_root_cause_rank_among_prefixed_tracebacks():
    from nemo_kubeflow.diagnosis import read_rank_failure

    log = ["[rank0]:Traceback (most recent call last):", '[rank0]:  File "t.py", line 3, in <module>',
           "[rank0]:KeyError: 'another rank, later'",
           "[rank1]:Traceback (most recent call last):", '[rank1]:  File "t.py", line 5, in <module>',
           "[rank1]:    raise RuntimeError('x')", "[rank1]:RuntimeError: the real one",
           "Root Cause (first observed failure):", "[0]:", "  rank      : 1 (local_rank: 1)",
           "  exitcode  : 1 (pid: 7)", "  error_file: <N/A>",
           "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
           "============================================================"]
    assert read_rank_failure(log, 1).headline(0) == "rank 1 on node 0: RuntimeError: the real one"


def test_rank_failure_without_torchrun_and_without_a_traceback():
    from nemo_kubeflow.diagnosis import read_rank_failure

    plain = ["step 1", "Traceback (most recent call last):", '  File "x.py", line 1, in <module>',
             "ZeroDivisionError: division by zero"]
    assert read_rank_failure(plain, 1).headline(3) == "node 3: ZeroDivisionError: division by zero"
    assert read_rank_failure(["just output"], 2).headline(0) == ""
    assert read_rank_failure(["sh: 1: exec: torchrun: not found"], 127).missing_command == "torchrun"
