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
PACKAGER = dict(include_pattern=["nemo_kubeflow/__init__.py", "nemo_kubeflow/progress.py", "progress_workload.py"],
                relative_path=["", "", "test"])


def cli(console_script, nemorun_home, tool, *args, timeout=180):
    env = {**os.environ, "NEMORUN_HOME": str(nemorun_home), "COLUMNS": "400"}
    return subprocess.run([console_script(tool), *args], env=env, capture_output=True, text=True, timeout=timeout)


def launch(backend, name, steps, seconds_per_step, interval, hang_at=0, **executor):
    executor = backend.executor(packager=ConfigMapPackager(**PACKAGER), **executor)
    with run.Experiment(name, executor=executor, log_level="WARN") as exp:
        exp.add(run.Partial(progress_workload.train, steps=steps, seconds_per_step=seconds_per_step,
                            interval=interval, hang_at=hang_at), name=name)
        exp.run(detach=True)
    return exp


def trainer_status(backend, job):
    [trainjob] = [j for j in backend.objects("trainjobs") if j["metadata"]["name"] == trainjob_of(job)]
    return (trainjob.get("status") or {}).get("trainerStatus")


def check_progress_everywhere(backend, console_script, nemorun_home, name, **executor):
    """A running job's progress in describe, `nemo-kubeflow status` and `nemo experiment status` (new
    processes, which know only the cluster), then `nemo-kubeflow watch` to its end. Returns the job."""
    exp = launch(backend, name, steps=400, seconds_per_step=0.15, interval=1.0, **executor)
    job, steps = exp.jobs[0], 400
    desc = wait_for(lambda: (d := create_scheduler("t").describe(app_id_of(job))).state == AppState.RUNNING
                    and f" of {steps} (" in d.msg and "ETA " in d.msg and d, "progress with an ETA in describe",
                    timeout=180)
    assert "steps/s" in desc.msg and "ETA " in desc.msg and "loss=" in desc.msg, desc.msg

    out = cli(console_script, nemorun_home, "nemo-kubeflow", "status", exp._id)
    assert out.returncode == 0, out.stderr
    assert "state: RUNNING" in out.stdout and f" of {steps} (" in out.stdout and "ETA " in out.stdout, out.stdout

    out = cli(console_script, nemorun_home, "nemo", "experiment", "status", exp._id)
    shown = " ".join((out.stdout + out.stderr).split())
    assert "running: step " in shown and f" of {steps} (" in shown and "loss=" in shown, shown[-3000:]

    out = cli(console_script, nemorun_home, "nemo-kubeflow", "watch", exp._id, "--interval", "2", timeout=280)
    assert out.returncode == 0, out.stdout + out.stderr
    running = [line for line in out.stdout.splitlines() if ": RUNNING: step " in line]
    assert running and "ETA " in running[-1], out.stdout
    assert "SUCCEEDED" in out.stdout.splitlines()[-1], out.stdout
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
    assert metrics["total_steps"] == "400" and "loss" in metrics and "steps_per_second" in metrics, metrics
    logs = "\n".join(node_logs(job, "prog-srv", nodes=(0,)))
    assert "via status-server" in logs and "[nemo-kubeflow progress]" not in logs, logs[-2000:]
    done = [line.strip() for line in logs.splitlines() if "progress done:" in line]
    assert done and not done[0].endswith(" 0 to the status server"), done


def test_progress_through_the_log_line_without_the_gate(backend, console_script, nemorun_home):
    """No status server offered (the local cluster without the gate; on the real stage, which runs with it,
    the pods choose the log line with NEMO_KUBEFLOW_PROGRESS=log): status reads node 0's log."""
    env = {"NEMO_KUBEFLOW_PROGRESS": "log"} if backend.name == "real" else {}
    job = check_progress_everywhere(backend, console_script, nemorun_home, "prog-log", env_vars=env)
    assert trainer_status(backend, job) is None  # nothing in the TrainJob: the log line carried it
    logs = "\n".join(node_logs(job, "prog-log", nodes=(0,)))
    assert "via log" in logs and "[nemo-kubeflow progress] {" in logs, logs[-2000:]


def test_a_stall_is_no_new_step_when_progress_is_reported(backend, console_script, nemorun_home):
    """The job keeps printing but makes no step: log silence would never warn; progress does."""
    exp = launch(backend, "prog-stall", steps=1000, seconds_per_step=0.05, interval=1.0, hang_at=20,
                 stall_warning_seconds=6)
    job = exp.jobs[0]
    desc = wait_for(lambda: "no new step for" in (d := create_scheduler("t").describe(app_id_of(job))).msg and d,
                    "the stall warning", timeout=180)
    # The last write was at most step 20 (the steps the interval held back before the hang are not written).
    assert desc.state == AppState.RUNNING and "rank 0 reported step " in desc.msg, desc.msg
    out = cli(console_script, nemorun_home, "nemo-kubeflow", "status", exp._id)
    assert "warning: no new step for" in out.stdout and " of 1000 (" in out.stdout, out.stdout
    create_scheduler("t").cancel(app_id_of(job))
