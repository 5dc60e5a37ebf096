"""The TorchX scheduler ``kubeflow_trainer``: NeMo-Run's bridge to the cluster.

* ``_submit_dryrun`` only builds: it validates the executor, packages the task's
  files, renders and checks every manifest, and writes them to
  ``<job_dir>/manifests/``. NeMo-Run calls it on every real run too, so it never
  contacts a cluster.
* ``schedule`` only applies what the dry run built (``submit.submit``).
* ``describe``/``log_iter``/``_cancel_existing`` are stateless: the app id is
  ``<namespace>:<trainjob>``, and the kubeconfig comes from a small per-app record,
  so status, logs and cancel work from ``Experiment.from_id`` in a new process and
  from ``nemo experiment status|logs|cancel``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from types import FrameType
from typing import TYPE_CHECKING, Any, Iterable, Optional

from nemo_run.run.torchx_backend.schedulers.api import SchedulerMixin
from torchx.schedulers.api import AppDryRunInfo, DescribeAppResponse, Scheduler, Stream, filter_regex
from torchx.specs import AppDef, AppState, ReplicaStatus, Role, RoleStatus, is_terminal, make_app_handle, runopts

from nemo_kubeflow.build import yamlio
from nemo_kubeflow.cluster import records
from nemo_kubeflow.cluster.client import Cluster, KubernetesCluster
from nemo_kubeflow.config.executor import KubeflowExecutor
from nemo_kubeflow.constants import SCHEDULER_NAME, TASK_LABEL, TRAINER_NODE, TRAINJOB_KIND, queue_name
from nemo_kubeflow.errors import ClusterError, ConfigError, SubmissionStopped
from nemo_kubeflow.nemo_run import finished_jobs, interrupt
from nemo_kubeflow.observe.status import (
    job_status,
    owned_workload,
    queue_wait_message,
    running_for_at_least,
    stall_message,
)

if TYPE_CHECKING:
    from nemo_kubeflow.build.plan import Submission
    from nemo_kubeflow.observe.diagnosis import InJobRestarts, JobView, Restarts
    from nemo_kubeflow.observe.logs import NodeLogKeeper

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
    if req.manifests_dir and req.manifests_removed:
        lines.append("  manifests: not kept, exp.dryrun() removes the experiment directory when it returns; keep "
                     "them with exp.dryrun(delete_exp_dir=False), or write them anywhere with nemo-kubeflow render "
                     "--out DIR")
    elif req.manifests_dir:
        lines.append(f"  manifests written to {req.manifests_dir}")
    return "\n".join(lines)


def _removed_by_exp_dryrun(path: str) -> bool:
    """Whether NeMo-Run's ``Experiment.dryrun`` runs this dry run and removes ``path`` when it returns: it
    removes the experiment directory unless called with ``delete_exp_dir=False``. Read from its frame (NeMo-Run
    tells the scheduler nothing of it); ``False`` when the dry run is not one of ``exp.dryrun()``."""
    from nemo_run.run.experiment import Experiment

    frame: Optional[FrameType] = sys._getframe(1)
    while frame is not None:
        if frame.f_code is Experiment.dryrun.__code__:
            exp_dir = getattr(frame.f_locals.get("self"), "_exp_dir", None)
            return bool(frame.f_locals.get("delete_exp_dir")) and isinstance(exp_dir, str) and \
                os.path.commonpath([os.path.abspath(exp_dir), os.path.abspath(path)]) == os.path.abspath(exp_dir)
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
    return (f"retries={executor.retries} with {launcher}: when a rank fails, {launcher} exits 1, which "
            f"fail_fast_exit_codes={list(codes)} counts as a user error: the job fails at once, no retry. retries "
            "restarts the gang only for pod disruptions (eviction, preemption, a lost node) and exit codes not in "
            "fail_fast_exit_codes. To retry failed ranks too, set fail_fast_exit_codes=[] (or drop 1 from it); see "
            "docs/resilience.md#failure-classes-user-errors-fail-fast")


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


class KubeflowTrainerScheduler(SchedulerMixin, Scheduler[dict]):  # type: ignore[misc]
    def __init__(self, session_name: str, cluster: Optional[Cluster] = None) -> None:
        super().__init__(SCHEDULER_NAME, session_name)
        #: Injected for tests; otherwise one client per (kubeconfig, context).
        self._fixed_cluster = cluster
        self._clusters: dict[tuple, Cluster] = {}
        #: Per cluster: the runtimes this scheduler created or reused, not sent again (submit.py).
        self._known_runtimes: dict[tuple, set] = {}
        self._last_progress: dict[str, str] = {}
        self._running_seen: dict[str, int] = {}
        self._keepers: dict[str, NodeLogKeeper] = {}
        self._reported_failure: dict[str, bool] = {}
        #: app id -> (when, warning) of the last stall check: NeMo-Run's wait loop polls often.
        self._stall_checked: dict[str, tuple[float, str]] = {}
        #: app id -> gang attempt -> how its failed pod ended, as this process saw it: JobSet deletes an
        #: attempt's pods when it restarts the gang, so later describes only have the events.
        self._failures_seen: dict[str, dict[int, str]] = {}
        #: app id -> the most ft_launcher restarts the kept node logs showed (old lines leave the keeper).
        self._in_job_seen: dict[str, InJobRestarts] = {}
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
                result = submit(cluster, sub, known_runtimes=known, timeout=req.submit_timeout_seconds,
                                stop=interrupt.stop_requested)
            except SubmissionStopped as stopped:
                interrupt.stopped(stopped)
                # A plain KeyboardInterrupt: uncaught, Python ends the program by SIGINT (a shell's 130).
                raise KeyboardInterrupt(str(stopped)) from None
            records.save(records.AppRecord(
                namespace=sub.namespace, name=sub.name, kubeconfig=_abs(req.kubeconfig), context=req.context,
                nodes=req.nodes, job_dir=req.job_dir, stall_warning_seconds=req.stall_warning_seconds,
            ))
        log.info("submitted TrainJob %s/%s (%s)", sub.namespace, sub.name,
                 ", ".join(f"{v} {k}" for v, k, _ in result.actions))
        app_id = records.app_id(sub.namespace, sub.name)
        interrupt.submitted(app_id, make_app_handle(SCHEDULER_NAME, self.session_name, app_id), req.job_dir)
        return app_id

    # --- observe ---------------------------------------------------------------------
    def describe(self, app_id: str) -> Optional[DescribeAppResponse]:
        from nemo_kubeflow.observe.diagnosis import JobView, why_failed, why_waiting
        from nemo_kubeflow.repair import node_avoidance

        namespace, name = records.parse_app_id(app_id)
        record = records.load(namespace, name)
        cluster = self._cluster_for(namespace, name, record)
        trainjob = cluster.get(TRAINJOB_KIND, name, namespace)
        finished_jobs.note_described(app_id, trainjob)
        nodes = nodes_of(trainjob, record)
        if trainjob is None and record is not None and record.outcome_state:
            # We deleted it ourselves after a fatal error: keep reporting that error.
            return self._response(app_id, AppState[record.outcome_state], record.outcome_message, nodes,
                                  TRAINER_NODE)
        status = job_status(trainjob, name=f"{namespace}/{name}")
        state, message = status.state, status.message
        queue = queue_name(trainjob)
        view: Optional[JobView] = None  # the job's pods, read at most once per describe
        waiting = state in (AppState.SUBMITTED, AppState.PENDING) and trainjob is not None \
            and not message.startswith("suspended")
        if state in (AppState.SUBMITTED, AppState.PENDING) and queue and (trainjob.get("spec") or {}).get("suspend"):
            # Suspended until Kueue admits it: say why it waits, from its Workload.
            state, message = AppState.PENDING, self._why_queued(cluster, namespace, trainjob, queue)
            self._report_progress(app_id, state, message)
        elif waiting:
            view = JobView.read(cluster, trainjob)
            verdict = why_waiting(view, nodes, state)
            state, message = verdict.state, verdict.message
            if verdict.fatal:
                self._delete_unstartable(cluster, namespace, name, record, message)
            self._report_progress(app_id, state, message)
        elif state == AppState.FAILED:
            view = self._view(app_id, cluster, trainjob)
            message = why_failed(view, message, record.job_dir if record else "", keeper=self._keepers.get(app_id),
                                 seen=self._failures_seen.get(app_id))
            self._report_failure(app_id, message)
        elif state == AppState.RUNNING:
            view = self._view(app_id, cluster, trainjob)
            if record is not None and record.job_dir:
                self._keep_logs(app_id, cluster, namespace, name, nodes, record.job_dir)
            facts = [self._restarts(app_id, view).note(finished=False)]
            if record is not None and record.stall_warning_seconds:
                facts.insert(0, self._stall_warning_throttled(app_id, cluster, view, record.stall_warning_seconds))
            message = "; ".join(f for f in facts if f) or message
        if trainjob is not None and not is_terminal(state):
            message = "; ".join(m for m in (message, node_avoidance.check(
                cluster, namespace, name, trainjob, nodes, pods=view.pods if view else None))
                                if m)
        if state == AppState.RUNNING:
            # NeMo-Run's wait and `nemo experiment status` show only the state: say what changed.
            self._report_progress(app_id, state, message)
        if is_terminal(state) and app_id in self._keepers:
            self._keepers.pop(app_id).stop()
        interrupt.check_wait(app_id, is_terminal(state))
        return self._response(app_id, state, message, nodes, role_of(trainjob))

    def _view(self, app_id: str, cluster: Cluster, trainjob: dict) -> JobView:
        """The job's pods (one read), noting how each gang attempt's failed pod ended while it is at hand."""
        from nemo_kubeflow.observe.diagnosis import JobView

        view = JobView.read(cluster, trainjob)
        seen = self._failures_seen.setdefault(app_id, {})
        for attempt, how in view.failures_by_attempt().items():
            seen.setdefault(attempt, how)
        return view

    def _restarts(self, app_id: str, view: JobView) -> Restarts:
        """A running job's restarts: gang restarts from its pods (and events, after one), ft_launcher's from
        the node logs this process keeps while it waits, else (another process: ``nemo experiment status``)
        from node 0's last lines, one log read, for a job that runs ft_launcher only."""
        from nemo_kubeflow.observe.diagnosis import keeper_in_job_restarts

        keeper = self._keepers.get(app_id)
        in_job = keeper_in_job_restarts(keeper) if keeper is not None else \
            view.in_job_restarts_of_node_0() if view.runs_ft_launcher() else None
        best = self._in_job_seen.get(app_id)
        if in_job is not None and (best is None or in_job.count >= best.count):
            self._in_job_seen[app_id] = best = in_job
        return view.restarts(seen=self._failures_seen.get(app_id), in_job=best)

    def _keep_logs(self, app_id: str, cluster: Cluster, namespace: str, name: str, nodes: int, job_dir: str) -> None:
        """From the second time a running job is described in this process (a wait polls; one status
        call does not), keep every node's last lines, for the failure summary (``NodeLogKeeper``)."""
        self._running_seen[app_id] = self._running_seen.get(app_id, 0) + 1
        if self._running_seen[app_id] >= 2 and app_id not in self._keepers:
            from nemo_kubeflow.observe.logs import NodeLogKeeper

            self._keepers[app_id] = NodeLogKeeper(cluster, namespace, name, nodes, os.path.join(job_dir, "logs"))

    def _report_failure(self, app_id: str, message: str) -> None:
        """Say why a job failed once, in NeMo-Run's console, when this process first sees it
        (NeMo-Run's own status shows only the state)."""
        if self._reported_failure.get(app_id) or threading.current_thread() is threading.main_thread():
            return  # NeMo-Run waits and builds its status table in worker threads
        self._reported_failure[app_id] = True
        from nemo_run.core.frontend.console.api import CONSOLE
        from rich.markup import escape

        CONSOLE.log(f"[bold]{records.parse_app_id(app_id)[1]}[/bold] failed: {escape(message)}", highlight=False)


    def _stall_warning_throttled(self, app_id: str, cluster: Cluster, view: JobView, seconds: int) -> str:
        """``_stall_warning``, not checked again before a tenth of the threshold (30 s at most) has passed."""
        checked_at, warning = self._stall_checked.get(app_id, (float("-inf"), ""))
        if time.monotonic() - checked_at >= min(30.0, seconds / 10):
            warning = self._stall_warning(cluster, view, seconds)
            self._stall_checked[app_id] = (time.monotonic(), warning)
        return warning

    @staticmethod
    def _stall_warning(cluster: Cluster, view: JobView, seconds: int) -> str:
        """Which running nodes printed nothing for ``seconds``: no log read while the job is younger
        than that, then one short log read (``sinceSeconds``) per node (the pods are the view's)."""
        now = datetime.now(timezone.utc)
        created = view.trainjob["metadata"].get("creationTimestamp")
        if not created or (now - datetime.fromisoformat(created.replace("Z", "+00:00"))).total_seconds() < seconds:
            return ""
        namespace, pods = view.namespace, view.node_pods
        silent = [index for index, pod in sorted(running_for_at_least(pods, seconds, now).items())
                  if not any(True for _ in cluster.pod_log(pod, namespace, container=TRAINER_NODE, tail_lines=1,
                                                           since_seconds=seconds))]
        return stall_message(silent, seconds)

    @staticmethod
    def _why_queued(cluster: Cluster, namespace: str, trainjob: dict, queue: str) -> str:
        """While Kueue holds the job: the Workload's reason (one read; none if Workloads cannot be read)."""
        try:
            workloads = cluster.list("Workload", namespace)
        except ClusterError as e:
            log.debug("cannot read Kueue Workloads in %s: %s", namespace, e)
            workloads = []
        return queue_wait_message(queue, owned_workload(workloads, trainjob))

    @staticmethod
    def _delete_unstartable(cluster: Cluster, namespace: str, name: str, record: Optional[records.AppRecord],
                            message: str) -> None:
        """A job that can never start as configured (``diagnosis.why_waiting`` says fatal: an image the
        registry does not have): stop waiting and free the cluster. The TrainJob is deleted, and the app
        record keeps the outcome, so that later describes (which find no TrainJob) still report it."""
        cluster.delete(TRAINJOB_KIND, name, namespace)
        if record is not None:
            records.save(dataclasses.replace(record, outcome_state=AppState.FAILED.name, outcome_message=message))

    def _report_progress(self, app_id: str, state: AppState, message: str) -> None:
        """Show what a waiting job waits for, or how often a running one restarted, in NeMo-Run's console,
        when it changes."""
        if message and self._last_progress.get(app_id) != message:
            self._last_progress[app_id] = message
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
        from nemo_kubeflow.observe.logs import kept_node_log, node_log_lines, node_log_path, tee_to_file

        namespace, name = records.parse_app_id(app_id)
        record = records.load(namespace, name)
        cluster = self._cluster_for(namespace, name, record)
        lines = node_log_lines(cluster, namespace, name, k, follow=should_tail,
                               stall_after=record.stall_warning_seconds if record else None)
        if should_tail and record is not None and record.job_dir:
            # Kept next to the job: pods, and their logs, go when the job is deleted or fails.
            lines = tee_to_file(lines, node_log_path(record.job_dir, k))
        elif not should_tail and record is not None and record.job_dir:
            # A finished job cleaned up (its TTL, gc, a failure that deleted the pods): what was kept.
            lines = list(lines) or kept_node_log(record.job_dir, k)
        return filter_regex(regex, lines) if regex else lines

    def _cancel_existing(self, app_id: str) -> None:
        namespace, name = records.parse_app_id(app_id)
        finished_jobs.note_cancelled(app_id)
        # Deleting the TrainJob removes its JobSet, pods, ConfigMaps and Secret (ownerReferences).
        self._cluster_for(namespace, name).delete(TRAINJOB_KIND, name, namespace)

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


def role_of(trainjob: Optional[dict]) -> str:
    """The role a described job reports: its task's name, as in the AppDef NeMo-Run submitted. NeMo-Run and
    `torchx log` print `<role>/<replica>` before each log line (the role cut to its last 10 characters),
    so a followed line reads `train/1 ...` in the submitting process and in any later one alike."""
    return ((trainjob or {}).get("metadata", {}).get("labels") or {}).get(TASK_LABEL) or TRAINER_NODE


def nodes_of(trainjob: Optional[dict], record: Optional[records.AppRecord]) -> int:
    trainer = ((trainjob or {}).get("spec") or {}).get("trainer") or {}
    return trainer.get("numNodes") or (record.nodes if record else 1)


def _abs(path: Optional[str]) -> Optional[str]:
    return os.path.abspath(os.path.expanduser(path)) if path else None


def create_scheduler(session_name: str, **kwargs: Any) -> KubeflowTrainerScheduler:
    return KubeflowTrainerScheduler(session_name=session_name)
