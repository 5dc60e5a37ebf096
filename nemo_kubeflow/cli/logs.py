"""``nemo-kubeflow logs``: print, or follow, the logs of an experiment's tasks."""

from __future__ import annotations

import argparse
import functools
import sys
import threading
from typing import Any, Callable, Optional, Sequence

from nemo_kubeflow.cli.experiments import _experiment_tasks
from nemo_kubeflow.errors import ConfigError


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
    """The index of each task by the names ``--task`` takes: its index, and its name (which wins)."""
    return {str(index): index for index, *_ in tasks} | {job.id: index for index, job, *_ in tasks}


def cmd_logs(args: argparse.Namespace) -> int:
    """Print, or follow, the logs of an experiment's tasks: each line after ``<task>/<node>``, as
    ``nemo experiment logs`` prints it, from a process that leaves torch out (``_import_nemo_run``):
    about 470 MiB less than NeMo-Run's own command holds while it follows (benchmarks, `logs`)."""
    exp, scheduler, tasks = _experiment_tasks(args.experiment, "nemo-kubeflow-logs")
    streams = _log_streams(scheduler, _select_tasks(tasks, args.task))
    if not streams:
        raise ConfigError(f"experiment {exp._id}: no task of it has a TrainJob to read logs from")
    show = functools.partial(_print_log, scheduler, args.follow, threading.Lock())
    if not args.follow:
        for stream in streams:
            show(*stream)
        return 0
    _follow_logs(streams, show)
    return 0


def _log_streams(scheduler: Any, tasks: list) -> list[tuple[str, str, int]]:
    """(app id, role, node index) of each node of each task that has a TrainJob; why a task has none
    goes to stderr."""
    streams = []
    for index, job, app_id, why_not in tasks:
        streams += _task_streams(scheduler, index, job, app_id, why_not)
    return streams


def _task_streams(
    scheduler: Any, index: int, job: Any, app_id: Optional[str], why_not: str
) -> list[tuple[str, str, int]]:
    """The log streams of one task's nodes, or none, saying why on stderr (not ours, or no TrainJob)."""
    if app_id is None:
        print(f"Task {index}: {job.id}: {why_not}", file=sys.stderr)
        return []
    desc = scheduler.describe(app_id)
    if desc is None or not desc.roles:
        print(f"Task {index}: {job.id}: TrainJob {app_id.replace(':', '/')} not found", file=sys.stderr)
        return []
    # named after the task, as its TrainJob's role is (which a TrainJob cleaned up no longer tells)
    return [(app_id, job.id, k) for k in range(desc.roles[0].num_replicas)]


def _print_log(scheduler: Any, follow: bool, printing: threading.Lock, app_id: str, role: str, k: int) -> None:
    """Print the log of node ``k``, each line after NeMo-Run's prefix (the role cut to its last 10 characters);
    ``printing`` keeps the lines of different nodes whole."""
    prefix = f"{role[-10:]}/{k} "
    for line in scheduler.log_iter(app_id, role, k, should_tail=follow):
        with printing:
            sys.stdout.write(prefix + line)
            sys.stdout.flush()


def _follow_logs(streams: Sequence[tuple[str, str, int]], show: Callable[[str, str, int], None]) -> None:
    """``show`` each stream in a thread of its own until all end, as NeMo-Run follows them; the scheduler's
    log follower reads them all with a fixed number of connections (logs.LOG_READERS)."""
    threads = [
        threading.Thread(target=show, args=stream, daemon=True, name=f"follow-{stream[2]}") for stream in streams
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(0.5)  # wakes for Ctrl-C
