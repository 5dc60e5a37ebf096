"""The TorchX scheduler ``kubeflow_trainer``: NeMo-Run's bridge to the cluster.

* ``_submit_dryrun`` only builds: it validates the executor, packages the task's
  files, renders and checks every manifest, and writes them to
  ``<job_dir>/manifests/``. NeMo-Run calls it on every real run too, so it never
  contacts a cluster.
* ``schedule`` only applies what the dry run built (``submit.submit``).
* ``describe`` only reads: it returns the state and why (``observe``), and the repairs it
  recommends are applied by ``look_after``'s repair step (``repair.steps``), which NeMo-Run's
  attached wait (torchx's ``Runner.wait``) and ``nemo-kubeflow watch`` run, never a status query.
* ``describe``/``log_iter``/``_cancel_existing`` need nothing from an earlier call: the app id is
  ``<namespace>:<trainjob>``, and the kubeconfig comes from a small per-app record,
  so status, logs and cancel work from ``Experiment.from_id`` in a new process and
  from ``nemo experiment status|logs|cancel``. What a scheduler remembers of an app
  (``AppWatch``) only adds what a process that keeps looking saw.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from types import FrameType
from typing import TYPE_CHECKING, Any, Iterable, Optional

from nemo_run.run.torchx_backend.schedulers.api import SchedulerMixin
from torchx.schedulers.api import AppDryRunInfo, DescribeAppResponse, Scheduler, Stream, filter_regex
from torchx.specs import AppDef, AppState, ReplicaStatus, Role, RoleStatus, is_terminal, make_app_handle, runopts

from nemo_kubeflow.cluster import records
from nemo_kubeflow.cluster.client import Cluster, ClusterReader, KubernetesCluster, kubectl_delete
from nemo_kubeflow.cluster.watched import WatchedJob
from nemo_kubeflow.config.executor import KubeflowExecutor
from nemo_kubeflow.constants import SCHEDULER_NAME, TASK_LABEL, TRAINER_NODE, TRAINJOB_KIND, queue_name
from nemo_kubeflow.errors import ClusterError, ClusterUnreachableError, ConfigError, SubmissionStopped
from nemo_kubeflow.nemo_run import finished_jobs, interrupt
from nemo_kubeflow.nemo_run.app_watch import AppWatch, Outage
from nemo_kubeflow.observe import progress_view
from nemo_kubeflow.observe.observation import (
    DELETE_UNSTARTABLE,
    KEEP_NODE_LOGS,
    MOVE_OFF_NODES,
    Observation,
    RepairAction,
)
from nemo_kubeflow.observe.status import (
    job_status,
    owned_workload,
    queue_wait_message,
    running_for_at_least,
    stall_message,
)
from nemo_kubeflow.parts import yamlio

if TYPE_CHECKING:
    from nemo_kubeflow.build.plan import Submission
    from nemo_kubeflow.observe.job_view import JobView
    from nemo_kubeflow.observe.restarts import Restarts

# The build and apply half (plan, manifests, validation, submit) is imported where it is used:
# `nemo experiment status|logs|cancel` never needs it (bench_imports times both halves). So are
# diagnosis, node_avoidance and logs, which a submission never needs (the first task of a process).

log = logging.getLogger(__name__)


@dataclass
class KubeflowRequest:
    """What a dry run built and ``schedule`` applies."""

    submission: Submission
    kubeconfig: Optional[str]
    context: Optional[str]
    nodes: int
    job_dir: str
    manifests_dir: Optional[str]
    stall_warning_seconds: Optional[int] = None
    submit_timeout_seconds: float = 60.0
    #: The dry run is NeMo-Run's ``exp.dryrun()`` that removes the experiment directory, manifests included,
    #: when it returns (its default ``delete_exp_dir=True``).
    manifests_removed: bool = False

    def __str__(self) -> str:
        return format_summary(self)


def format_summary(req: KubeflowRequest) -> str:
    """A readable dry-run summary: a table of settings, then the objects to be sent."""
    sub = req.submission
    rows = list(sub.summary.items())
    width = max(len(k) for k, _ in rows)
    lines = ["Kubeflow Trainer submission (dry run: nothing was sent to any cluster)"]
    lines += [f"  {k.ljust(width)}  {v}" for k, v in rows]
    lines.append("  objects:")
    for obj in sub.manifests():
        ns = obj["metadata"].get("namespace")
        where = f" (namespace {ns})" if ns else ""
        lines.append(f"    - {obj['kind']} {obj['metadata']['name']}{where}")
    if req.manifests_dir:
        lines.append(_manifests_line(req.manifests_dir, req.manifests_removed))
    return "\n".join(lines)


def _manifests_line(manifests_dir: str, removed: bool) -> str:
    """The summary's line on where the dry run wrote the manifests."""
    if removed:
        return (
            "  manifests: not kept, exp.dryrun() removes the experiment directory when it returns; keep "
            "them with exp.dryrun(delete_exp_dir=False), or write them anywhere with nemo-kubeflow render "
            "--out DIR"
        )
    return f"  manifests written to {manifests_dir}"


def _removed_by_exp_dryrun(path: str) -> bool:
    """Whether NeMo-Run's ``Experiment.dryrun`` runs this dry run and removes ``path`` when it returns: it
    removes the experiment directory unless called with ``delete_exp_dir=False``. Read from its frame (NeMo-Run
    tells the scheduler nothing of it); ``False`` when the dry run is not one of ``exp.dryrun()``."""
    from nemo_run.run.experiment import Experiment

    frame: Optional[FrameType] = sys._getframe(1)
    while frame is not None:
        if frame.f_code is Experiment.dryrun.__code__:
            exp_dir = getattr(frame.f_locals.get("self"), "_exp_dir", None)
            return (
                bool(frame.f_locals.get("delete_exp_dir"))
                and isinstance(exp_dir, str)
                and os.path.commonpath([os.path.abspath(exp_dir), os.path.abspath(path)]) == os.path.abspath(exp_dir)
            )
        frame = frame.f_back
    return False


def role_launcher(entrypoint: str, sub: Submission) -> Optional[str]:
    """The launcher that runs the task's processes: ``torchrun``, ``ft_launcher`` or None (the task's own command)."""
    if entrypoint == "ft_launcher":
        return "ft_launcher"
    return "torchrun" if sub.launch.uses_torchrun else None


def retry_scope_warning(executor: KubeflowExecutor, launcher: Optional[str]) -> str:
    """What ``retries`` will and will not retry, when the launcher turns every rank failure into exit 1 and
    exit 1 fails the job at once (``fail_fast_exit_codes``); empty otherwise."""
    codes = executor.fail_fast_exit_codes
    if launcher is None or not executor.retries or 1 not in codes or executor.runtime_name is not None:
        return ""
    return (
        f"retries={executor.retries} with {launcher}: when a rank fails, {launcher} exits 1, which "
        f"fail_fast_exit_codes={list(codes)} counts as a user error: the job fails at once, no retry. retries "
        "restarts the gang only for pod disruptions (eviction, preemption, a lost node) and exit codes not in "
        "fail_fast_exit_codes. To retry failed ranks too, set fail_fast_exit_codes=[] (or drop 1 from it); see "
        "docs/resilience.md#failure-classes-user-errors-fail-fast"
    )


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    """A warning line, once per process (the tasks of an experiment share their executor's settings)."""
    if message and message not in _warned:
        _warned.add(message)
        log.warning("%s", message)


def write_manifests(sub: Submission, directory: str) -> None:
    """Write every (masked) manifest as YAML, numbered in submission order."""
    os.makedirs(directory, exist_ok=True)
    for stale in os.listdir(directory):
        if stale.endswith(".yaml"):
            os.remove(os.path.join(directory, stale))
    for i, obj in enumerate(sub.manifests()):
        filename = f"{i:02d}-{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"
        with open(os.path.join(directory, filename), "w") as f:
            f.write(_runtime_yaml(obj) if obj is sub.runtime else yamlio.dump(obj))


#: The runtime's YAML by its JSON (in its own key order): the tasks of one configuration write the same
#: runtime, and YAML's representer was the largest share of writing the manifests.
_RUNTIME_YAML: dict[str, str] = {}


def _runtime_yaml(runtime: dict) -> str:
    key = json.dumps(runtime)
    text = _RUNTIME_YAML.get(key)
    if text is None:
        if len(_RUNTIME_YAML) >= 16:
            _RUNTIME_YAML.clear()
        text = _RUNTIME_YAML[key] = yamlio.dump(runtime)
    return text


@dataclass
class _Look:
    """What one look at TrainJob ``namespace/name`` has found so far: its state and why, its pods where
    they were read (at most once per look), and the repairs it needs."""

    namespace: str
    name: str
    state: AppState
    message: str
    view: Optional[JobView] = None
    actions: list[RepairAction] = field(default_factory=list)


class KubeflowTrainerScheduler(SchedulerMixin, Scheduler[dict]):
    def __init__(self, session_name: str, cluster: Optional[Cluster] = None) -> None:
        super().__init__(SCHEDULER_NAME, session_name)
        #: Injected for tests; otherwise one client per (kubeconfig, context).
        self._fixed_cluster = cluster
        self._clusters: dict[tuple, Cluster] = {}
        #: Per cluster: the runtimes this scheduler created or reused, not sent again (submit.py).
        self._known_runtimes: dict[tuple, set] = {}
        #: What this scheduler remembers of each app it looked at (app_watch.py says how long).
        self._watches: dict[str, AppWatch] = {}
        #: id(cluster) -> its API server's outage, while it does not answer.
        self._outages: dict[int, Outage] = {}
        #: app id -> (when, ``_looks`` then, the answer) of its last status query (``describe`` outside an
        #: attached wait).
        self._answered: dict[str, tuple[float, int, DescribeAppResponse]] = {}
        _quiet_urllib3_retries()
        finished_jobs.watch_cancels()  # tell a cancel of a finished job what to do instead

    def _run_opts(self) -> runopts:
        return runopts()

    # --- build -------------------------------------------------------------------
    def _submit_dryrun(self, app: AppDef, cfg: Any) -> AppDryRunInfo[KubeflowRequest]:
        if not isinstance(cfg, KubeflowExecutor):
            raise ConfigError(f"the {SCHEDULER_NAME} scheduler runs KubeflowExecutor tasks, not {type(cfg).__name__}")
        if len(app.roles) != 1:
            raise ConfigError(f"a KubeflowExecutor task has exactly one role; got {len(app.roles)}")
        from nemo_kubeflow.build.plan import build_for_app
        from nemo_kubeflow.cluster.submit import check_secret_sources

        executor = cfg
        # Every run starts with this dry run, in the main thread: Ctrl-C must work in the wait that follows.
        interrupt.install()
        submission = build_for_app(app, executor)
        # NeMo-Run's component says 1 replica; torchx keeps this AppDef for the submitting process, whose
        # log readers (tail_logs, exp.logs) read one replica per count: one per node, as `describe` says.
        app.roles[0].num_replicas = executor.nodes
        check_secret_sources(submission.secret_sources)
        _warn_once(retry_scope_warning(executor, role_launcher(app.roles[0].entrypoint, submission)))
        manifests_dir = None
        if executor.job_dir:
            manifests_dir = os.path.join(executor.job_dir, "manifests")
            write_manifests(submission, manifests_dir)
        req = KubeflowRequest(
            submission=submission,
            kubeconfig=executor.kubeconfig,
            context=executor.kube_context,
            nodes=executor.nodes,
            job_dir=executor.job_dir,
            manifests_dir=manifests_dir,
            stall_warning_seconds=executor.stall_warning_seconds,
            submit_timeout_seconds=executor.submit_timeout_seconds,
            manifests_removed=manifests_dir is not None and _removed_by_exp_dryrun(manifests_dir),
        )
        return AppDryRunInfo(req, format_summary)

    # --- apply -----------------------------------------------------------------------
    def schedule(self, dryrun_info: AppDryRunInfo[KubeflowRequest]) -> str:
        from nemo_kubeflow.cluster.submit import submit

        req = dryrun_info.request
        sub = req.submission
        cluster = self._cluster(req.kubeconfig, req.context)
        known = self._known_runtimes.setdefault((_abs(req.kubeconfig), req.context), set())
        with interrupt.submitting(f"{sub.namespace}/{sub.name}"):
            try:
                result = submit(
                    cluster,
                    sub,
                    known_runtimes=known,
                    timeout=req.submit_timeout_seconds,
                    stop=interrupt.stop_requested,
                )
            except SubmissionStopped as stopped:
                interrupt.stopped(stopped)
                # A plain KeyboardInterrupt: uncaught, Python ends the program by SIGINT (a shell's 130).
                raise KeyboardInterrupt(str(stopped)) from None
            records.save(
                records.AppRecord(
                    namespace=sub.namespace,
                    name=sub.name,
                    kubeconfig=_abs(req.kubeconfig),
                    context=req.context,
                    nodes=req.nodes,
                    job_dir=req.job_dir,
                    stall_warning_seconds=req.stall_warning_seconds,
                    task=role_of(sub.trainjob),
                )
            )
        log.info(
            "submitted TrainJob %s/%s (%s)",
            sub.namespace,
            sub.name,
            ", ".join(f"{v} {k}" for v, k, _ in result.actions),
        )
        app_id = records.app_id(sub.namespace, sub.name)
        interrupt.submitted(app_id, make_app_handle(SCHEDULER_NAME, self.session_name, app_id), req.job_dir)
        return app_id

    # --- observe, then repair ------------------------------------------------------------
    def describe(self, app_id: str) -> Optional[DescribeAppResponse]:
        """A look at the job: reads only. Called by NeMo-Run's attached wait (torchx's ``Runner.wait``), the
        look is followed by the repair step (``look_after``); a status query never writes, and the same query
        again within ``ANSWER_REUSE_S`` gets the same answer without a read."""
        if _in_attached_wait():
            return self.look_after(app_id)[0]
        answered = self._answered.get(app_id)
        if answered is not None and time.monotonic() - answered[0] < ANSWER_REUSE_S and answered[1] == _looks[0]:
            return copy.deepcopy(answered[2])
        response = self.look_after(app_id, repair=False)[0]
        self._answered[app_id] = (time.monotonic(), _looks[0], copy.deepcopy(response))
        return response

    def look_after(self, app_id: str, *, repair: bool = True) -> tuple[DescribeAppResponse, list[str]]:
        """Look at the job (``observe``: reads only) and, with ``repair``, apply what the look recommends
        (``repair.steps``): the attached wait's and ``nemo-kubeflow watch``'s step. Returns the response and
        the lines naming each repair made."""
        namespace, name = records.parse_app_id(app_id)
        record = records.load(namespace, name)
        cluster = self._cluster_for(namespace, name, record)
        watch = self._watches.setdefault(app_id, AppWatch())
        _looked_or_wrote()
        observation = self._observe_or_unknown(
            app_id,
            cluster,
            record,
            watch,
            keeps_logs=repair,
            reader=self._watched(watch, cluster, namespace, name) if repair else None,
        )
        if repair:
            watch.looks_after += 1
        message, notes, lines = observation.message, list(observation.notes), list[str]()
        if repair and observation.actions:
            message, notes, lines = self._repair(cluster, observation, record, watch)
            if watch.job_cache is not None:
                watch.job_cache.wrote()
        state = observation.state
        message = _joined((message, *notes))
        self._say_repairs(watch, app_id, lines)
        self._report(watch, app_id, observation, message)
        if is_terminal(state):
            self._stop_keeping(watch)
        interrupt.check_wait(app_id, is_terminal(state))
        return self._response(app_id, state, message, observation.nodes, observation.role), lines

    def _say_repairs(self, watch: AppWatch, app_id: str, lines: list[str]) -> None:
        """Say the repairs a look made (the lines naming them), unless they are the ones said last."""
        if lines and watch.last_repair != "; ".join(lines):
            watch.last_repair = "; ".join(lines)
            self._say(app_id, "repaired", watch.last_repair)

    @staticmethod
    def _watched(watch: AppWatch, cluster: Cluster, namespace: str, name: str) -> Optional[WatchedJob]:
        """The reader of a look that repeats (an attached wait, ``nemo-kubeflow watch``): from its second look on
        (a job the first finds over is not watched), the job's TrainJob, JobSet and pods from watches
        (``cluster/watched.py``), not read again on each look."""
        if watch.job_cache is None and watch.looks_after >= 1:
            watch.job_cache = WatchedJob(cluster, namespace, name)
        return watch.job_cache

    @staticmethod
    def _stop_keeping(watch: AppWatch) -> None:
        """The job is over: stop keeping its node logs (``NodeLogKeeper``) and watching it."""
        if watch.keeper is not None:
            watch.keeper.stop()
            watch.keeper = None
        if watch.job_cache is not None:
            watch.job_cache.stop()
            watch.job_cache = None

    def _report(self, watch: AppWatch, app_id: str, observation: Observation, message: str) -> None:
        """NeMo-Run's wait and `nemo experiment status` show only the state: say what a waiting or running job
        waits for or how it goes, when that changes, and why a job ended, once."""
        state = observation.state
        if observation.trainjob is not None and state in (AppState.PENDING, AppState.RUNNING):
            self._report_progress(watch, app_id, state, message)
        elif state == AppState.FAILED or (state == AppState.CANCELLED and observation.trainjob is None):
            self._report_end(watch, app_id, state, message)

    def _repair(
        self, cluster: Cluster, observation: Observation, record: Optional[records.AppRecord], watch: AppWatch
    ) -> tuple[str, list[str], list[str]]:
        """Apply the repairs ``observation`` recommends (``repair.steps``). Returns the message and the notes
        to show after it, and the lines naming each repair made."""
        from nemo_kubeflow.repair import steps

        message, notes, lines = observation.message, list(observation.notes), []
        try:
            done = steps.apply(cluster, observation, record, watch.keeper)
        except ClusterError as error:  # the next look tries again
            return message, notes + [f"could not repair ({error}); trying again at the next look"], []
        for repaired in done:
            if repaired.kind == DELETE_UNSTARTABLE:
                message = self._outcome_of(observation)
            elif repaired.kind == MOVE_OFF_NODES:
                notes = [repaired.line] if repaired.line else []
            elif repaired.line:
                notes.append(repaired.line)
            if repaired.line:
                lines.append(repaired.line)
        return message, notes, lines

    def _observe_or_unknown(
        self,
        app_id: str,
        cluster: ClusterReader,
        record: Optional[records.AppRecord],
        watch: AppWatch,
        *,
        keeps_logs: bool = True,
        reader: Optional[ClusterReader] = None,
    ) -> Observation:
        """``observe`` (through ``reader``, if given: the cluster's reads from watches); while the API server
        does not answer, UNKNOWN with why (never a state it could not read), said once per outage, and looked
        at again only with backoff."""
        outage = self._outages.get(id(cluster))
        if outage is not None and not outage.due():
            return self._unknown(app_id, record, watch, outage)
        try:
            observation = self.observe(app_id, reader or cluster, record, watch, keeps_logs=keeps_logs)
        except ClusterUnreachableError as error:
            return self._unknown(app_id, record, watch, self._outage_seen(app_id, cluster, error))
        if outage is not None:
            del self._outages[id(cluster)]
            self._say(
                app_id,
                observation.state.name.lower(),
                f"the API server answers again (unreachable from {outage.since_text()} for "
                f"{time.time() - outage.since:.0f} s)",
                always=True,
            )
        return observation

    def _outage_seen(self, app_id: str, cluster: ClusterReader, error: ClusterUnreachableError) -> Outage:
        """The API server of ``cluster`` did not answer: its outage (begun now, or going on), said once."""
        outage = self._outages.get(id(cluster))
        if outage is None:
            outage = self._outages[id(cluster)] = Outage(_short_error(error))
        else:
            outage.failed_again(_short_error(error))
        if not outage.said:
            outage.said = True
            self._say(app_id, "unknown", outage.message(), always=True)
        return outage

    @staticmethod
    def _unknown(app_id: str, record: Optional[records.AppRecord], watch: AppWatch, outage: Outage) -> Observation:
        return Observation(
            app_id, AppState.UNKNOWN, outage.message(), nodes_of(None, record), _role(None, record, watch)
        )

    @staticmethod
    def _outcome_of(observation: Observation) -> str:
        return next(a.why for a in observation.actions if a.kind == DELETE_UNSTARTABLE)

    def observe(
        self,
        app_id: str,
        cluster: ClusterReader,
        record: Optional[records.AppRecord],
        watch: AppWatch,
        *,
        keeps_logs: bool = True,
    ) -> Observation:
        """The job's state and why, and the repairs it needs: GETs and LISTs (and log reads) only. With
        ``keeps_logs`` (a look that repairs: the attached wait, ``nemo-kubeflow watch``), a running job's node
        logs are kept from its second look on; a status query (NeMo-Run's describes each job twice) does not
        start following them."""
        namespace, name = records.parse_app_id(app_id)
        trainjob = cluster.get(TRAINJOB_KIND, name, namespace)
        finished_jobs.note_described(app_id, trainjob)
        nodes, role = nodes_of(trainjob, record), _role(trainjob, record, watch)
        if trainjob is None:
            return self._gone(app_id, record, watch, nodes, role)
        status = job_status(trainjob, name=f"{namespace}/{name}")
        look = _Look(namespace, name, status.state, status.message)
        if is_terminal(status.state):
            # Why it ended is read from the API server, once: each watch is a stream of its own, so the pods' last
            # changes may not have reached the held copies when the TrainJob's verdict did.
            cluster = getattr(cluster, "server_reader", cluster)
        self._diagnose(look, cluster, record, watch, trainjob, nodes, keeps_logs)
        notes = self._assess_nodes(look, cluster, watch, trainjob, nodes) if not is_terminal(look.state) else ()
        return Observation(
            app_id, look.state, look.message, nodes, role, trainjob=trainjob, actions=tuple(look.actions), notes=notes
        )

    def _gone(
        self, app_id: str, record: Optional[records.AppRecord], watch: AppWatch, nodes: int, role: str
    ) -> Observation:
        """A job whose TrainJob no longer exists: the fatal error a repair deleted it for, else why it is gone."""
        if record is not None and record.outcome_state:
            # A repair deleted it after a fatal error: keep reporting that error.
            return Observation(app_id, AppState[record.outcome_state], record.outcome_message, nodes, role)
        namespace, name = records.parse_app_id(app_id)
        status = job_status(None, name=f"{namespace}/{name}")
        return Observation(app_id, status.state, self._gone_message(app_id, watch, status.message), nodes, role)

    @staticmethod
    def _assess_nodes(
        look: _Look, cluster: ClusterReader, watch: AppWatch, trainjob: dict, nodes: int
    ) -> tuple[str, ...]:
        """Whether a job not over keeps failing on the same nodes (``node_avoidance.assess``, with the pods the
        look read, if any): the note to show, and the repair added to ``look``."""
        from nemo_kubeflow.repair import node_avoidance

        view = look.view
        line, action = node_avoidance.assess(
            cluster,
            look.namespace,
            look.name,
            trainjob,
            nodes,
            pods=view.pods if view else None,
            checked=watch.checked_attempts,
            jobset=view.jobset if view else None,
        )
        look.actions += [action] if action else []
        return (line,) if line else ()

    def _diagnose(
        self,
        look: _Look,
        cluster: ClusterReader,
        record: Optional[records.AppRecord],
        watch: AppWatch,
        trainjob: dict,
        nodes: int,
        keeps_logs: bool = True,
    ) -> None:
        """Say in ``look`` why the job is in its state, reading its pods (``look.view``) where that tells more."""
        waiting = look.state in (AppState.SUBMITTED, AppState.PENDING)
        queue = _held_by_queue(trainjob)
        if waiting and queue:
            # Suspended until Kueue admits it: say why it waits, from its Workload.
            look.state, look.message = AppState.PENDING, self._why_queued(cluster, look.namespace, trainjob, queue)
        elif waiting and not look.message.startswith("suspended"):
            self._diagnose_waiting(look, cluster, trainjob, nodes)
        elif look.state == AppState.FAILED:
            self._diagnose_failed(look, cluster, record, watch, trainjob)
        elif look.state == AppState.RUNNING:
            self._diagnose_running(look, cluster, record, watch, trainjob, nodes, keeps_logs)

    @staticmethod
    def _diagnose_waiting(look: _Look, cluster: ClusterReader, trainjob: dict, nodes: int) -> None:
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
        self, look: _Look, cluster: ClusterReader, record: Optional[records.AppRecord], watch: AppWatch, trainjob: dict
    ) -> None:
        from nemo_kubeflow.observe.rank_failure import logs_to_keep, why_failed

        look.view = view = self._view(watch, cluster, trainjob, failed=True)
        job_dir = _job_dir(record)
        look.message = why_failed(view, look.message, job_dir, keeper=watch.keeper, seen=watch.failures_seen)
        keep = logs_to_keep(view, job_dir, watch.keeper)
        if keep:
            look.actions.append(
                RepairAction(KEEP_NODE_LOGS, "save the node logs next to the job", tuple(map(str, keep)))
            )
        elif job_dir and os.path.isdir(os.path.join(job_dir, "logs")):
            look.message += f"; node logs kept in {os.path.join(job_dir, 'logs')}"

    def _diagnose_running(
        self,
        look: _Look,
        cluster: ClusterReader,
        record: Optional[records.AppRecord],
        watch: AppWatch,
        trainjob: dict,
        nodes: int,
        keeps_logs: bool = True,
    ) -> None:
        stall_after, job_dir = _stall_after(record), _job_dir(record)
        look.view = view = self._view(
            watch, cluster, trainjob, every_pod=self._needs_every_pod(watch, trainjob, stall_after)
        )
        if keeps_logs and job_dir:
            self._keep_logs(watch, cluster, look.namespace, look.name, nodes, job_dir)
        restarts = self._restarts(watch, view).note(finished=False)
        if view.restarting():
            # The TrainJob's counts still speak of the attempt before the restart: the JobSet, or the new
            # attempt's pending pods, say it starts again.
            starting = view.nodes_starting()
            look.state = AppState.PENDING
            look.message = _joined(
                [
                    f"restarting: {starting} of {nodes} nodes of the new attempt starting"
                    if starting
                    else "restarting: the new attempt's nodes are not all ready yet",
                    restarts,
                ]
            )
            return
        reported = progress_view.read(cluster, view, watch.progress, watch.keeper)
        facts = [reported.text() if reported else "", restarts]
        if stall_after:
            facts.insert(0, self._stall_fact(watch, cluster, view, reported, stall_after))
        look.message = _joined(facts) or look.message

    def _needs_every_pod(self, watch: AppWatch, trainjob: dict, stall_after: Optional[int]) -> bool:
        """Whether a look at a running job reads every pod: only when what is shown needs the running ones (a
        stall check that is due, or ft_launcher's restarts without the kept logs); else the JobSet and the
        pods not running do."""
        from nemo_kubeflow.observe.restarts import runs_ft_launcher

        if stall_after and self._stall_check_due(watch, trainjob, stall_after):
            return True
        return watch.keeper is None and runs_ft_launcher(trainjob)

    def _stall_fact(
        self,
        watch: AppWatch,
        cluster: ClusterReader,
        view: JobView,
        reported: Optional[progress_view.Progress],
        seconds: int,
    ) -> str:
        """Whether the job stalls: progress says whether steps go on; without it (or with a step not known to be
        current), log silence is the sign."""
        if reported and not reported.stale:
            return progress_view.stall_message(reported, seconds, datetime.now(timezone.utc))
        return self._stall_warning_throttled(watch, cluster, view, seconds)

    @staticmethod
    def _gone_message(app_id: str, watch: AppWatch, message: str) -> str:
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
        self, watch: AppWatch, cluster: ClusterReader, trainjob: dict, *, every_pod: bool = True, failed: bool = False
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

    @staticmethod
    def _restarts(watch: AppWatch, view: JobView) -> Restarts:
        """A running job's restarts: gang restarts from its pods (and events, after one), ft_launcher's from
        the node logs this process keeps while it waits, else (another process: ``nemo experiment status``)
        from every node's last lines, one log read per node, for a job that runs ft_launcher only."""
        from nemo_kubeflow.observe.restarts import keeper_in_job_restarts

        keeper = watch.keeper
        in_job = (
            keeper_in_job_restarts(keeper)
            if keeper is not None
            else view.in_job_restarts_of_nodes()
            if view.runs_ft_launcher()
            else None
        )
        best = watch.in_job_seen
        if keeper is not None and in_job is not None and not in_job.why and in_job.count:
            # A restart in node 0's lines (every agent logs each one); its cause is in the failing node's, which
            # the keeper reads on trouble only: read them now, and at the next look if the cause was not there yet.
            counted, reads = watch.in_job_cause_reads
            reads = reads + 1 if in_job.count == counted else 1
            if reads <= IN_JOB_CAUSE_READS:
                watch.in_job_cause_reads = (in_job.count, reads)
                keeper.read_every_node()
                in_job = keeper_in_job_restarts(keeper)
        if in_job is not None and (best is None or in_job.count >= best.count):
            watch.in_job_seen = best = in_job
        return view.restarts(seen=watch.failures_seen, in_job=best)

    @staticmethod
    def _keep_logs(
        watch: AppWatch, cluster: ClusterReader, namespace: str, name: str, nodes: int, job_dir: str
    ) -> None:
        """From the second time a running job is looked at in this process (a wait polls; one status
        call does not), keep every node's last lines in memory, for the failure summary (``NodeLogKeeper``)."""
        watch.running_seen += 1
        if watch.running_seen >= 2 and watch.keeper is None:
            from nemo_kubeflow.observe.kept_logs import NodeLogKeeper

            watch.keeper = NodeLogKeeper(cluster, namespace, name, nodes, os.path.join(job_dir, "logs"))

    def _report_end(self, watch: AppWatch, app_id: str, state: AppState, message: str) -> None:
        """Say why a job failed, or that its TrainJob was deleted, once, in NeMo-Run's console, when this
        process first sees it (NeMo-Run's own status shows only the state)."""
        if watch.reported_end or threading.current_thread() is threading.main_thread():
            return  # NeMo-Run waits and builds its status table in worker threads
        watch.reported_end = True
        self._say(app_id, "failed" if state == AppState.FAILED else state.name.lower(), message)

    @staticmethod
    def _say(app_id: str, what: str, message: str, *, always: bool = False) -> None:
        """One line in NeMo-Run's console: ``<trainjob> <what>: <message>`` (``always``: from any thread)."""
        if not always and threading.current_thread() is threading.main_thread():
            return
        from nemo_run.core.frontend.console.api import CONSOLE
        from rich.markup import escape

        CONSOLE.log(f"[bold]{records.parse_app_id(app_id)[1]}[/bold] {what}: {escape(message)}", highlight=False)

    @staticmethod
    def _stall_check_due(watch: AppWatch, trainjob: dict, seconds: int) -> bool:
        """Whether this look checks for silent nodes (``_stall_warning_throttled`` then reads their logs)."""
        if time.monotonic() - watch.stall_checked[0] < min(30.0, seconds / 10):
            return False
        created = trainjob["metadata"].get("creationTimestamp")
        return (
            bool(created)
            and (datetime.now(timezone.utc) - datetime.fromisoformat(created.replace("Z", "+00:00"))).total_seconds()
            >= seconds
        )

    def _stall_warning_throttled(self, watch: AppWatch, cluster: ClusterReader, view: JobView, seconds: int) -> str:
        """``_stall_warning``, not checked again before a tenth of the threshold (30 s at most) has passed."""
        checked_at, warning = watch.stall_checked
        if time.monotonic() - checked_at >= min(30.0, seconds / 10):
            warning = self._stall_warning(cluster, view, seconds)
            watch.stall_checked = (time.monotonic(), warning)
        return warning

    @staticmethod
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
                True
                for _ in cluster.pod_log(pod, namespace, container=TRAINER_NODE, tail_lines=1, since_seconds=seconds)
            )
        ]
        return stall_message(silent, seconds)

    @staticmethod
    def _why_queued(cluster: ClusterReader, namespace: str, trainjob: dict, queue: str) -> str:
        """While Kueue holds the job: the Workload's reason (one read; none if Workloads cannot be read)."""
        try:
            workloads = cluster.list("Workload", namespace)
        except ClusterError as e:
            log.debug("cannot read Kueue Workloads in %s: %s", namespace, e)
            workloads = []
        return queue_wait_message(queue, owned_workload(workloads, trainjob))

    def _report_progress(self, watch: AppWatch, app_id: str, state: AppState, message: str) -> None:
        """Show what a waiting job waits for, or how often a running one restarted, in NeMo-Run's console,
        when it changes."""
        if message and watch.last_progress != message:
            watch.last_progress = message
            from nemo_run.core.frontend.console.api import CONSOLE
            from rich.markup import escape

            CONSOLE.log(f"[bold]{records.parse_app_id(app_id)[1]}[/bold] {state.name.lower()}: {escape(message)}")

    @staticmethod
    def _response(app_id: str, state: AppState, message: str, nodes: int, role: str) -> DescribeAppResponse:
        replicas = [ReplicaStatus(id=i, role=role, state=state, hostname="") for i in range(nodes)]
        return DescribeAppResponse(
            app_id=app_id,
            state=state,
            msg=message,
            roles_statuses=[RoleStatus(role, replicas=replicas)],
            roles=[Role(name=role, image="", num_replicas=nodes)],
        )

    def log_iter(
        self,
        app_id: str,
        role_name: str,
        k: int = 0,
        regex: Optional[str] = None,
        since: Optional[datetime] = None,
        until: Optional[datetime] = None,
        should_tail: bool = False,
        streams: Optional[Stream] = None,
    ) -> Iterable[str]:
        from nemo_kubeflow.observe.kept_logs import node_log_path, tee_to_file
        from nemo_kubeflow.observe.log_follower import node_log_lines

        namespace, name = records.parse_app_id(app_id)
        record = records.load(namespace, name)
        cluster = self._cluster_for(namespace, name, record)
        job_dir = _job_dir(record)
        lines: Iterable[str] = node_log_lines(
            cluster, namespace, name, k, follow=should_tail, stall_after=_stall_after(record)
        )
        if should_tail and job_dir:
            # Kept next to the job: pods, and their logs, go when the job is deleted or fails.
            lines = tee_to_file(iter(lines), node_log_path(job_dir, k))
        elif not should_tail:
            # A finished job cleaned up (its TTL, gc, a failure that deleted the pods): what was kept.
            lines = list(lines) or self._kept_or_no_log(cluster, namespace, name, k, job_dir)
        return filter_regex(regex, lines) if regex else lines

    @classmethod
    def _kept_or_no_log(cls, cluster: ClusterReader, namespace: str, name: str, k: int, job_dir: str) -> list[str]:
        """Node ``k``'s log as kept next to the job, or why it has none (``_no_log``)."""
        from nemo_kubeflow.observe.kept_logs import kept_node_log

        kept = kept_node_log(job_dir, k) if job_dir else []
        return kept or cls._no_log(cluster, namespace, name, k, job_dir)

    @staticmethod
    def _no_log(cluster: ClusterReader, namespace: str, name: str, k: int, job_dir: str) -> list[str]:
        """Why node ``k`` has no log to show: its pod is gone and none was kept, or it printed nothing."""
        from nemo_kubeflow.observe.kept_logs import node_log_path
        from nemo_kubeflow.observe.log_follower import node_selector

        if cluster.list("Pod", namespace, node_selector(name, k)):
            return []  # the pod is there and printed nothing (yet)
        gone = "no longer exists" if cluster.get(TRAINJOB_KIND, name, namespace) is None else "has no pod for it"
        where = (
            f"logs are kept in {node_log_path(job_dir, k)} when they are followed (an attached run, "
            "`nemo-kubeflow logs -f`) or saved when the job fails"
            if job_dir
            else "this job has no job directory to keep logs in"
        )
        return [
            f"--- node {k}: no log: TrainJob {namespace}/{name} {gone}, so its pods and their logs are gone, "
            f"and no log was kept ({where})\n"
        ]

    def _cancel_existing(self, app_id: str) -> None:
        namespace, name = records.parse_app_id(app_id)
        finished_jobs.note_cancelled(app_id)
        watch = self._watches.setdefault(app_id, AppWatch())
        watch.cancelled_here = True
        _looked_or_wrote()
        # Deleting the TrainJob removes its JobSet, pods, ConfigMaps and Secret (ownerReferences).
        self._cluster_for(namespace, name).delete(TRAINJOB_KIND, name, namespace)
        if watch.job_cache is not None:
            watch.job_cache.wrote()

    def list(self) -> list:
        return []

    def _validate(self, app: AppDef, scheduler: str) -> None:
        # Resources are the executor's business, not TorchX's named resources.
        pass

    # --- clients -------------------------------------------------------------------------
    def _cluster(self, kubeconfig: Optional[str], context: Optional[str]) -> Cluster:
        if self._fixed_cluster is not None:
            return self._fixed_cluster
        key = (_abs(kubeconfig), context)
        if key not in self._clusters:
            self._clusters[key] = KubernetesCluster(kubeconfig=key[0], context=context)
        return self._clusters[key]

    def _cluster_for(self, namespace: str, name: str, record: Optional[records.AppRecord] = None) -> Cluster:
        record = record or records.load(namespace, name)
        if record is None:
            return self._cluster(None, None)
        return self._cluster(record.kubeconfig, record.context)


def _held_by_queue(trainjob: dict) -> Optional[str]:
    """The Kueue queue of a job suspended until Kueue admits it; None for a job no queue holds."""
    queue = queue_name(trainjob)
    return queue if queue and (trainjob.get("spec") or {}).get("suspend") else None


def _joined(parts: Iterable[str]) -> str:
    """The parts of a message that say something, joined by "; "."""
    return "; ".join(part for part in parts if part)


def _job_dir(record: Optional[records.AppRecord]) -> str:
    """The job's directory (its logs, its manifests); "" without a record."""
    return record.job_dir if record is not None else ""


def _stall_after(record: Optional[records.AppRecord]) -> Optional[int]:
    """The job's ``stall_warning_seconds``; None without a record."""
    return record.stall_warning_seconds if record is not None else None


def role_of(trainjob: Optional[dict]) -> str:
    """The role a described job reports: its task's name, as in the AppDef NeMo-Run submitted. NeMo-Run and
    `torchx log` print `<role>/<replica>` before each log line (the role cut to its last 10 characters),
    so a followed line reads `train/1 ...` in the submitting process and in any later one alike."""
    return ((trainjob or {}).get("metadata", {}).get("labels") or {}).get(TASK_LABEL) or TRAINER_NODE


def _role(trainjob: Optional[dict], record: Optional[records.AppRecord], watch: AppWatch) -> str:
    """The task's role: from its TrainJob, remembered once seen; from the app record once the TrainJob is gone
    (so kept log lines read ``<task>/<node>`` too)."""
    if trainjob is not None:
        watch.role = role_of(trainjob)
    return watch.role or (record.task if record is not None else "") or TRAINER_NODE


#: Reads of every node's last lines for the cause of an ft_launcher restart counted in node 0's lines: at the
#: look that counts it and, if the cause was not there yet, at the next (each read is a log read per node).
IN_JOB_CAUSE_READS = 2
#: A status query answered this recently is answered again without a read: NeMo-Run's ``Experiment.status`` asks
#: each task's state twice in a row (its table and its dict), and each look reads the TrainJob, its JobSet, pods
#: and node 0's progress line.
ANSWER_REUSE_S = 1.0
#: Looks at any job (an attached wait's, a status query's) and writes to one (a cancel, a repair) by any
#: scheduler of this process: a status answer is given again only if none came after it (NeMo-Run cancels
#: through another runner's scheduler, and waits through a third).
_looks = [0]


def _looked_or_wrote() -> None:
    _looks[0] += 1


def _in_attached_wait() -> bool:
    """Whether this call comes from torchx's ``Runner.wait``: NeMo-Run's attached wait (``wait_and_exit``),
    the one caller of ``describe`` that repairs; a status query (``Runner.status`` alone) only reads."""
    from torchx.runner.api import Runner

    wait = Runner.wait.__code__
    frame: Optional[FrameType] = sys._getframe(1)
    while frame is not None:
        if frame.f_code is wait:
            return True
        frame = frame.f_back
    return False


def _short_error(error: ClusterError) -> str:
    """The error without its advice (said once, with the time it started)."""
    return str(error).split("; check the kubeconfig")[0]


class _DropRetryWarnings(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Retrying")


def _quiet_urllib3_retries() -> None:
    """urllib3 logs a WARNING for each retry of a connection (about 30 while the API server is down): ours
    say once that it cannot be reached, so those stay out of the user's console."""
    connections = logging.getLogger("urllib3.connectionpool")
    if not any(isinstance(f, _DropRetryWarnings) for f in connections.filters):
        connections.addFilter(_DropRetryWarnings())


def nodes_of(trainjob: Optional[dict], record: Optional[records.AppRecord]) -> int:
    trainer = ((trainjob or {}).get("spec") or {}).get("trainer") or {}
    return trainer.get("numNodes") or (record.nodes if record else 1)


def _abs(path: Optional[str]) -> Optional[str]:
    return os.path.abspath(os.path.expanduser(path)) if path else None


def create_scheduler(session_name: str, **kwargs: Any) -> KubeflowTrainerScheduler:
    return KubeflowTrainerScheduler(session_name=session_name)
