"""The failing rank's exception (type, message, last frame) reaches every status view: the attached run,
`exp.status()`/describe, `nemo experiment status` and `nemo-kubeflow status` in another process, for Partial,
Script and inline tasks, under torchrun and ft_launcher, raised before or after ``init_process_group`` (after it,
torch prefixes the exception's lines with its own ``[rank1]: ``)."""

import os
import subprocess
from pathlib import Path

import nemo_run as run
import pytest
import rank_failures
from torchx.specs import AppState, parse_app_handle

from nemo_kubeflow import ConfigMapPackager, KubeflowExecutor
from nemo_kubeflow.nemo_run.scheduler import create_scheduler

MESSAGE = "S3BOOM: rank 1 got a bad batch"
ERROR = f"ValueError: {MESSAGE}"
HERE = Path(__file__).parent
SCRIPT = """import os, time
if os.environ.get("RANK", "0") == os.environ.get("FAIL_RANK", "1"):
    raise ValueError("S3BOOM: rank 1 got a bad batch")
time.sleep(60)
"""


def describe(job):
    return create_scheduler("t").describe(parse_app_handle(job.handle)[2])


@pytest.mark.needs_torch
@pytest.mark.timeout(600)
def test_the_failing_ranks_exception_reaches_every_status(local, tmp_path, nemorun_home, console_script):
    (tmp_path / "boom.py").write_text(SCRIPT)
    base = KubeflowExecutor(
        container_image="python:3.11",
        nodes=2,
        nprocs_per_node=1,
        shm_size=None,
        launcher="torchrun",
        kubeconfig=str(local.kubeconfig_path),
        packager=ConfigMapPackager(relative_path=str(HERE), include_pattern="rank_failures.py"),
    )
    ft = base.clone()
    ft.launcher = "ft"
    script = base.clone()
    script.packager = ConfigMapPackager(relative_path=str(tmp_path), include_pattern="boom.py")
    inline = KubeflowExecutor(
        container_image="python:3.11",
        nodes=1,
        shm_size=None,
        env_vars={"FAIL_RANK": "0"},
        kubeconfig=str(local.kubeconfig_path),
    )
    with run.Experiment("s3boom", executor=base, log_level="WARN") as exp:
        exp.add(run.Partial(rank_failures.raise_on_rank, 1, MESSAGE), name="partial")
        exp.add(run.Partial(rank_failures.raise_on_rank, 1, MESSAGE), name="partialft", executor=ft)
        exp.add(run.Partial(rank_failures.raise_on_rank_after_init, 1, MESSAGE), name="afterinit")
        exp.add(run.Script(path=str(tmp_path / "boom.py"), entrypoint="python"), name="script", executor=script)
        exp.add(run.Script(inline=f"python3 -c '{SCRIPT}'"), name="inline", executor=inline)
        exp.run(sequential=False)
        exp_id = exp._id
    # ft_launcher's c10d rendezvous gives out the global ranks: rank 1 may be on either node.
    ft_node = "0" if "rank 1 on node 0" in describe(exp.jobs[1]).msg else "1"
    expected = {
        "partial": f"rank 1 on node 1: {ERROR}",
        "partialft": f"rank 1 on node {ft_node}: {ERROR}",
        "afterinit": f"rank 1 on node 1: {ERROR}",
        "script": f"rank 1 on node 1: {ERROR}",
        "inline": f"node 0: {ERROR}",
    }
    for job in exp.jobs:
        desc = describe(job)
        assert desc.state == AppState.FAILED, (job.id, desc.msg)
        assert desc.msg.startswith(expected[job.id]), (job.id, desc.msg)
        # The last frame is quoted (python -c has no source line to show: its file and line).
        frame = 'File "<string>", line 3' if job.id == "inline" else "raise ValueError("
        assert frame in desc.msg, (job.id, desc.msg)
    env = {**os.environ, "NEMORUN_HOME": str(nemorun_home), "COLUMNS": "400"}
    out = subprocess.run(
        [console_script("nemo-kubeflow"), "status", exp_id], env=env, capture_output=True, text=True, timeout=120
    )
    for headline in expected.values():
        assert f"why:   {headline}" in out.stdout, out.stdout
    out = subprocess.run(
        [console_script("nemo"), "experiment", "status", exp_id], env=env, capture_output=True, text=True, timeout=120
    )
    shown = " ".join((out.stdout + out.stderr).split())
    for headline in expected.values():
        assert f"failed: {headline}" in shown, shown[-4000:]
