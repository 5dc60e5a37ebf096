"""Progress reported by a training loop (nemo_kubeflow.progress) read from fresh processes: describe,
`nemo-kubeflow status`, `nemo experiment status` and `nemo-kubeflow watch`, on both back ends; through the log
line (no TrainJobStatus gate) and through Trainer's status server (the gate on: the local cluster's emulation,
and the real Trainer v2.3.0). Pure parts (parsing, text, the stall rule) are in test/unit/test_progress_view.py."""

import os
import subprocess

import nemo_run as run
import progress_workload
import pytest
from backends import app_id_of, trainjob_of, wait_for
from backends import logs as node_logs
from torchx.specs import AppState

from nemo_kubeflow import ConfigMapPackager
from nemo_kubeflow.nemo_run.scheduler import create_scheduler

#: The pods import this checkout's progress module (progress_workload.py says why), and the workload.
PACKAGER = dict(
    include_pattern=["nemo_kubeflow/__init__.py", "nemo_kubeflow/progress.py", "progress_workload.py"],
    relative_path=["", "", "test"],
)


def cli(console_script, nemorun_home, tool, *args, timeout=180):
    return subprocess.run(
        [console_script(tool), *args], env=cli_env(nemorun_home), capture_output=True, text=True, timeout=timeout
    )


def cli_env(nemorun_home):
    return {**os.environ, "NEMORUN_HOME": str(nemorun_home), "COLUMNS": "400"}


def launch(backend, name, steps, seconds_per_step, interval, hang_at=0, release_file="", **executor):
    executor = backend.executor(packager=ConfigMapPackager(**PACKAGER), **executor)
    with run.Experiment(name, executor=executor, log_level="WARN") as exp:
        exp.add(
            run.Partial(
                progress_workload.train,
                steps=steps,
                seconds_per_step=seconds_per_step,
                interval=interval,
                hang_at=hang_at,
                release_file=release_file,
            ),
            name=name,
        )
        exp.run(detach=True)
    return exp


def trainer_status(backend, job):
    [trainjob] = [j for j in backend.objects("trainjobs") if j["metadata"]["name"] == trainjob_of(job)]
    return (trainjob.get("status") or {}).get("trainerStatus")


#: The steps of check_progress_everywhere's job: it steps slowly until the test releases it (a loaded machine's
#: commands may take longer than any fixed length of job), then runs the rest at once.
STEPS = 4000


def check_progress_everywhere(backend, console_script, nemorun_home, name, **executor):
    """A running job's progress in describe, `nemo-kubeflow status` and `nemo experiment status` (new
    processes, which know only the cluster), then `nemo-kubeflow watch` to its end. Returns the job."""
    release = nemorun_home / f"{name}.release"
    exp = launch(backend, name, steps=STEPS, seconds_per_step=0.15, interval=1.0, release_file=str(release), **executor)
    job, steps = exp.jobs[0], STEPS
    desc = wait_for(
        lambda: (
            (d := create_scheduler("t").describe(app_id_of(job))).state == AppState.RUNNING
            and f" of {steps} (" in d.msg
            and "ETA " in d.msg
            and d
        ),
        "progress with an ETA in describe",
        timeout=180,
    )
    assert "steps/s" in desc.msg and "ETA " in desc.msg and "loss=" in desc.msg, desc.msg
    # `watch` starts now, while the job runs (on a loaded machine the other commands can outlast the job).
    watch = subprocess.Popen(
        [console_script("nemo-kubeflow"), "watch", exp._id, "--interval", "2"],
        env=cli_env(nemorun_home),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )

    out = cli(console_script, nemorun_home, "nemo-kubeflow", "status", exp._id)
    assert out.returncode == 0, out.stderr
    assert "state: RUNNING" in out.stdout and f" of {steps} (" in out.stdout and "ETA " in out.stdout, out.stdout
    # Said once: the command's own lines, not NeMo-Run's console line of the same look beside them.
    assert out.stdout.count(f" of {steps} (") == 1 and "scheduler.py" not in out.stdout, out.stdout

    out = cli(console_script, nemorun_home, "nemo", "experiment", "status", exp._id)
    shown = " ".join((out.stdout + out.stderr).split())
    assert "running: step " in shown and f" of {steps} (" in shown and "loss=" in shown, shown[-3000:]

    release.touch()
    try:
        watched, _ = watch.communicate(timeout=280)
    finally:
        watch.kill()
    assert watch.returncode == 0, watched
    running = [line for line in watched.splitlines() if ": RUNNING: step " in line]
    # Each change once: every line that shows a step is watch's own "Task 0:" line.
    stepped = [line for line in watched.splitlines() if f" of {steps} (" in line]
    assert all(" Task 0: " in line for line in stepped) and "scheduler.py" not in watched, watched
    assert running and "ETA " in running[-1], watched
    assert "SUCCEEDED" in watched.splitlines()[-1], watched
    return job


@pytest.mark.backend_gates("TrainJobStatus")
def test_progress_through_trainers_status_server(backend, console_script, nemorun_home):
    """The gate on: the pods get the status server's URL, CA and token; rank 0 writes trainerStatus, and
    status reads it from the TrainJob (no log read for it)."""
    job = check_progress_everywhere(backend, console_script, nemorun_home, "prog-srv")
    status = trainer_status(backend, job)
    assert status is not None and status.get("progressPercentage", -1) >= 0, status
    metrics = {m["name"]: m["value"] for m in status["metrics"]}
    # The last write is the last step, unless the pod ended before its sender thread got it out (a loaded
    # machine: the end of training waits for it 10 s at most).
    assert metrics["total_steps"] == str(STEPS) and "loss" in metrics and "steps_per_second" in metrics, metrics
    logs = "\n".join(node_logs(job, "prog-srv", nodes=(0,)))
    assert "via status-server" in logs and "[nemo-kubeflow progress]" not in logs, logs[-2000:]
    done = [line.strip() for line in logs.splitlines() if "progress done:" in line]
    assert done and not done[0].endswith(" 0 to the status server"), done


@pytest.fixture()
def without_the_gate(backend, request):
    """A Trainer without the TrainJobStatus gate: the local back end's default; the real one's Trainer v2.3.0
    is restarted with the gate off for the test, and with it on again after (the other real tests need it)."""
    if backend.name != "real":
        yield backend
        return
    from controlplane.cluster import TRAINER_FEATURE_GATES

    with request.getfixturevalue("real_control_plane").trainer_feature_gates(
        {**TRAINER_FEATURE_GATES, "TrainJobStatus": False}
    ):
        yield backend


@pytest.mark.timeout(600)  # on the real stage, Trainer restarts before and after it
def test_progress_through_the_log_line_without_the_gate(without_the_gate, console_script, nemorun_home):
    """No status server offered: the pods get no status-server env, rank 0 chooses the log line by itself
    (no NEMO_KUBEFLOW_PROGRESS override), and status reads node 0's log."""
    backend = without_the_gate
    job = check_progress_everywhere(backend, console_script, nemorun_home, "prog-log")
    assert trainer_status(backend, job) is None  # nothing in the TrainJob: the log line carried it
    [jobset] = backend.objects("jobsets", owned_by=trainjob_of(job))
    pods = [r["template"]["spec"]["template"]["spec"] for r in jobset["spec"]["replicatedJobs"]]
    env = {e["name"] for pod in pods for c in pod["containers"] for e in c.get("env") or []}
    assert "PET_NNODES" in env and not any(name.startswith("KUBEFLOW_TRAINER_SERVER_") for name in env), sorted(env)
    logs = "\n".join(node_logs(job, "prog-log", nodes=(0,)))
    assert "via log" in logs and "[nemo-kubeflow progress] {" in logs, logs[-2000:]


def test_a_stall_is_no_new_step_when_progress_is_reported(backend, console_script, nemorun_home):
    """The job keeps printing but makes no step: log silence would never warn; progress does."""
    exp = launch(
        backend, "prog-stall", steps=1000, seconds_per_step=0.05, interval=1.0, hang_at=20, stall_warning_seconds=6
    )
    job = exp.jobs[0]
    desc = wait_for(
        lambda: "no new step for" in (d := create_scheduler("t").describe(app_id_of(job))).msg and d,
        "the stall warning",
        timeout=180,
    )
    # The last write was at most step 20 (the steps the interval held back before the hang are not written).
    assert desc.state == AppState.RUNNING and "rank 0 reported step " in desc.msg, desc.msg
    out = cli(console_script, nemorun_home, "nemo-kubeflow", "status", exp._id)
    assert "warning: no new step for" in out.stdout and " of 1000 (" in out.stdout, out.stdout
    create_scheduler("t").cancel(app_id_of(job))
