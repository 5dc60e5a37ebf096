"""``nemo-kubeflow status``: what each task of an experiment is doing, and why it failed."""

from __future__ import annotations

import argparse

from nemo_kubeflow.cli.experiments import _exit_code, _experiment_tasks, _select_tasks


def cmd_status(args: argparse.Namespace) -> int:
    """Each task of an experiment (those ``--task`` names): its TrainJob, state and why (the reason NeMo-Run's
    status omits)."""
    exp, scheduler, tasks = _experiment_tasks(args.experiment, "nemo-kubeflow-status")
    print(f"Experiment {exp._id}")
    states = []
    for index, job, app_id, why_not in _select_tasks(tasks, args.task):
        if app_id is None:
            print(f"Task {index}: {job.id}: {why_not}")
            continue
        desc = scheduler.describe(app_id)
        namespace, name = app_id.split(":", 1)
        print(f"Task {index}: {job.id} (TrainJob {namespace}/{name})")
        print(f"  state: {desc.state.name}")
        if desc.msg:
            print("  why:   " + desc.msg.replace("\n", "\n         "))
        states.append(desc.state)
    return _exit_code(states)
