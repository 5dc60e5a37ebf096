"""A cancel asked for a job that already finished: say so, and how to remove what it left.

NeMo-Run's ``Experiment.cancel`` (and ``nemo experiment cancel``) calls torchx's
``Runner.cancel``, which describes the app first and calls the scheduler's cancel only when
the app is not in a terminal state. For a finished job nothing is deleted and nothing is said,
although its TrainJob, ConfigMaps, Secret and pods stay on the cluster (until ``gc``, or
``gc --expired`` once its ``ttl_seconds_after_finished`` has passed).

The scheduler cannot see this from its cancel, which is never called. It can see the two ends
of it, through public hooks, without patching NeMo-Run or torchx:

* its ``describe`` (which ``Runner.cancel`` calls first) notes the state it reported
  (``note_described``), and its ``_cancel_existing`` notes a cancel it carried out
  (``note_cancelled``);
* torchx records an event for every Runner call on its events logger (a ``logging`` logger)
  when the call ends; a handler there (``watch_cancels``) sees ``api="cancel"`` for one of our
  apps and prints the message when the last description was finished and no cancel ran.
"""

from __future__ import annotations

import logging
import shlex
import threading
from typing import Optional

from torchx.specs import AppState

from nemo_kubeflow.cluster import records
from nemo_kubeflow.constants import EXPERIMENT_LABEL, SCHEDULER_NAME
from nemo_kubeflow.observe.status import job_status

#: torchx.runner.events: ``log_event`` records one JSON event per Runner call on this logger
#: (destination "null"); torchx leaves its level unset, so INFO records need it set.
TORCHX_EVENTS_LOGGER = "torchx-events-null"

_lock = threading.Lock()
#: app id -> (state name, experiment label) of the last description; only finished TrainJobs.
_finished: dict[str, tuple[str, str]] = {}
#: app ids whose cancel this process carried out since their last cancel event.
_cancelled: set[str] = set()
_handler: Optional[logging.Handler] = None


def note_described(app_id: str, trainjob: Optional[dict]) -> None:
    """What ``describe`` just read for ``app_id`` (``None``: the TrainJob does not exist)."""
    finished = _finished_as(trainjob)
    with _lock:
        if finished is None:
            _finished.pop(app_id, None)
        else:
            _finished[app_id] = finished


def _finished_as(trainjob: Optional[dict]) -> Optional[tuple[str, str]]:
    """(state name, experiment label) of a finished TrainJob; ``None`` for one not finished, or none."""
    if trainjob is None:
        return None
    state = job_status(trainjob).state
    if state not in (AppState.SUCCEEDED, AppState.FAILED):
        return None
    labels = (trainjob.get("metadata") or {}).get("labels") or {}
    return state.name, labels.get(EXPERIMENT_LABEL, "")


def note_cancelled(app_id: str) -> None:
    with _lock:
        _cancelled.add(app_id)


def finished_cancel_message(app_id: str, state: str, experiment: str) -> str:
    """What to tell a user who cancelled a finished job."""
    namespace, name = records.parse_app_id(app_id)
    gc = shlex.join(_gc_argv(namespace, experiment, records.load(namespace, name)))
    scope = "the finished jobs of this experiment" if experiment else "every finished job of the namespace"
    return (
        f"TrainJob {namespace}/{name} already finished ({state}), so cancel deleted nothing: the TrainJob, its "
        "ConfigMaps, Secret and pods stay on the cluster. "
        f"Remove them with `{gc}` ({scope}; add --dry-run to list them first) or "
        f"`kubectl delete trainjob {name} -n {namespace}`. With the executor's ttl_seconds_after_finished, "
        "`nemo-kubeflow gc --expired` run on a schedule removes later jobs once it has passed."
    )


def _gc_argv(namespace: str, experiment: str, record: Optional[records.AppRecord]) -> list[str]:
    """The ``nemo-kubeflow gc`` that removes the finished jobs of ``experiment`` (every one without it), on
    the cluster the job's app ``record`` names."""
    argv = ["nemo-kubeflow", "gc", "--namespace", namespace]
    argv += ["--experiment", experiment] if experiment else ["--finished"]
    if record is None:
        return argv
    for flag, value in (("--kubeconfig", record.kubeconfig), ("--context", record.context)):
        if value:
            argv += [flag, value]
    return argv


class _CancelEvents(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            _on_event(record.getMessage())
        except Exception:  # noqa: BLE001 - a message must never break a cancel
            self.handleError(record)


def _on_event(message: str) -> None:
    """A torchx event: after a cancel of one of our apps that found the job finished (so cancelled nothing),
    say so, and how to remove what it left."""
    from torchx.runner.events.api import TorchxEvent

    event = TorchxEvent.deserialize(message)
    if event.api != "cancel" or event.scheduler != SCHEDULER_NAME or not event.app_id or event.raw_exception:
        return
    cancelled, finished = _take_notes(event.app_id)
    if cancelled or finished is None:
        return
    from nemo_run.core.frontend.console.api import CONSOLE
    from rich.markup import escape

    CONSOLE.log(escape(finished_cancel_message(event.app_id, *finished)), highlight=False)


def _take_notes(app_id: str) -> tuple[bool, Optional[tuple[str, str]]]:
    """What was noted about ``app_id`` since its last cancel event, cleared: whether this process cancelled
    it, and how it finished (``note_described``)."""
    with _lock:
        cancelled = app_id in _cancelled
        _cancelled.discard(app_id)
        return cancelled, _finished.pop(app_id, None)


def watch_cancels() -> None:
    """Install the handler on torchx's events logger (once per process)."""
    global _handler
    with _lock:
        if _handler is not None:
            return
        _handler = _CancelEvents(level=logging.INFO)
    events = logging.getLogger(TORCHX_EVENTS_LOGGER)
    if events.level == logging.NOTSET or events.level > logging.INFO:
        events.setLevel(logging.INFO)
    events.propagate = False  # as torchx sets it: events are not log lines
    events.addHandler(_handler)
