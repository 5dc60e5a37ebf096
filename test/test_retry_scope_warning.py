"""`retries` with a launcher that turns every rank failure into exit 1 (torchrun, ft_launcher): exit 1 fails the
job at once by default (`fail_fast_exit_codes=[1]`), so `retries` alone never retries a failed rank. The
submission says so, once, with what will and will not be retried and how to change it."""

import re

import nemo_run as run
import pytest

from nemo_kubeflow import KubeflowExecutor
from nemo_kubeflow.nemo_run import scheduler


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch):
    monkeypatch.setattr(scheduler, "_warned", set())  # the warning is once per process


def printed(capfd) -> str:
    """What the dry runs printed, without rich's wrapping and its "file.py:line" column (spaces removed)."""
    out, err = capfd.readouterr()
    return "".join(re.sub(r"\S+\.py:\d+", " ", out + err).split())


def squeeze(text: str) -> str:
    return "".join(text.split())


def warnings_of(capfd, **executor_fields) -> list[str]:
    """The retry warnings two dry runs of two tasks with the same settings printed, spaces removed."""
    executor = KubeflowExecutor(container_image="python:3.11", nodes=2, nprocs_per_node=2, **executor_fields)
    capfd.readouterr()
    for task in ("first", "second"):
        run.run(run.Script(inline="python train.py"), executor=executor.clone(), name=task, dryrun=True)
    return re.findall(r"retries=\d+with.*?failure-classes-user-errors-fail-fast", printed(capfd))


def test_retries_with_torchrun_say_once_that_a_failed_rank_is_not_retried(capfd):
    [warning] = warnings_of(capfd, retries=1, launcher="torchrun")
    assert warning.startswith(
        squeeze(
            "retries=1 with torchrun: when a rank fails, torchrun exits 1, which "
            "fail_fast_exit_codes=[1] counts as a user error: the job fails at once, "
            "no retry."
        )
    )
    assert squeeze("only for pod disruptions (eviction, preemption, a lost node)") in warning
    assert squeeze("set fail_fast_exit_codes=[]") in warning


def test_retries_with_ft_launcher_say_it_too(capfd):
    [warning] = warnings_of(capfd, retries=2, launcher="ft")
    assert warning.startswith(squeeze("retries=2 with ft_launcher: when a rank fails, ft_launcher exits 1"))


@pytest.mark.parametrize(
    "fields",
    [
        dict(retries=1, launcher="torchrun", fail_fast_exit_codes=[]),  # rank failures restart the gang
        dict(retries=1, launcher="torchrun", fail_fast_exit_codes=[3]),
        dict(retries=0, launcher="torchrun"),  # nothing is retried anyway
    ],
    ids=["no-fail-fast", "exit-1-not-fail-fast", "no-retries"],
)
def test_no_warning_where_retries_do_what_they_say(capfd, fields):
    assert warnings_of(capfd, **fields) == []


def test_no_warning_without_a_launcher(capfd):
    executor = KubeflowExecutor(container_image="python:3.11", nodes=1, retries=1)
    capfd.readouterr()
    run.run(run.Script(inline="python train.py"), executor=executor, name="plain", dryrun=True)
    assert "fail_fast_exit_codes" not in printed(capfd)
