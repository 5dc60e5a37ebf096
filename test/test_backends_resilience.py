"""Issue 15's resilience scenarios on both back ends (the `backend` fixture of conftest.py): a killed rank
recovered in-job, a user error failing at once, a node fault avoided by the next attempt, a Kueue
preemption resumed from its SIGTERM checkpoint, the stall warning. `local` runs by default; the `real`
params (the upstream kube-controller-manager, Trainer, JobSet and Kueue with our node agent running the
pods) run with `python -m pytest -q -m real test/test_backends_resilience.py` (docs/real-control-plane.md).
test_resilience.py has the finer checks of each mechanism, on the local cluster only."""

import json
import os
import signal
from pathlib import Path

import nemo_run as run
import polling
import pytest
import workloads
from backends import app_id_of, trainjob_of, wait_for
from torchx.specs import AppState

from nemo_kubeflow import ConfigMapPackager
from nemo_kubeflow import constants as C
from nemo_kubeflow.nemo_run.scheduler import create_scheduler
from nemo_kubeflow.repair.node_avoidance import PATCH_MANAGER

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "kubeflow"


def condition(obj: dict, type_: str) -> dict:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == type_), {})


def running_pods(backend, trainjob: str, count: int = 2):
    """The TrainJob's `count` running pods (none being deleted), or None."""
    pods = [
        p
        for p in backend.objects("pods", trainjob)
        if (p.get("status") or {}).get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    ]
    return pods if len(pods) == count else None


# ---------------------------------------------------------------- (1) a killed rank, recovered in the job


@pytest.mark.needs_torch
def test_a_killed_rank_is_restarted_by_ft_launcher_inside_the_same_pods(backend, tmp_path):
    pytest.importorskip(
        "nvidia_resiliency_ext",
        reason="ft_launcher: pip install --no-deps nvidia-resiliency-ext (docs/resilience.md lists its dependencies)",
    )
    executor = backend.executor(
        launcher=run.FaultTolerance(max_restarts=2, initial_rank_heartbeat_timeout=120, rank_heartbeat_timeout=60)
    )

    def pid_files():  # the ranks' pid files, oldest first (the pods run on this machine, as processes)
        return sorted(tmp_path.glob("rank*.pid"), key=lambda p: p.stat().st_mtime_ns)

    with run.Experiment("be-ft", executor=executor, log_level="WARN") as exp:
        exp.add(run.Partial(workloads.fault_tolerant_steps, steps=60, pid_dir=str(tmp_path)), name="train")
        exp.run(sequential=True)
        job = exp.jobs[0]
        first = wait_for(lambda: len(pid_files()) == 2 and pid_files(), "both ranks to start", timeout=180)
        # The waiting process keeps each node's log from its second describe on: it counts ft_launcher's restarts.
        watcher = create_scheduler("watch")
        assert [watcher.describe(app_id_of(job)).msg for _ in range(2)] == ["", ""]  # running, no restart yet
        pods_before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in backend.objects("pods", trainjob_of(job))}
        assert len(pods_before) == 2, pods_before
        victim = int(first[1].read_text())
        # Its pod's node (the rendezvous, not the node, decides a rank): PET_NODE_RANK, as Trainer set it.
        environ = dict(e.split("=", 1) for e in Path(f"/proc/{victim}/environ").read_text().split("\0") if "=" in e)
        node = int(environ["PET_NODE_RANK"])
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: len(pid_files()) == 4, "every rank to start again", timeout=180)
        restarted = wait_for(
            lambda: (
                (d := watcher.describe(app_id_of(job))).state == AppState.RUNNING and "in-job restart" in d.msg and d
            ),
            "status to count the in-job restart",
        )
    assert restarted.msg == (
        "1 in-job restart by ft_launcher (no pod recreated, the last as local rank 0 on node "
        f"{node} killed by signal 9)"
    ), restarted.msg
    core = backend.core()
    lines = "".join(core.read_namespaced_pod_log(name, backend.namespace) for name in pods_before)
    assert exp.status(return_dict=True)[job.id]["status"] == AppState.SUCCEEDED, lines
    pods = backend.objects("pods", trainjob_of(job))
    # The same pods, never restarted: the ranks came back inside them.
    assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods} == pods_before
    assert all(s["restartCount"] == 0 for p in pods for s in p["status"]["containerStatuses"]), pods
    assert sorted(line.rsplit(":", 1)[-1] for line in lines.splitlines() if "finished 60 steps" in line) == [
        f"rank {r} finished 60 steps" for r in range(2)
    ], lines
    assert "Worker group FAILED. 2/2 attempts left; will restart worker group" in lines
    (jobset,) = backend.objects("jobsets", trainjob_of(job))
    assert not jobset["status"].get("restarts"), jobset["status"]  # no gang restart either


# ---------------------------------------------------------------- (2) a user error fails at once


def test_a_user_error_fails_at_once_with_its_exit_code_and_no_gang_restart(backend):
    with run.Experiment("be-usererr", executor=backend.executor(retries=2), log_level="WARN") as exp:
        exp.add(run.Script(inline='echo "bad config on $PET_NODE_RANK"; exit 1'), name="t")
        exp.run(sequential=True)
        job = exp.jobs[0]
    assert exp.status(return_dict=True)[job.id]["status"] == AppState.FAILED
    desc = create_scheduler("t").describe(app_id_of(job))
    assert desc.state == AppState.FAILED
    assert (
        "exited with code 1" in desc.msg
        and "no gang restart: its exit code is in fail_fast_exit_codes (a user "
        "error), so the job failed at once without using retries"
        in desc.msg
    ), desc.msg
    name = trainjob_of(job)
    # The Job's podFailurePolicy rule failed the Job (FailJob), the JobSet's failurePolicy rule the JobSet
    # (FailJobSet): retries=2, none used.
    (node_job,) = [j for j in backend.objects("jobs", name) if j["metadata"]["name"] == f"{name}-node-0"]
    assert condition(node_job, "Failed")["reason"] == "PodFailurePolicy", node_job["status"]
    (jobset,) = backend.objects("jobsets", name)
    assert jobset["status"].get("restarts", 0) == 0 and jobset["status"].get("terminalState") == "Failed", jobset[
        "status"
    ]
    assert condition(jobset, "Failed")["reason"] == "FailJobSetFailurePolicyAction", jobset["status"]
    (trainjob,) = backend.objects("trainjobs", name)
    assert condition(trainjob, "Failed")["reason"] == "FailJobSetFailurePolicyAction", trainjob["status"]


# ---------------------------------------------------------------- (3) a node fault: the next attempt avoids it


@pytest.mark.backend_nodes(3)
def test_a_node_fault_restarts_the_gang_and_the_next_attempt_avoids_the_node(backend, tmp_path):
    marker = tmp_path / "done"  # the pods run on this machine: a file tells them to finish
    script = (
        f'echo "up on $PET_NODE_RANK"; for i in $(seq 1 900); do [ -e {marker} ] && exit 0; sleep 0.2; done; exit 5'
    )
    scheduler = create_scheduler("t")
    with run.Experiment("be-badnode", executor=backend.executor(retries=2), log_level="WARN") as exp:
        exp.add(run.Script(inline=script), name="train")
        exp.run(sequential=True)
        job = exp.jobs[0]
        name = trainjob_of(job)

        last = {}

        def moved():  # what a waiting run does every few seconds: a look, then the repair step (moves the job)
            last["message"] = message = scheduler.look_after(app_id_of(job))[0].msg
            last["pods"] = pods = running_pods(backend, name)
            return (
                "avoiding node" in message
                and "suspended" not in message
                and pods
                and all(p["spec"]["nodeName"] != lost for p in pods)
                and (message, pods)
            )

        def seen():
            return f"the last look said {last.get('message')!r}; running pods on " + str(
                [p["spec"].get("nodeName") for p in last.get("pods") or ()]
            )

        try:
            first = wait_for(lambda: running_pods(backend, name), "both pods to run", timeout=100)
            lost = next(
                p["spec"]["nodeName"] for p in first if p["metadata"]["labels"][C.COMPLETION_INDEX_LABEL] == "0"
            )
            (before_move,) = backend.objects("jobsets", name)
            backend.fail_node(lost)
            # Both waits end within the test's timeout (300 s), so that a miss reads as itself.
            message, pods = polling.wait_for(
                moved, "the job to be moved off the failed node", timeout=150, interval=0.3, detail=seen
            )
        except BaseException:
            # The experiment's exit waits for the job: one left suspended or mid-move would keep it waiting.
            scheduler.cancel(app_id_of(job))
            raise
        finally:
            marker.write_text("")  # the job ends, whatever happened
    assert exp.status(return_dict=True)[job.id]["status"] == AppState.SUCCEEDED
    assert f"avoiding node {lost} after its pod {name}-node-0-0-" in message, message
    # Which trace names the fault depends on what the first look found: the failed pod itself (its
    # DisruptionTarget condition), or only the events of a pod already deleted (the local cluster's lost node
    # records NodeNotReady first; the real taint-eviction controller TaintManagerEviction).
    assert (
        "failed with DisruptionTarget (DeletionByTaintManager" in message
        or f"failed with TaintManagerEviction (Marking for deletion Pod {backend.namespace}/{name}-node-0-0-" in message
        or "failed with NodeNotReady (Node is not ready)" in message
    ), message
    assert "1 gang restart before the move" in message, message
    # Trainer's webhook took the runtime patch, and Trainer built the new JobSet with it: its pods carry the term.
    for pod in pods:
        terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ]
        assert [e for t in terms for e in t["matchExpressions"]] == [
            {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": [lost]}
        ], terms
    (trainjob,) = backend.objects("trainjobs", name)
    assert [p["manager"] for p in trainjob["spec"]["runtimePatches"]][-1] == PATCH_MANAGER
    assert trainjob["spec"].get("suspend") in (False, None), trainjob["spec"]
    (jobset,) = backend.objects("jobsets", name)
    assert_rebuilt_without_restarts(backend, name, before_move, jobset)


def assert_rebuilt_without_restarts(backend, trainjob: str, before_move: dict, jobset: dict) -> None:
    """The JobSet after the move is a new one (the product deleted the old one and Trainer built it again) whose
    restart count started again and stayed 0 (the test's pods ran once and completed); each failure says which
    JobSet it read (by uid) and what it holds."""
    old_uid, uid, status = before_move["metadata"]["uid"], jobset["metadata"]["uid"], jobset.get("status") or {}
    assert uid != old_uid, (
        f"the product: JobSet {uid} is the one that ran before the node fault, not a new one: the move did not "
        "delete it, or Trainer built it again under its old uid and restart count (the local cluster's Trainer did, "
        f"under load, before its fix); restarts {status.get('restarts', 0)}, status {status}"
    )
    warnings = [
        f"{e['involvedObject']['kind']} {e['involvedObject']['name']}: {e.get('reason')}: {e.get('message')}"
        for e in backend.objects("events")
        if e.get("type") == "Warning" and e["involvedObject"]["name"].startswith(trainjob)
    ]
    assert status.get("restarts", 0) == 0 and status.get("terminalState") == "Completed", (
        f"JobSet {uid} (built by the move; the one before it: {old_uid}) restarted {status.get('restarts', 0)} "
        f"time(s) after the move, RestartingJobSet {condition(jobset, 'RestartingJobSet')}, terminalState "
        f"{status.get('terminalState')}; the job's Warning events: {warnings}"
    )


# ---------------------------------------------------------------- (4) a Kueue preemption, resumed from a checkpoint


@pytest.mark.needs_torch
def test_a_kueue_preempted_job_resumes_from_its_sigterm_checkpoint(backend, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    import preemptible_training

    custom = backend.custom_objects()
    low_priority = backend.provide_priority_class("low", 10)
    high_priority = backend.provide_priority_class("high", 1000)
    cluster_queue = backend.provide_cluster_queue(cpu="1", memory="4Gi", preempt_lower_priority=True)
    custom.create_namespaced_custom_object(
        "kueue.x-k8s.io",
        backend.kueue_version(),
        backend.namespace,
        "localqueues",
        {
            "apiVersion": f"kueue.x-k8s.io/{backend.kueue_version()}",
            "kind": "LocalQueue",
            "metadata": {"name": "be-one"},
            "spec": {"clusterQueue": cluster_queue},
        },
    )
    checkpoints = tmp_path / "checkpoints"  # the pods run on this machine: a directory stands in for a claim
    events_file = checkpoints / "events.jsonl"

    def events():
        return [json.loads(line) for line in events_file.read_text().splitlines()] if events_file.exists() else []

    queued = dict(nodes=1, queue_name="be-one", cpu_request="1", memory_request="1Gi")
    low = backend.executor(
        **queued,
        workload_priority_class=low_priority,
        termination_grace_period_seconds=20,
        packager=ConfigMapPackager(relative_path="examples/kubeflow", include_pattern="preemptible_training.py"),
    )
    # 150 steps of 0.1 s: the high job is submitted after 30, well before the low one could end.
    task = run.Partial(
        preemptible_training.train, steps=150, step_seconds=0.1, checkpoint_every=25, checkpoint_dir=str(checkpoints)
    )
    scheduler = create_scheduler("t")
    with run.Experiment("be-low", executor=low, log_level="WARN") as low_exp:
        low_exp.add(task, name="train")
        low_exp.run(detach=True)
    low_id = app_id_of(low_exp.jobs[0])
    wait_for(lambda: sum("step" in e for e in events()) >= 30, "30 steps of the low-priority job", timeout=180)
    high = backend.executor(**queued, workload_priority_class=high_priority)
    with run.Experiment("be-high", executor=high, log_level="WARN") as high_exp:
        high_exp.add(run.Script(inline='echo "the high-priority job runs"; sleep 2'), name="t")
        high_exp.run(detach=True)
    # Kueue evicts the low job (suspends its TrainJob): its pod gets SIGTERM and checkpoints.
    preempted = wait_for(
        lambda: (d := scheduler.describe(low_id)).msg.startswith("preempted") and d,
        "status to say the low job was preempted",
        timeout=120,
    )
    assert preempted.state == AppState.PENDING, (preempted.state, preempted.msg)  # not FAILED: it waits
    assert preempted.msg.startswith(
        "preempted, waiting for queue be-one to admit it again (Preempted: Preempted to accommodate a workload (UID: "
    ), preempted.msg
    assert preempted.msg.endswith(
        f"due to prioritization in the ClusterQueue; preemptor path: /{cluster_queue}; "
        f"preemptee path: /{cluster_queue})"
    ), preempted.msg
    stopped_at = wait_for(
        lambda: next((e["checkpoint"] for e in events() if e.get("why") == "SIGTERM"), None),
        "the checkpoint on SIGTERM",
        timeout=60,
    )
    high_id = app_id_of(high_exp.jobs[0])
    wait_for(lambda: scheduler.describe(high_id).state == AppState.SUCCEEDED, "the high job to run", timeout=180)
    # Its quota freed, Kueue admits the low job again: it resumes from the checkpoint and ends.
    wait_for(
        lambda: scheduler.describe(low_id).state in (AppState.SUCCEEDED, AppState.FAILED),
        "the low job to be admitted again and to finish",
        timeout=180,
    )
    log = events()
    assert scheduler.describe(low_id).state == AppState.SUCCEEDED, log
    steps = [e["step"] for e in log if "step" in e]
    # Every step ran exactly once: the second run started at the SIGTERM checkpoint.
    assert steps == list(range(1, 151)), steps
    assert 30 <= stopped_at < 150 and log[-1] == {"checkpoint": 150, "why": "done"}, log

    def finished_workload():
        (workload,) = [
            w
            for w in backend.objects("workloads")
            if w["metadata"]["name"].startswith(f"trainjob-{trainjob_of(low_exp.jobs[0])}-")
        ]
        return condition(workload, "Finished").get("status") == "True" and workload

    # Kueue marks the Workload Finished on its own reconcile, after the TrainJob ends: wait for it.
    workload = wait_for(finished_workload, "Kueue to mark the low job's Workload Finished", timeout=60)
    # Admitted again after the preemption, as Kueue records it.
    evicted = condition(workload, "Evicted")
    assert (evicted["status"], evicted["reason"]) == ("False", "QuotaReserved"), evicted
    assert evicted["message"].startswith("Previously: Preempted to accommodate a workload (UID: "), evicted


# ---------------------------------------------------------------- (5) the stall warning


def test_status_warns_of_a_running_node_that_went_silent(backend):
    executor = backend.executor(stall_warning_seconds=2)
    script = (
        'echo "step 0"; if [ "$PET_NODE_RANK" = 1 ]; then sleep 15; exit 0; fi\n'
        'for i in $(seq 1 50); do echo "step $i"; sleep 0.3; done'
    )
    with run.Experiment("be-stall", executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(inline=script), name="train")
        exp.run(detach=True)
    app_id = app_id_of(exp.jobs[0])
    scheduler = create_scheduler("t")
    desc = wait_for(
        lambda: (d := scheduler.describe(app_id)).msg.startswith("warning") and d,
        "status to warn of the silent node",
        timeout=90,
    )
    assert desc.state == AppState.RUNNING
    assert desc.msg.startswith("warning: node 1 printed nothing for the last 2 s while running"), desc.msg
    wait_for(lambda: scheduler.describe(app_id).state == AppState.SUCCEEDED, "the job to finish", timeout=90)
