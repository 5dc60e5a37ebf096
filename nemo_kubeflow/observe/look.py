"""The look at one job: its state and why, and the repairs it recommends, from what it reads (GETs, LISTs and
log reads only; docs/architecture.md, "The describe path").

``look_at`` is what ``describe`` (nemo_run/scheduler.py) shows for a TrainJob the scheduler has just read: it
reads what else the state needs (Kueue's Workloads while queued, the pods and events of a job that waits or
failed, the JobSet and the pods not running of a running one, node logs for restarts and stalls) and says why,
with what this process remembers of the app (``LookMemory``); for a job not over, whether it keeps failing on
the same nodes (``node_faults.assess``). A new failure or waiting message is written here
or in the module of its source (``pod_states``, ``events``, ``rank_failure``, ``restarts``); the scheduler only
maps the ``Observation`` to torchx's answer.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Iterable, Optional

from torchx.specs import AppState, is_terminal

from nemo_kubeflow.cluster import records
from nemo_kubeflow.cluster.client import ClusterReader
from nemo_kubeflow.cluster.experiment_snapshot import one_of_many
from nemo_kubeflow.cluster.kinds import kubectl_delete
from nemo_kubeflow.constants import TASK_LABEL, TRAINER_NODE, TRAINJOB_KIND, queue_name
from nemo_kubeflow.errors import ClusterError
from nemo_kubeflow.observe import progress_view
from nemo_kubeflow.observe.look_memory import LookMemory
from nemo_kubeflow.observe.observation import DELETE_UNSTARTABLE, KEEP_NODE_LOGS, Observation, RepairAction
from nemo_kubeflow.observe.status import (
    job_status,
    owned_workload,
    queue_place,
    queue_wait_message,
    running_for_at_least,
    stall_message,
)

if TYPE_CHECKING:
    from nemo_kubeflow.observe.job_view import JobView
    from nemo_kubeflow.observe.restarts import Restarts

# diagnosis, logs and node faults are imported where they are used: a submission never needs them (bench_imports).

log = logging.getLogger(__name__)

#: Reads of every node's last lines for the cause of an ft_launcher restart counted in node 0's lines: at the
#: look that counts it and, if the cause was not there yet, at a later look (each read is a log read per node).
IN_JOB_CAUSE_READS = 2
#: The later read waits this long after the first: the failing node logs its worker's end before the other agents
#: restart, but its kubelet may serve that line a moment after node 0's (a loaded node), and looks may come quickly.
IN_JOB_CAUSE_AGAIN_S = 3.0


@dataclass
class Look:
    """What one look at app ``app_id`` (TrainJob ``namespace/name``) has found so far: its state and why, its
    pods where they were read (at most once per look), and the repairs it needs."""

    app_id: str
    namespace: str
    name: str
    state: AppState
    message: str
    nodes: int
    role: str
    #: The TrainJob as read (None: it does not exist).
    trainjob: Optional[dict] = None
    view: Optional[JobView] = None
    actions: list[RepairAction] = field(default_factory=list)
    notes: tuple[str, ...] = ()
    unread: str = ""

    def observation(self) -> Observation:
        return Observation(
            self.app_id,
            self.state,
            self.message,
            self.nodes,
            self.role,
            trainjob=self.trainjob,
            actions=tuple(self.actions),
            notes=self.notes,
            unread=self.unread,
        )


def look_at(
    app_id: str,
    trainjob: Optional[dict],
    cluster: ClusterReader,
    record: Optional[records.AppRecord],
    watch: LookMemory,
    *,
    keeps_logs: bool = True,
) -> Look:
    """The job's state and why, and the repairs it needs, given its TrainJob as just read (None: it does not
    exist): GETs and LISTs (and log reads) only. With ``keeps_logs`` (a look that repairs: the attached wait,
    ``nemo-kubeflow watch``), a running job's node logs are kept from its second look on; a status query
    (NeMo-Run's describes each job twice) does not start following them."""
    namespace, name = records.parse_app_id(app_id)
    nodes, role = nodes_of(trainjob, record), role_for(trainjob, record, watch)
    if trainjob is None:
        state, message = _gone(app_id, record, watch)
        return Look(app_id, namespace, name, state, message, nodes, role)
    status = job_status(trainjob, name=f"{namespace}/{name}")
    found = Look(app_id, namespace, name, status.state, status.message, nodes, role, trainjob=trainjob)
    if is_terminal(status.state):
        # Why it ended is read from the API server, once: each watch is a stream of its own, so the pods' last
        # changes may not have reached the held copies when the TrainJob's verdict did.
        cluster = getattr(cluster, "server_reader", cluster)
    _diagnose(found, cluster, record, watch, trainjob, nodes, keeps_logs)
    if not is_terminal(found.state):
        _assess_nodes(found, cluster, watch, trainjob)
    return found


def unknown(app_id: str, record: Optional[records.AppRecord], watch: LookMemory, message: str) -> Observation:
    """What a look that could not read says: UNKNOWN, and why (never a state it could not read)."""
    return Observation(app_id, AppState.UNKNOWN, message, nodes_of(None, record), role_for(None, record, watch))


def _gone(app_id: str, record: Optional[records.AppRecord], watch: LookMemory) -> tuple[AppState, str]:
    """A job whose TrainJob no longer exists: the fatal error a repair deleted it for, else why it is gone."""
    if record is not None and record.outcome_state:
        # A repair deleted it after a fatal error: keep reporting that error.
        return AppState[record.outcome_state], record.outcome_message
    namespace, name = records.parse_app_id(app_id)
    status = job_status(None, name=f"{namespace}/{name}")
    return status.state, _gone_message(app_id, watch, status.message)


def _diagnose(
    look: Look,
    cluster: ClusterReader,
    record: Optional[records.AppRecord],
    watch: LookMemory,
    trainjob: dict,
    nodes: int,
    keeps_logs: bool = True,
) -> None:
    """Say in ``look`` why the job is in its state, reading its pods (``look.view``) where that tells more."""
    waiting = look.state in (AppState.SUBMITTED, AppState.PENDING)
    queue = _held_by_queue(trainjob)
    if waiting and queue:
        # Suspended until Kueue admits it: say why it waits, from its Workload.
        look.state, look.message = AppState.PENDING, _why_queued(cluster, look.namespace, trainjob, queue)
    elif waiting and not look.message.startswith("suspended"):
        _diagnose_waiting(look, cluster, trainjob, nodes)
    elif look.state == AppState.FAILED:
        _diagnose_failed(look, cluster, record, watch, trainjob)
    elif look.state == AppState.RUNNING:
        _diagnose_running(look, cluster, record, watch, trainjob, nodes, keeps_logs)


def _assess_nodes(look: Look, cluster: ClusterReader, watch: LookMemory, trainjob: dict) -> None:
    """Whether a job not over keeps failing on the same nodes (``node_faults.assess``, with the pods the look
    read, if any): the note to show in ``look.notes``, and the repair added to ``look.actions``."""
    from nemo_kubeflow.observe.node_faults import assess

    view = look.view
    line, action = assess(
        cluster,
        look.namespace,
        look.name,
        trainjob,
        look.nodes,
        pods=view.pods if view else None,
        checked=watch.checked_attempts,
        jobset=view.jobset if view else None,
    )
    look.actions += [action] if action else []
    look.notes = (line,) if line else ()


def _diagnose_waiting(look: Look, cluster: ClusterReader, trainjob: dict, nodes: int) -> None:
    from nemo_kubeflow.observe.job_view import JobView, why_waiting

    look.view = JobView.read_waiting(cluster, trainjob)
    verdict = why_waiting(look.view, nodes, look.state)
    look.state, look.message = verdict.state, verdict.message
    if verdict.fatal:
        look.actions.append(RepairAction(DELETE_UNSTARTABLE, f"{look.message}; the TrainJob was deleted"))
        look.message += (
            f"; it can never start as configured: an attached run or `nemo-kubeflow watch` deletes "
            f"it, or delete it yourself ({kubectl_delete(TRAINJOB_KIND, look.name, look.namespace)})"
        )


def _diagnose_failed(
    look: Look, cluster: ClusterReader, record: Optional[records.AppRecord], watch: LookMemory, trainjob: dict
) -> None:
    from nemo_kubeflow.observe.rank_failure import logs_to_keep, why_failed

    look.view = view = _view(watch, cluster, trainjob, failed=True)
    job_dir = job_dir_of(record)
    look.message = why_failed(view, look.message, job_dir, keeper=watch.keeper, seen=watch.failures_seen)
    keep = logs_to_keep(view, job_dir, watch.keeper)
    if keep:
        look.actions.append(RepairAction(KEEP_NODE_LOGS, "save the node logs next to the job", tuple(map(str, keep))))
    elif job_dir and os.path.isdir(os.path.join(job_dir, "logs")):
        look.message += f"; node logs kept in {os.path.join(job_dir, 'logs')}"


def _diagnose_running(
    look: Look,
    cluster: ClusterReader,
    record: Optional[records.AppRecord],
    watch: LookMemory,
    trainjob: dict,
    nodes: int,
    keeps_logs: bool = True,
) -> None:
    stall_after, job_dir = stall_after_of(record), job_dir_of(record)
    many = one_of_many(cluster)  # asked with the other tasks of its experiment: no node log read
    look.view = view = _view(
        watch, cluster, trainjob, every_pod=not many and _needs_every_pod(watch, trainjob, stall_after)
    )
    if keeps_logs and job_dir:
        _keep_logs(watch, cluster, look.namespace, look.name, nodes, job_dir)
    restarts = _restarts(watch, view, read_node_logs=not many).note(finished=False)
    if view.restarting():
        # The TrainJob's counts still speak of the attempt before the restart: the JobSet, or the new
        # attempt's pending pods, say it starts again.
        starting = view.nodes_starting()
        look.state = AppState.PENDING
        look.message = joined(
            [
                f"restarting: {starting} of {nodes} nodes of the new attempt starting"
                if starting
                else "restarting: the new attempt's nodes are not all ready yet",
                restarts,
            ]
        )
        return
    reported = progress_view.read(cluster, view, watch.progress, watch.keeper, read_logs=not many)
    facts = [reported.text() if reported else "", restarts]
    progressing = reported is not None and not reported.stale
    if stall_after and (progressing or not many):
        facts.insert(0, _stall_fact(watch, cluster, view, reported, stall_after))
    look.message = joined(facts) or look.message
    if many:
        unread = {
            "progress": reported is None,
            "log silence": not progressing and bool(stall_after and _stall_check_due(watch, trainjob, stall_after)),
            "ft_launcher's in-job restarts": watch.keeper is None and view.runs_ft_launcher(),
        }
        look.unread = _logs_not_read(look.name, record, [what for what, missing in unread.items() if missing])


def _logs_not_read(name: str, record: Optional[records.AppRecord], unread: list[str]) -> str:
    """What a look at one of many tasks asked together (TrainJob ``name``) did not read from node logs, and the
    command that reads it (the task alone); "" when nothing it would show comes from them."""
    if not unread:
        return ""
    experiment = (record.experiment if record is not None else "") or "<experiment>"
    return (
        f"{', '.join(unread)} not read from node logs for one of many tasks asked at once "
        f"(`nemo-kubeflow status {experiment} --task {name}` reads them)"
    )


def _needs_every_pod(watch: LookMemory, trainjob: dict, stall_after: Optional[int]) -> bool:
    """Whether a look at a running job reads every pod: only when what is shown needs the running ones (a
    stall check that is due, or ft_launcher's restarts without the kept logs); else the JobSet and the
    pods not running do."""
    from nemo_kubeflow.observe.restarts import runs_ft_launcher

    if stall_after and _stall_check_due(watch, trainjob, stall_after):
        return True
    return watch.keeper is None and runs_ft_launcher(trainjob)


def _stall_fact(
    watch: LookMemory,
    cluster: ClusterReader,
    view: JobView,
    reported: Optional[progress_view.Progress],
    seconds: int,
) -> str:
    """Whether the job stalls: progress says whether steps go on; without it (or with a step not known to be
    current), log silence is the sign."""
    if reported and not reported.stale:
        return progress_view.stall_message(reported, seconds, datetime.now(timezone.utc))
    return _stall_warning_throttled(watch, cluster, view, seconds)


def _gone_message(app_id: str, watch: LookMemory, message: str) -> str:
    """Why a TrainJob no longer exists, as far as this process knows."""
    if watch.cancelled_here:
        return f"TrainJob {app_id.replace(':', '/')} was cancelled: it no longer exists"
    if watch.role:  # this process saw it exist, and did not cancel it
        return (
            f"TrainJob {app_id.replace(':', '/')} no longer exists: it was deleted outside this NeMo-Run "
            "process (kubectl delete, nemo-kubeflow gc, or a cancel from another process)"
        )
    return message


def _view(
    watch: LookMemory, cluster: ClusterReader, trainjob: dict, *, every_pod: bool = True, failed: bool = False
) -> JobView:
    """The job's pods (one read; without ``every_pod``, of a running job, its JobSet and the pods not
    running: ``JobView.read_running``; of a ``failed`` one, ``JobView.read_failed``), noting how each gang
    attempt's failed pod ended while it is at hand."""
    from nemo_kubeflow.observe.job_view import JobView

    if failed:
        view = JobView.read_failed(cluster, trainjob)
    else:
        view = JobView.read(cluster, trainjob) if every_pod else JobView.read_running(cluster, trainjob)
    for attempt, how in view.failures_by_attempt().items():
        watch.failures_seen.setdefault(attempt, how)
    return view


def _restarts(watch: LookMemory, view: JobView, read_node_logs: bool = True) -> Restarts:
    """A running job's restarts: gang restarts from its pods (and events, after one), ft_launcher's from
    the node logs this process keeps while it waits, else (another process: ``nemo experiment status``)
    from every node's last lines, one log read per node, for a job that runs ft_launcher only (and
    ``read_node_logs``)."""
    from nemo_kubeflow.observe.restarts import keeper_in_job_restarts

    keeper = watch.keeper
    in_job = (
        keeper_in_job_restarts(keeper)
        if keeper is not None
        else view.in_job_restarts_of_nodes()
        if view.runs_ft_launcher() and read_node_logs
        else None
    )
    best = watch.in_job_seen
    if keeper is not None and in_job is not None and not in_job.why and in_job.count:
        # A restart in node 0's lines (every agent logs each one); its cause is in the failing node's, which
        # the keeper reads on trouble only: read them now, and at a later look if the cause was not there yet.
        counted, reads, last = watch.in_job_cause_reads
        again = in_job.count == counted
        reads, now = reads + 1 if again else 1, time.monotonic()
        if reads <= IN_JOB_CAUSE_READS and not (again and now - last < IN_JOB_CAUSE_AGAIN_S):
            watch.in_job_cause_reads = (in_job.count, reads, now)
            keeper.read_every_node()
            in_job = keeper_in_job_restarts(keeper)
    if in_job is not None and (best is None or in_job.count >= best.count):
        watch.in_job_seen = best = in_job
    return view.restarts(seen=watch.failures_seen, in_job=best)


def _keep_logs(watch: LookMemory, cluster: ClusterReader, namespace: str, name: str, nodes: int, job_dir: str) -> None:
    """From the second time a running job is looked at in this process (a wait polls; one status
    call does not), keep every node's last lines in memory, for the failure summary (``NodeLogKeeper``)."""
    watch.running_seen += 1
    if watch.running_seen >= 2 and watch.keeper is None:
        from nemo_kubeflow.observe.kept_logs import NodeLogKeeper

        watch.keeper = NodeLogKeeper(cluster, namespace, name, nodes, os.path.join(job_dir, "logs"))


def _stall_check_due(watch: LookMemory, trainjob: dict, seconds: int) -> bool:
    """Whether this look checks for silent nodes (``_stall_warning_throttled`` then reads their logs)."""
    if time.monotonic() - watch.stall_checked[0] < min(30.0, seconds / 10):
        return False
    created = trainjob["metadata"].get("creationTimestamp")
    return (
        bool(created)
        and (datetime.now(timezone.utc) - datetime.fromisoformat(created.replace("Z", "+00:00"))).total_seconds()
        >= seconds
    )


def _stall_warning_throttled(watch: LookMemory, cluster: ClusterReader, view: JobView, seconds: int) -> str:
    """``_stall_warning``, not checked again before a tenth of the threshold (30 s at most) has passed."""
    checked_at, warning = watch.stall_checked
    if time.monotonic() - checked_at >= min(30.0, seconds / 10):
        warning = _stall_warning(cluster, view, seconds)
        watch.stall_checked = (time.monotonic(), warning)
    return warning


def _stall_warning(cluster: ClusterReader, view: JobView, seconds: int) -> str:
    """Which running nodes printed nothing for ``seconds``: no log read while the job is younger
    than that, then one short log read (``sinceSeconds``) per node (the pods are the view's)."""
    now = datetime.now(timezone.utc)
    created = view.trainjob["metadata"].get("creationTimestamp")
    if not created or (now - datetime.fromisoformat(created.replace("Z", "+00:00"))).total_seconds() < seconds:
        return ""
    namespace, pods = view.namespace, view.node_pods
    silent = [
        index
        for index, pod in sorted(running_for_at_least(pods, seconds, now).items())
        if not any(
            True for _ in cluster.pod_log(pod, namespace, container=TRAINER_NODE, tail_lines=1, since_seconds=seconds)
        )
    ]
    return stall_message(silent, seconds)


def _why_queued(cluster: ClusterReader, namespace: str, trainjob: dict, queue: str) -> str:
    """While Kueue holds the job: the Workload's reason (one read; none if Workloads cannot be read)."""
    try:
        workloads = cluster.list("Workload", namespace)
    except ClusterError as e:
        log.debug("cannot read Kueue Workloads in %s: %s", namespace, e)
        workloads = []
    workload = owned_workload(workloads, trainjob)
    return queue_wait_message(queue, workload, _queue_place(cluster, namespace, queue, workload))


#: Namespaces whose Kueue visibility API refused or failed a read: said once at debug, not again.
_PLACE_UNREAD: set[str] = set()


def _queue_place(cluster: ClusterReader, namespace: str, queue: str, workload: Optional[dict]) -> str:
    """The Workload's place in its LocalQueue from Kueue's visibility API ("" where it is not served, refused, or
    failed: the reason is then Kueue's alone, never a guessed place)."""
    if workload is None:
        return ""
    try:
        pending = cluster.pending_workloads(namespace, queue)
    except ClusterError as e:
        if namespace not in _PLACE_UNREAD:
            _PLACE_UNREAD.add(namespace)
            log.debug("cannot read Kueue's pending workloads of queue %s in %s: %s", queue, namespace, e)
        return ""
    return queue_place(queue, pending or [], workload)


def _held_by_queue(trainjob: dict) -> Optional[str]:
    """The Kueue queue of a job suspended until Kueue admits it; None for a job no queue holds."""
    queue = queue_name(trainjob)
    return queue if queue and (trainjob.get("spec") or {}).get("suspend") else None


def joined(parts: Iterable[str]) -> str:
    """The parts of a message that say something, joined by "; "."""
    return "; ".join(part for part in parts if part)


def job_dir_of(record: Optional[records.AppRecord]) -> str:
    """The job's directory (its logs, its manifests); "" without a record."""
    return record.job_dir if record is not None else ""


def stall_after_of(record: Optional[records.AppRecord]) -> Optional[int]:
    """The job's ``stall_warning_seconds``; None without a record."""
    return record.stall_warning_seconds if record is not None else None


def role_of(trainjob: Optional[dict]) -> str:
    """The role a described job reports: its task's name, as in the AppDef NeMo-Run submitted. NeMo-Run and
    `torchx log` print `<role>/<replica>` before each log line (the role cut to its last 10 characters),
    so a followed line reads `train/1 ...` in the submitting process and in any later one alike."""
    return ((trainjob or {}).get("metadata", {}).get("labels") or {}).get(TASK_LABEL) or TRAINER_NODE


def role_for(trainjob: Optional[dict], record: Optional[records.AppRecord], watch: LookMemory) -> str:
    """The task's role: from its TrainJob, remembered once seen; from the app record once the TrainJob is gone
    (so kept log lines read ``<task>/<node>`` too)."""
    if trainjob is not None:
        watch.role = role_of(trainjob)
    return watch.role or (record.task if record is not None else "") or TRAINER_NODE


def nodes_of(trainjob: Optional[dict], record: Optional[records.AppRecord]) -> int:
    trainer = ((trainjob or {}).get("spec") or {}).get("trainer") or {}
    return trainer.get("numNodes") or (record.nodes if record else 1)
