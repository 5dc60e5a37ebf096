"""Ctrl-C while NeMo-Run submits or waits for Kubeflow jobs.

NeMo-Run waits for jobs in worker threads (``Experiment._wait_for_jobs`` runs ``runner.wait``, a
loop over our ``describe``, in a ``ThreadPoolExecutor``), and submits in worker threads too. A
Ctrl-C raises ``KeyboardInterrupt`` in the main thread only: leaving the pool joins its threads,
which keep polling a job that runs for hours, and the interpreter joins them again at exit, so
the process never ends. And a Ctrl-C while the main thread waits for a submission thread skips
``Experiment._save_jobs``: the TrainJob runs, and NeMo-Run's records have no handle for it.

``install`` (called by the scheduler from the main thread, during the dry run that precedes every
run) replaces Python's default SIGINT handler, and only that one (a program's own handler stays):

* During a submission, the first Ctrl-C stops it. The TrainJob is created suspended and resumed
  last (cluster/submit.py): before the resume, what the submission had created is deleted (nothing
  ran) and ``KeyboardInterrupt`` ends the program; once resumed the job runs, so it is recorded in
  NeMo-Run's records, how to cancel it is said, and ``KeyboardInterrupt`` ends the program. A request
  under way is not cut: its answer says what exists.
* While jobs are waited for, the first Ctrl-C saves NeMo-Run's records of the experiment, says how
  to follow, reconnect to or cancel each job (which keeps running), and raises
  ``KeyboardInterrupt``; the waiting threads stop at their next poll (``check_wait``).
* A second Ctrl-C exits at once (exit code 130).
* Anywhere else, Ctrl-C raises ``KeyboardInterrupt`` as usual.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from typing import Iterator, Optional

from torchx.specs import parse_app_handle

from nemo_kubeflow.cluster import records
from nemo_kubeflow.cluster.kinds import kubectl_delete
from nemo_kubeflow.constants import TRAINJOB_KIND

#: A job counts as waited for while its status was polled from a worker thread this recently (NeMo-Run
#: polls every 2 s).
WATCH_WINDOW_S = 10.0
#: How long a stopped wait stays stopped: later status calls of the same job answer again.
STOP_WINDOW_S = 30.0
EXIT_CODE = 130

_lock = threading.RLock()
_submitting: dict[int, str] = {}
_watched: dict[str, float] = {}
_stop: dict[str, float] = {}
_told: set[str] = set()
#: A Ctrl-C came during a submission: submissions stop (``stop_requested``) until the next run.
_stop_submissions = False
_presses = 0


def install() -> None:
    """Handle SIGINT as the module docstring says; a no-op outside the main thread, or when the
    program has its own handler. Called by the dry run that starts every run: a Ctrl-C that stopped
    the submissions of an earlier run (which the program caught) does not stop this one's."""
    global _stop_submissions
    with _lock:
        if not _submitting:
            _stop_submissions = False
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_sigint)


def _say(text: str) -> None:
    try:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
    except (OSError, RuntimeError, ValueError):  # a write interrupted mid-way, or a closed stream
        pass


def _on_sigint(signum: int, frame: object) -> None:
    global _presses
    with _lock:
        now = time.monotonic()
        waited = _waited(now)
        submitting = sorted(_submitting.values())
        if not (submitting or waited or _stop_submissions or _presses):
            raise KeyboardInterrupt
        _presses += 1
        if _presses >= 2:
            _exit_now(submitting)
        if submitting:
            _stop_the_submissions(submitting)
            return
        for app in waited:
            _stop[app] = now + STOP_WINDOW_S
    _save_experiment()
    for app in waited:
        _tell(app)
    raise KeyboardInterrupt


def _stop_the_submissions(submitting: list[str]) -> None:
    """The first Ctrl-C during submissions: they stop before their next write (``stop_requested``)."""
    global _stop_submissions
    _stop_submissions = True
    _say(
        "\nCtrl-C: stopping the submission of " + ", ".join(submitting) + " (a request under way is "
        "answered first): what it created is deleted, unless its job has started already. Press Ctrl-C "
        "again to exit at once."
    )


def _waited(now: float) -> list[str]:
    """The apps whose status a worker thread polled within ``WATCH_WINDOW_S``: those being waited for."""
    return sorted(app for app, seen in _watched.items() if now - seen < WATCH_WINDOW_S)


def _exit_now(submitting: list[str]) -> None:
    """The second Ctrl-C: exit at once, saying what a submission cut short leaves (or that the jobs run on)."""
    where = (
        (
            " The submission of " + ", ".join(submitting) + " was cut short: a TrainJob left suspended "
            "never runs; delete it with kubectl delete trainjob <name>."
        )
        if submitting
        else " The jobs keep running on the cluster."
    )
    _say(f"\nSecond Ctrl-C: exiting now.{where}")
    try:
        sys.stdout.flush()
    finally:
        os._exit(EXIT_CODE)


@contextmanager
def submitting(name: str) -> Iterator[None]:
    """Mark a submission in progress (``name``: ``namespace/trainjob``)."""
    global _presses
    key = threading.get_ident()
    with _lock:
        if not _submitting and not _stop_submissions:
            _presses = 0  # a new run: a Ctrl-C of an earlier one is forgotten
        _submitting[key] = name
    try:
        yield
    finally:
        with _lock:
            _submitting.pop(key, None)


def stop_requested() -> bool:
    """Whether a Ctrl-C asked the submissions under way to stop (``submit``'s ``stop``)."""
    return _stop_submissions


def stopped(error: BaseException) -> None:
    """A submission stopped by Ctrl-C before its job started: say so, and what is left if its removal failed."""
    notes = " ".join(getattr(error, "__notes__", None) or [])
    _say(f"Ctrl-C: {error}; " + (notes or "what it had created was deleted, nothing ran on the cluster."))


def submitted(app_id: str, handle: str, job_dir: str) -> None:
    """A submission finished (its job runs). If a Ctrl-C came during it: record the job in NeMo-Run's
    records of the experiment (under ``handle``, as the launch would have), say that it runs and how to
    cancel it, and raise ``KeyboardInterrupt``: the Ctrl-C stops the program."""
    with _lock:
        if not _stop_submissions:
            return
        _stop[app_id] = time.monotonic() + STOP_WINDOW_S  # and a wait for it stops
    namespace, name = records.parse_app_id(app_id)
    exp = _experiment()
    lines = [f"Ctrl-C came after TrainJob {namespace}/{name} had started: the job runs on the cluster."]
    if _record_launch(exp, handle, job_dir):
        lines += _nemo_commands(exp, app_id)
    lines.append(
        f"  or delete it:     {kubectl_delete(TRAINJOB_KIND, name, namespace)}   (its ConfigMaps and Secret go with it)"
    )
    _say("\n".join(lines))
    raise KeyboardInterrupt(f"TrainJob {namespace}/{name} was submitted; Ctrl-C stopped the program")


def _nemo_commands(exp, app_id: str) -> list[str]:
    """How to cancel and follow the experiment's task of ``app_id`` with NeMo-Run's commands (none when the
    experiment has no id or no such task)."""
    exp_id = getattr(exp, "_id", None)
    index, _ = _task_of(exp, app_id)
    if not exp_id or index is None:
        return []
    return [
        f"  cancel it:        nemo experiment cancel {exp_id} {index}",
        f"  follow its logs:  nemo experiment logs {exp_id} {index}",
    ]


def _record_launch(exp, handle: str, job_dir: str) -> bool:
    """Give the experiment's task of ``job_dir`` the handle NeMo-Run's launch would have given it, and save the
    experiment's records: the ``KeyboardInterrupt`` that follows skips both."""
    if exp is None:
        return False
    try:
        from torchx.specs import AppState

        job = next(j for j in exp.jobs if getattr(getattr(j, "executor", None), "job_dir", None) == job_dir)
        job.handle, job.launched, job.state = handle, True, AppState.SUBMITTED
        exp._save_jobs()
        return True
    except Exception as e:  # noqa: BLE001 - NeMo-Run internals: without them, the kubectl command alone
        _say(f"(could not record the job in the experiment's records: {type(e).__name__}: {e})")
        return False


def check_wait(app_id: str, terminal: bool) -> None:
    """Called by ``describe``: note that ``app_id`` is waited for, or stop the wait after a Ctrl-C
    (raise ``KeyboardInterrupt`` in the waiting thread)."""
    if threading.current_thread() is threading.main_thread():
        return
    with _lock:
        if terminal:
            _watched.pop(app_id, None)
            return
        # Every poll within the window stops: NeMo-Run's status table (which swallows the exception)
        # may poll before the wait does.
        deadline = _stop.get(app_id)
        if deadline is None or time.monotonic() > deadline:
            _stop.pop(app_id, None)
            _watched[app_id] = time.monotonic()
            return
        _watched.pop(app_id, None)
    _save_experiment()
    _tell(app_id)
    raise KeyboardInterrupt(f"stopped waiting for {app_id} (Ctrl-C)")


def _experiment():  # -> Optional[nemo_run.Experiment]
    try:
        from nemo_run.run.experiment import _current_experiment

        return _current_experiment.get(None)
    except Exception:  # noqa: BLE001 - NeMo-Run internals: without them, generic advice
        return None


def _save_experiment() -> None:
    """Write NeMo-Run's records of the running experiment now: a ``KeyboardInterrupt`` skips the
    ``_save_jobs`` that ``Experiment.run`` does after its waits, and then its jobs have no handle."""
    exp = _experiment()
    if exp is None:
        return
    try:
        exp._save_jobs()
    except Exception as e:  # noqa: BLE001 - a record we cannot write must not hide the Ctrl-C
        _say(f"(could not save the experiment's records: {e})")


def _task_of(exp, app_id: str) -> tuple[Optional[int], str]:
    for index, job in enumerate(getattr(exp, "jobs", None) or []):
        if _app_id_of(getattr(job, "handle", "") or "") == app_id:
            return index, job.id
    return None, ""


def _app_id_of(handle: str) -> Optional[str]:
    """The app id of a task's handle; ``None`` for no handle, or one of another scheduler's form."""
    try:
        return parse_app_handle(handle)[2] if handle else None
    except Exception:  # noqa: BLE001 - a handle of another scheduler
        return None


def follow_up(app_id: str) -> str:
    """How to follow, reconnect to and cancel a job that is no longer waited for."""
    namespace, name = records.parse_app_id(app_id)
    exp = _experiment()
    exp_id = getattr(exp, "_id", None) or "<experiment id>"
    index, task = _task_of(exp, app_id) if exp is not None else (None, "")
    idx = "<task index>" if index is None else str(index)
    task = task or "<task>"
    return "\n".join(
        [
            f"Ctrl-C: stopped waiting for TrainJob {namespace}/{name}; it keeps running on the cluster.",
            f"  follow its logs:  nemo experiment logs {exp_id} {idx}",
            f"  its status:       nemo experiment status {exp_id}   (why it failed: nemo-kubeflow status {exp_id})",
            f"  cancel it:        nemo experiment cancel {exp_id} {idx}",
            f'  from Python:      exp = run.Experiment.from_id("{exp_id}"); exp.logs("{task}"); exp.cancel("{task}")',
            "Press Ctrl-C again to exit at once.",
        ]
    )


def _tell(app_id: str) -> None:
    with _lock:
        if app_id in _told:
            return
        _told.add(app_id)
    _say("\n" + follow_up(app_id))
