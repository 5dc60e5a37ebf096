"""End to end through NeMo-Run, on the local cluster (real HTTP, real processes)."""

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import nemo_run as run
import pytest
import workloads
from polling import wait_for
from torchx.specs import AppState, parse_app_handle

from nemo_kubeflow import ConfigMapPackager, KubeflowExecutor

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture()
def executor(cluster):
    cluster.clear_requests()
    return KubeflowExecutor(
        container_image="python:3.11",  # ignored by the local cluster
        nodes=2,
        nprocs_per_node=1,
        kubeconfig=str(cluster.kubeconfig_path),
        shm_size=None,
        packager=ConfigMapPackager(relative_path="test", include_pattern="workloads.py"),
    )


def app_id_of(handle: str) -> str:
    return parse_app_handle(handle)[2]


def trainjob_name(handle: str) -> str:
    return app_id_of(handle).split(":", 1)[1]


def plain(text: str) -> str:
    """``text`` without terminal colours (NeMo-Run colours its log prefix)."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def state_of(exp, task: str) -> AppState:
    """Ask the experiment (Job.state is not updated in place). Call it after the `with`
    block: inside it, NeMo-Run only launches; it waits for the jobs in __exit__."""
    return exp.status(return_dict=True)[task]["status"]


def writes(cluster):
    return [(r.verb, r.resource) for r in cluster.requests if r.verb in ("create", "patch", "update", "delete")]


def test_script_task_runs_on_every_node_with_minimal_requests(cluster, executor):
    script = run.Script(inline='echo "node $PET_NODE_RANK of $PET_NNODES says $GREETING"', env={"GREETING": "hi there"})
    with run.Experiment("e2e-script", executor=executor, log_level="WARN") as exp:
        exp.add(script, name="hello")
        exp.run(sequential=True)
        job = exp.jobs[0]
    assert state_of(exp, job.id) == AppState.SUCCEEDED
    handle = job.handle
    # One runtime create, one TrainJob create, one ConfigMap, one resume: nothing else is written.
    assert writes(cluster) == [
        ("create", "clustertrainingruntimes"),
        ("create", "trainjobs"),
        ("create", "configmaps"),
        ("patch", "trainjobs"),
    ]
    name = trainjob_name(handle)
    [cm] = [c for c in cluster.objects("configmaps", "default") if c["metadata"]["name"] == f"{name}-code"]
    [owner] = cm["metadata"]["ownerReferences"]
    assert owner["kind"] == "TrainJob" and owner["name"] == name
    from nemo_kubeflow.nemo_run.scheduler import create_scheduler

    scheduler = create_scheduler("t")
    for node in (0, 1):
        lines = list(scheduler.log_iter(app_id_of(handle), "hello", node))
        assert f"node {node} of 2 says hi there\n" in lines


@pytest.mark.needs_torch
def test_partial_task_runs_in_the_pods(cluster, executor):
    with run.Experiment("e2e-partial", executor=executor, log_level="WARN") as exp:
        exp.add(run.Partial(workloads.greet, name="fiddle"), name="greet")
        exp.run(sequential=True)
        job = exp.jobs[0]
    assert state_of(exp, job.id) == AppState.SUCCEEDED
    from nemo_kubeflow.nemo_run.scheduler import create_scheduler

    lines = list(create_scheduler("t").log_iter(app_id_of(job.handle), "greet", 1))
    assert "hello fiddle from node 1\n" in lines


@pytest.mark.needs_torch
def test_torchrun_allreduce_two_nodes_two_procs(cluster, executor, capsys):
    executor.nprocs_per_node = 2
    executor.launcher = "torchrun"
    with run.Experiment("e2e-allreduce", executor=executor, log_level="WARN") as exp:
        exp.add(run.Partial(workloads.allreduce, expected_world_size=4), name="allreduce")
        exp.run(sequential=True)
        job = exp.jobs[0]
    assert state_of(exp, job.id) == AppState.SUCCEEDED
    from nemo_kubeflow.nemo_run.scheduler import create_scheduler

    scheduler = create_scheduler("t")
    lines = [line for node in (0, 1) for line in scheduler.log_iter(app_id_of(job.handle), "allreduce", node)]
    sums = sorted(line for line in lines if "all_reduce sum" in line)
    assert len(sums) == 4 and all(line.rstrip().endswith("sum = 10") for line in sums), lines
    # As a person reads them (NeMo-Run prints them on stderr), in the process that submitted the task:
    # every node, one prefix (NeMo-Run's `<task>/<node>`), then the global rank on the lines torchrun tees.
    capsys.readouterr()
    exp.logs(job.id)
    printed = plain(capsys.readouterr().err).splitlines()
    for rank in range(4):
        assert f"allreduce/{rank // 2} [rank{rank}]:rank {rank}/4: all_reduce sum = 10" in printed, printed
    assert all(re.match(r"allreduce/[01] ", line) for line in printed if line), printed
    assert not [line for line in printed if re.search(r"\[node-\d\]|\[default\d\]:", line)], printed


def test_failing_task_reports_failed_with_message(cluster, executor):
    with run.Experiment("e2e-fail", executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(inline="echo about to fail; exit 7"), name="boom")
        exp.run(sequential=True)
        job = exp.jobs[0]
    assert state_of(exp, job.id) == AppState.FAILED
    from nemo_kubeflow.nemo_run.scheduler import create_scheduler

    desc = create_scheduler("t").describe(app_id_of(job.handle))
    assert desc.state == AppState.FAILED
    assert "exited with code 7" in desc.msg and "node " in desc.msg, desc.msg


def test_parallel_and_detached_experiment(cluster, executor):
    with run.Experiment("e2e-parallel", executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(inline="sleep 1; echo a"), name="a")
        exp.add(run.Script(inline="sleep 1; echo b"), name="b")
        exp.run(detach=True)
        handles = [j.handle for j in exp.jobs]
    from nemo_kubeflow.nemo_run.scheduler import create_scheduler

    scheduler = create_scheduler("t")
    assert all(handles)
    for handle in handles:
        wait_for(lambda: scheduler.describe(app_id_of(handle)).state == AppState.SUCCEEDED, "the job to succeed")


def test_status_while_running_then_cancel_removes_everything(cluster, executor):
    with run.Experiment("e2e-cancel", executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(inline="echo started; sleep 300"), name="long")
        exp.run(detach=True)
        handle = exp.jobs[0].handle
    from nemo_kubeflow.nemo_run.scheduler import create_scheduler

    scheduler = create_scheduler("t")
    app_id = app_id_of(handle)
    wait_for(lambda: scheduler.describe(app_id).state == AppState.RUNNING, "the job to run")
    name = trainjob_name(handle)
    # The local kubelet reports containerID "local://<pid>" for each running container.
    pids = [
        int(cs["containerID"].rsplit("/", 1)[1])
        for p in cluster.objects("pods", "default")
        if p["metadata"]["labels"].get("jobset.sigs.k8s.io/jobset-name") == name
        for cs in p["status"].get("containerStatuses", [])
        if cs.get("containerID")
    ]
    assert len(pids) == 2 and all(_alive(pid) for pid in pids)
    scheduler.cancel(app_id)
    wait_for(
        lambda: not [o for o in cluster.objects("configmaps", "default") if o["metadata"]["name"].startswith(name)],
        "the job's ConfigMaps to be deleted",
    )
    wait_for(
        lambda: (
            not [
                p
                for p in cluster.objects("pods", "default")
                if p["metadata"]["labels"].get("jobset.sigs.k8s.io/jobset-name") == name
            ]
        ),
        "the job's pods to be deleted",
    )
    desc = scheduler.describe(app_id)
    assert desc.state == AppState.CANCELLED and "no longer exists" in desc.msg
    for pid in pids:
        wait_for(lambda: not _alive(pid), f"process {pid} to end", timeout=15)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_reconnect_from_a_fresh_process(cluster, executor, nemorun_home):
    with run.Experiment("e2e-reconnect", executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(inline="echo reconnect-marker; sleep 300"), name="sleeper")
        exp.run(detach=True)
        exp_id = exp._id
        handle = exp.jobs[0].handle
    code = textwrap.dedent(f"""
        import json, sys, time
        import nemo_run as run
        from nemo_kubeflow.nemo_run.scheduler import create_scheduler
        from torchx.specs import parse_app_handle
        exp = run.Experiment.from_id({exp_id!r})
        job = exp.jobs[0]
        app_id = parse_app_handle(job.handle)[2]
        sched = create_scheduler("fresh")
        for _ in range(200):
            if sched.describe(app_id).state.name == "RUNNING":
                break
            time.sleep(0.1)
        status = exp.status(return_dict=True)
        lines = [l for n in (0, 1) for l in sched.log_iter(app_id, "sleeper", n)]
        exp.cancel(job.id)
        print(json.dumps({{"status": str(list(status.values())[0]["status"]), "lines": lines,
                          "submission_path_loaded": sorted(m for m in sys.modules if m.startswith((
                              "kubeflow_trainer_api", "nemo_kubeflow.schema.", "nemo_kubeflow.build.plan")))}}))
    """)
    env = {**os.environ, "NEMORUN_HOME": str(nemorun_home), "PYTHONPATH": str(REPO / "test")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert "RUNNING" in result["status"]
    assert result["lines"].count("reconnect-marker\n") == 2, result["lines"]
    # Status, logs and cancel never load the submission path (kubeflow_trainer_api alone is ~0.5 s).
    assert result["submission_path_loaded"] == []
    from nemo_kubeflow.nemo_run.scheduler import create_scheduler

    wait_for(
        lambda: create_scheduler("t").describe(app_id_of(handle)).state == AppState.CANCELLED, "the job to be cancelled"
    )


def test_nemo_experiment_cli_status_logs_cancel(cluster, executor, nemorun_home, console_script):
    with run.Experiment("e2e-cli", executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(inline="echo cli-marker-$PET_NODE_RANK; sleep 300"), name="cli")
        exp.run(detach=True)
        exp_id = exp._id
        handle = exp.jobs[0].handle
    from nemo_kubeflow.nemo_run.scheduler import create_scheduler

    scheduler = create_scheduler("t")
    wait_for(lambda: scheduler.describe(app_id_of(handle)).state == AppState.RUNNING, "the job to run")
    nemo = console_script("nemo")
    env = {**os.environ, "NEMORUN_HOME": str(nemorun_home), "COLUMNS": "200"}

    def nemo_cli(*args):
        out = subprocess.run([nemo, "experiment", *args], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stdout + out.stderr

    assert "RUNNING" in nemo_cli("status", exp_id)
    wait_for(
        lambda: "cli-marker-1" in "".join(scheduler.log_iter(app_id_of(handle), "cli", 1)),
        "cli-marker-1 in node 1's log",
    )
    logs = nemo_cli("logs", exp_id, "0")
    assert "cli/0 cli-marker-0\n" in plain(logs) and "cli/1 cli-marker-1\n" in plain(logs), logs
    nemo_cli("cancel", exp_id, "0")
    wait_for(lambda: scheduler.describe(app_id_of(handle)).state == AppState.CANCELLED, "the job to be cancelled")
