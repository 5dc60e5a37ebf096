"""Megatron-Bridge's NeMo-Run plugins (``megatron.bridge.recipes.run_plugins``, the installed release) applied to
a ``KubeflowExecutor`` as its docs apply them to a ``SlurmExecutor``: each does its part on the cluster, or is
refused at ``exp.add`` before anything reaches it (config/plugins.py). On the `backend` fixture's back ends; the
pods run this machine's Python (3.12 in .ci/run's stage) and never import megatron.bridge: the plugins act on the
submitting side only. What each plugin does here: docs/frameworks.md, "Megatron-Bridge"."""

import hashlib
import json

import nemo_run as run
import pytest
from backends import app_id_of, logs, trainjob_of
from bridge_plugins import run_plugins, version
from torchx.specs import AppState

from nemo_kubeflow import ConfigMapPackager
from nemo_kubeflow.errors import ConfigError
from nemo_kubeflow.nemo_run.scheduler import create_scheduler

plugins = run_plugins()

#: The task: one gloo all-reduce over both nodes (a process group, as Megatron-Bridge's training forms), then
#: what it was given: its arguments (the plugins' overrides) and a digest of each credential it can read.
TRAIN = """\
import hashlib, os, sys
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
total = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(total)
digests = {k: hashlib.sha256(os.environ[k].encode()).hexdigest()[:12] for k in ("WANDB_API_KEY", "COMET_API_KEY")
           if k in os.environ}
print(f"bridge rank {dist.get_rank()} of {dist.get_world_size()}: sum {total.item():g}; args {sys.argv[1:]}; "
      f"keys {digests}", flush=True)
dist.destroy_process_group()
"""


def script_task(backend, tmp_path, **fields):
    (tmp_path / "train.py").write_text(TRAIN)
    executor = backend.executor(
        packager=ConfigMapPackager(relative_path=str(tmp_path), include_pattern="train.py"), **fields
    )
    return executor, run.Script(path=str(tmp_path / "train.py"), entrypoint="python")


def said(job) -> list[str]:
    """The ranks' lines, from ``bridge rank`` on, sorted."""
    lines = [line[line.index("bridge rank") :].strip() for line in logs(job, "train") if "bridge rank" in line]
    return sorted(lines)


def run_to_the_end(backend, tmp_path, title: str, task_plugins: list, **fields):
    executor, task = script_task(backend, tmp_path, **fields)
    with run.Experiment(title, executor=executor, log_level="WARN") as exp:
        exp.add(task, name="train", plugins=task_plugins)
        exp.run(sequential=True)
    job = exp.jobs[0]
    desc = create_scheduler("t").describe(app_id_of(job))
    assert desc.state == AppState.SUCCEEDED, (desc.msg, logs(job, "train")[-40:])
    return job


@pytest.mark.needs_torch
@pytest.mark.timeout(420)
def test_fault_tolerance_plugin_runs_the_2_node_script_under_ft_launcher_to_succeeded(backend, tmp_path):
    pytest.importorskip("nvidia_resiliency_ext", reason="ft_launcher: pip install -e '.[test]' (Python < 3.13)")
    plugin = plugins.FaultTolerancePlugin(
        num_in_job_restarts=1, num_job_retries_on_failure=0, initial_rank_heartbeat_timeout=120,
        rank_heartbeat_timeout=60,
    )  # fmt: skip
    job = run_to_the_end(backend, tmp_path, "mb-ft", [plugin])
    print(f"megatron-bridge {version()}: FaultTolerancePlugin -> {job.executor.launcher!r}")  # for the record
    # What the plugin set on the task's executor, as on Slurm: ft_launcher with its restarts and timeouts.
    assert isinstance(job.executor.launcher, run.FaultTolerance)
    assert (job.executor.launcher.max_restarts, job.executor.retries) == (1, 0)
    [trainjob] = [t for t in backend.objects("trainjobs") if t["metadata"]["name"] == trainjob_of(job)]
    [line] = [x for x in trainjob["spec"]["trainer"]["args"][0].splitlines() if x.startswith("exec ")]
    assert line.startswith("exec ft_launcher "), line
    assert (
        " --ft-initial_rank_heartbeat_timeout 120 --ft-rank_heartbeat_timeout 60 --max-restarts 1 --tee 3 "
        "/nemo_run/code/train.py ft.enable_ft_package=true ft.calc_ft_timeouts=true"
    ) in line, line
    # Both ranks in one group, under ft_launcher, with the plugin's hydra overrides as their arguments.
    overrides = ["ft.enable_ft_package=true", "ft.calc_ft_timeouts=true"]
    assert said(job) == [f"bridge rank {r} of 2: sum 3; args {overrides}; keys {{}}" for r in range(2)]


@pytest.mark.needs_torch
@pytest.mark.timeout(300)
def test_preemption_plugin_gives_the_pods_preempt_time_between_sigterm_and_sigkill(backend, tmp_path):
    job = run_to_the_end(backend, tmp_path, "mb-preempt", [plugins.PreemptionPlugin(preempt_time=45)])
    # On Slurm: SIGTERM 45 s before the time limit. Here every SIGTERM Kubernetes sends comes 45 s before SIGKILL.
    assert job.executor.termination_grace_period_seconds == 45
    pods = backend.objects("pods", trainjob_of(job))
    assert [p["spec"]["terminationGracePeriodSeconds"] for p in pods] == [45, 45], pods
    overrides = ["train.exit_signal_handler=True", "train.exit_signal_handler_for_dataloader=False"]
    assert said(job) == [f"bridge rank {r} of 2: sum 3; args {overrides}; keys {{}}" for r in range(2)]


def test_preemption_plugin_refused_when_the_grace_period_is_shorter_than_preempt_time(backend, tmp_path):
    executor, task = script_task(backend, tmp_path, termination_grace_period_seconds=30)
    with run.Experiment("mb-preempt-short", executor=executor, log_level="WARN") as exp:
        with pytest.raises(ConfigError) as refused:
            exp.add(task, name="train", plugins=[plugins.PreemptionPlugin(preempt_time=60)])
        assert exp.jobs == []
    assert str(refused.value) == (
        "plugin megatron.bridge.recipes.run_plugins.PreemptionPlugin cannot do its part on KubeflowExecutor:\n"
        "  - preempt_time=60 asks for 60 s between SIGTERM and the end, but the executor's "
        "termination_grace_period_seconds=30 kills the pods 30 s after SIGTERM: set "
        "termination_grace_period_seconds=60 (or more), or preempt_time=30\n"
        "(or leave PreemptionPlugin out of plugins=[...] for this executor)"
    )
    assert backend.objects("trainjobs") == []
    assert [c for c in backend.objects("configmaps") if not c["metadata"]["name"].startswith("kube-")] == []


def test_nsys_plugin_is_refused_before_anything_reaches_the_cluster(backend, tmp_path):
    executor, task = script_task(backend, tmp_path)
    with run.Experiment("mb-nsys", executor=executor, log_level="WARN") as exp:
        with pytest.raises(ConfigError, match=r"^plugin megatron\.bridge\.recipes\.run_plugins\.NsysPlugin ") as no:
            exp.add(task, name="train", plugins=[plugins.NsysPlugin(profile_step_start=1, profile_step_end=2)])
        assert exp.jobs == []
    assert "turned on nsys profiling (launcher.nsys_profile), which KubeflowExecutor does not run" in str(no.value)
    assert "Use PyTorchProfilerPlugin" in str(no.value)
    assert backend.objects("trainjobs") == []


def test_the_plugins_own_refusal_of_a_partial_reaches_the_user_and_adds_nothing(backend):
    executor = backend.executor()
    with run.Experiment("mb-partial", executor=executor, log_level="WARN") as exp:
        with pytest.raises(NotImplementedError, match="FaultTolerancePlugin is only supported for run.Script tasks"):
            exp.add(run.Partial(json.dumps, "hi"), name="train", plugins=[plugins.FaultTolerancePlugin()])
        assert exp.jobs == []


@pytest.mark.needs_torch
@pytest.mark.timeout(300)
def test_wandb_comet_and_profiler_plugins_send_their_keys_as_a_secret_and_their_overrides(
    backend, tmp_path, monkeypatch, nemorun_home
):
    keys = {"WANDB_API_KEY": "wandb-key-a1b2c3d4e5", "COMET_API_KEY": "comet-key-f6a7b8c9d0"}
    for name, value in keys.items():
        monkeypatch.setenv(name, value)
    task_plugins = [
        plugins.WandbPlugin(project="bridge", name="run1", save_dir="wandb-logs"),
        plugins.CometPlugin(project="bridge"),
        plugins.PyTorchProfilerPlugin(profile_step_start=1, profile_step_end=2),
    ]
    job = run_to_the_end(backend, tmp_path, "mb-loggers", task_plugins)
    # The keys reached the ranks...
    digests = {name: hashlib.sha256(value.encode()).hexdigest()[:12] for name, value in keys.items()}
    overrides = [
        "logger.wandb_project=bridge", "logger.wandb_exp_name=run1", "logger.wandb_save_dir=wandb-logs",
        "logger.comet_project=bridge",
        "profiling.use_pytorch_profiler=true", "profiling.profile_step_start=1", "profiling.profile_step_end=2",
        "profiling.profile_ranks=[0]", "profiling.record_memory_history=false",
        "profiling.memory_snapshot_path=snapshot.pickle", "profiling.record_shapes=false",
    ]  # fmt: skip
    assert said(job) == [f"bridge rank {r} of 2: sum 3; args {overrides}; keys {digests}" for r in range(2)]
    # ...through a Secret: not in the TrainJob, its ConfigMaps, nor the executor NeMo-Run saved.
    assert job.executor.env_vars == {} and job.executor.secret_env_vars == {k: f"env:{k}" for k in keys}
    [trainjob] = [t for t in backend.objects("trainjobs") if t["metadata"]["name"] == trainjob_of(job)]
    env = {e["name"]: e for e in trainjob["spec"]["trainer"]["env"]}
    assert all("valueFrom" in env[k] and "value" not in env[k] for k in keys), env
    stored = json.dumps([trainjob, backend.objects("configmaps", trainjob_of(job))])
    saved = "".join(p.read_text(errors="replace") for p in nemorun_home.rglob("*") if p.is_file())
    for value in keys.values():
        assert value not in stored and value not in saved
