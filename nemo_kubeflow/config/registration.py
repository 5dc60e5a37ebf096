"""The one place that plugs our executor into NeMo-Run's closed registries, and tells our scheduler which of
its describes are an attached wait's.

NeMo-Run dispatches on the exact executor class in several module-level tables;
an unregistered executor fails with ``KeyError`` at dry run, an ``AssertionError``
on parallel runs and silently refuses to detach. The tables are imported by name
elsewhere in nemo_run, so they are mutated in place, never rebound.

NeMo-Run's attached wait (``wait_and_exit``, after ``exp.run()`` or in ``Experiment._wait_for_jobs``) is
torchx's ``Runner.wait``, a loop over ``Runner.status``, which calls the scheduler's ``describe``: the same
call a status query makes. ``wrap_runner_wait`` has ``Runner.wait`` tell a scheduler that takes attached waits
(``AttachedWaits``: ours) that the describes of the current thread are the wait's until it returns; those
looks repair (docs/architecture.md, "Repairs"), a status query's never do.
"""

from __future__ import annotations

import functools
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

from nemo_kubeflow.constants import SCHEDULER_NAME


def register_executor(cls: type, scheduler_name: str = SCHEDULER_NAME) -> None:
    """Register ``cls`` with NeMo-Run's scheduler mappings and Experiment capabilities, and wrap torchx's
    ``Runner.wait`` (``wrap_runner_wait``). Idempotent."""
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
    wrap_runner_wait()


@runtime_checkable
class AttachedWaits(Protocol):
    """A scheduler whose describes repair while torchx's ``Runner.wait`` polls them (nemo_run/scheduler.py)."""

    def attached_wait(self) -> AbstractContextManager[None]: ...


def wrap_runner_wait() -> None:
    """Wrap torchx's ``Runner.wait`` (NeMo-Run's ``Runner`` inherits it): for an app of a scheduler that takes
    attached waits, the wait runs inside that scheduler's ``attached_wait()``; any other wait runs as it was.
    Done when the executor is registered, before any wait of the process starts. Idempotent."""
    from torchx.runner.api import Runner

    plain = Runner.wait
    if getattr(plain, "attached_waits", False):
        return

    @functools.wraps(plain)
    def wait(self: Runner, app_handle: str, wait_interval: float = 10) -> Any:
        scheduler, _, _ = self._scheduler_app_id(app_handle, check_session=False)
        if not isinstance(scheduler, AttachedWaits):
            return plain(self, app_handle, wait_interval)
        with scheduler.attached_wait():
            return plain(self, app_handle, wait_interval)

    wait.attached_waits = True  # type: ignore[attr-defined]
    Runner.wait = wait
