"""The TrainJobs, JobSets and pods of one experiment's tasks in one namespace, each kind listed once: the status
queries of an experiment of many tasks (NeMo-Run's ``Experiment.status``, ``nemo experiment status``,
``nemo-kubeflow status`` and ``logs``) answered from a few lists, not from a look's reads per task.

The status queries of an experiment's tasks come in rounds (NeMo-Run's ``Experiment.status`` asks each task in
turn). A round's first query reads as a look of one task does (a status of one task costs what it did); its
second lists, as its look asks for them, the TrainJobs labelled ``EXPERIMENT_LABEL=E`` (one list), the namespace's
JobSets and the pods of those TrainJobs' JobSets (they do not carry the experiment's label: Trainer gives them none
of the TrainJob's own): those not running while only running tasks' looks ask (``NOT_RUNNING``: a running sweep's
are few, where every pod of 1,000 tasks was most of the bytes), every pod once another look asks; the round's
other queries read what those lists hold (``TaskReader``: the
``ClusterReader`` of one task, as ``cluster/watched.WatchedJob`` is for one job's repeated looks, with the same
selector matching). A round ends when one of its tasks is asked again, ``REUSE_S`` after its last query, or at a
write.
What only a waiting or failed task needs (events, node logs) is read per task, as before; Kueue's Workloads of
the namespace once per snapshot. A running task's node logs (its progress line where its TrainJob carries no
``trainerStatus``, log silence, ft_launcher's restarts) are not read in a round's snapshot (``one_of_many``): one
log read per running task was most of a status of many tasks (1,000 of its 1,045 requests at 1,000 tasks); its
status says so, and how to ask for that task alone.

Its guarantees are those of a look: a list that fails is the look's error (never a state it could not read); the
lists are made in the order the look reads (the TrainJobs first), so the pods of a job over are at least as new
as the verdict; a write of this process (a submission, a cancel, a repair) drops every snapshot (``drop``). An
experiment with one task in the namespace is read as before (its JobSet and pods by name: a list of the whole
namespace's JobSets would cost more than it saves).
"""

from __future__ import annotations

import builtins
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator, Optional

from nemo_kubeflow.cluster.client import ClusterReader
from nemo_kubeflow.cluster.log_stream import LogStream
from nemo_kubeflow.cluster.watched import _pod_matcher, held_copy, partial_metadata
from nemo_kubeflow.constants import (
    EXPERIMENT_LABEL,
    JOBSET_KIND,
    JOBSET_NAME_LABEL,
    NOT_RUNNING,
    TRAINJOB_KIND,
    WORKLOAD_KIND,
)

#: A round of status queries (and its snapshot) ends when none of its tasks was asked for this long: a status of
#: 1,000 tasks on a loaded machine may take longer in all, and would list everything again part-way through.
REUSE_S = 5.0
#: The pods of at most this many characters of JobSet names are listed by name (``in (...)``); more, and every
#: JobSet pod of the namespace is (a request line stays well within any server's limit).
NAMED_SELECTOR_CHARS = 4000
#: The kinds a snapshot lists (and ``Workload``: Kueue's, of the whole namespace, as a queued look reads them).
HELD_KINDS = (TRAINJOB_KIND, JOBSET_KIND, "Pod")


class ExperimentSnapshot:
    """One experiment's objects in one namespace, each kind listed at its first read (thread-safe)."""

    def __init__(self, cluster: ClusterReader, namespace: str, experiment: str) -> None:
        self.cluster, self.namespace, self.experiment = cluster, namespace, experiment
        self._lock = threading.Lock()
        #: kind -> name -> object, once listed.
        self._held: dict[str, dict[str, dict]] = {}
        #: The experiment's pods by name, once listed: those not running (``NOT_RUNNING``), every pod (None).
        self._pods: dict[Optional[str], dict[str, dict]] = {}
        #: The held pods of each list by their JobSet's name, each JobSet's in the API server's order (by name),
        #: and the held Workloads by the uid of each owner: a task's query reads its own, not every one of 1,000
        #: tasks'.
        self._pods_by_jobset: dict[Optional[str], dict[str, list[dict]]] = {}
        self._workloads_by_owner: Optional[dict[str, list[dict]]] = None
        #: LocalQueue -> Kueue's pending workloads of it (``pending_workloads``), once read.
        self._pending: dict[str, Optional[list[dict]]] = {}

    def reader(self, name: str) -> TaskReader:
        """The reader of the look at task ``name`` (its TrainJob's name)."""
        return TaskReader(self, name)

    def trainjobs(self) -> dict[str, dict]:
        """The experiment's TrainJobs in the namespace, by name (listed at the first call)."""
        return self._listed(TRAINJOB_KIND)

    def covers(self, name: str) -> bool:
        """Whether the JobSet and pods of TrainJob ``name`` are read from the snapshot: it is one of the
        experiment's, and not its only one in the namespace."""
        jobs = self.trainjobs()
        return name in jobs and len(jobs) > 1

    def _listed(self, kind: str) -> dict[str, dict]:
        if kind == "Pod":
            with self._lock:
                return self._pods[self._pod_list(None)]
        with self._lock:  # one list per kind, whichever task's look asks first
            held = self._held.get(kind)
            if held is None:
                held = self._held[kind] = self._list(kind)
            return held

    def _pod_list(self, field_selector: Optional[str]) -> Optional[str]:
        """The key in ``_pods`` of the pods that answer a list with ``field_selector`` (under the lock), listed if
        not yet: every pod, once held; else the pods not running for a running task's look (``NOT_RUNNING``), and
        every pod for any other look (a selector of running pods would list about as many). At most two lists."""
        if None in self._pods:
            return None
        key = NOT_RUNNING if field_selector == NOT_RUNNING else None
        if key not in self._pods:
            self._pods[key] = self._list("Pod", key)
        return key

    def _list(self, kind: str, field_selector: Optional[str] = None) -> dict[str, dict]:
        items = self.cluster.list(kind, self.namespace, self._label_selector(kind), field_selector)
        return {o["metadata"]["name"]: o for o in items}

    def _label_selector(self, kind: str) -> Optional[str]:
        """The label selector of the list of ``kind``."""
        if kind == TRAINJOB_KIND:
            return f"{EXPERIMENT_LABEL}={self.experiment}"
        if kind == "Pod":
            names = ",".join(sorted(self._held.get(TRAINJOB_KIND) or {}))
            if names and len(names) <= NAMED_SELECTOR_CHARS:
                return f"{JOBSET_NAME_LABEL} in ({names})"
            return JOBSET_NAME_LABEL
        return None  # JobSets (named as their TrainJobs), Kueue's Workloads: the namespace's

    def pending_workloads(self, queue: str) -> Optional[list[dict]]:
        """Kueue's pending workloads of LocalQueue ``queue`` in the namespace, read once for the round."""
        with self._lock:
            if queue not in self._pending:
                self._pending[queue] = self.cluster.pending_workloads(self.namespace, queue)
            return self._pending[queue]

    def held(self, kind: str) -> dict[str, dict]:
        """The objects of ``kind`` (a kind of ``HELD_KINDS`` or ``WORKLOAD_KIND``), listed if not yet."""
        if kind == "Pod":
            self.trainjobs()  # the TrainJobs first: the pods then are at least as new as their verdicts
        return self._listed(kind)

    def pods_of(self, jobset: str, field_selector: Optional[str] = None) -> list[dict]:
        """The held pods of JobSet ``jobset`` among which a list with ``field_selector`` finds its answer (every
        pod of it, or those listed with that selector), by name (listed if not yet)."""
        self.trainjobs()  # the TrainJobs first: the pods then are at least as new as their verdicts
        with self._lock:
            key = self._pod_list(field_selector)
            index = self._pods_by_jobset.get(key)
            if index is None:
                index = self._pods_by_jobset[key] = {}
                pods = self._pods[key]
                for name in sorted(pods):
                    labels = pods[name]["metadata"].get("labels") or {}
                    if JOBSET_NAME_LABEL in labels:
                        index.setdefault(labels[JOBSET_NAME_LABEL], []).append(pods[name])
            return index.get(jobset, [])

    def workloads_owned_by(self, uid: str) -> list[dict]:
        """The held Workloads an object of that uid owns (listed if not yet)."""
        workloads = self.held(WORKLOAD_KIND)
        with self._lock:
            if self._workloads_by_owner is None:
                index: dict[str, list[dict]] = {}
                for workload in workloads.values():
                    for ref in workload["metadata"].get("ownerReferences") or ():
                        index.setdefault(ref.get("uid", ""), []).append(workload)
                self._workloads_by_owner = index
            return self._workloads_by_owner.get(uid, [])


@dataclass
class _Round:
    """One round of status queries of an experiment's tasks (``Experiment.status`` asks each in turn): its
    first task read on its own, the others from one snapshot, each task at most once."""

    last: float  # when a task of it was last asked
    asked: set[str]
    snapshot: Optional[ExperimentSnapshot] = None


class ExperimentSnapshots:
    """A process's rounds of status queries, by (API server, namespace, experiment). A round ends when one of its
    tasks is asked again (the next round's first query), ``REUSE_S`` after its last query, or at a write of this
    process: no answer is older than the round it belongs to. The API server is the tasks' (kubeconfig, context),
    not a client object: NeMo-Run's status may ask each task through a scheduler of its own, each with its own
    client."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rounds: dict[tuple, _Round] = {}

    def reader(
        self, cluster: ClusterReader, server: tuple, namespace: str, experiment: str, name: str
    ) -> Optional[TaskReader]:
        """The reader of the status query of task ``name`` of ``experiment`` on ``server`` (through ``cluster``):
        the round's snapshot (made now, if this is its second task), or None for a round's first query (the
        task's own reads)."""
        key, now = (server, namespace, experiment), time.monotonic()
        with self._lock:
            self._rounds = {k: r for k, r in self._rounds.items() if now - r.last < REUSE_S}
            round_ = self._rounds.get(key)
            if round_ is None or name in round_.asked:
                self._rounds[key] = _Round(now, {name})
                return None
            round_.asked.add(name)
            round_.last = now
            if round_.snapshot is None:
                round_.snapshot = ExperimentSnapshot(cluster, namespace, experiment)
            return round_.snapshot.reader(name)

    def drop(self) -> None:
        """This process wrote: the next status query starts a round."""
        with self._lock:
            self._rounds = {}


def one_of_many(reader: Any) -> bool:
    """Whether ``reader`` answers a status query of one task among several of its experiment, from their round's
    snapshot: the look reads no node log of a running task then (the experiment's status costs the API server a
    few lists, not a read per task)."""
    return isinstance(reader, TaskReader) and reader.snapshot.covers(reader.name)


class TaskReader:
    """A ``ClusterReader`` for one status query of task ``name``: its TrainJob, JobSet and pods (and, for a list
    of the namespace's Kueue Workloads, those its TrainJob owns: what a queued look reads them for) from the
    experiment's snapshot; every other read from the API server."""

    def __init__(self, snapshot: ExperimentSnapshot, name: str) -> None:
        self.snapshot, self.name = snapshot, name
        self.cluster = snapshot.cluster

    @property
    def server_reader(self) -> ClusterReader:
        """Why a job ended is read from this reader too: its lists came after its TrainJob's (``held``)."""
        return self

    def get(self, kind: str, name: str, namespace: Optional[str] = None) -> Optional[dict]:
        if name == self.name and self._answers(kind, namespace):
            found = self.snapshot.held(kind).get(name)
            if found is not None or kind == JOBSET_KIND:  # every JobSet of the namespace was listed
                return held_copy(found)
        return self.cluster.get(kind, name, namespace)  # a task gone from the list: as its own read says

    def list(
        self,
        kind: str,
        namespace: Optional[str],
        label_selector: Optional[str] = None,
        field_selector: Optional[str] = None,
        limit: Optional[int] = None,
    ) -> builtins.list[dict]:
        if kind == WORKLOAD_KIND and namespace == self.snapshot.namespace and not (label_selector or field_selector):
            # A look lists them for the one its TrainJob owns (``owned_workload``): those are what it gets.
            trainjob = self.snapshot.trainjobs().get(self.name)
            if trainjob is not None:
                owned = self.snapshot.workloads_owned_by(trainjob["metadata"].get("uid", ""))
                return held_copy(owned[:limit])
            return held_copy(list(self.snapshot.held(WORKLOAD_KIND).values())[:limit])
        found = self._pods(kind, namespace, label_selector, field_selector)
        if found is None:
            return self.cluster.list(kind, namespace, label_selector, field_selector, limit)
        return held_copy(found[:limit])

    def list_metadata(
        self,
        kind: str,
        namespace: Optional[str],
        label_selector: Optional[str] = None,
        field_selector: Optional[str] = None,
    ) -> builtins.list[dict]:
        found = self._pods(kind, namespace, label_selector, field_selector)
        if found is None:
            return self.cluster.list_metadata(kind, namespace, label_selector, field_selector)
        return partial_metadata(found)

    def pending_workloads(self, namespace: str, queue: str) -> Optional[builtins.list[dict]]:
        if namespace == self.snapshot.namespace:
            return self.snapshot.pending_workloads(queue)
        return self.cluster.pending_workloads(namespace, queue)

    def pod_log(self, name: str, namespace: str, **options: Any) -> Iterator[str]:
        return self.cluster.pod_log(name, namespace, **options)

    def pod_log_stream(self, name: str, namespace: str, **options: Any) -> LogStream:
        return self.cluster.pod_log_stream(name, namespace, **options)

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self.cluster, attribute)  # what else a reader of ours asks (served versions, access)

    def _answers(self, kind: str, namespace: Optional[str]) -> bool:
        """Whether a read of this task's ``kind`` comes from the snapshot."""
        if kind not in HELD_KINDS or namespace != self.snapshot.namespace:
            return False
        return kind == TRAINJOB_KIND or self.snapshot.covers(self.name)

    def _pods(
        self, kind: str, namespace: Optional[str], label_selector: Optional[str], field_selector: Optional[str]
    ) -> Optional[builtins.list[dict]]:
        """The held pods of this task's JobSet a list selects, in the API server's order (by name); None where
        it must ask (not a list of this task's pods, or a selector not evaluated here)."""
        if kind != "Pod" or not self._answers(kind, namespace):
            return None
        match = _pod_matcher(f"{JOBSET_NAME_LABEL}={self.name}", label_selector, field_selector)
        if match is None:
            return None
        return [pod for pod in self.snapshot.pods_of(self.name, field_selector) if match(pod)]
