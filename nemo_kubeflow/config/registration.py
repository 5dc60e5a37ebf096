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

NeMo-Run launches an experiment's tasks one by one (``Experiment._run_dag``, a thread pool per level) and says
only "Launching job ..." for each: ``wrap_experiment_run`` tells our scheduler how many of ours the run submits
(``SUBMITTING``), so that a long submission says how far it is ("submitted 340/1000 tasks of experiment ...").

NeMo-Run applies a task's plugins (``exp.add(..., plugins=[...])``, ``run.run(..., plugins=...)``) in
``Experiment._add_single_job``: ``wrap_plugin_setup`` has config/plugins.py's ``apply`` run each one on a task of
ours, so that a plugin's Slurm-only part is mapped or refused rather than lost without a word.
"""

from __future__ import annotations

import contextvars
import functools
import threading
from contextlib import AbstractContextManager
from typing import Any, Optional, Protocol, runtime_checkable

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
    wrap_experiment_run(cls)
    wrap_plugin_setup(cls)


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


#: Experiments of fewer tasks of ours than this print no submission progress (NeMo-Run's line per task suffices).
PROGRESS_MIN_TASKS = 20


class Submissions:
    """How far an experiment's run has submitted its tasks of ours: a line at each tenth of them and at the last."""

    def __init__(self, title: str, total: int) -> None:
        self.title = title
        self.total = total
        self.done = 0
        self._lock = threading.Lock()

    def one_more(self) -> Optional[str]:
        """Count one task submitted; the progress line to print now, if any."""
        with self._lock:
            self.done += 1
            done = self.done
        if done % max(1, self.total // 10) and done != self.total:
            return None
        return f"submitted {done}/{self.total} tasks of experiment {self.title}"


#: The submissions of the experiment whose run the current thread (or one of its launch threads) is in.
SUBMITTING: contextvars.ContextVar[Optional[Submissions]] = contextvars.ContextVar(
    "nemo_kubeflow_submitting", default=None
)


def wrap_experiment_run(cls: type) -> None:
    """Wrap NeMo-Run's ``Experiment._run_dag`` (what ``exp.run()`` launches the tasks with): an experiment of at
    least ``PROGRESS_MIN_TASKS`` tasks of a registered class runs with ``SUBMITTING`` set, which its launch threads
    inherit (they copy the context it was called in). Idempotent."""
    from nemo_run.run.experiment import Experiment

    _PROGRESS_OF.add(cls)
    plain = Experiment._run_dag
    if getattr(plain, "submission_progress", False):
        return

    @functools.wraps(plain)
    def run_dag(self: Experiment, *args: Any, **kwargs: Any) -> Any:
        total = sum(isinstance(getattr(job, "executor", None), tuple(_PROGRESS_OF)) for job in self.jobs)
        if total < PROGRESS_MIN_TASKS:
            return plain(self, *args, **kwargs)
        token = SUBMITTING.set(Submissions(self._title, total))
        try:
            return plain(self, *args, **kwargs)
        finally:
            SUBMITTING.reset(token)

    run_dag.submission_progress = True  # type: ignore[attr-defined]
    Experiment._run_dag = run_dag


#: The executor classes whose tasks an experiment's submission progress counts.
_PROGRESS_OF: set[type] = set()


def wrap_plugin_setup(cls: type) -> None:
    """Wrap NeMo-Run's ``Experiment._add_single_job``: for a task whose executor is a registered class, the task
    is added without its plugins, then each plugin is assigned and set up on the task's clones, in order, as
    NeMo-Run does, through config/plugins.py's ``apply`` (which maps or refuses what the plugin did); a refusal
    takes the task out again. Any other task is added as it was. Idempotent."""
    from nemo_run.run.experiment import Experiment

    from nemo_kubeflow.config import plugins as applied

    _PLUGINS_OF.add(cls)
    plain = Experiment._add_single_job
    if getattr(plain, "plugins_applied", False):
        return

    @functools.wraps(plain)
    def add_single_job(self: Experiment, task: Any, executor: Any, *args: Any, **kwargs: Any) -> Any:
        plugins = kwargs.get("plugins")
        if not plugins or not isinstance(executor, tuple(_PLUGINS_OF)):
            return plain(self, task, executor, *args, **kwargs)
        job_id = plain(self, task, executor, *args, **{**kwargs, "plugins": None})
        job = self._jobs[-1]
        job.plugins = plugins
        try:
            for plugin in plugins:
                plugin.assign(self._id)
                applied.apply(plugin, job.task, job.executor)
        except BaseException:
            self._jobs.remove(job)
            raise
        return job_id

    add_single_job.plugins_applied = True  # type: ignore[attr-defined]
    Experiment._add_single_job = add_single_job


#: The executor classes whose tasks' plugins config/plugins.py applies.
_PLUGINS_OF: set[type] = set()
