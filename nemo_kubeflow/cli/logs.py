"""``nemo-kubeflow logs``: print, or follow, the logs of an experiment's tasks."""

from __future__ import annotations

import argparse
import functools
import queue
import sys
import threading
from typing import Any, Callable, Optional, Sequence

from torchx.specs import is_terminal

from nemo_kubeflow.cli.experiments import _experiment_tasks, _select_tasks
from nemo_kubeflow.errors import ConfigError

#: Node logs followed at once with ``--follow``: each holds a thread here and a reader of its job's log follower
#: (``log_follower.JobLogFollower``). The other nodes are followed as those end (their whole log then: no line
#: lost, none twice), and stderr says so.
FOLLOWED_AT_ONCE = 4


def cmd_logs(args: argparse.Namespace) -> int:
    """Print, or follow, the logs of an experiment's tasks: each line after ``<task>/<node>``, as
    ``nemo experiment logs`` prints it, from a process that leaves torch out (``_import_nemo_run``):
    about 470 MiB less than NeMo-Run's own command holds while it follows (benchmarks, `logs`). With ``--follow``,
    the tasks over are followed one after another (following keeps each node's log next to its job), then the others,
    ``FOLLOWED_AT_ONCE`` nodes at a time."""
    exp, scheduler, tasks = _experiment_tasks(args.experiment, "nemo-kubeflow-logs")
    streams = _log_streams(scheduler, _select_tasks(tasks, args.task))
    if not streams:
        raise ConfigError(f"experiment {exp._id}: no task of it has a TrainJob to read logs from")
    show = functools.partial(_print_log, scheduler, threading.Lock())
    # Followed, the tasks over too: following keeps each node's log next to its job (``log_iter``).
    for app_id, role, k, ended in streams:
        if ended or not args.follow:
            show(app_id, role, k, args.follow)
    _follow_logs([(app_id, role, k, True) for app_id, role, k, ended in streams if not ended and args.follow], show)
    return 0


def _log_streams(scheduler: Any, tasks: list) -> list[tuple[str, str, int, bool]]:
    """(app id, role, node index, whether the task is over) of each node of each task that has a TrainJob; why a
    task has none goes to stderr."""
    streams = []
    for index, job, app_id, why_not in tasks:
        streams += _task_streams(scheduler, index, job, app_id, why_not)
    return streams


def _task_streams(
    scheduler: Any, index: int, job: Any, app_id: Optional[str], why_not: str
) -> list[tuple[str, str, int, bool]]:
    """The log streams of one task's nodes, or none, saying why on stderr (not ours, or no TrainJob)."""
    if app_id is None:
        print(f"Task {index}: {job.id}: {why_not}", file=sys.stderr)
        return []
    desc = scheduler.describe(app_id)
    if desc is None or not desc.roles:
        print(f"Task {index}: {job.id}: TrainJob {app_id.replace(':', '/')} not found", file=sys.stderr)
        return []
    # named after the task, as its TrainJob's role is (which a TrainJob cleaned up no longer tells)
    return [(app_id, job.id, k, is_terminal(desc.state)) for k in range(desc.roles[0].num_replicas)]


def _print_log(scheduler: Any, printing: threading.Lock, app_id: str, role: str, k: int, follow: bool) -> None:
    """Print the log of node ``k``, each line after NeMo-Run's prefix (the role cut to its last 10 characters);
    ``printing`` keeps the lines of different nodes whole."""
    prefix = f"{role[-10:]}/{k} "
    for line in scheduler.log_iter(app_id, role, k, should_tail=follow):
        with printing:
            sys.stdout.write(prefix + line)
            sys.stdout.flush()


def _follow_logs(streams: Sequence[tuple[str, str, int, bool]], show: Callable[..., None]) -> None:
    """``show`` each stream until all end, ``FOLLOWED_AT_ONCE`` at a time (threads that take the next stream when
    theirs ends), as NeMo-Run follows them; the scheduler's log follower reads each with its readers."""
    if len(streams) > FOLLOWED_AT_ONCE:
        print(
            f"following {FOLLOWED_AT_ONCE} of {len(streams)} node logs at once; each of the others is printed "
            "whole, then followed, when one of those ends",
            file=sys.stderr,
        )
    waiting: queue.SimpleQueue = queue.SimpleQueue()
    for stream in streams:
        waiting.put(stream)

    def follow_next() -> None:
        while True:
            try:
                stream = waiting.get_nowait()
            except queue.Empty:
                return
            show(*stream)

    threads = [
        threading.Thread(target=follow_next, daemon=True, name=f"follow-{i}")
        for i in range(min(FOLLOWED_AT_ONCE, len(streams)))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(0.5)  # wakes for Ctrl-C
