"""Any NeMo-Run plugin on a KubeflowExecutor (config/plugins.py): a Slurm-only setting it leaves on our executor,
or an nsys profile, is refused at ``exp.add`` naming the plugin; a credential it copies from this environment into
``env_vars`` goes in ``secret_env_vars``; a plugin that does its part is applied as NeMo-Run applies it. The
plugins here are written as Slurm-minded plugins are (Megatron-Bridge's own: test/megatron_bridge/, Python 3.12).
Nothing reaches a cluster: plugins run when the task is added."""

from dataclasses import dataclass

import nemo_run as run
import pytest

from nemo_kubeflow import KubeflowExecutor
from nemo_kubeflow.errors import ConfigError


@dataclass(kw_only=True)
class SignalPlugin(run.Plugin):
    """Sets Slurm's ``signal`` on whatever executor it gets, without checking its class."""

    preempt_time: int = 60

    def setup(self, task, executor):
        executor.signal = f"TERM@{self.preempt_time}"


@dataclass(kw_only=True)
class TokenPlugin(run.Plugin):
    """Copies a token and a plain setting from this environment into the executor's ``env_vars``."""

    def setup(self, task, executor):
        import os

        executor.env_vars["HF_TOKEN"] = os.environ["HF_TOKEN"]
        executor.env_vars["TRAIN_MODE"] = "fast"
        task.args.append("--tokened")


@dataclass(kw_only=True)
class NsysOnPlugin(run.Plugin):
    def setup(self, task, executor):
        executor.get_launcher().nsys_profile = True


def add(*plugins, **fields):
    executor = KubeflowExecutor(container_image="python:3.11", **fields)
    with run.Experiment("plugins", executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(inline="echo hi"), name="train", plugins=list(plugins))
    return exp


def test_a_slurm_setting_left_on_our_executor_is_refused_naming_the_plugin_and_the_attribute():
    with pytest.raises(ConfigError) as refused:
        add(SignalPlugin(preempt_time=90))
    assert str(refused.value) == (
        f"plugin {__name__}.SignalPlugin cannot do its part on KubeflowExecutor:\n"
        "  - it set executor.signal='TERM@90', which KubeflowExecutor does not have (a setting of another executor, "
        "e.g. SlurmExecutor's): it would do nothing here. Use the KubeflowExecutor field that does the same, if any "
        "(docs/executor.md)\n"
        "(or leave SignalPlugin out of plugins=[...] for this executor)"
    )


def test_a_refused_plugin_leaves_no_task_in_the_experiment():
    executor = KubeflowExecutor(container_image="python:3.11")
    with run.Experiment("plugins", executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(inline="echo first"), name="first")
        with pytest.raises(ConfigError, match="NsysOnPlugin cannot do its part"):
            exp.add(run.Script(inline="echo hi"), name="train", plugins=[NsysOnPlugin()])
        assert [job.id for job in exp.jobs] == ["first"]


def test_a_credential_copied_from_this_environment_is_sent_as_a_secret(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefghijklmnop")
    plugin = TokenPlugin()
    exp = add(plugin)
    [job] = exp.jobs
    assert job.executor.env_vars == {"TRAIN_MODE": "fast"}
    assert job.executor.secret_env_vars == {"HF_TOKEN": "env:HF_TOKEN"}
    assert job.task.args == ["--tokened"]
    assert job.plugins == [plugin] and plugin.experiment_id == exp._id
    job.executor.validate()


def test_a_credential_already_sent_from_a_secret_is_not_sent_twice(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefghijklmnop")
    [job] = add(TokenPlugin(), secret_key_refs={"HF_TOKEN": "hf/token"}).jobs
    assert (job.executor.env_vars, job.executor.secret_env_vars) == ({"TRAIN_MODE": "fast"}, {})
    job.executor.validate()


def test_another_executor_gets_the_plugin_as_nemo_run_applies_it():
    executor = run.LocalExecutor()
    with run.Experiment("plugins", executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(inline="echo hi"), name="train", plugins=[SignalPlugin(preempt_time=90)])
    assert exp.jobs[0].executor.signal == "TERM@90"
