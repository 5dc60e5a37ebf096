"""The TorchX scheduler ``kubeflow_trainer``: NeMo-Run's bridge to the cluster.

* ``_submit_dryrun`` only builds: it validates the executor, packages the task's
  files, renders and checks every manifest, and writes them to
  ``<job_dir>/manifests/``. NeMo-Run calls it on every real run too, so it never
  contacts a cluster.
* ``schedule`` only applies what the dry run built (``submit.submit``).
* ``describe`` only reads: it returns the state and why (``observe.look``, mapped to torchx's
  answer), and the repairs it recommends are applied by ``look_after``'s repair step (``repair.steps``),
  which NeMo-Run's attached wait (torchx's ``Runner.wait``, run inside ``attached_wait`` by
  ``registration.wrap_runner_wait``) and ``nemo-kubeflow watch`` run, never a status query.
* ``describe``/``log_iter``/``_cancel_existing`` need nothing from an earlier call: the app id is
  ``<namespace>:<trainjob>``, and the kubeconfig comes from a small per-app record,
  so status, logs and cancel work from ``Experiment.from_id`` in a new process and
  from ``nemo experiment status|logs|cancel``. What a scheduler remembers of an app
  (``AppWatch``) only adds what a process that keeps looking saw.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import sys
import threading
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from types import FrameType
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Optional

from nemo_run.run.torchx_backend.schedulers.api import SchedulerMixin
from torchx.schedulers.api import AppDryRunInfo, DescribeAppResponse, Scheduler, Stream, filter_regex
from torchx.specs import AppDef, AppState, ReplicaStatus, Role, RoleStatus, is_terminal, make_app_handle, runopts

from nemo_kubeflow.cluster import records
from nemo_kubeflow.cluster.client import Cluster, ClusterReader, KubernetesCluster
from nemo_kubeflow.cluster.watched import WatchedJob, experiment_watched
from nemo_kubeflow.config.executor import KubeflowExecutor
from nemo_kubeflow.config.registration import SUBMITTING
from nemo_kubeflow.constants import EXPERIMENT_LABEL, SCHEDULER_NAME, TRAINJOB_KIND
from nemo_kubeflow.errors import ClusterError, ClusterUnreachableError, ConfigError, SubmissionStopped
from nemo_kubeflow.nemo_run import finished_jobs, interrupt
from nemo_kubeflow.nemo_run.app_watch import AppWatch
from nemo_kubeflow.nemo_run.status_answers import StatusAnswers
from nemo_kubeflow.observe import look
from nemo_kubeflow.observe.observation import DELETE_UNSTARTABLE, MOVE_OFF_NODES, Observation
from nemo_kubeflow.observe.outage import Outage, short_error
from nemo_kubeflow.observe.status import without_place
from nemo_kubeflow.parts import yamlio

if TYPE_CHECKING:
    from nemo_kubeflow.build.plan import Submission

# The build and apply half (plan, manifests, validation, submit) is imported where it is used:
# `nemo experiment status|logs|cancel` never needs it (bench_imports times both halves). So are
# the repair steps and logs (and, in observe/look.py, diagnosis and node faults), which a submission never needs
# (the first task of a process).

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


class KubeflowTrainerScheduler(SchedulerMixin, Scheduler[dict]):
    def __init__(
        self, session_name: str, cluster: Optional[Cluster] = None, answers: Optional[StatusAnswers] = None
    ) -> None:
        super().__init__(SCHEDULER_NAME, session_name)
        #: Injected for tests; otherwise one client per (kubeconfig, context).
        self._fixed_cluster = cluster
        self._clusters: dict[tuple, Cluster] = {}
        #: Per cluster: the runtimes this scheduler created or reused, not sent again (submit.py).
        self._known_runtimes: dict[tuple, set] = {}
        #: Per cluster, the namespaces' rules submissions read lately (cluster/admission.py).
        self._rules_read: dict[tuple, dict] = {}
        #: What this scheduler remembers of each app it looked at (app_watch.py says how long).
        self._watches: dict[str, AppWatch] = {}
        #: id(cluster) -> its API server's outage, while it does not answer.
        self._outages: dict[int, Outage] = {}
        #: The answers of its status queries (``describe`` outside an attached wait), given again without a read
        #: when no look at the job nor write came since (status_answers.py): the looks and writes shared by the
        #: schedulers of this process's runners (``create_scheduler``), else this scheduler's own.
        self._answers = answers or StatusAnswers()
        #: Its own answers' key in ``_answers`` (unique in the process, unlike an id).
        self._answers_key = next(_SCHEDULER_NUMBERS)
        #: ``waits``: the attached waits (``attached_wait``) the current thread is in, in any of our schedulers.
        self._attached = _ATTACHED
        #: Whether what it sees is said in NeMo-Run's console (``_say``, ``_report_progress``): off where the
        #: caller prints each answer itself (``nemo-kubeflow status`` and ``watch``), else each change shows twice.
        self.says_in_console = True
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
        rules_read = self._rules_read.setdefault((_abs(req.kubeconfig), req.context), {})
        with interrupt.submitting(f"{sub.namespace}/{sub.name}"):
            try:
                result = submit(
                    cluster,
                    sub,
                    known_runtimes=known,
                    timeout=req.submit_timeout_seconds,
                    stop=interrupt.stop_requested,
                    rules_read=rules_read,
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
                    task=look.role_of(sub.trainjob),
                    experiment=(sub.trainjob["metadata"].get("labels") or {}).get(EXPERIMENT_LABEL, ""),
                )
            )
            self._answers.wrote()
        sub.release_files()  # sent: not held for the rest of the experiment, once per task
        log.info(
            "submitted TrainJob %s/%s (%s)",
            sub.namespace,
            sub.name,
            ", ".join(f"{v} {k}" for v, k, _ in result.actions),
        )
        progress = SUBMITTING.get()
        line = progress.one_more() if progress is not None else None
        if line:
            log.info(line)
        app_id = records.app_id(sub.namespace, sub.name)
        interrupt.submitted(app_id, make_app_handle(SCHEDULER_NAME, self.session_name, app_id), req.job_dir)
        return app_id

    # --- observe, then repair ------------------------------------------------------------
    def describe(self, app_id: str) -> Optional[DescribeAppResponse]:
        """A look at the job: reads only. Called by NeMo-Run's attached wait (torchx's ``Runner.wait``), the
        look is followed by the repair step (``look_after``); a status query never writes, and the same query
        again within ``ANSWER_REUSE_S`` gets the same answer without a read (``StatusAnswers``). Which describes
        are an attached wait's is said by ``attached_wait``, not guessed."""
        if getattr(self._attached, "waits", 0):
            return self.look_after(app_id)[0]
        again = self._answers.again(self._answers_key, app_id)
        if again is not None:
            return again
        response = self.look_after(app_id, repair=False)[0]
        self._answers.keep(self._answers_key, app_id, response)
        return response

    @contextmanager
    def attached_wait(self) -> Iterator[None]:
        """While in it, the describes of this thread are an attached wait's (torchx's ``Runner.wait``, which
        ``registration.wrap_runner_wait`` runs inside it): each is ``look_after``, its look then its repair."""
        self._attached.waits = getattr(self._attached, "waits", 0) + 1
        try:
            yield
        finally:
            self._attached.waits -= 1

    def look_after(self, app_id: str, *, repair: bool = True) -> tuple[DescribeAppResponse, list[str]]:
        """Look at the job (``observe``: reads only) and, with ``repair``, apply what the look recommends
        (``repair.steps``): the attached wait's and ``nemo-kubeflow watch``'s step. Returns the response and
        the lines naming each repair made."""
        namespace, name = records.parse_app_id(app_id)
        record = records.load(namespace, name)
        cluster = self._cluster_for(namespace, name, record)
        watch = self._watches.setdefault(app_id, AppWatch())
        self._answers.looked(app_id)
        observation = self._observe_or_unknown(
            app_id,
            cluster,
            record,
            watch,
            keeps_logs=repair,
            reader=self._watched(watch, cluster, record, namespace, name)
            if repair
            else self._snapshot(cluster, record),
        )
        if repair:
            watch.looks_after += 1
        if observation.trainjob is not None and not watch.experiment:
            watch.experiment = ((observation.trainjob.get("metadata") or {}).get("labels") or {}).get(
                EXPERIMENT_LABEL, ""
            )
        message, notes, lines = observation.message, list(observation.notes), list[str]()
        if repair and observation.actions:
            message, notes, lines = self._repair(cluster, observation, record, watch)
            self._answers.wrote()
            if watch.job_cache is not None:
                watch.job_cache.wrote()
        state = observation.state
        message = look.joined((message, *notes))
        self._say_repairs(watch, app_id, lines)
        self._report(watch, app_id, observation, message)
        if is_terminal(state):
            watch.over = True
            self._stop_keeping(watch)
        interrupt.check_wait(app_id, is_terminal(state))
        answer = look.joined((message, observation.unread))
        return self._response(app_id, state, answer, observation.nodes, observation.role), lines

    def _say_repairs(self, watch: AppWatch, app_id: str, lines: list[str]) -> None:
        """Say the repairs a look made (the lines naming them), unless they are the ones said last."""
        if lines and watch.last_repair != "; ".join(lines):
            watch.last_repair = "; ".join(lines)
            self._say(app_id, "repaired", watch.last_repair)

    @staticmethod
    def _watched(
        watch: AppWatch, cluster: Cluster, record: Optional[records.AppRecord], namespace: str, name: str
    ) -> Optional[WatchedJob]:
        """The reader of a look that repeats (an attached wait, ``nemo-kubeflow watch``): the job's TrainJob, JobSet
        and pods from watches (``cluster/watched.py``: one set for the tasks of its experiment), not read again on
        each look. From its second look on (a job the first finds over starts no watch), or from its first where
        its experiment's set is watched already (a sweep's next task, waited on as another ends: joining costs the
        API server nothing); none once a look found it over."""
        if watch.job_cache is not None or watch.over:
            return watch.job_cache
        experiment = watch.experiment or (record.experiment if record is not None else "")
        if watch.looks_after >= 1 or (experiment and experiment_watched(cluster, namespace, experiment)):
            watch.job_cache = WatchedJob(cluster, namespace, name, experiment=experiment or None)
        return watch.job_cache

    def _snapshot(self, cluster: Cluster, record: Optional[records.AppRecord]) -> Optional[ClusterReader]:
        """The reader of a status query: its experiment's snapshot (``cluster/experiment_snapshot.py``: the
        experiment's TrainJobs, JobSets and pods listed once for the queries of all its tasks, from the second
        task queried on), or None (the cluster itself): the first task queried, a job whose record does not name
        its experiment."""
        if record is None or not record.experiment:
            return None
        server = (id(self._fixed_cluster),) if self._fixed_cluster is not None else (record.kubeconfig, record.context)
        return self._answers.snapshots.reader(cluster, server, record.namespace, record.experiment, record.name)

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
            self._say(app_id, observation.state.name.lower(), outage.over_message(), always=True)
        return observation

    def _outage_seen(self, app_id: str, cluster: ClusterReader, error: ClusterUnreachableError) -> Outage:
        """The API server of ``cluster`` did not answer: its outage (begun now, or going on), said once."""
        outage = self._outages.get(id(cluster))
        if outage is None:
            outage = self._outages[id(cluster)] = Outage(short_error(error))
        else:
            outage.failed_again(short_error(error))
        if not outage.said:
            outage.said = True
            self._say(app_id, "unknown", outage.message(), always=True)
        return outage

    @staticmethod
    def _unknown(app_id: str, record: Optional[records.AppRecord], watch: AppWatch, outage: Outage) -> Observation:
        return look.unknown(app_id, record, watch, outage.message())

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
        """The job's state and why, and the repairs it needs (``observe/look.py``): GETs and LISTs (and log
        reads) only. The TrainJob is read here, for ``finished_jobs`` to note how it stands; with
        ``keeps_logs`` (a look that repairs), a running job's node logs are kept from its second look on."""
        namespace, name = records.parse_app_id(app_id)
        trainjob = cluster.get(TRAINJOB_KIND, name, namespace)
        finished_jobs.note_described(app_id, trainjob)
        return look.look_at(app_id, trainjob, cluster, record, watch, keeps_logs=keeps_logs).observation()

    def _report_end(self, watch: AppWatch, app_id: str, state: AppState, message: str) -> None:
        """Say why a job failed, or that its TrainJob was deleted, once, in NeMo-Run's console, when this
        process first sees it (NeMo-Run's own status shows only the state)."""
        if watch.reported_end or threading.current_thread() is threading.main_thread():
            return  # NeMo-Run waits and builds its status table in worker threads
        watch.reported_end = True
        self._say(app_id, "failed" if state == AppState.FAILED else state.name.lower(), message)

    def _say(self, app_id: str, what: str, message: str, *, always: bool = False) -> None:
        """One line in NeMo-Run's console: ``<trainjob> <what>: <message>`` (``always``: from any thread)."""
        if not self.says_in_console or (not always and threading.current_thread() is threading.main_thread()):
            return
        from nemo_run.core.frontend.console.api import CONSOLE
        from rich.markup import escape

        CONSOLE.log(f"[bold]{records.parse_app_id(app_id)[1]}[/bold] {what}: {escape(message)}", highlight=False)

    def _report_progress(self, watch: AppWatch, app_id: str, state: AppState, message: str) -> None:
        """Show what a waiting job waits for, or how often a running one restarted, in NeMo-Run's console,
        when it changes. A queued task's place moving is not a change (it is said with the next line, and by
        `status`): a sweep of 1,000 tasks queued would print a line for each waiting task each time the queue moved."""
        said = without_place(message)
        if message and watch.last_progress != said and self.says_in_console:
            watch.last_progress = said
            from nemo_run.core.frontend.console.api import CONSOLE
            from rich.markup import escape

            CONSOLE.log(
                f"[bold]{records.parse_app_id(app_id)[1]}[/bold] {state.name.lower()}: {escape(message)}",
                highlight=False,
            )

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
        from nemo_kubeflow.observe.no_log import kept_or_no_log

        namespace, name = records.parse_app_id(app_id)
        record = records.load(namespace, name)
        cluster = self._cluster_for(namespace, name, record)
        job_dir = look.job_dir_of(record)
        lines: Iterable[str] = node_log_lines(
            cluster, namespace, name, k, follow=should_tail, stall_after=look.stall_after_of(record)
        )
        if should_tail and job_dir:
            # Kept next to the job: pods, and their logs, go when the job is deleted or fails.
            lines = tee_to_file(iter(lines), node_log_path(job_dir, k))
        elif not should_tail:
            # A finished job cleaned up (its TTL, gc, a failure that deleted the pods): what was kept.
            lines = list(lines) or kept_or_no_log(cluster, namespace, name, k, job_dir)
        return filter_regex(regex, lines) if regex else lines

    def _cancel_existing(self, app_id: str) -> None:
        namespace, name = records.parse_app_id(app_id)
        finished_jobs.note_cancelled(app_id)
        watch = self._watches.setdefault(app_id, AppWatch())
        watch.cancelled_here = True
        self._answers.wrote()
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


#: The attached waits each thread is in, shared by the schedulers of the process: torchx's ``Runner._scheduler``
#: makes its scheduler at first use without a lock, so the threads of NeMo-Run's wait pool (``_wait_for_jobs``),
#: starting together, may each make one, and a wait entered on one (``registration.wrap_runner_wait``) then
#: describes through another, the one the runner kept: its looks must still be the wait's.
_ATTACHED = threading.local()


class _DropRetryWarnings(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Retrying")


def _quiet_urllib3_retries() -> None:
    """urllib3 logs a WARNING for each retry of a connection (about 30 while the API server is down): ours
    say once that it cannot be reached, so those stay out of the user's console."""
    connections = logging.getLogger("urllib3.connectionpool")
    if not any(isinstance(f, _DropRetryWarnings) for f in connections.filters):
        connections.addFilter(_DropRetryWarnings())


def _abs(path: Optional[str]) -> Optional[str]:
    return os.path.abspath(os.path.expanduser(path)) if path else None


#: The status answers, looks and writes of the schedulers torchx makes for this process's runners: NeMo-Run
#: cancels through another runner's scheduler, waits through a third and asks a status through any, and an
#: answer is given again only if none of them looked at the job or wrote since (status_answers.py).
RUNNERS_ANSWERS = StatusAnswers()


#: Numbers each scheduler's answers in ``RUNNERS_ANSWERS``.
_SCHEDULER_NUMBERS = itertools.count()
#: id(experiment) -> (the NeMo-Run experiment, weakly, its scheduler): one per experiment (``create_scheduler``).
_EXPERIMENT_SCHEDULERS: dict[int, tuple[weakref.ref, KubeflowTrainerScheduler]] = {}
_EXPERIMENT_SCHEDULERS_LOCK = threading.Lock()


def create_scheduler(session_name: str, **kwargs: Any) -> KubeflowTrainerScheduler:
    """torchx's factory of our scheduler, sharing ``RUNNERS_ANSWERS``: one per NeMo-Run experiment (the
    ``experiment`` its runner passes), else a new one. torchx makes one per runner, but every thread of NeMo-Run's
    status pool that finds none yet makes its own (the first import is slow), and a task's second query then came
    through another scheduler than its first: it read again, and started a second round of lists."""
    experiment = kwargs.get("experiment")
    if experiment is None:
        return KubeflowTrainerScheduler(session_name=session_name, answers=RUNNERS_ANSWERS)
    with _EXPERIMENT_SCHEDULERS_LOCK:
        for key, (ref, _) in list(_EXPERIMENT_SCHEDULERS.items()):
            if ref() is None:
                del _EXPERIMENT_SCHEDULERS[key]
        made = _EXPERIMENT_SCHEDULERS.get(id(experiment))
        if made is not None and made[0]() is experiment and made[1].session_name == session_name:
            return made[1]
        scheduler = KubeflowTrainerScheduler(session_name=session_name, answers=RUNNERS_ANSWERS)
        try:
            _EXPERIMENT_SCHEDULERS[id(experiment)] = (weakref.ref(experiment), scheduler)
        except TypeError:
            pass  # not weakly referable: a scheduler of its own
        return scheduler
