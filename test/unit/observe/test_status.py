"""The TrainJob -> AppState table (status.py's docstring), row by row."""

import pytest
from torchx.specs import AppState

from nemo_kubeflow.observe.status import job_status


def tj(conditions=(), jobs=None, nodes=2, deleting=False, suspend=None, queue=""):
    job = {
        "metadata": {"name": "j", "labels": {"kueue.x-k8s.io/queue-name": queue} if queue else {}},
        "spec": {"trainer": {"numNodes": nodes}},
        "status": {"conditions": list(conditions)},
    }
    if suspend is not None:
        job["spec"]["suspend"] = suspend
    if jobs is not None:
        job["status"]["jobsStatus"] = [{"name": "node", **jobs}]
    if deleting:
        job["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return job


def cond(ctype, reason="", message="", status="True"):
    return {"type": ctype, "status": status, "reason": reason, "message": message}


@pytest.mark.parametrize(
    "job, state, text",
    [
        (None, AppState.CANCELLED, "no longer exists"),
        (tj([cond("Complete", "JobSetCompleted", "done")]), AppState.SUCCEEDED, "done"),
        (tj([cond("Failed", "JobSetFailed", "pod j-node-0-1 exited with code 7")]), AppState.FAILED, "code 7"),
        (tj([cond("Failed", "DeadlineExceeded", "active deadline")]), AppState.FAILED, "DeadlineExceeded"),
        (tj(deleting=True), AppState.CANCELLED, "being deleted"),
        (
            tj([cond("Suspended", "Suspended", "queued")], suspend=True),
            AppState.PENDING,
            "suspended (Suspended: queued)",
        ),
        # Resumed (Kueue admitted it, or a submission resumed it) before Trainer turned its condition: not suspended.
        (
            tj([cond("Suspended", "Suspended", "queued")], suspend=False, queue="q"),
            AppState.PENDING,
            "admitted by queue q, starting (the TrainJob still says Suspended: queued)",
        ),
        (tj([cond("Suspended", "Suspended", "s")]), AppState.PENDING, "resumed, starting (the TrainJob still says"),
        # jobsStatus counts Jobs (one Job of N pods here), not pods.
        (tj([cond("Suspended", "Resumed", status="False")], jobs={"active": 1, "ready": 1}), AppState.RUNNING, ""),
        (tj(jobs={"active": 1, "ready": 0}), AppState.PENDING, "waiting for all 2 nodes to be ready"),
        # A pod failed mid gang-restart: no Failed condition yet, so not a failure.
        (tj(jobs={"active": 1, "ready": 1, "failed": 1}), AppState.RUNNING, ""),
        (tj(), AppState.SUBMITTED, "waiting for pods"),
    ],
)
def test_status_table(job, state, text):
    status = job_status(job, name="ns/j")
    assert status.state == state
    assert text in status.message


def pod(index, name, code=None, finished="2026-01-01T00:00:01Z", reason="Error"):
    cs = {"name": "node", "state": {"running": {}}}
    if code is not None:
        cs["state"] = {"terminated": {"exitCode": code, "reason": reason, "finishedAt": finished}}
    return {
        "metadata": {"name": name, "labels": {"batch.kubernetes.io/job-completion-index": str(index)}},
        "status": {"containerStatuses": [cs]},
    }


def test_failure_detail_names_the_first_failed_node():
    from nemo_kubeflow.observe.pod_states import failure_detail

    pods = [
        pod(0, "j-node-0-0-a", 137, "2026-01-01T00:00:05Z", "OOMKilled"),
        pod(1, "j-node-0-1-b", 3, "2026-01-01T00:00:02Z"),
        pod(2, "j-node-0-2-c"),
    ]
    assert failure_detail(pods) == "node 1 (pod j-node-0-1-b) exited with code 3"
    assert failure_detail(pods[:1]) == "node 0 (pod j-node-0-0-a) was killed by signal 9 (OOMKilled)"
    assert failure_detail([pod(0, "ok", 0)]) == ""


def test_of_nodes_that_ended_in_the_same_second_the_one_whose_pod_was_not_being_deleted_failed_first():
    # Node 2 exits 5; the Job fails and its controller deletes the running pods, whose SIGTERM ends node 0 in
    # the same second (finishedAt is to the second) before node 2 in the list.
    from nemo_kubeflow.observe.pod_states import failure_detail

    second = "2026-01-01T00:00:07Z"
    deleted = pod(0, "j-node-0-0-a", 143, second)
    deleted["metadata"]["deletionTimestamp"] = second
    cause = pod(2, "j-node-0-2-c", 5, second)
    assert failure_detail([deleted, cause]) == "node 2 (pod j-node-0-2-c) exited with code 5"
    # Ended a second before its pod was deleted: its own end, the first.
    early = pod(0, "j-node-0-0-a", 143, "2026-01-01T00:00:06Z")
    early["metadata"]["deletionTimestamp"] = second
    assert failure_detail([cause, early]) == "node 0 (pod j-node-0-0-a) was killed by signal 15"


def test_initializer_progress():
    from nemo_kubeflow.observe.pod_states import initializer_progress

    def p(step, phase):
        return {"metadata": {"labels": {"jobset.sigs.k8s.io/replicatedjob-name": step}}, "status": {"phase": phase}}

    assert (
        initializer_progress([p("model-initializer", "Pending"), p("dataset-initializer", "Running")])
        == "initializing: dataset-initializer Running, model-initializer Pending"
    )
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
    from nemo_kubeflow.observe.rank_failure import read_rank_failure

    why = read_rank_failure(ROOT_CAUSE_WITH_RECORD.splitlines(), 1)
    assert (why.rank, why.local_rank, why.exitcode) == (5, 1, 1)
    assert why.headline(2) == "rank 5 on node 2: ValueError: loss is nan at step 12"
    assert why.traceback[-1] == "ValueError: loss is nan at step 12"


def test_rank_failure_picks_the_root_cause_rank_among_prefixed_tracebacks():
    from nemo_kubeflow.observe.rank_failure import read_rank_failure

    log = [
        "[rank0]:Traceback (most recent call last):",
        '[rank0]:  File "t.py", line 3, in <module>',
        "[rank0]:KeyError: 'another rank, later'",
        "[rank1]:Traceback (most recent call last):",
        '[rank1]:  File "t.py", line 5, in <module>',
        "[rank1]:    raise RuntimeError('x')",
        "[rank1]:RuntimeError: the real one",
        "Root Cause (first observed failure):",
        "[0]:",
        "  rank      : 1 (local_rank: 1)",
        "  exitcode  : 1 (pid: 7)",
        "  error_file: <N/A>",
        "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
        "============================================================",
    ]
    assert read_rank_failure(log, 1).headline(0) == "rank 1 on node 0: RuntimeError: the real one"


def test_rank_failure_without_torchrun_and_without_a_traceback():
    from nemo_kubeflow.observe.rank_failure import read_rank_failure

    plain = [
        "step 1",
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in <module>',
        "ZeroDivisionError: division by zero",
    ]
    assert read_rank_failure(plain, 1).headline(3) == "node 3: ZeroDivisionError: division by zero"
    assert read_rank_failure(["just output"], 2).headline(0) == ""
    assert read_rank_failure(["sh: 1: exec: torchrun: not found"], 127).missing_command == "torchrun"


# --- restarts: how many, of which kind, why (restarts.Restarts) ------------------------------------------


def node_pod(index, attempt, *, code=None, conditions=(), reason="", restarts=0, job_uid=""):
    """A `node` pod as the API returns it, of gang attempt `attempt` (owned by the Job of uid `job_uid`)."""
    cs = {"name": "node", "restartCount": restarts, "state": {"running": {}}}
    if code is not None:
        cs["state"] = {"terminated": {"exitCode": code, "reason": "Error", "finishedAt": "2026-01-01T00:00:02Z"}}
    status = {"containerStatuses": [cs], "conditions": list(conditions)}
    if reason:
        status.update(phase="Failed", reason=reason, message="The node was low on resource: memory.")
    owners = [{"kind": "Job", "name": "j-node-0", "uid": job_uid, "controller": True}] if job_uid else []
    return {
        "metadata": {
            "name": f"j-node-0-{index}-{attempt}x",
            "creationTimestamp": f"2026-01-01T00:0{attempt}:00Z",
            "labels": {
                "batch.kubernetes.io/job-completion-index": str(index),
                "jobset.sigs.k8s.io/replicatedjob-name": "node",
                "jobset.sigs.k8s.io/restart-attempt": str(attempt),
            },
            "ownerReferences": owners,
        },
        "status": status,
    }


def event(kind, name, reason, message, count=1, type_="Warning", uid="", at="2026-01-01T00:00:03Z"):
    return {
        "type": type_,
        "reason": reason,
        "message": message,
        "count": count,
        "involvedObject": {"kind": kind, "name": name, "uid": uid},
        "lastTimestamp": at,
    }


def fail_job_event(pod, code, uid, at, rule=2):
    """The Job controller's Warning event for a Job that a FailJob rule of its podFailurePolicy ended."""
    return event(
        "Job",
        "j-node-0",
        "PodFailurePolicy",
        f"Container node for pod ns/{pod} failed with exit code {code} matching FailJob rule at index {rule}",
        uid=uid,
        at=at,
    )


def view(pods, events=()):
    from nemo_kubeflow.observe.job_view import JobView

    return JobView(
        cluster=None, trainjob={"metadata": {"name": "j", "namespace": "ns"}}, pods=list(pods), _events=list(events)
    )


def test_how_a_node_pod_ended_names_disruptions_before_exit_codes():
    from nemo_kubeflow.observe.pod_states import pod_end

    disrupted = node_pod(
        0,
        0,
        code=137,
        conditions=[
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": "DeletionByTaintManager",
                "message": "Taint manager: deleting due to NoExecute taint",
            }
        ],
    )
    assert pod_end(disrupted) == (
        "was disrupted (DisruptionTarget, DeletionByTaintManager: Taint manager: deleting due to NoExecute taint)"
    )
    assert pod_end(node_pod(0, 0, reason="Evicted")) == "was evicted (The node was low on resource: memory.)"
    assert pod_end(node_pod(1, 0, code=3)) == "exited with code 3"
    assert pod_end(node_pod(1, 0)) == ""


def with_phase(pod, phase, deleting=False):
    pod["status"]["phase"] = phase
    if deleting:
        pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:01:01Z"
    return pod


def test_the_nodes_of_the_newest_gang_attempt_still_pending_are_counted_as_starting():
    # Just after a gang restart the TrainJob still mirrors the previous attempt's ready Job; the pods tell.
    pods = [
        with_phase(node_pod(0, 0, code=3), "Failed"),
        with_phase(node_pod(1, 0), "Pending", deleting=True),
        with_phase(node_pod(0, 1), "Pending"),
        with_phase(node_pod(1, 1), "Running"),
        with_phase(node_pod(2, 1), "Pending", deleting=True),
    ]
    assert view(pods).gang_restarts() == 1 and view(pods).nodes_starting() == 1
    assert view(pods[:2] + [with_phase(node_pod(0, 1), "Running")]).nodes_starting() == 0


def test_a_jobset_that_says_it_restarts_is_restarting_before_the_new_attempts_pods_exist():
    # JobSet v0.12 sets RestartingJobSet True at the restart, before it creates the new attempt's Jobs: the
    # pods not running are the previous attempt's, being deleted, and none of the new one is there to count.
    from nemo_kubeflow.observe.job_view import JobView

    def with_jobset(pods, restarting, restarts=1):
        condition = {"type": "RestartingJobSet", "status": restarting, "reason": "DefaultFailurePolicy"}
        jobset = {"metadata": {"name": "j"}, "status": {"restarts": restarts, "conditions": [condition]}}
        return JobView(
            cluster=None, trainjob={"metadata": {"name": "j", "namespace": "ns"}}, pods=list(pods), jobset=jobset
        )

    old_attempt = [with_phase(node_pod(0, 0, code=3), "Failed"), with_phase(node_pod(1, 0), "Running", deleting=True)]
    restarting = with_jobset(old_attempt, "True")
    assert restarting.restarting() and restarting.nodes_starting() == 0 and restarting.gang_restarts() == 1
    # Every Job of the new attempt ready: JobSet sets it False (reason JobsReady), and the running look stands.
    assert not with_jobset([], "False").restarting()
    # A JobSet older than v0.12 sets no such condition: the new attempt's pending pods still tell.
    older = JobView(
        cluster=None,
        trainjob={"metadata": {"name": "j", "namespace": "ns"}},
        pods=[with_phase(node_pod(0, 1), "Pending")],
        jobset={"status": {"restarts": 1}},
    )
    assert older.restarting() and older.nodes_starting() == 1
    assert not view([with_phase(node_pod(0, 0), "Running")]).restarting()


def test_gang_restarts_while_running_say_why_each_happened():
    # Attempt 0 ended on an exit code this process saw; attempt 1's pods went before anyone looked:
    # the events still say a pod was evicted, and the Job failed (the last failed Job is attempt 1's).
    events = [
        event("Pod", "j-node-0-1-1x", "Evicted", "The node was low on resource: memory."),
        event("Job", "j-node-0", "BackoffLimitExceeded", "Job has reached the specified backoff limit", 2),
        event("Job", "other-node-0", "BackoffLimitExceeded", "not this job's"),
    ]
    restarts = view([node_pod(0, 2), node_pod(1, 2)], events).restarts(seen={0: "node 1 (pod p) exited with code 3"})
    assert restarts.gang == 2
    assert restarts.note(finished=False) == (
        "2 gang restarts so far (attempt 0: node 1 (pod p) exited with code 3, attempt 1: a pod of Job j-node-0 "
        "failed (BackoffLimitExceeded), events: pod j-node-0-1-1x evicted: The node was low on resource: memory.)"
    )
    # Seen for every attempt: the events are not needed.
    assert view([node_pod(0, 1)], events).restarts(seen={0: "node 0 (pod q) was evicted (x)"}).gang_causes == (
        "attempt 0: node 0 (pod q) was evicted (x)",
    )


def test_each_gang_restart_gets_its_exit_code_from_the_failed_jobs_event_after_its_pods_are_gone():
    # JobSet recreates the `node` Job under the same name at each restart: one failure event per Job uid, in
    # time order, is one attempt. Attempt 0 ended on exit code 3 (the catch-all FailJob rule), attempt 1 on an
    # eviction (counted against backoffLimit: no code kept), attempt 2 runs (its Job's uid is the pods' owner).
    events = [
        fail_job_event("j-node-0-1-ab1cd", 3, "u0", "2026-01-01T00:00:05Z"),
        event("Pod", "j-node-0-0-zz9yx", "Evicted", "The node was low on resource: memory.", at="2026-01-01T00:01:05Z"),
        event(
            "Job",
            "j-node-0",
            "BackoffLimitExceeded",
            "Job has reached the specified backoff limit",
            uid="u1",
            at="2026-01-01T00:01:06Z",
        ),
        fail_job_event("other-node-0-1-ab1cd", 3, "o0", "2026-01-01T00:00:05Z")
        | {"involvedObject": {"kind": "Job", "name": "other-node-0", "uid": "o0"}},
    ]
    running = [node_pod(0, 2, job_uid="u2"), node_pod(1, 2, job_uid="u2")]
    assert view(running, events).restarts().note(finished=False) == (
        "2 gang restarts so far (attempt 0: node 1 (pod j-node-0-1-ab1cd) exited with code 3, attempt 1: a pod of "
        "Job j-node-0 failed (BackoffLimitExceeded), events: pod j-node-0-0-zz9yx evicted: The node was low on "
        "resource: memory.)"
    )
    # A failed job: the last attempt's own failure (its Job is the pods' owner) is not a restart's cause;
    # a signal (128 + 9) reads as one; every attempt explained by an exit code needs no other event.
    failed = [node_pod(0, 1, code=137, job_uid="u1"), node_pod(1, 1, job_uid="u1")]
    events = [
        fail_job_event("j-node-0-0-ab1cd", 137, "u0", "2026-01-01T00:00:05Z"),
        fail_job_event("j-node-0-0-ef2gh", 137, "u1", "2026-01-01T00:01:05Z"),
    ]
    assert view(failed, events).restarts().note(finished=True) == (
        "after 1 gang restart (attempt 0: node 0 (pod j-node-0-0-ab1cd) was killed by signal 9)"
    )
    # Events older than the JobSet (an earlier move off a bad node) come first and are left out.
    older = [fail_job_event("j-node-0-1-old00", 2, "x0", "2025-12-31T23:00:00Z")]
    assert view(failed, older + events).restarts().gang_causes == (
        "attempt 0: node 0 (pod j-node-0-0-ab1cd) was killed by signal 9",
    )


def test_restart_notes_by_kind():
    from nemo_kubeflow.observe.restarts import InJobRestarts, Restarts

    assert Restarts().note(finished=False) == ""  # a running job that never restarted: nothing to say
    assert Restarts().note(finished=True) == "no gang restart"
    assert Restarts(failed_fast=True).note(finished=True) == (
        "no gang restart: its exit code is in fail_fast_exit_codes (a user error), so the job failed at once "
        "without using retries"
    )
    assert Restarts(gang=1).note(finished=True) == "after 1 gang restart"
    assert view([node_pod(0, 0, restarts=2)]).restarts(in_job=InJobRestarts(3, "local rank 0 killed by signal 9")).note(
        finished=False
    ) == (
        "3 in-job restarts by ft_launcher (no pod recreated, the last as local rank 0 "
        "killed by signal 9); 2 container restarts in place by the kubelet"
    )


# What ft_launcher's agents log (nvidia-resiliency-ext 0.4.1's launcher and torchelastic's formats): node 1's
# worker was SIGKILLed twice; node 0's agent restarted its healthy worker each time with the group.
FT_NODE_1 = """\
[default0]:rank 1 step 3
E1124 01:50:01.000000 812 site-packages/torch/distributed/elastic/multiprocessing/api.py:882] failed (exitcode: -9) local_rank: 0 (pid: 901) of binary: /usr/bin/python
I1124 01:50:01.100000 812 site-packages/nvidia_resiliency_ext/fault_tolerance/launcher.py:318] [default] Worker group FAILED. 2/2 attempts left; will restart worker group
[default0]:rank 1 step 4
E1124 01:50:09.000000 812 site-packages/torch/distributed/elastic/multiprocessing/api.py:882] failed (exitcode: -9) local_rank: 0 (pid: 950) of binary: /usr/bin/python
I1124 01:50:09.100000 812 site-packages/nvidia_resiliency_ext/fault_tolerance/launcher.py:318] [default] Worker group FAILED. 1/2 attempts left; will restart worker group
""".splitlines()
FT_NODE_0 = """\
I1124 01:50:01.200000 700 launcher.py:340] [default] Detected 1 new nodes from group_rank=0; will restart worker group
I1124 01:50:09.200000 700 launcher.py:443] 1/2 restart attempts left; restarting worker group...
""".splitlines()


def test_in_job_restarts_are_read_from_ft_launchers_log():
    from nemo_kubeflow.observe.restarts import InJobRestarts, read_in_job_restarts

    assert read_in_job_restarts(FT_NODE_1) == InJobRestarts(2, "local rank 0 killed by signal 9")
    assert read_in_job_restarts(FT_NODE_0) == InJobRestarts(2, "")
    assert read_in_job_restarts(["[default0]:rank 0 step 1"]) == InJobRestarts(0, "")
    # Last lines without the restart's own line: the rendezvous round the agent joined still counts it.
    assert read_in_job_restarts(FT_ROUNDS[:2]) == InJobRestarts(0, "")
    assert read_in_job_restarts(FT_ROUNDS) == InJobRestarts(1, "")
    assert read_in_job_restarts(FT_NODE_0 + FT_ROUNDS) == InJobRestarts(2, "")


def test_of_the_nodes_in_job_restarts_a_rank_killed_by_a_signal_says_why_before_a_peer_that_exited():
    from nemo_kubeflow.observe.restarts import InJobRestarts, most_telling

    # Rank 1 got SIGKILL; rank 0's all-reduce then failed and its worker exited 1 before its agent stopped it.
    peer, killed = (
        InJobRestarts(1, "local rank 0 exited with code 1"),
        InJobRestarts(1, "local rank 0 killed by signal 9"),
    )
    assert most_telling([peer, killed]) == most_telling([killed, peer]) == killed
    assert most_telling([InJobRestarts(2, ""), killed]) == InJobRestarts(2, "")  # more restarts seen first
    assert most_telling([InJobRestarts(1, ""), peer]) == peer
    assert most_telling([]) is None


# ft_launcher's c10d rendezvous as node 0's agent logged it (nvidia-resiliency-ext 0.4.1), before and after
# one restart of the worker group (the rendezvous id is the TrainJob's name and the gang attempt).
FT_ROUNDS = """[2026-11-24 04:52:51,794] [INFO] [ft_launcher22499@vm] The node 'localhost_22499_0' attempts to join the next round of the rendezvous 'ft-inj-1795495964459033345-train-fb68c0-0'.
[2026-11-24 04:52:52,011] [INFO] [ft_launcher22499@vm] The node 'localhost_22499_0' has joined round 0 of the rendezvous 'ft-inj-1795495964459033345-train-fb68c0-0' as rank 0 in a world of size 2.
[default0]:rank 0 step 9
[2026-11-24 04:53:09,229] [INFO] [ft_launcher22499@vm] The node 'localhost_22499_0' attempts to join the next round of the rendezvous 'ft-inj-1795495964459033345-train-fb68c0-0'.
[2026-11-24 04:53:10,460] [INFO] [ft_launcher22499@vm] The node 'localhost_22499_0' has joined round 1 of the rendezvous 'ft-inj-1795495964459033345-train-fb68c0-0' as rank 0 in a world of size 2.
[default0]:rank 0 step 10
""".splitlines()


# ft_launcher's log when rank 1 raised (nvidia-resiliency-ext 0.4.1 on CPU): its GPU health check logs an NVML
# traceback first (not the cause), and it ends with a ProcessFailure line instead of torchrun's root-cause report.
FT_FAILED_LOG = """\
[2026-11-24 02:23:42,830] [ERROR] [ft_launcher27156@vm] NVML Error: NVML Shared Library Not Found
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/pynvml.py", line 3190, in _LoadNvmlLibrary
    nvmlLib = CDLL("libnvidia-ml.so.1")
OSError: libnvidia-ml.so.1: cannot open shared object file: No such file or directory
[rank1]:Traceback (most recent call last):
[rank1]:  File "/nemo_run/code/workloads.py", line 68, in raise_on_rank
[rank1]:    raise RuntimeError(message)
[rank1]:RuntimeError: bad config
[2026-11-24 02:24:44,019] [ERROR] [ft_launcher27156@vm] failed (exitcode: 1) local_rank: 0 (pid: 30546) of binary: /venv/bin/python3
[2026-11-24 02:24:44,531] [ERROR] [ft_launcher27156@vm] Some rank(s) exited with non-zero exit code: {1: ProcessFailure(local_rank=0, pid=30546, exitcode=1, error_file='<N/A>', error_file_data={'message': '<NONE>'}, message='To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html', timestamp=1795487084)}. Agent's exit code = 1
""".splitlines()


def test_ft_launchers_failed_rank_is_read_past_its_nvml_check():
    from nemo_kubeflow.observe.rank_failure import read_rank_failure

    why = read_rank_failure(FT_FAILED_LOG, 1)
    assert (why.rank, why.local_rank, why.exitcode) == (1, 0, 1)
    assert why.headline(1) == "rank 1 on node 1: RuntimeError: bad config"
    # A peer's log, with only the health check's traceback: nothing to say, rather than the NVML error.
    assert read_rank_failure(FT_FAILED_LOG[:5], 1).headline(0) == ""


def test_a_node_failed_beside_nodes_being_stopped_reads_as_failing_until_the_job_controller_fails_the_job():
    # The Job's Failed condition waits until every pod ended (Kubernetes 1.31 on); meanwhile the TrainJob counts
    # no node active or ready, and the pods tell: node 1 failed on its own, node 0's pod is being deleted.
    from nemo_kubeflow.observe.job_view import why_waiting

    failed, stopping = (
        with_phase(node_pod(1, 0, code=3), "Failed"),
        with_phase(node_pod(0, 0), "Running", deleting=True),
    )
    failing = view([failed, stopping])
    assert (
        failing.failing().detail() == "node 1 (pod j-node-0-1-0x) exited with code 3" and failing.nodes_stopping() == 1
    )
    verdict = why_waiting(failing, 2, AppState.SUBMITTED)
    assert (verdict.state, verdict.message) == (
        AppState.RUNNING,
        (
            "failing: node 1 (pod j-node-0-1-0x) exited with code 3; the Job controller stops its other nodes (1 of 2 "
            "still stopping), then JobSet restarts the gang or fails the job"
        ),
    )
    # Stopped, not gone yet: still failing, until the Job controller adds Failed.
    ended = with_phase(node_pod(0, 0, code=143), "Failed", deleting=True)
    assert why_waiting(view([failed, ended]), 2, AppState.SUBMITTED).message.startswith(
        "failing: node 1 (pod j-node-0-1-0x) exited with code 3; its other nodes stopped, then"
    )
    # A failed pod that the Job replaces (an admin runtime's backoffLimit) deletes no other: not failing.
    assert view([failed, with_phase(node_pod(0, 0), "Running")]).failing() is None
    # The previous attempt's pods, deleted by a gang restart, are not this attempt's failure.
    assert view([failed, stopping, with_phase(node_pod(0, 1), "Pending")]).failing() is None


def test_a_queued_workloads_place_is_told_from_kueues_pending_workloads():
    from nemo_kubeflow.observe.status import queue_place

    pending = [{"metadata": {"name": f"w{i}"}, "positionInLocalQueue": i} for i in range(12)]
    assert queue_place("q", pending, {"metadata": {"name": "w0"}}) == " (1st of 12 in LocalQueue q)"
    assert queue_place("q", pending, {"metadata": {"name": "w11"}}) == " (12th of 12 in LocalQueue q)"
    assert queue_place("q", pending, {"metadata": {"name": "w2"}}) == " (3rd of 12 in LocalQueue q)"
    assert queue_place("q", pending, {"metadata": {"name": "admitted"}}) == ""  # not among them: no place
    page = [{"metadata": {"name": f"w{i}"}, "positionInLocalQueue": i} for i in range(1000)]
    assert queue_place("q", page, {"metadata": {"name": "w21"}}) == " (22nd of 1000 or more in LocalQueue q)"
