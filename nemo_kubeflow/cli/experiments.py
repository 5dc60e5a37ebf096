"""What ``status``, ``watch`` and ``logs`` share: a NeMo-Run experiment's tasks, the app id of each one
launched on Kubeflow Trainer, and the exit code of their states."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from nemo_kubeflow.cli.nemo_run_import import _import_nemo_run
from nemo_kubeflow.errors import ConfigError


def _experiment_tasks(experiment_id: str, session: str):
    """The experiment, a scheduler, and each task as (index, job, app id or None, why not ours)."""
    exp = _load_experiment(experiment_id)  # imports NeMo-Run first, without torch
    from nemo_kubeflow.nemo_run.scheduler import create_scheduler

    scheduler = create_scheduler(session)
    # status and watch print each answer themselves, logs only the lines: NeMo-Run's console lines would say
    # each change a second time
    scheduler.says_in_console = False
    # (index, job, app id or None, why not)
    tasks: list[tuple[int, Any, Optional[str], str]] = [
        (index, job, *_app_id_of(job, scheduler.backend)) for index, job in enumerate(exp.jobs)
    ]
    return exp, scheduler, tasks


def _select_tasks(tasks: list, wanted: Optional[Sequence[str]]) -> list:
    """The tasks ``--task`` names (by index or by name), in the experiment's order; all without it."""
    if not wanted:
        return tasks
    names = _task_names(tasks)
    _check_task_names(wanted, names, tasks)
    chosen = {names[w] for w in wanted}
    return [task for task in tasks if task[0] in chosen]


def _check_task_names(wanted: Sequence[str], names: dict[str, int], tasks: list) -> None:
    """Refuse a ``--task`` that names no task, listing the tasks."""
    for name in wanted:
        if name not in names:
            choices = ", ".join(f"{index} ({job.id})" for index, job, *_ in tasks)
            raise ConfigError(f"--task {name}: the experiment has no such task; its tasks: {choices}")


def _task_names(tasks: list) -> dict[str, int]:
    """The index of each task by the names ``--task`` takes: its index, its TrainJob's name (as status names a
    task), and its name (which wins)."""
    trainjobs = {app_id.split(":", 1)[-1]: index for index, _, app_id, _ in tasks if app_id}
    return {str(index): index for index, *_ in tasks} | trainjobs | {job.id: index for index, job, *_ in tasks}


def _load_experiment(experiment_id: str):  # -> nemo_run.Experiment
    """The NeMo-Run experiment of that id, or a ``ConfigError`` saying where it was looked for."""
    run = _import_nemo_run()
    from nemo_run.run.experiment import Experiment

    try:
        exp = Experiment.from_id(experiment_id)
    except (AssertionError, FileNotFoundError, ValueError):
        exp = None
    if exp is None:
        raise ConfigError(
            f"no experiment {experiment_id!r} under {run.config.get_nemorun_home()}/experiments: "
            "give the id NeMo-Run printed (<title>_<number>), e.g. from `nemo experiment list <title>`"
        )
    return exp


def _app_id_of(job: Any, backend: str) -> tuple[Optional[str], str]:
    """(the app id of a task launched on Kubeflow Trainer, "") or (None, why it has none)."""
    from torchx.specs import parse_app_handle

    handle = getattr(job, "handle", "") or ""
    if not handle:
        return None, "not launched"
    scheduler_name, _, app_id = parse_app_handle(handle)
    if scheduler_name != backend:
        return None, f"run by {scheduler_name}, not by Kubeflow Trainer"
    return app_id, ""


def _exit_code(states: Sequence[Any]) -> int:
    """1 when a task failed, else 0 (``status``, ``watch``)."""
    return 1 if any(state.name == "FAILED" for state in states) else 0
