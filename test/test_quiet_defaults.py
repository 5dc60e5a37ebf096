"""The first hour is quiet: torchelastic's INFO chatter is off by default (LOGLEVEL=WARNING unless the executor's
env_vars set it), and `nemo-kubeflow --help` shows no reStructuredText markup."""

import re

import nemo_run as run
import pytest
from torchx.specs import AppState, parse_app_handle

from nemo_kubeflow import ConfigMapPackager, KubeflowExecutor
from nemo_kubeflow.cli import main as console
from nemo_kubeflow.nemo_run.scheduler import create_scheduler


@pytest.mark.parametrize("env_vars, expected", [({}, "WARNING"), ({"LOGLEVEL": "INFO"}, "INFO")])
@pytest.mark.needs_torch
def test_torchelastic_is_quiet_unless_asked(local, tmp_path, env_vars, expected):
    (tmp_path / "say.py").write_text('import os\nprint("LOGLEVEL=" + os.environ["LOGLEVEL"], flush=True)\n')
    executor = KubeflowExecutor(
        container_image="python:3.11",
        nodes=1,
        nprocs_per_node=2,
        launcher="torchrun",
        shm_size=None,
        kubeconfig=str(local.kubeconfig_path),
        env_vars=dict(env_vars),
        packager=ConfigMapPackager(relative_path=str(tmp_path), include_pattern="say.py"),
    )
    with run.Experiment("quiet", executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(path=str(tmp_path / "say.py"), entrypoint="python"), name="quiet")
        exp.run(sequential=True)
    job = exp.jobs[0]
    assert exp.status(return_dict=True)[job.id]["status"] == AppState.SUCCEEDED
    lines = list(create_scheduler("t").log_iter(parse_app_handle(job.handle)[2], "quiet", 0))
    assert f"LOGLEVEL={expected}" in "\n".join(lines), lines
    # torchelastic's INFO records ("I1127 06:23:08.497000 31265 torch/distributed/..." or "[INFO]").
    chatter = [line for line in lines if "INFO" in line or re.match(r"I\d{4} \d\d:\d\d:\d\d", line)]
    if expected == "WARNING":
        assert chatter == [], lines
    else:
        assert chatter, lines  # as asked


def test_help_shows_no_rst_markup(capsys):
    with pytest.raises(SystemExit):
        console.main(["--help"])
    out = capsys.readouterr().out
    assert "``" not in out and "`nemo-kubeflow`: render" in out, out
