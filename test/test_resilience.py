"""Resilience on the local cluster (real HTTP, real processes): in-job restarts with ft_launcher."""

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import nemo_run as run
import pytest
import workloads
from kubernetes import client
from polling import wait_for
from test_diagnosis import describe_cost
from test_e2e import app_id_of
from torchx.specs import AppState

from nemo_kubeflow import ConfigMapPackager, KubeflowExecutor
from nemo_kubeflow import constants as C
from nemo_kubeflow.nemo_run.scheduler import create_scheduler
from nemo_kubeflow.nemo_run.status_answers import ANSWER_REUSE_S
from nemo_kubeflow.observe.job_view import IN_JOB_TAIL

REPO = Path(__file__).resolve().parent.parent


def core_api(cluster) -> client.CoreV1Api:
    return client.CoreV1Api(client.ApiClient(cluster.configuration()))


def pid_files(directory):
    """The ranks' pid files, oldest first."""
    return sorted(directory.glob("rank*.pid"), key=lambda p: p.stat().st_mtime_ns)


def ft_executor(cluster, **fields) -> KubeflowExecutor:
    """2 nodes x 1 process running test/workloads.py under ft_launcher (``fields``: the launcher and more)."""
    pytest.importorskip(
        "nvidia_resiliency_ext",
        reason="ft_launcher: pip install --no-deps nvidia-resiliency-ext (docs/resilience.md lists its dependencies)",
    )
    return KubeflowExecutor(
        container_image="python:3.11",
        nodes=2,
        nprocs_per_node=1,
        kubeconfig=str(cluster.kubeconfig_path),
        shm_size=None,
        packager=ConfigMapPackager(relative_path="test", include_pattern="workloads.py"),
        **fields,
    )


@pytest.mark.needs_torch
def test_killed_rank_is_restarted_inside_the_running_pods(cluster, tmp_path):
    executor = ft_executor(
        cluster,
        launcher=run.FaultTolerance(max_restarts=2, initial_rank_heartbeat_timeout=120, rank_heartbeat_timeout=60),
    )
    task = run.Partial(workloads.fault_tolerant_steps, steps=60, pid_dir=str(tmp_path))
    core = core_api(cluster)
    with run.Experiment("ft-inj", executor=executor, log_level="WARN") as exp:
        exp.add(task, name="train")
        exp.run(sequential=True)
        first = wait_for(
            lambda: len(pid_files(tmp_path)) == 2 and pid_files(tmp_path), "both ranks to start", timeout=120
        )
        # A waiting process keeps each node's log from its second describe on: status counts ft_launcher's restarts.
        watcher, app_id = create_scheduler("watch"), app_id_of(exp.jobs[0].handle)
        assert [watcher.describe(app_id).msg for _ in range(2)] == ["", ""]  # running, no restart yet
        pods_before = {
            p.metadata.name: p.metadata.uid
            for p in core.list_namespaced_pod("default").items
            if p.metadata.labels.get("jobset.sigs.k8s.io/jobset-name", "").startswith("ft-inj")
        }
        assert len(pods_before) == 2
        killed_at = time.monotonic()
        os.kill(int(first[1].read_text()), signal.SIGKILL)
        try:
            wait_for(lambda: len(pid_files(tmp_path)) == 4, "both ranks to start again", timeout=120)
        except AssertionError:
            raise AssertionError("".join(core.read_namespaced_pod_log(n, "default") for n in pods_before)) from None
        recovery = time.monotonic() - killed_at
        restarted = wait_for(
            lambda: (d := watcher.describe(app_id)).state == AppState.RUNNING and "in-job restart" in d.msg and d,
            "status to count the in-job restart",
            timeout=60,
        )
        # Another process (`nemo experiment status`) follows no log: for an ft_launcher job it reads every node's
        # last lines, one request per node more than for any other running job (test_diagnosis: "list pods",
        # "get trainjobs"); the agents' restart lines and rendezvous rounds count the restart, and the killed
        # worker's node names the cause (not its peer's side-effect failure).
        fresh, requests = describe_cost(cluster, app_id)
        assert fresh.state == AppState.RUNNING and fresh.msg.startswith("1 in-job restart by ft_launcher"), fresh.msg
        assert re.search(r"the last as local rank 0 on node [01] killed by signal 9\)$", fresh.msg), fresh.msg
        assert requests == ["get pods/log", "get pods/log", "get trainjobs", "list pods"], requests
        log_reads = [r for r in cluster.requests if r.resource == "pods/log" and r.name.startswith("ft-inj")]
        assert all(r.query.get("tailLines") == str(IN_JOB_TAIL) for r in log_reads), log_reads
        assert sorted(r.name.split("-node-0-")[1][0] for r in log_reads) == ["0", "1"], log_reads
        job = exp.jobs[0]
    # Every agent logs the group's restart; the killed rank's agent says how its worker ended.
    assert re.fullmatch(
        r"1 in-job restart by ft_launcher \(no pod recreated, the last as local rank 0 on node [01] "
        r"killed by signal 9\)",
        restarted.msg,
    ), restarted.msg
    assert exp.status(return_dict=True)[job.id]["status"] == AppState.SUCCEEDED
    pods = [p for p in core.list_namespaced_pod("default").items if p.metadata.name in pods_before]
    # The same pods, never restarted: the rank came back inside them.
    assert {p.metadata.name: p.metadata.uid for p in pods} == pods_before
    assert all(s.restart_count == 0 for p in pods for s in p.status.container_statuses)
    logs = "".join(core.read_namespaced_pod_log(name, "default") for name in pods_before)
    # ft_launcher prefixes each worker's lines (`--tee 3`): "[default0]:rank 0 finished 40 steps".
    assert sorted(line.rsplit(":", 1)[-1] for line in logs.splitlines() if "finished 60 steps" in line) == [
        f"rank {r} finished 60 steps" for r in range(2)
    ], logs
    # Every rank was restarted once (the killed one and its peer), as new processes.
    assert {p.name.split("-")[0] for p in pid_files(tmp_path)[2:]} | {p.name.split("-")[0] for p in first} == {
        "rank0",
        "rank1",
    }
    assert "Worker group FAILED. 2/2 attempts left; will restart worker group" in logs
    print(f"in-job recovery (SIGKILL to every rank training again): {recovery:.1f}s")


@pytest.mark.needs_torch
def test_ft_launcher_restarts_then_a_user_error_says_both(cluster):
    """A rank that raises on every start: ft_launcher restarts it in the pods once (--max-restarts 1), then
    the pod exits 1, a user error, and the job fails with no gang restart. The failure says all three."""
    pytest.importorskip(
        "nvidia_resiliency_ext",
        reason="ft_launcher: pip install --no-deps nvidia-resiliency-ext (docs/resilience.md lists its dependencies)",
    )
    executor = KubeflowExecutor(
        container_image="python:3.11",
        nodes=2,
        nprocs_per_node=1,
        kubeconfig=str(cluster.kubeconfig_path),
        shm_size=None,
        packager=ConfigMapPackager(relative_path="test", include_pattern="workloads.py"),
        retries=2,
        launcher=run.FaultTolerance(max_restarts=1, initial_rank_heartbeat_timeout=120, rank_heartbeat_timeout=60),
    )
    with run.Experiment("ft-user", executor=executor, log_level="WARN") as exp:
        exp.add(run.Partial(workloads.raise_on_rank, rank_to_fail=1, message="bad config"), name="train")
        exp.run(sequential=True)
    desc = create_scheduler("t").describe(app_id_of(exp.jobs[0].handle))
    assert desc.state == AppState.FAILED
    # ft_launcher's c10d rendezvous numbers ranks in the order the nodes join: rank 1 may run on node 0.
    assert re.match(r"rank 1 on node [01]: RuntimeError: bad config;", desc.msg), desc.msg
    assert "no gang restart: its exit code is in fail_fast_exit_codes" in desc.msg, desc.msg
    assert re.search(
        r"; 1 in-job restart by ft_launcher \(no pod recreated, the last as local rank 0 on node [01] "
        r"exited with code 1\)",
        desc.msg,
    ), desc.msg


def run_script(cluster, inline: str, name: str, **settings):
    """Run an inline script on 2 nodes; return the final state, the TrainJob and its pods' restart attempts."""
    executor = KubeflowExecutor(
        container_image="python:3.11",
        nodes=2,
        nprocs_per_node=1,
        shm_size=None,
        kubeconfig=str(cluster.kubeconfig_path),
        **settings,
    )
    with run.Experiment(name, executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(inline=inline), name="train")
        exp.run(sequential=True)
        job = exp.jobs[0]
    return outcome(cluster, exp, job)


def outcome(cluster, exp, job):
    """A finished job's final state, its TrainJob, the reasons of its events and its status message."""
    state = exp.status(return_dict=True)[job.id]["status"]
    message = create_scheduler("t").describe(app_id_of(job.handle)).msg  # what `nemo experiment status` shows
    namespace, trainjob_name = job.handle.rsplit("/", 1)[-1].split(":", 1)
    api = client.ApiClient(cluster.configuration())
    trainjob = client.CustomObjectsApi(api).get_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs", trainjob_name
    )
    events = client.CoreV1Api(api).list_namespaced_event(namespace).items
    reasons = [e.reason for e in events if e.involved_object.name.startswith(trainjob_name)]
    return state, trainjob, reasons, message


def failed_condition(trainjob) -> dict:
    return next(c for c in trainjob["status"]["conditions"] if c["type"] == "Failed")


def test_user_error_fails_at_once_without_using_restarts(cluster):
    state, trainjob, reasons, message = run_script(
        cluster, 'echo "bad config on $PET_NODE_RANK"; exit 1', "user-err", retries=2
    )
    assert state == AppState.FAILED
    assert failed_condition(trainjob)["reason"] == "FailJobSetFailurePolicyAction", trainjob["status"]
    assert "PodFailurePolicy" in reasons and "RestartJobSetFailurePolicyAction" not in reasons, reasons
    assert (
        "exited with code 1" in message
        and "no gang restart: its exit code is in fail_fast_exit_codes (a user "
        "error), so the job failed at once without using retries"
        in message
    ), message


def test_other_failures_restart_the_gang_up_to_retries(cluster):
    state, trainjob, reasons, message = run_script(cluster, "exit 3", "other-err", retries=1)
    assert state == AppState.FAILED
    assert failed_condition(trainjob)["reason"] == "ReachedMaxRestarts", trainjob["status"]
    # Each attempt's Job failed through the catch-all FailJob rule, whose event keeps the exit code.
    assert reasons.count("RestartJobSetFailurePolicyAction") == 1 and reasons.count("PodFailurePolicy") == 2, reasons
    assert re.search(
        r"exited with code 3; .*after 1 gang restart \(attempt 0: node [01] \(pod [-\w]+\) exited with "
        r"code 3\)",
        message,
    ), message


def _ready_pods(cluster, trainjob, attempt):
    """The job's pods of gang attempt ``attempt`` that are ready."""
    return sum(
        1
        for p in cluster.objects("pods", "default")
        if p["metadata"]["labels"].get(C.JOBSET_NAME_LABEL) == trainjob
        and p["metadata"]["labels"].get(C.RESTART_ATTEMPT_LABEL) == attempt
        and not p["metadata"].get("deletionTimestamp")
        and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or [])
    )


def test_status_says_how_often_and_why_the_gang_restarted_while_it_runs(cluster, tmp_path, console_script):
    """Node 1 fails the first attempt (exit 3: not a user error), the gang restarts and runs: a running
    job's status counts the restart and says why, from one pod list and one event list."""
    marker = tmp_path / "failed-once"  # the local cluster's pods share this machine's files
    script = (
        f'if [ "$PET_NODE_RANK" = 1 ] && [ ! -f {marker} ]; then touch {marker}; exit 3; fi\n'
        'echo "attempt $NEMO_KUBEFLOW_RESTART_ATTEMPT up"; sleep 120'
    )
    executor = KubeflowExecutor(
        container_image="python:3.11",
        nodes=2,
        nprocs_per_node=1,
        shm_size=None,
        kubeconfig=str(cluster.kubeconfig_path),
        retries=2,
    )
    with run.Experiment("gang-run", executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(inline=script), name="train")
        exp.run(detach=True)
    app_id, name = app_id_of(exp.jobs[0].handle), app_id_of(exp.jobs[0].handle).split(":", 1)[1]
    desc = wait_for(
        lambda: (
            (d := create_scheduler("t").describe(app_id)).state == AppState.RUNNING and "gang restart" in d.msg and d
        ),
        "the restarted gang to run",
        timeout=90,
    )
    # The failed pod (and Job) went with attempt 0; the Job controller's event still says which pod failed, how.
    assert re.fullmatch(
        rf"1 gang restart so far \(attempt 0: node 1 \(pod {name}-node-0-1-[a-z0-9]{{5}}\) exited with "
        r"code 3\)",
        desc.msg,
    ), desc.msg
    # A process that keeps looking (an AppWatch per app and scheduler) checks the attempt's node faults once:
    # from its second look on, a describe costs the TrainJob, its JobSet, the pods that are not running, the
    # Warning events and the current attempt's Jobs (metadata only), never the running pods.
    # The restarted gang's pods ready, and the watcher's first look finds the job running: the TrainJob mirrors
    # JobSet's status of the new attempt's Job, which can still say "0/2 nodes running" for a look or two.
    wait_for(lambda: _ready_pods(cluster, name, attempt="1") == 2, "the restarted gang's pods ready", timeout=60)
    watcher = create_scheduler("t")
    wait_for(lambda: watcher.describe(app_id).state == AppState.RUNNING, "the watcher to see it running", timeout=30)
    time.sleep(ANSWER_REUSE_S)  # not the same status query again (answered without a read: test_describe_reads.py)
    cluster.clear_requests()
    watcher.describe(app_id)
    mine = sorted(
        f"{r.verb} {r.resource}"
        for r in cluster.requests
        if (r.name or "").startswith(name) or name in r.query.get("labelSelector", "") or r.resource == "events"
    )
    assert mine == ["get jobsets", "get trainjobs", "list events", "list jobs", "list pods"], mine
    assert [
        r.query.get("fieldSelector")
        for r in cluster.requests
        if r.resource == "pods" and name in r.query.get("labelSelector", "")
    ] == ["status.phase!=Running"]
    out = subprocess.run(
        [console_script("nemo-kubeflow"), "status", exp._id],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "250"},
    )
    assert "state: RUNNING" in out.stdout and "why:   1 gang restart so far" in out.stdout, out.stdout + out.stderr
    # NeMo-Run's own status prints only the state: the restarts are printed with it.
    out = subprocess.run(
        [console_script("nemo"), "experiment", "status", exp._id],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "400"},
    )
    shown = " ".join((out.stdout + out.stderr).split())
    assert "running: 1 gang restart so far (attempt 0: node 1 (pod" in shown, shown[-3000:]
    create_scheduler("t").cancel(app_id)


def test_without_fail_fast_codes_exit_1_restarts_too(cluster):
    state, trainjob, reasons, _ = run_script(cluster, "exit 1", "no-fast", retries=1, fail_fast_exit_codes=[])
    assert state == AppState.FAILED
    assert failed_condition(trainjob)["reason"] == "ReachedMaxRestarts", trainjob["status"]
    assert reasons.count("RestartJobSetFailurePolicyAction") == 1, reasons


@pytest.mark.needs_torch
def test_preempted_job_resumes_from_its_sigterm_checkpoint(cluster, tmp_path, monkeypatch):
    """Suspend the running TrainJob as Kueue does on preemption, resume it: the loop checkpoints on
    SIGTERM (within the grace period), restarts from that step, and no step runs twice."""
    monkeypatch.syspath_prepend(str(REPO / "examples" / "kubeflow"))
    import preemptible_training

    checkpoints = tmp_path / "checkpoints"  # the local cluster's pods share this machine's files
    executor = KubeflowExecutor(
        container_image="python:3.11",
        nodes=1,
        nprocs_per_node=1,
        shm_size=None,
        kubeconfig=str(cluster.kubeconfig_path),
        termination_grace_period_seconds=20,
        packager=ConfigMapPackager(relative_path="examples/kubeflow", include_pattern="preemptible_training.py"),
    )
    task = run.Partial(
        preemptible_training.train, steps=60, step_seconds=0.1, checkpoint_every=25, checkpoint_dir=str(checkpoints)
    )
    api = client.ApiClient(cluster.configuration())
    custom = client.CustomObjectsApi(api)
    events_file = checkpoints / "events.jsonl"

    def events():
        return [json.loads(line) for line in events_file.read_text().splitlines()] if events_file.exists() else []

    def set_suspend(namespace, name, value):
        custom.patch_namespaced_custom_object(
            "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs", name, {"spec": {"suspend": value}}
        )

    with run.Experiment("preempt", executor=executor, log_level="WARN") as exp:
        exp.add(task, name="train")
        exp.run(sequential=True)
        job = exp.jobs[0]
        namespace, name = job.handle.rsplit("/", 1)[-1].split(":", 1)
        wait_for(lambda: sum("step" in e for e in events()) >= 30, "30 steps", timeout=120)
        set_suspend(namespace, name, True)  # Kueue's preemption: suspend; Trainer deletes the pods
        wait_for(lambda: any(e.get("why") == "SIGTERM" for e in events()), "the checkpoint on SIGTERM", timeout=60)
        pods = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=f"{C.JOBSET_NAME_LABEL}={name}")
        wait_for(
            lambda: (
                not client.CoreV1Api(api)
                .list_namespaced_pod(namespace, label_selector=f"{C.JOBSET_NAME_LABEL}={name}")
                .items
            ),
            "the pods to go",
            timeout=60,
        )
        status = exp.status(return_dict=True)[job.id]
        assert status["status"] == AppState.PENDING, status  # not FAILED: waiting to be let in again
        set_suspend(namespace, name, False)  # re-admitted
    assert exp.status(return_dict=True)[job.id]["status"] == AppState.SUCCEEDED
    log = events()
    steps = [e["step"] for e in log if "step" in e]
    stopped_at = next(e["checkpoint"] for e in log if e.get("why") == "SIGTERM")
    # Every step ran exactly once: the second run started at the SIGTERM checkpoint.
    assert steps == list(range(1, 61)), steps
    assert 30 <= stopped_at < 60 and len(pods.items) == 1
    assert log[-1] == {"checkpoint": 60, "why": "done"}


# --- silent nodes: the stall warning (the failure rules rendered: test/unit/build/test_failure_rules.py) ---


def test_following_logs_warns_when_a_running_node_goes_silent(cluster):
    executor = KubeflowExecutor(
        container_image="python:3.11",
        nodes=2,
        nprocs_per_node=1,
        shm_size=None,
        kubeconfig=str(cluster.kubeconfig_path),
        stall_warning_seconds=1,
    )
    script = 'echo "step 1"; if [ "$PET_NODE_RANK" = 1 ]; then sleep 4; fi; echo "step 2"'
    with run.Experiment("stall", executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(inline=script), name="train")
        exp.run(detach=True)
    app_id = app_id_of(exp.jobs[0].handle)
    scheduler = create_scheduler("t")
    silent = list(scheduler.log_iter(app_id, "train", 1, should_tail=True))
    warnings = [line for line in silent if "--- warning: node 1" in line]
    assert silent[0] == "step 1\n" and silent[-1] == "step 2\n", silent
    assert 2 <= len(warnings) <= 5 and "has printed nothing for 1 s while running" in warnings[0], silent
    chatty = list(scheduler.log_iter(app_id, "train", 0, should_tail=True))
    assert chatty == ["step 1\n", "step 2\n"]  # a finished node's log: no warning


def test_status_names_the_running_nodes_that_went_silent(cluster):
    executor = KubeflowExecutor(
        container_image="python:3.11",
        nodes=2,
        nprocs_per_node=1,
        shm_size=None,
        kubeconfig=str(cluster.kubeconfig_path),
        stall_warning_seconds=2,
    )
    script = (
        'echo "step 0"; if [ "$PET_NODE_RANK" = 1 ]; then sleep 12; exit 0; fi\n'
        'for i in $(seq 1 40); do echo "step $i"; sleep 0.3; done'
    )
    with run.Experiment("stall-status", executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(inline=script), name="train")
        exp.run(detach=True)
    app_id = app_id_of(exp.jobs[0].handle)
    scheduler = create_scheduler("t")
    desc = wait_for(
        lambda: (d := scheduler.describe(app_id)).msg.startswith("warning") and d, "the stall warning", timeout=60
    )
    assert desc.state == AppState.RUNNING
    assert desc.msg.startswith("warning: node 1 printed nothing for the last 2 s while running"), desc.msg
    wait_for(lambda: scheduler.describe(app_id).state == AppState.SUCCEEDED, "the job to succeed", timeout=60)


# --- OOM kills: a user error unless restart_on_oom_kill -------------------------------------------------


def waiting_nodes(cluster, marker, **settings):
    """An executor of 2 nodes, and a script that waits (up to 3 minutes) for `marker`, then succeeds."""
    executor = KubeflowExecutor(
        container_image="python:3.11",
        nodes=2,
        nprocs_per_node=1,
        shm_size=None,
        kubeconfig=str(cluster.kubeconfig_path),
        **settings,
    )
    return executor, f"for i in $(seq 1 900); do [ -e {marker} ] && exit 0; sleep 0.2; done; exit 5"


def two_running_pods(core, namespace: str, trainjob: str):
    """The TrainJob's 2 running pods (not being deleted), or None."""
    pods = core.list_namespaced_pod(namespace, label_selector=f"{C.JOBSET_NAME_LABEL}={trainjob}").items
    running = [p for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp]
    return running if len(running) == 2 else None


def oom_kill_node_0(cluster, tmp_path, name: str, **settings):
    """Run 2 nodes that wait for a marker file; OOM-kill node 0's container once both run, then
    write the marker (a restarted gang finishes at once). Returns what run_script's caller needs."""
    marker = tmp_path / "oom-killed"
    executor, script = waiting_nodes(cluster, marker, **settings)
    core = core_api(cluster)
    with run.Experiment(name, executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(inline=script), name="train")
        exp.run(sequential=True)
        job = exp.jobs[0]
        namespace, trainjob_name = job.handle.rsplit("/", 1)[-1].split(":", 1)
        pod = next(
            p
            for p in wait_for(lambda: two_running_pods(core, namespace, trainjob_name), "two running pods", timeout=120)
            if p.metadata.labels[C.COMPLETION_INDEX_LABEL] == "0"
        )
        cluster.oom_kill(pod.metadata.name, namespace=namespace)

        def failed_or_gone():
            # One list (not a list, then a read: the gang restart may delete the pod in between).
            found = core.list_namespaced_pod(namespace, field_selector=f"metadata.name={pod.metadata.name}").items
            return not found or found[0].status.phase == "Failed"

        wait_for(failed_or_gone, "the OOM-killed pod to fail", timeout=60)
        marker.write_text("")
    return outcome(cluster, exp, job)


def test_an_oom_killed_node_fails_the_job_at_once_by_default(cluster, tmp_path):
    state, trainjob, reasons, message = oom_kill_node_0(cluster, tmp_path, "oom-fail", retries=2)
    assert state == AppState.FAILED
    assert failed_condition(trainjob)["reason"] == "FailJobSetFailurePolicyAction", trainjob["status"]
    assert "PodFailurePolicy" in reasons and "RestartJobSetFailurePolicyAction" not in reasons, reasons
    assert "node 0" in message and "was killed by signal 9 (OOMKilled)" in message and "no gang restart" in message, (
        message
    )


def test_an_oom_killed_node_restarts_the_gang_when_the_user_opts_in(cluster, tmp_path):
    state, trainjob, reasons, _ = oom_kill_node_0(cluster, tmp_path, "oom-restart", retries=1, restart_on_oom_kill=True)
    assert state == AppState.SUCCEEDED, trainjob["status"]
    # 137 matched the catch-all FailJob rule (its event keeps the code), not the userError one: the gang restarted.
    assert reasons.count("RestartJobSetFailurePolicyAction") == 1 and reasons.count("PodFailurePolicy") == 1, reasons


# --- a node that failed the job is not used again -------------------------------------------------------


@pytest.fixture
def three_nodes(tmp_path):
    """A local cluster of its own whose kubelet schedules onto three virtual nodes."""
    from nemo_kubeflow_local import LocalCluster

    with LocalCluster(workdir=tmp_path / "cluster") as started:
        started.add_virtual_nodes("node-a", "node-b", "node-c")
        yield started


def lose_node_of_rank_0(cluster, tmp_path, name: str, check, before_loss=None, **settings):
    """Run 2 nodes that wait for a marker while torchx's `Runner.wait` (NeMo-Run's attached wait, whose looks
    repair) waits for them in a thread; lose the node of rank 0, then look at the job as `nemo experiment
    status` does (reads only) until `check(message, pods)` holds; write the marker. Returns the outcome, the
    node lost, what `check` returned, and the TrainJob's last pods."""
    import threading

    from nemo_run.run.torchx_backend.runner import get_runner

    marker = tmp_path / "done"
    executor, script = waiting_nodes(cluster, marker, retries=2, **settings)
    core = core_api(cluster)
    scheduler = create_scheduler("t")
    with run.Experiment(name, executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(inline=script), name="train")
        exp.run(sequential=True)
        job = exp.jobs[0]
        namespace, trainjob_name = job.handle.rsplit("/", 1)[-1].split(":", 1)
        waiter = threading.Thread(
            target=get_runner().wait, args=(job.handle,), kwargs={"wait_interval": 0.5}, daemon=True
        )

        def running_pods():
            return two_running_pods(core, namespace, trainjob_name)

        first = wait_for(running_pods, "two running pods", timeout=120)
        waiter.start()
        lost = next(p.spec.node_name for p in first if p.metadata.labels[C.COMPLETION_INDEX_LABEL] == "0")
        if before_loss is not None:
            before_loss(namespace, trainjob_name)
        assert cluster.lose_node(lost)
        seen = wait_for(
            lambda: check(scheduler.describe(app_id_of(job.handle)).msg, running_pods(), lost),
            "the job to be moved off the lost node",
            timeout=180,
        )
        pods = running_pods()
        marker.write_text("")
        waiter.join(timeout=120)
        assert not waiter.is_alive(), "the attached wait did not end with the job"
    return outcome(cluster, exp, job), lost, seen, pods


def moved_off(message: str) -> bool:
    """A look (reads only) says the move is done: the job avoids the node, no step of it left."""
    return "avoiding node" in message and not any(w in message for w in ("suspended", "under way", "to be moved"))


def test_a_node_lost_mid_run_is_avoided_by_the_next_attempt(three_nodes, tmp_path):
    def moved(message, pods, lost):
        away = pods and all(p.spec.node_name != lost for p in pods)
        return moved_off(message) and away and (message, pods)

    (state, trainjob, reasons, _), lost, (message, pods), _ = lose_node_of_rank_0(
        three_nodes, tmp_path, "bad-node", moved
    )
    assert state == AppState.SUCCEEDED, trainjob["status"]
    assert f"avoiding node {lost} after its pod bad-node" in message, message
    assert "failed with NodeNotReady (Node is not ready); 1 gang restart before the move" in message, message
    # The pods of the new JobSet run elsewhere, and carry the NotIn term.
    assert lost not in {p.spec.node_name for p in pods}, [p.spec.node_name for p in pods]
    terms = pods[0].spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution.node_selector_terms
    assert [(e.key, e.operator, e.values) for e in terms[0].match_expressions] == [
        ("kubernetes.io/hostname", "NotIn", [lost])
    ]
    assert trainjob["spec"]["suspend"] is False
    managers = [p["manager"] for p in trainjob["spec"]["runtimePatches"]]
    assert managers[-1] == "nemo-kubeflow.nvidia.com/node-avoidance" and len(set(managers)) == len(managers)
    assert reasons.count("RestartJobSetFailurePolicyAction") == 1, reasons


def test_a_jobset_built_again_from_an_older_copy_is_replaced_before_the_job_resumes(three_nodes, tmp_path):
    """Trainer builds the deleted JobSet from the TrainJob as its cache had it before the runtime patch (seen on
    the real control plane under load): no apply can add the term to that JobSet (JobSet's webhook), so resuming
    it would leave the job suspended for good (the local Trainer refuses that apply as JobSet's webhook does). The
    move deletes it again, and resumes the one with the term."""

    def moved(message, pods, lost):
        away = pods and all(p.spec.node_name != lost for p in pods)
        return moved_off(message) and away and (message, pods)

    def stale_next_build(namespace, name):
        three_nodes.rebuild_from_older_copy(name, namespace)

    (state, trainjob, _, _), lost, (message, pods), _ = lose_node_of_rank_0(
        three_nodes, tmp_path, "stale-copy", moved, before_loss=stale_next_build
    )
    assert state == AppState.SUCCEEDED, trainjob["status"]
    assert "1 gang restart before the move" in message, message
    terms = pods[0].spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution.node_selector_terms
    assert [(e.key, e.operator, e.values) for e in terms[0].match_expressions] == [
        ("kubernetes.io/hostname", "NotIn", [lost])
    ]
    annotation = json.loads(trainjob["metadata"]["annotations"]["nemo-kubeflow.nvidia.com/node-avoidance"])
    assert annotation["moving"] == [] and "replacing" not in annotation, annotation


def test_a_lost_node_is_not_avoided_when_the_job_would_no_longer_fit(tmp_path):
    from nemo_kubeflow_local import LocalCluster

    with LocalCluster(workdir=tmp_path / "cluster") as cluster:
        cluster.add_virtual_nodes("node-a", "node-b")

        def capped(message, pods, lost):
            return "not avoiding node" in message and len(pods or []) == 2 and (message, pods)

        (state, trainjob, _, _), lost, (message, _), pods = lose_node_of_rank_0(cluster, tmp_path, "no-room", capped)
    assert state == AppState.SUCCEEDED, trainjob["status"]
    assert f"not avoiding node {lost}: only 1 schedulable node would be left for 2 pods" in message, message
    # Nothing was moved: the same JobSet ran on, restarted once by JobSet itself.
    assert all(p["manager"] != "nemo-kubeflow.nvidia.com/node-avoidance" for p in trainjob["spec"]["runtimePatches"])
    assert {p.metadata.labels["jobset.sigs.k8s.io/restart-attempt"] for p in pods} == {"1"}


def test_watch_moves_a_detached_job_off_its_lost_node(three_nodes, tmp_path, nemorun_home, console_script):
    """No run attached: `nemo-kubeflow watch`, in a process of its own, looks after the job until it ends."""
    import subprocess

    marker = tmp_path / "done"
    executor, script = waiting_nodes(three_nodes, marker, retries=2)
    with run.Experiment("watched", executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(inline=script), name="train")
        exp.run(detach=True)
    core = core_api(three_nodes)
    trainjob_name = exp.jobs[0].handle.rsplit(":", 1)[-1]
    pods = wait_for(lambda: two_running_pods(core, "default", trainjob_name), "two running pods", timeout=120)
    lost = next(p.spec.node_name for p in pods if p.metadata.labels[C.COMPLETION_INDEX_LABEL] == "0")
    three_nodes.lose_node(lost)
    env = {**os.environ, "NEMORUN_HOME": str(nemorun_home), "COLUMNS": "250"}
    watcher = subprocess.Popen(
        [console_script("nemo-kubeflow"), "watch", exp._id, "--interval", "0.5"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(
            lambda: (
                (running := two_running_pods(core, "default", trainjob_name))
                and lost not in {p.spec.node_name for p in running}
                and all(p.spec.affinity.node_affinity for p in running)
            ),
            "the pods to run off the lost node",
            timeout=120,
        )
        marker.write_text("")
        out, err = watcher.communicate(timeout=120)
    finally:
        watcher.kill()
    assert watcher.returncode == 0, (out, err)
    assert f"avoiding node {lost} after its pod watched-" in out and "SUCCEEDED" in out.splitlines()[-1], out
    # The repair step names what it did.
    assert f": repaired: avoiding node {lost} after its pod watched-" in out, out


def test_runtime_patches_cannot_change_while_the_jobset_still_runs_pods(cluster, tmp_path):
    """Trainer's webhook: suspending and patching in one request is refused while pods run, so a
    move must wait for the pods to stop (node_avoidance.py does)."""
    marker = tmp_path / "done"
    executor, script = waiting_nodes(cluster, marker)
    core = core_api(cluster)
    custom = client.CustomObjectsApi(client.ApiClient(cluster.configuration()))
    with run.Experiment("patch-live", executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(inline=script), name="train")
        exp.run(sequential=True)
        namespace, name = exp.jobs[0].handle.rsplit("/", 1)[-1].split(":", 1)
        wait_for(lambda: two_running_pods(core, namespace, name), "two running pods", timeout=120)
        trainjob = custom.get_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs", name)
        patches = trainjob["spec"]["runtimePatches"] + [{"manager": "example.com/late"}]
        with pytest.raises(client.ApiException) as refused:
            custom.patch_namespaced_custom_object(
                "trainer.kubeflow.org",
                "v1alpha1",
                namespace,
                "trainjobs",
                name,
                {"spec": {"suspend": True, "runtimePatches": patches}},
            )
        marker.write_text("")
    assert (
        "RuntimePatches cannot be modified when the JobSet's ReplicatedJob node is still active" in refused.value.body
    ), refused.value.body


def test_with_avoid_failed_nodes_false_the_job_is_left_where_the_restart_put_it(three_nodes, tmp_path):
    looks = []

    def restarted(message, pods, lost):
        looks.append(message)
        return (
            len(looks) >= 5
            and pods
            and {p.metadata.labels["jobset.sigs.k8s.io/restart-attempt"] for p in pods} == {"1"}
            and (message, pods)
        )

    (state, trainjob, _, _), _, _, pods = lose_node_of_rank_0(
        three_nodes, tmp_path, "stay", restarted, avoid_failed_nodes=False
    )
    assert state == AppState.SUCCEEDED, trainjob["status"]
    assert not [m for m in looks if "avoiding" in m], looks
    assert trainjob["metadata"]["annotations"]["nemo-kubeflow.nvidia.com/node-avoidance"] == "off"
    assert all(p["manager"] != "nemo-kubeflow.nvidia.com/node-avoidance" for p in trainjob["spec"]["runtimePatches"])
    assert not [p for p in pods if p.spec.affinity and p.spec.affinity.node_affinity]
