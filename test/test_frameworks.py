"""The framework tier (issue 38): training code no one here wrote, run as NeMo-Run users run it (``run.Partial``
of a function in a shipped module), on 2 nodes x 1 process, CPU and gloo, tiny models; status read from new
processes. The frameworks are the `test` extra's pins (pyproject.toml):

* PyTorch Lightning DDP with ``progress.lightning_callback()``: both back ends (the `real` param on the upstream
  control plane);
* transformers' ``Trainer``: one DDP group over the PET variables; its own ``KubeflowCallback`` read as step N of
  M through Trainer's status server (both back ends: the real one is Trainer v2.3.0's own status server), and
  ``progress.hf_callback()``'s log line;
* a loop shaped like Megatron-Bridge's ``train_step`` with ``progress.step_hook()`` on its ``on_train_step_end``;
* Lightning under ft_launcher (``run.FaultTolerance``): rank 1 SIGKILLed mid-run, the ranks restarted in the
  same pods, training resumed from ``last.ckpt``.

This module's local cluster runs Trainer's TrainJobStatus gate (as the real stage's Trainer does): the reporters
write ``status.trainerStatus`` unless a test forces the log line (``NEMO_KUBEFLOW_PROGRESS=log``).
The workloads are in framework_workloads.py."""

import os
import signal
import subprocess
import time

import framework_workloads
import nemo_run as run
import pytest
from backends import Backend, app_id_of, trainjob_of, wait_for
from backends import logs as node_logs
from torchx.specs import AppState

from nemo_kubeflow import ConfigMapPackager
from nemo_kubeflow.nemo_run.scheduler import create_scheduler
from nemo_kubeflow.observe import progress_view
from nemo_kubeflow_local import LocalCluster

pytestmark = pytest.mark.needs_torch

#: The pods import this checkout's progress module and the workloads (as test_progress.py's packager).
PACKAGER = dict(
    include_pattern=["nemo_kubeflow/__init__.py", "nemo_kubeflow/progress.py", "framework_workloads.py"],
    relative_path=["", "", "test"],
)
#: Slow steps until the test releases them (framework_workloads.py): a new process's status sees a running job;
#: a report a second at most.
SLOW_TASK = dict(interval=1.0, step_seconds=0.3)


def framework(module: str):
    return pytest.importorskip(module, reason=f"{module}: pip install -e '.[test]' (pyproject.toml pins it)")


@pytest.fixture(scope="module")
def local_cluster(tmp_path_factory):
    """This module's local cluster, with Trainer's TrainJobStatus gate on (the `backend` fixture's local one too)."""
    with LocalCluster(workdir=tmp_path_factory.mktemp("local-cluster"), feature_gates=("TrainJobStatus",)) as started:
        yield started


@pytest.fixture()
def on_local(local_cluster):
    """This module's local cluster in a namespace of the test's own (the scenarios that run on the local cluster
    only: the `backend` fixture's `real` param is for the Lightning and transformers ones)."""
    namespace = f"local-{len(local_cluster.objects('namespaces'))}"
    local_cluster.create_namespace(namespace)
    made = Backend(
        "local",
        str(local_cluster.kubeconfig_path),
        namespace,
        lambda resource: local_cluster.objects(resource, namespace),
    )
    yield made
    made.clean_up()


def executor(backend, **fields):
    return backend.executor(packager=ConfigMapPackager(**PACKAGER), **fields)


def status_cli(console_script, nemorun_home, exp_id: str) -> str:
    """``nemo-kubeflow status``, a new process that knows only the cluster."""
    env = {**os.environ, "NEMORUN_HOME": str(nemorun_home), "COLUMNS": "400"}
    out = subprocess.run(
        [console_script("nemo-kubeflow"), "status", exp_id], env=env, capture_output=True, text=True, timeout=180
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def running_progress(job, steps: int) -> str:
    """Wait for a new process's describe to show the running job at ``step N of <steps>`` with a rate."""
    desc = wait_for(
        lambda: (
            (d := create_scheduler("t").describe(app_id_of(job))).state == AppState.RUNNING
            and f" of {steps} (" in d.msg
            and "steps/s" in d.msg
            and d
        ),
        f"step N of {steps} in describe",
        timeout=240,
    )
    return desc.msg


def said(lines: list, start: str) -> list[str]:
    """What the pods said from ``start`` on, in each line holding it (after any launcher's prefix), sorted."""
    return sorted(line[line.index(start) :].strip() for line in lines if start in line)


def trainer_status(backend, job) -> dict:
    [trainjob] = [j for j in backend.objects("trainjobs") if j["metadata"]["name"] == trainjob_of(job)]
    return (trainjob.get("status") or {}).get("trainerStatus") or {}


def run_released(backend, name, function, steps, tmp_path, console_script, nemorun_home, task, **fields):
    """Submit ``run.Partial(function, steps=steps, release_file=..., **task)``, see its progress as ``step N of
    <steps>`` from new processes while it runs, release it, and wait for its end. Returns the job and what describe
    and ``nemo-kubeflow status`` showed."""
    release = tmp_path / "release"
    with run.Experiment(name, executor=executor(backend, **fields), log_level="WARN") as exp:
        exp.add(run.Partial(function, steps=steps, release_file=str(release), **task), name=name)
        exp.run(detach=True)
    job = exp.jobs[0]
    shown = running_progress(job, steps)
    out = status_cli(console_script, nemorun_home, exp._id)
    print(f"{name} on {backend.name}: describe: {shown}\n{out}")  # for the record (pytest -rP)
    release.touch()
    wait_for(lambda: create_scheduler("t").describe(app_id_of(job)).state == AppState.SUCCEEDED, "the end", 300)
    return job, shown, out


# ---------------------------------------------------------------- Lightning DDP, both back ends


@pytest.mark.timeout(600)
def test_lightning_ddp_2x1_reports_step_n_of_m_to_a_new_process(backend, console_script, nemorun_home, tmp_path):
    framework("pytorch_lightning")
    steps, function = 400, framework_workloads.lightning_ddp
    job, shown, out = run_released(
        backend, "fw-lightning", function, steps, tmp_path, console_script, nemorun_home, SLOW_TASK
    )
    assert "state: RUNNING" in out and f" of {steps} (" in out and "train_loss=" in out, out
    assert "ETA " in shown and "train_loss=" in shown, shown
    lines = node_logs(job, "fw-lightning")
    # One DDP group over the PET variables: Lightning found torchrun's environment, both nodes in one gloo group.
    ranks = said(lines, "lightning rank ")
    assert [(s.split(" (node ")[0], s.split("): ")[1]) for s in ranks] == [
        (
            f"lightning rank {rank} of 2",
            f"{steps} steps, process group gloo of 2, strategy DDPStrategy, environment TorchElasticEnvironment",
        )
        for rank in range(2)
    ], lines[-40:]
    assert sorted(s.split(" (node ")[1].split(")")[0] for s in ranks) == ["0", "1"], ranks
    status = trainer_status(backend, job)
    metrics = {m["name"]: m["value"] for m in status.get("metrics") or []}
    said_of_progress = [line for line in lines if "progress" in line][-5:]
    assert metrics.get("total_steps") == str(steps) and "train_loss" in metrics, (status, said_of_progress)


# ---------------------------------------------------------------- transformers


@pytest.mark.timeout(600)
def test_transformers_trainer_2x1_one_ddp_group_and_its_callback_reads_as_step_n_of_m(
    backend, console_script, nemorun_home, tmp_path
):
    """transformers' own KubeflowCallback (added by Trainer where the status server is offered) writes
    ``current_step``; status shows it as step N of M. ``progress.hf_callback()`` runs beside it on the log line."""
    framework("transformers")
    framework("accelerate")
    steps, function = 60, framework_workloads.hf_trainer
    # Its callback writes at most every 5 s: slower steps than the others'.
    task = dict(output_dir=str(tmp_path / "out"), step_seconds=1.5, ours=True)
    job, shown, out = run_released(
        backend,
        "fw-hf",
        function,
        steps,
        tmp_path,
        console_script,
        nemorun_home,
        task,
        env_vars={"NEMO_KUBEFLOW_PROGRESS": "log"},  # ours on the log line; transformers' on the status server
    )
    assert "% done" not in shown and "current_step" not in shown and "loss=" in shown, shown
    assert f" of {steps} (" in out and "current_step" not in out, out
    status = trainer_status(backend, job)
    assert status.get("progressPercentage") == 100, status  # transformers' last report, at the end of training
    lines = node_logs(job, "fw-hf")
    ranks = said(lines, "transformers rank ")
    assert [s.split(", callbacks")[0] for s in ranks] == [
        f"transformers rank {rank} of 2: {steps} steps, process group gloo of 2, model DistributedDataParallel"
        for rank in range(2)
    ], lines[-40:]
    assert all("KubeflowCallback" in s and "ProgressCallback" in s for s in ranks), ranks
    ours = progress_view.from_log_lines(line for line in lines if line.startswith("[node-0]"))
    assert ours is not None and ours.text().startswith(f"step {steps} of {steps} (100%), "), lines[-40:]
    assert "loss=" in ours.text() and "learning_rate=" in ours.text(), ours.text()


# ---------------------------------------------------------------- a Megatron-Bridge-shaped loop


def test_megatron_bridge_style_loop_with_the_step_hook_reports_step_n_of_m(
    on_local, console_script, nemorun_home, tmp_path
):
    backend = on_local
    steps, function = 500, framework_workloads.megatron_style
    job, shown, out = run_released(
        backend,
        "fw-mbridge",
        function,
        steps,
        tmp_path,
        console_script,
        nemorun_home,
        SLOW_TASK,
        env_vars={"NEMO_KUBEFLOW_PROGRESS": "log"},  # the log line: no feature of the cluster needed
    )
    assert "ETA " in shown and "lm loss=" in shown, shown
    assert f" of {steps} (" in out and "lm loss=" in out, out
    assert not trainer_status(backend, job), trainer_status(backend, job)
    lines = node_logs(job, "fw-mbridge")
    assert said(lines, "megatron-style rank ") == [
        f"megatron-style rank {rank} of 2: {steps} steps" for rank in range(2)
    ], lines[-40:]


# ---------------------------------------------------------------- Lightning under ft_launcher: kill, resume


@pytest.mark.timeout(600)
def test_lightning_under_ft_launcher_resumes_from_last_ckpt_after_rank_1_is_killed(on_local, tmp_path):
    backend = on_local
    framework("pytorch_lightning")
    framework("nvidia_resiliency_ext")
    pid_dir, checkpoints = tmp_path / "pids", tmp_path / "checkpoints"
    pid_dir.mkdir()

    def pid_files():  # the ranks' pid files, oldest first (the pods run on this machine, as processes)
        return sorted(pid_dir.glob("rank*.pid"), key=lambda p: p.stat().st_mtime_ns)

    fault_tolerance = run.FaultTolerance(max_restarts=2, initial_rank_heartbeat_timeout=120, rank_heartbeat_timeout=60)
    task = run.Partial(
        framework_workloads.lightning_fault_tolerant,
        steps=60,
        checkpoint_dir=str(checkpoints),
        pid_dir=str(pid_dir),
        step_seconds=0.3,
    )
    with run.Experiment(
        "fw-lightning-ft", executor=executor(backend, launcher=fault_tolerance), log_level="WARN"
    ) as exp:
        exp.add(task, name="train")
        exp.run(detach=True)
    job = exp.jobs[0]
    wait_for(lambda: (checkpoints / "last.ckpt").exists(), "Lightning's first last.ckpt", timeout=240)
    first = wait_for(lambda: len(pid_files()) == 2 and pid_files(), "both ranks to start", timeout=60)
    pods_before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in backend.objects("pods", trainjob_of(job))}
    victim = next(p for p in first if p.name.startswith("rank1-"))
    killed_at = time.monotonic()
    os.kill(int(victim.read_text()), signal.SIGKILL)
    wait_for(lambda: len(pid_files()) == 4, "every rank to start again", timeout=240)
    print(f"in-job restart: both ranks training again {time.monotonic() - killed_at:.1f} s after the SIGKILL")
    final = wait_for(
        lambda: (
            (d := create_scheduler("t").describe(app_id_of(job))).state in (AppState.SUCCEEDED, AppState.FAILED) and d
        ),
        "the end",
        timeout=300,
    )
    lines = node_logs(job, "train")
    assert final.state == AppState.SUCCEEDED, (final.msg, lines[-60:])
    # The same pods, never restarted: ft_launcher restarted the ranks inside them.
    pods = backend.objects("pods", trainjob_of(job))
    assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods} == pods_before
    assert all(s["restartCount"] == 0 for p in pods for s in p["status"]["containerStatuses"]), pods
    text = "\n".join(lines)
    assert "Worker group FAILED. 2/2 attempts left; will restart worker group" in text, lines[-60:]
    resumed = [line for line in lines if f"resuming from {checkpoints / 'last.ckpt'}" in line]
    assert len(resumed) == 2, lines[-60:]  # both ranks, after the restart
    assert [s for s in said(lines, "lightning rank ") if " finished at step " in s] == [
        f"lightning rank {rank} finished at step 60" for rank in range(2)
    ], lines[-60:]
