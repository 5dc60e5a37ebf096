"""``nemo-kubeflow gc``: delete finished TrainJobs and the rendered runtimes no TrainJob references."""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import re
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional, Sequence

from nemo_kubeflow.cluster.client import KubernetesCluster
from nemo_kubeflow.constants import (
    CLUSTER_RUNTIME_KIND,
    EXPERIMENT_LABEL,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    RUNTIME_KIND,
    TRAINJOB_KIND,
    TTL_ANNOTATION,
)
from nemo_kubeflow.errors import ClusterError
from nemo_kubeflow.parts import naming

#: TrainJobs deleted at once: a DELETE waits for the API server (and, on the local cluster, its garbage collector's
#: first pass), so 1,000 finished tasks one after another took minutes; within the client's connection pool.
PARALLEL_DELETES = 8

#: ``gc`` leaves younger runtimes alone: a submission creates its runtime a moment before
#: the TrainJob that references it.
DEFAULT_MIN_AGE_S = 300


#: ``--older-than`` units: 30s, 45m, 12h, 7d, 2w, and sums such as 1d12h.
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(?:(\d+)([smhdw]))+")


def parse_duration(text: str) -> float:
    """Seconds of ``7d``, ``12h``, ``1d12h``, ``90m``, ``3600s`` (argparse type of ``--older-than``)."""
    value = text.strip()
    if not _DURATION.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected a duration such as 30m, 12h, 7d or 1d12h (units s, m, h, d, w)"
        )
    return float(sum(int(n) * DURATION_UNITS[u] for n, u in re.findall(r"(\d+)([smhdw])", value)))


#: The units of ``format_age``, largest first.
AGE_UNITS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))


def format_age(seconds: float) -> str:
    """``3d4h``, ``5h12m``, ``1m1s``, ``42s``: the largest unit and the next one, as kubectl shows ages."""
    if seconds == float("inf"):
        return "?"
    left = max(0, int(seconds))
    for i, (unit, size) in enumerate(AGE_UNITS):
        if left >= size or unit == "s":
            return _in_units(left, i)
    raise AssertionError("unreachable")  # pragma: no cover


def _in_units(seconds: int, i: int) -> str:
    """``seconds`` in unit ``i`` of ``AGE_UNITS``, and the rest in the next unit when it is not zero."""
    unit, size = AGE_UNITS[i]
    text = f"{seconds // size}{unit}"
    if i + 1 < len(AGE_UNITS):
        next_unit, next_size = AGE_UNITS[i + 1]
        if (seconds % size) // next_size:
            text += f"{(seconds % size) // next_size}{next_unit}"
    return text


def _since(stamp: Optional[str], now: datetime) -> float:
    if not stamp:
        return float("inf")
    return (now - datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))).total_seconds()


def _age_s(obj: dict, now: datetime) -> float:
    return _since(obj.get("metadata", {}).get("creationTimestamp"), now)


def _finished_age_s(trainjob: dict, now: datetime) -> float:
    """Seconds since the TrainJob's Complete or Failed condition turned true (else since its creation)."""
    finished = _finished_condition(trainjob)
    if finished is None:
        return _age_s(trainjob, now)
    return _since(finished.get("lastTransitionTime") or trainjob["metadata"].get("creationTimestamp"), now)


def _finished_condition(trainjob: dict) -> Optional[dict]:
    """The TrainJob's Complete or Failed condition, when one is true."""
    from nemo_kubeflow.observe.status import nested

    return next(
        (
            cond
            for cond in nested(trainjob, "status", "conditions", default=[])
            if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True"
        ),
        None,
    )


def experiment_labels(experiment: str) -> Callable[[str], bool]:
    """Whether an experiment label value belongs to ``experiment``, an experiment id or title.

    The label holds ``naming.label_value(id)`` and NeMo-Run's ids are ``<title>_<time_ns>``, so
    a title matches ``<title>_<digits>``. An id too long for a label value was shortened with a
    hash of the whole id: the ids of the title's experiments run from this machine
    (``$NEMORUN_HOME/experiments/<title>/``) are recognised too.
    """
    wanted = {naming.label_value(experiment)} | _local_experiment_labels(experiment)

    def matches(label: str) -> bool:
        if label in wanted:
            return True
        stamped = re.fullmatch(r".+_(\d+)", label)
        return stamped is not None and naming.label_value(f"{experiment}_{stamped.group(1)}") == label

    return matches


def _local_experiment_labels(title: str) -> set[str]:
    """The label values of the experiments titled ``title`` that this machine ran (NeMo-Run's home)."""
    try:
        title_dir = _title_dir(title)
        if title_dir is not None:
            return {naming.label_value(d.name) for d in title_dir.iterdir() if d.is_dir()}
    except OSError:
        pass
    return set()


def _title_dir(title: str) -> Optional[Path]:
    """NeMo-Run's directory of the experiments titled ``title`` on this machine; ``None`` when there is none,
    or ``title`` cannot be a title."""
    from nemo_run.config import get_nemorun_home

    title_dir = Path(get_nemorun_home()) / "experiments" / title
    if not title or "/" in title or not title_dir.is_dir():
        return None
    return title_dir


@dataclasses.dataclass
class FinishedJobs:
    """What ``gc`` decided about the TrainJobs nemo-kubeflow created."""

    #: (namespace, TrainJob, state name, seconds since it finished), to delete.
    selected: list[tuple[str, dict, str, float]] = dataclasses.field(default_factory=list)
    #: Not finished (pending, suspended, running): never deleted.
    unfinished: int = 0
    #: Finished, but more recently than ``--older-than`` (or, with ``--expired``, than their TTL).
    recent: int = 0
    #: Finished, without a ``ttl_seconds_after_finished`` (``--expired`` leaves them).
    without_ttl: int = 0


def job_ttl(trainjob: dict) -> Optional[int]:
    """The job's ``ttl_seconds_after_finished`` (its annotation), ``None`` without one."""
    from nemo_kubeflow.observe.status import nested

    value = nested(trainjob, "metadata", "annotations", TTL_ANNOTATION)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def select_finished_jobs(
    jobs: Sequence[tuple[str, dict]],
    now: datetime,
    *,
    experiments: Sequence[str] = (),
    older_than: Optional[float] = None,
    expired: bool = False,
) -> FinishedJobs:
    """The finished TrainJobs labelled as nemo-kubeflow's among ``jobs`` ((namespace, TrainJob)
    pairs) that belong to one of ``experiments`` (all when empty) and finished at least
    ``older_than`` seconds ago; with ``expired``, only those whose own ``ttl_seconds_after_finished``
    has passed. Talks to no cluster."""
    matchers = [experiment_labels(e) for e in experiments]
    result = FinishedJobs()
    for namespace, job in jobs:
        if _gc_may_consider(job, matchers):
            _sort_in(result, namespace, job, now, older_than, expired)
    return result


def _sort_in(
    result: FinishedJobs, namespace: str, job: dict, now: datetime, older_than: Optional[float], expired: bool
) -> None:
    """Count ``job`` where it belongs in ``result``: unfinished, without a TTL (with ``expired``), recent, or
    selected."""
    state = _finished_state(job)
    if state is None:
        result.unfinished += 1
        return
    age = _finished_age_s(job, now)
    ttl = job_ttl(job)
    if expired and ttl is None:
        result.without_ttl += 1
    elif _too_recent(age, older_than, ttl if expired else None):
        result.recent += 1
    else:
        result.selected.append((namespace, job, state, age))


def _too_recent(age: float, older_than: Optional[float], ttl: Optional[int]) -> bool:
    """Whether a job that finished ``age`` seconds ago did so less than ``older_than`` ago, or within its
    ``ttl`` (``--expired``); ``None``: no such limit."""
    return _finished_within(age, older_than) or _finished_within(age, ttl)


def _finished_state(job: dict) -> Optional[str]:
    """``SUCCEEDED`` or ``FAILED``; ``None`` while the job has not finished (pending, suspended, running)."""
    from torchx.specs import AppState

    from nemo_kubeflow.observe.status import job_status

    state = job_status(job).state
    return state.name if state in (AppState.SUCCEEDED, AppState.FAILED) else None


def _gc_may_consider(job: dict, matchers: Sequence[Callable[[str], bool]]) -> bool:
    """Whether ``job`` is ours (never touch another's), of a wanted experiment (any without ``matchers``)
    and not already being deleted."""
    labels = job.get("metadata", {}).get("labels") or {}
    if labels.get(MANAGED_BY_LABEL) != MANAGED_BY_VALUE:
        return False
    if not _of_experiments(labels, matchers):
        return False
    return not job["metadata"].get("deletionTimestamp")


def _of_experiments(labels: dict, matchers: Sequence[Callable[[str], bool]]) -> bool:
    """Whether a job's experiment label matches one of ``matchers`` (every job, without them)."""
    return not matchers or any(m(labels.get(EXPERIMENT_LABEL, "")) for m in matchers)


def _finished_within(age: float, limit: Optional[float]) -> bool:
    """Whether a job that finished ``age`` seconds ago did so less than ``limit`` ago (no limit: no)."""
    return limit is not None and age < limit


def _describe(kind: str, name: str, namespace: Optional[str]) -> str:
    return f"{kind}/{name}" + (f" (namespace {namespace})" if namespace else "")


def cmd_gc(args: argparse.Namespace) -> int:
    cluster = KubernetesCluster(kubeconfig=args.kubeconfig, context=args.context)
    namespaces = _gc_namespaces(cluster, args)
    # Candidates are listed before the TrainJobs, so that a TrainJob created in between is seen.
    candidates = _gc_runtime_candidates(cluster, namespaces, args.all_namespaces)
    jobs = _list_trainjobs(cluster, namespaces)
    now = datetime.now(timezone.utc)
    finished = select_finished_jobs(
        jobs, now, experiments=args.experiment or (), older_than=args.older_than, expired=args.expired
    )
    verb = "would delete" if args.dry_run else "deleted"

    leaving: set[tuple[str, Optional[str]]] = set()
    if _gc_deletes_finished(args):
        leaving = _gc_finished_jobs(cluster, finished, args, verb)
    elif finished.selected:
        print(
            f"{len(finished.selected)} finished TrainJob(s) kept, with their pods, ConfigMaps and Secrets: "
            "pass --finished, --experiment, --older-than or --expired to delete them",
            file=sys.stderr,
        )
    _gc_runtimes(cluster, candidates, _runtimes_in_use(jobs, leaving), now, args, verb)
    return 0


def _list_trainjobs(cluster: KubernetesCluster, namespaces: Sequence[str]) -> list[tuple[str, dict]]:
    """(namespace, TrainJob) of every TrainJob of ``namespaces``."""
    return [(ns, job) for ns in namespaces for job in cluster.list(TRAINJOB_KIND, ns)]


def _gc_namespaces(cluster: KubernetesCluster, args: argparse.Namespace) -> list[str]:
    """The namespaces ``gc`` collects: every one with ``--all-namespaces``, else those given (``default``)."""
    if args.all_namespaces:
        # One list per namespace: cluster.Kind.path has no cluster-wide form for namespaced kinds.
        return [ns["metadata"]["name"] for ns in cluster.list("Namespace", None)]
    return args.namespace or ["default"]


def _gc_deletes_finished(args: argparse.Namespace) -> bool:
    """Whether the command line selects finished TrainJobs to delete (else gc only reports them)."""
    return bool(args.finished or args.experiment or args.older_than is not None or args.expired)


def _gc_runtime_candidates(
    cluster: KubernetesCluster, namespaces: Sequence[str], all_namespaces: bool
) -> list[tuple[str, Optional[str], dict]]:
    """Our runtimes that gc may delete, as (kind, namespace or None, object): ClusterTrainingRuntimes only
    with ``all_namespaces`` (TrainJobs of any namespace may use them)."""
    selector = f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}"
    candidates: list[tuple[str, Optional[str], dict]] = [
        (RUNTIME_KIND, ns, obj) for ns in namespaces for obj in cluster.list(RUNTIME_KIND, ns, selector)
    ]
    if all_namespaces:
        candidates += [(CLUSTER_RUNTIME_KIND, None, obj) for obj in cluster.list(CLUSTER_RUNTIME_KIND, None, selector)]
    else:
        print(
            "ClusterTrainingRuntimes skipped: TrainJobs of any namespace may use them; "
            "pass --all-namespaces to collect them too",
            file=sys.stderr,
        )
    return candidates


def _gc_finished_jobs(
    cluster: KubernetesCluster, finished: FinishedJobs, args: argparse.Namespace, verb: str
) -> set[tuple[str, Optional[str]]]:
    """Delete the selected finished TrainJobs (or say what would go, with ``--dry-run``); the (namespace,
    uid) of each one going, whose runtimes it no longer holds."""
    leaving = set()
    deleted_jobs = 0
    pool = concurrent.futures.ThreadPoolExecutor(PARALLEL_DELETES, thread_name_prefix="gc-delete")
    try:
        # map keeps the list's order for what is printed; the first error (not a 409) ends gc as before, the
        # deletes not started yet cancelled.
        results = list(
            pool.map(lambda sel: _delete_finished_job(cluster, sel[0], sel[1], args.dry_run), finished.selected)
        )
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    for (ns, job, state, age), gone in zip(finished.selected, results):
        if gone is None:
            continue
        if gone:
            print(
                f"{verb} {_describe(TRAINJOB_KIND, job['metadata']['name'], ns)}: {state}, "
                f"finished {format_age(age)} ago"
            )
            deleted_jobs += 1
            if not args.dry_run:
                _remember_how_it_ended(ns, job, state, age)
        leaving.add((ns, job["metadata"].get("uid")))
    print(
        f"TrainJobs: {verb} {deleted_jobs} finished (their JobSets, pods, ConfigMaps and Secrets go with "
        f"them); kept {finished.unfinished} not finished{_finished_kept(finished, args)}",
        file=sys.stderr,
    )
    return leaving


def _delete_finished_job(cluster: KubernetesCluster, ns: str, job: dict, dry_run: bool) -> Optional[bool]:
    """Delete a finished TrainJob as listed: whether it is gone (with ``dry_run``: ``True``, nothing deleted),
    ``None`` when a new TrainJob has replaced it since (kept, and said so)."""
    name = job["metadata"]["name"]
    # Deleting the TrainJob lets the garbage collector remove what it owns: the JobSet and
    # its pods, the ConfigMaps, the Secret.
    try:
        # The uid: a TrainJob recreated under this name since the list is not the one that finished.
        return dry_run or cluster.delete(TRAINJOB_KIND, name, ns, uid=job["metadata"].get("uid"))
    except ClusterError as e:
        if e.status != 409:
            raise
    print(f"kept {_describe(TRAINJOB_KIND, name, ns)}: replaced by a new TrainJob since it was listed", file=sys.stderr)
    return None


def _finished_kept(finished: FinishedJobs, args: argparse.Namespace) -> str:
    """The finished TrainJobs gc kept, for its summary line: too recent, or without a TTL (``--expired``)."""
    recent = (
        f", {finished.recent} that finished less than {format_age(args.older_than)} ago"
        if args.older_than is not None
        else ""
    )
    if args.expired:
        if args.older_than is None:
            recent += f", {finished.recent} within their ttl_seconds_after_finished"
        recent += f", {finished.without_ttl} without ttl_seconds_after_finished"
    return recent


def _remember_how_it_ended(namespace: str, trainjob: dict, state: str, age: float) -> None:
    """A status of a job gc deleted says how it ended (from the app record, where this machine has one)."""
    from nemo_kubeflow.cluster import records
    from nemo_kubeflow.observe.status import job_status

    reason = job_status(trainjob).message
    deleted = f"its TrainJob was deleted by nemo-kubeflow gc {format_age(age)} after it finished"
    records.record_outcome(
        namespace, trainjob["metadata"]["name"], state, f"{reason} ({deleted})" if reason else deleted
    )


def _runtimes_in_use(
    jobs: Sequence[tuple[str, dict]], leaving: set[tuple[str, Optional[str]]]
) -> set[tuple[str, Optional[str], str]]:
    """The (kind, namespace or None, name) of the runtime each of ``jobs`` refers to, but for the jobs
    ``leaving`` ((namespace, uid): being deleted)."""
    referenced: set[tuple[str, Optional[str], str]] = set()
    for ns, job in jobs:
        if (ns, job["metadata"].get("uid")) in leaving:
            continue
        ref = job.get("spec", {}).get("runtimeRef", {})
        kind = ref.get("kind") or CLUSTER_RUNTIME_KIND  # Trainer's default
        referenced.add((kind, None if kind == CLUSTER_RUNTIME_KIND else ns, ref.get("name", "")))
    return referenced


def _gc_runtimes(
    cluster: KubernetesCluster,
    candidates: Sequence[tuple[str, Optional[str], dict]],
    referenced: set[tuple[str, Optional[str], str]],
    now: datetime,
    args: argparse.Namespace,
    verb: str,
) -> None:
    """Delete the candidate runtimes no TrainJob uses that are at least ``--min-age`` old."""
    removed = kept = young = 0
    for kind, ns, obj in candidates:
        name = obj["metadata"]["name"]
        if (kind, ns, name) in referenced:
            kept += 1
        elif _age_s(obj, now) < args.min_age:
            young += 1
        elif _delete_runtime(cluster, kind, name, ns, args.dry_run):
            removed += 1
    print(
        f"{verb} {removed}, kept {kept} in use, {young} younger than {args.min_age:g}s",
        file=sys.stderr,
    )


def _delete_runtime(cluster: KubernetesCluster, kind: str, name: str, ns: Optional[str], dry_run: bool) -> bool:
    """Delete a runtime (with ``dry_run``, say that it would go), printing it; whether it went (or would)."""
    what = _describe(kind, name, ns)
    if dry_run:
        print(f"would delete {what}")
        return True
    if cluster.delete(kind, name, ns):
        print(f"deleted {what}")
        return True
    return False
