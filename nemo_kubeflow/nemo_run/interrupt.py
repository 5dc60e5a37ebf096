"""Ctrl-C while NeMo-Run submits or waits for Kubeflow jobs.

NeMo-Run waits for jobs in worker threads (``Experiment._wait_for_jobs`` runs ``runner.wait``, a
loop over our ``describe``, in a ``ThreadPoolExecutor``), and submits in worker threads too. A
Ctrl-C raises ``KeyboardInterrupt`` in the main thread only: leaving the pool joins its threads,
which keep polling a job that runs for hours, and the interpreter joins them again at exit, so
the process never ends. And a Ctrl-C while the main thread waits for a submission thread skips
``Experiment._save_jobs``: the TrainJob runs, and NeMo-Run's records have no handle for it.

``install`` (called by the scheduler from the main thread, during the dry run that precedes every
run) replaces Python's default SIGINT handler, and only that one (a program's own handler stays):

* During a submission, the first Ctrl-C lets the submission finish (so that NeMo-Run records the
  job) and says so; the wait then stops at once, as below.
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
_pending = False
_presses = 0


def install() -> None:
    """Handle SIGINT as the module docstring says; a no-op outside the main thread, or when the
    program has its own handler."""
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
    global _pending, _presses
    with _lock:
        now = time.monotonic()
        waited = sorted(app for app, seen in _watched.items() if now - seen < WATCH_WINDOW_S)
        submitting = sorted(_submitting.values())
        if not (submitting or waited or _pending or _presses):
            raise KeyboardInterrupt
        _presses += 1
        if _presses >= 2:
            where = (" The submission of " + ", ".join(submitting) + " was cut short: a TrainJob left suspended "
                     "never runs; delete it with kubectl delete trainjob <name>.") if submitting else \
                " The jobs keep running on the cluster."
            _say(f"\nSecond Ctrl-C: exiting now.{where}")
            try:
                sys.stdout.flush()
            finally:
                os._exit(EXIT_CODE)
        if submitting:
            _pending = True
            _say("\nCtrl-C: finishing the submission of " + ", ".join(submitting) + " first, so that NeMo-Run "
                 "records the job; waiting stops right after. Press Ctrl-C again to exit at once.")
            return
        for app in waited:
            _stop[app] = now + STOP_WINDOW_S
    _save_experiment()
    for app in waited:
        _tell(app)
    raise KeyboardInterrupt


@contextmanager
def submitting(name: str) -> Iterator[None]:
    """Mark a submission in progress (``name``: ``namespace/trainjob``)."""
    global _presses, _pending
    key = threading.get_ident()
    with _lock:
        if not _submitting and not _pending:
            _presses = 0  # a new run: a Ctrl-C of an earlier one is forgotten
        _submitting[key] = name
    try:
        yield
    finally:
        with _lock:
            _submitting.pop(key, None)


def submitted(app_id: str) -> None:
    """A submission finished: if Ctrl-C came during it, say so, and stop the wait for it."""
    global _pending
    with _lock:
        if not _pending:
            return
        _stop[app_id] = time.monotonic() + STOP_WINDOW_S
        if not _submitting:
            _pending = False
    namespace, name = records.parse_app_id(app_id)
    _say(f"Ctrl-C came during the submission of TrainJob {namespace}/{name}: the submission was completed, "
         "so NeMo-Run has a record of the job; it is not waited for.")


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
        handle = getattr(job, "handle", "") or ""
        try:
            if handle and parse_app_handle(handle)[2] == app_id:
                return index, job.id
        except Exception:  # noqa: BLE001 - a handle of another scheduler
            continue
    return None, ""


def follow_up(app_id: str) -> str:
    """How to follow, reconnect to and cancel a job that is no longer waited for."""
    namespace, name = records.parse_app_id(app_id)
    exp = _experiment()
    exp_id = getattr(exp, "_id", None) or "<experiment id>"
    index, task = _task_of(exp, app_id) if exp is not None else (None, "")
    idx = "<task index>" if index is None else str(index)
    task = task or "<task>"
    return "\n".join([
        f"Ctrl-C: stopped waiting for TrainJob {namespace}/{name}; it keeps running on the cluster.",
        f"  follow its logs:  nemo experiment logs {exp_id} {idx}",
        f"  its status:       nemo experiment status {exp_id}   (why it failed: nemo-kubeflow status {exp_id})",
        f"  cancel it:        nemo experiment cancel {exp_id} {idx}",
        f'  from Python:      exp = run.Experiment.from_id("{exp_id}"); exp.logs("{task}"); exp.cancel("{task}")',
        "Press Ctrl-C again to exit at once.",
    ])


def _tell(app_id: str) -> None:
    with _lock:
        if app_id in _told:
            return
        _told.add(app_id)
    _say("\n" + follow_up(app_id))
