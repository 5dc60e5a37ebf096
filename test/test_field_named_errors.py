"""Every refusal names the field the user set and the fix: no KeyError, AttributeError, TypeError or
ValueError from deep inside NeMo-Run, fiddle or the standard library."""

import nemo_run as run
import pytest

from nemo_kubeflow import ConfigError, KubeflowExecutor
from nemo_kubeflow.cli import main as console


def dry_run(executor, name="probe", task_name="probe"):
    with run.Experiment(name, executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(inline="echo hi"), name=task_name)
        exp.dryrun(delete_exp_dir=True)


@pytest.mark.parametrize(
    "fields, named, fix",
    [
        ({"launcher": "torchrum"}, "launcher='torchrum'", "did you mean 'torchrun'"),
        (
            {"initializer_settings": {}},
            "initializer_settings: expected InitializerSettings(...), got dict ({})",
            "leave it None",
        ),
        ({"workspace_mount_path": "/"}, "workspace_mount_path='/'", "e.g. '/nemo_run'"),
        ({"workspace_mount_path": "/a/../b"}, "workspace_mount_path='/a/../b'", "absolute path, normalized"),
    ],
)
def test_a_bad_field_is_refused_by_name(fields, named, fix):
    with pytest.raises(ConfigError) as err:
        dry_run(KubeflowExecutor(container_image="python:3.11", **fields))
    assert named in str(err.value) and fix in str(err.value), str(err.value)


def test_a_nul_in_the_task_name_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"task name 'a\\x00b': contains a NUL character"):
        dry_run(KubeflowExecutor(container_image="python:3.11"), task_name="a\0b")


@pytest.mark.parametrize(
    "override, named",
    [
        ("worker_preload=Config(x)", "--set worker_preload=Config(x): worker_preload: cannot build the executor"),
        ("packager.max_shards={}", "ConfigMapPackager.max_shards must be an integer of at least 1, not {}"),
        ("launcher=torchrum", "launcher='torchrum': not a NeMo-Run launcher"),
        ("initializer_settings={}", "initializer_settings: expected InitializerSettings(...), got dict"),
        ("workspace_mount_path=/", "workspace_mount_path='/': must be an absolute path, normalized and other than '/'"),
    ],
)
def test_render_refuses_a_bad_override_by_name(override, named, capsys):
    code = console.main(["render", "--factory", "kubeflow_cpu", "--set", override, "--", "python", "train.py"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("nemo-kubeflow: error: ") and named in err, err
    assert "Traceback" not in err
