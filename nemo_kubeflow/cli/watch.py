"""``nemo-kubeflow watch``: look after an experiment's running tasks until they finish, repairing as an
attached run would."""

from __future__ import annotations

import argparse
import time
from typing import Any

from nemo_kubeflow.cli.experiments import _exit_code, _experiment_tasks
from nemo_kubeflow.errors import ConfigError


def cmd_watch(args: argparse.Namespace) -> int:
    """Look at an experiment's tasks until they finish, printing each change of state or reason, and apply
    the repairs each look recommends (repair/steps.py: move a job off a node that failed it, delete a job
    that can never start, keep the node logs of a failed one), printing each; so this keeps a detached job
    looked after with no `nemo experiment run` attached. A status query only reads."""
    from torchx.specs import is_terminal

    exp, scheduler, tasks = _experiment_tasks(args.experiment, "nemo-kubeflow-watch")
    ours = _launched(tasks)
    if not ours:
        raise ConfigError(f"experiment {exp._id} has no task launched on Kubeflow Trainer: nothing to watch")
    print(f"Watching experiment {exp._id} (every {args.interval:g}s; Ctrl-C stops watching, not the jobs)", flush=True)
    shown: dict[int, str] = {}
    while True:
        states = [_look_after_task(scheduler, index, job, app_id, shown) for index, job, app_id in ours]
        if all(is_terminal(state) for state in states):
            return _exit_code(states)
        time.sleep(args.interval)


def _launched(tasks: list) -> list[tuple[int, Any, str]]:
    """(index, job, app id) of the tasks launched on Kubeflow Trainer."""
    return [(index, job, app_id) for index, job, app_id, _ in tasks if app_id is not None]


def _look_after_task(scheduler: Any, index: int, job: Any, app_id: str, shown: dict[int, str]) -> Any:
    """One look at a task (``watch``): print the repairs it made and its state line when that changed
    (``shown``: the last line printed per task); its state."""
    desc, repaired = scheduler.look_after(app_id)
    for what in repaired:
        print(f"{time.strftime('%H:%M:%S')} Task {index}: {job.id}: repaired: {what}", flush=True)
    line = desc.state.name + (f": {desc.msg}" if desc.msg else "")
    if shown.get(index) != line:
        shown[index] = line
        print(f"{time.strftime('%H:%M:%S')} Task {index}: {job.id}: {line}", flush=True)
    return desc.state
