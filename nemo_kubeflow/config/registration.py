"""The one place that plugs our executor into NeMo-Run's closed registries.

NeMo-Run dispatches on the exact executor class in several module-level tables;
an unregistered executor fails with ``KeyError`` at dry run, an ``AssertionError``
on parallel runs and silently refuses to detach. The tables are imported by name
elsewhere in nemo_run, so they are mutated in place, never rebound.
"""

from __future__ import annotations

from nemo_kubeflow.constants import SCHEDULER_NAME


def register_executor(cls: type, scheduler_name: str = SCHEDULER_NAME) -> None:
    """Register ``cls`` with NeMo-Run's scheduler mappings and Experiment capabilities. Idempotent."""
    from nemo_run.run.experiment import Experiment
    from nemo_run.run.torchx_backend.schedulers import api

    api.EXECUTOR_MAPPING[cls] = scheduler_name
    api.REVERSE_EXECUTOR_MAPPING[scheduler_name] = cls
    # Parallel and detached runs are safe: the scheduler's memory of an app (app_watch.py) only adds to
    # what the cluster and the app record tell any process.
    # Not added: _DEPENDENCY_SUPPORTED_EXECUTORS (Slurm-only semantics) and
    # _RUNNER_DEPENDENT_EXECUTORS (waits use a fresh runner, which is what we want).
    for attr in ("_PARALLEL_SUPPORTED_EXECUTORS", "_DETACH_SUPPORTED_EXECUTORS"):
        supported = getattr(Experiment, attr)
        if cls not in supported:
            setattr(Experiment, attr, tuple(supported) + (cls,))
