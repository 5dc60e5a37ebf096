"""The dry-run summary names a manifests directory only where it will still exist: NeMo-Run's `exp.dryrun()`
removes the experiment directory when it returns, unless called with `delete_exp_dir=False`."""

import re
from pathlib import Path

import nemo_run as run

from nemo_kubeflow import KubeflowExecutor


def printed(capsys) -> str:
    """The output without rich's wrapping and its "file.py:line" column, spaces removed (rich wraps long paths
    anywhere)."""
    return "".join(re.sub(r"\S+\.py:\d+", " ", capsys.readouterr().out).split())


def squeeze(text: str) -> str:
    return "".join(text.split())


def dry_run(title: str, **dryrun_args) -> Path:
    executor = KubeflowExecutor(container_image="python:3.11", nodes=1, kubeconfig="/nonexistent/kubeconfig")
    with run.Experiment(title, executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(inline="echo hi"), name="task")
        exp.dryrun(**dryrun_args)
        return Path(exp._exp_dir)


def test_the_default_dry_run_does_not_name_a_directory_it_removes(capsys):
    exp_dir = dry_run("dry-removed")
    out = printed(capsys)
    assert not exp_dir.exists()
    assert "manifestswrittento" not in out and squeeze(str(exp_dir)) not in out, out
    assert (
        squeeze(
            "manifests: not kept, exp.dryrun() removes the experiment directory when it returns; keep them "
            "with exp.dryrun(delete_exp_dir=False), or write them anywhere with nemo-kubeflow render "
            "--out DIR"
        )
        in out
    ), out


def test_a_dry_run_that_keeps_the_directory_says_where_the_manifests_are(capsys):
    exp_dir = dry_run("dry-kept", delete_exp_dir=False)
    manifests = exp_dir / "task" / "manifests"
    out = printed(capsys)
    assert squeeze(f"manifests written to {manifests}") in out, out
    assert "notkept" not in out
    assert any(p.suffix == ".yaml" for p in manifests.iterdir())


def test_run_with_dryrun_removes_it_too_and_says_so(capsys):
    executor = KubeflowExecutor(container_image="python:3.11", nodes=1)
    run.run(run.Script(inline="echo hi"), executor=executor, name="dry-run-run", dryrun=True)
    out = printed(capsys)
    assert "manifestswrittento" not in out and squeeze("manifests: not kept") in out, out
