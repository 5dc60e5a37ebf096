"""An experiment of many tasks says how far its submission is ("submitted 340/1000"); a small one does not."""

import re

import nemo_run as run

from nemo_kubeflow.config.registration import PROGRESS_MIN_TASKS

PROGRESS = re.compile(r"submitted (\d+)/(\d+) tasks of experiment (\S+)")


def _progress(capsys) -> list[tuple[int, int, str]]:
    """The progress lines as the user sees them: NeMo-Run's log handler (``configure_logging``) prints them."""
    out, err = capsys.readouterr()
    return sorted((int(m.group(1)), int(m.group(2)), m.group(3)) for m in PROGRESS.finditer(out + err))


def _submit(backend, title: str, tasks: int) -> None:
    with run.Experiment(title, executor=backend.executor(nodes=1), log_level="INFO") as exp:
        for i in range(tasks):
            exp.add(run.Script(inline="true"), name=f"t{i}")
        exp.run(detach=True)


def test_an_experiment_of_many_tasks_says_each_tenth_submitted(backend, capsys):
    _submit(backend, "many", PROGRESS_MIN_TASKS)
    assert _progress(capsys) == [(n, PROGRESS_MIN_TASKS, "many") for n in range(2, PROGRESS_MIN_TASKS + 1, 2)]
    assert len(backend.objects("trainjobs")) == PROGRESS_MIN_TASKS


def test_an_experiment_of_few_tasks_says_no_progress(backend, capsys):
    _submit(backend, "few", 3)
    assert _progress(capsys) == []
    assert len(backend.objects("trainjobs")) == 3
