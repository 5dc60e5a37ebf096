"""A job's TrainJob, JobSet and pods kept current by watches: the reads of a look that repeats (an attached
wait, ``nemo-kubeflow watch``) answered without a request.

A look every 2 s that GETs the TrainJob and the JobSet and lists the pods not running costs the API server
three requests, and their bytes, per look, whether anything changed or not. ``WatchedJob`` lists each of them
once, then watches their changes (one request per ``WATCH_SECONDS`` each, carrying only what changed) and
answers ``get`` and ``list`` from what it holds while that collection's watch is current. Otherwise the read
goes to the API server as before, and its errors are the look's: not listed yet, a watch broken, silent past
its timeout or refused (no ``watch`` right), the API server not heard from lately (``ANSWERED_WITHIN_S``), or
a write by this process a moment ago. What it holds is never shown as a state it could not read. Other reads
(events, logs, other kinds) always go to the API server.

One set of watches per experiment, not per task: the ``WatchedJob`` of each task of an experiment (``experiment``:
its TrainJob's ``EXPERIMENT_LABEL``) is a view of one ``_Watches`` shared by the experiment's tasks in this process
and namespace: its TrainJobs by that label, and its JobSets and pods by what they carry (Trainer puts no TrainJob
label on the JobSet it makes, nor JobSet on the pods): the namespace's JobSets, and its pods that have a JobSet
(``JOBSET_NAME_LABEL``); from a look at a queued task on, the namespace's Kueue Workloads (a queued task's look
lists them for Kueue's reason: read once for all the tasks, not once per queued task per look). The API load of an
attached experiment is then that of one job, whatever its task count;
each look reads only its own task's objects (held by name, the pods by their JobSet's name). A job whose
experiment is not known (a ``pod_shape`` of its own, the TrainJob not read yet) is watched alone, by its name.
"""

from __future__ import annotations

import builtins
import collections
import contextlib
import copy
import json
import logging
import marshal
import re
import threading
import time
from typing import Any, Callable, Iterator, Optional

from nemo_kubeflow.cluster.client import MAX_WATCHED_SETS, ClusterReader
from nemo_kubeflow.cluster.log_stream import LogStream
from nemo_kubeflow.constants import EXPERIMENT_LABEL, JOBSET_KIND, JOBSET_NAME_LABEL, TRAINJOB_KIND, WORKLOAD_KIND
from nemo_kubeflow.errors import ClusterError, ClusterUnreachableError, NotFoundError, PermissionDeniedError

log = logging.getLogger(__name__)

#: How long each watch request lasts before the server ends it and it is opened again from where it was.
WATCH_SECONDS = 60
#: Nothing read from it for this long: stop watching (the next read starts again, with a list).
IDLE_STOP_S = 120.0
#: Reads are answered from the watches only if the API server answered within this long (a watch event, a
#: log read through this reader, else one GET of /version): a network gone silent breaks no connection. Within
#: the client's read timeout (30 s), which a read sent to a server gone silent waits out before it fails; the
#: pings are 2 of an attached wait's 5 requests a minute once nothing changes (benchmarks: apiload).
ANSWERED_WITHIN_S = 20.0
#: After a write of this process, reads go to the API server this long (the watch may not have its echo yet).
DIRECT_AFTER_WRITE_S = 5.0
#: A LocalQueue's places (Kueue's pending workloads: the whole queue, about 480 KiB at 1,000) are read again at most
#: this often in the looks that repeat: as a sweep's tasks end and the next are admitted, the Workloads change many
#: times in a few seconds (20 reads a minute at 1,000 queued before). A place shown is at most this old.
PLACES_EVERY_S = 10.0
#: The sets of watches running now (ids of ``_Watches``: at most ``MAX_WATCHED_SETS``).
_watching: set[int] = set()
_watching_lock = threading.Lock()
#: The sets of watches of this process with a view, by what they watch (``_scope_key``).
_sets: dict[tuple, "_Watches"] = {}

#: Wait before listing again after a failure, doubling up to the most.
FIRST_BACKOFF_S, MAX_BACKOFF_S = 1.0, 30.0

#: The pod fields a selector of ours names, and how to read each: evaluated here as the API server does (a
#: field not set reads as "").
_POD_FIELDS: dict[str, Callable[[dict], str]] = {
    "status.phase": lambda p: (p.get("status") or {}).get("phase") or "",
    "spec.nodeName": lambda p: (p.get("spec") or {}).get("nodeName") or "",
    "metadata.name": lambda p: p["metadata"].get("name") or "",
    "metadata.namespace": lambda p: p["metadata"].get("namespace") or "",
}


class _Expired(Exception):
    """The watch's resourceVersion is no longer served (410): list again."""


class _Collection:
    """One kind's matching objects (by name), listed then watched by a thread of its own."""

    def __init__(
        self,
        cluster: Any,
        kind: str,
        namespace: str,
        answered: Callable[[], None],
        *,
        label_selector: Optional[str] = None,
        field_selector: Optional[str] = None,
        on_event: Optional[Callable[[str, dict], None]] = None,
        shape: Optional[Callable[[dict], dict]] = None,
        index_label: Optional[str] = None,
    ) -> None:
        self.cluster, self.kind, self.namespace, self.answered = cluster, kind, namespace, answered
        self.label_selector, self.field_selector = label_selector, field_selector
        #: The label whose value groups ``objects`` in ``indexed`` (a job's pods: a look reads only its own).
        self.index_label = index_label
        self.indexed: dict[str, dict[str, dict]] = {}
        #: Told of each object listed ("LISTED") and each watch event (its type), from the watching thread.
        self.on_event = on_event
        #: What is kept of each object (None: all of it).
        self.shape = shape or (lambda obj: obj)
        self.objects: dict[str, dict] = {}
        #: Listed, and every change since is in ``objects`` (the watch has not broken since).
        self.current = False
        #: Listings and watch events taken in so far (what was read from it is older when this moved on).
        self.changes = 0
        #: The server refused to list or watch it (403, 404): reads go to the server from now on.
        self.refused = False
        self.lock = threading.Lock()
        self._stream: Optional[LogStream] = None

    def run(self, stopped: threading.Event) -> None:
        backoff = FIRST_BACKOFF_S
        while not stopped.is_set() and not self.refused:
            try:
                self._list_and_watch(stopped)
                backoff = FIRST_BACKOFF_S
            except _Expired:
                self._not_current()
            except (PermissionDeniedError, NotFoundError) as error:  # no right to list or watch; not served
                self._not_current()
                self.refused = True
                log.info("not watching %s (its reads go to the API server): %s", self.kind, error)
            except Exception as error:  # noqa: BLE001 - a request refused, a connection broken (urllib3's
                # HTTPError), an event not understood: nothing held is trusted until listed again.
                self._not_current()
                log.debug("watch of %s broke: %s; listing again in %.0f s", self.kind, error, backoff)
                stopped.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
        self._not_current()

    def stop(self) -> None:
        stream = self._stream
        if stream is not None:
            stream.close()

    def _list_and_watch(self, stopped: threading.Event) -> None:
        items, version = self.cluster.list_to_watch(self.kind, self.namespace, self.label_selector, self.field_selector)
        with self.lock:
            self.objects = {o["metadata"]["name"]: self.shape(o) for o in items}
            self.indexed = {}
            for name, obj in self.objects.items():
                self._index(name, obj)
            self.current = True
            self.changes += 1
        self.answered()
        for item in items:
            self._tell("LISTED", item)
        while not stopped.is_set():
            self._stream = stream = self.cluster.watch(
                self.kind,
                self.namespace,
                version,
                label_selector=self.label_selector,
                field_selector=self.field_selector,
                timeout_seconds=WATCH_SECONDS,
            )
            self.answered()
            if stopped.is_set():
                stream.close()
            for lines in stream:
                self.answered()
                for line in lines:
                    if line.strip():
                        version = self._apply(json.loads(line)) or version
            if stream.interrupted:
                return
            # The server ended it (its timeout): nothing was missed, watch again from ``version``.

    def _apply(self, event: dict) -> str:
        """Apply one watch event; the resourceVersion it brings."""
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise _Expired()
            raise ValueError(f"watch error: {obj.get('message') or obj}")
        meta = obj["metadata"]
        with self.lock:
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                self._unindex(meta["name"], self.objects.pop(meta["name"], None))
            if kind in ("ADDED", "MODIFIED"):
                self.objects[meta["name"]] = held = self.shape(obj)
                self._index(meta["name"], held)
            self.changes += kind != "BOOKMARK"
        self._tell(str(kind), obj)
        return meta.get("resourceVersion", "")

    def _group(self, obj: Optional[dict]) -> Optional[str]:
        if self.index_label is None or obj is None:
            return None
        return ((obj.get("metadata") or {}).get("labels") or {}).get(self.index_label)

    def _index(self, name: str, obj: dict) -> None:
        group = self._group(obj)
        if group is not None:
            self.indexed.setdefault(group, {})[name] = obj

    def _unindex(self, name: str, obj: Optional[dict]) -> None:
        group = self._group(obj)
        members = self.indexed.get(group) if group is not None else None
        if group is not None and members is not None:
            members.pop(name, None)
            if not members:
                del self.indexed[group]

    def grouped(self, group: str) -> builtins.list[dict]:
        """The held objects whose ``index_label`` is ``group``, by name (under ``lock``)."""
        members = self.indexed.get(group) or {}
        return [members[n] for n in sorted(members)]

    def _tell(self, kind: str, obj: dict) -> None:
        """Hand one object to ``on_event``: what the listener does wrong is its own, never a broken watch."""
        if self.on_event is None:
            return
        try:
            self.on_event(kind, obj)
        except Exception:  # noqa: BLE001 - logged; the watch goes on
            log.exception("a listener of the %s watch failed", self.kind)

    def _not_current(self) -> None:
        with self.lock:
            self.current = False
            self.objects = {}
            self.indexed = {}


def experiment_watched(cluster: ClusterReader, namespace: str, experiment: str) -> bool:
    """Whether this process watches ``experiment``'s tasks in ``namespace`` through ``cluster`` now (a view of
    another of its tasks started the set): a new task's view joins it at no cost to the API server."""
    with _watching_lock:
        watches = _sets.get((id(cluster), namespace, ("experiment", experiment), None))
    return watches is not None and watches.stopped is not None


class _Watches:
    """The watches of one scope (an experiment's tasks in a namespace, or one job), shared by its views
    (``WatchedJob``): started at a view's first read, paused when none has read for ``IDLE_STOP_S``, ended with
    the last view. Whether the API server answers lately (``ANSWERED_WITHIN_S``) is asked once for all views."""

    def __init__(
        self,
        key: tuple,
        cluster: ClusterReader,
        namespace: str,
        experiment: Optional[str],
        job: str,
        pod_shape: Optional[Callable[[dict], dict]],
    ) -> None:
        self.key, self.cluster, self.namespace = key, cluster, namespace
        self.experiment, self.job, self.pod_shape = experiment, job, pod_shape
        #: Kinds watched from a view's first list of them on, besides the TrainJobs, JobSets and pods (Workloads).
        self.listed_kinds: set[str] = set()
        self.collections = self._new_collections()
        #: Kinds the server refused to let us watch: not tried again.
        self.refused: set[str] = set()
        self.lock = threading.Lock()
        self.stopped: Optional[threading.Event] = None
        self.last_read = time.monotonic()
        #: When the API server last answered a view (a watch event or opened, a log read, /version).
        self.answered_at = float("-inf")
        #: Held by the one view asking the API server whether it answers: the others wait for that answer (the
        #: looks of NeMo-Run's wait pool come at once: each its own GET of /version before).
        self.asking = threading.Lock()
        #: LocalQueue -> (the Workload watch's changes when read, when read, Kueue's pending workloads of it).
        self.pending: dict[str, tuple[int, float, Optional[builtins.list[dict]]]] = {}
        #: Job name -> its views (each told its own pods' events).
        self.views: dict[str, builtins.list[WatchedJob]] = {}

    # --- views ------------------------------------------------------------------------------------
    @classmethod
    def joined(
        cls,
        view: WatchedJob,
        experiment: Optional[str],
        pod_shape: Optional[Callable[[dict], dict]],
    ) -> _Watches:
        """The watches ``view`` reads from: those of its experiment (or its job) made by an earlier view, or new."""
        scope = ("experiment", experiment) if experiment else ("job", view.name)
        key = (id(view.cluster), view.namespace, scope, id(pod_shape) if pod_shape else None)
        with _watching_lock:
            watches = _sets.get(key)
            if watches is None:
                watches = _sets[key] = cls(key, view.cluster, view.namespace, experiment, view.name, pod_shape)
            watches.views.setdefault(view.name, []).append(view)
        return watches

    def left(self, view: WatchedJob) -> None:
        """``view`` stopped: the last one out stops the watches."""
        with _watching_lock:
            views = self.views.get(view.name, [])
            if view in views:
                views.remove(view)
            if not views:
                self.views.pop(view.name, None)
            last = not self.views
            if last and _sets.get(self.key) is self:
                del _sets[self.key]
        if last:
            self.pause()

    def pod_event(self, kind: str, pod: dict) -> None:
        """Hand a pod's event to the views of its job only (the pods of the experiment's other tasks are not
        theirs)."""
        job = ((pod.get("metadata") or {}).get("labels") or {}).get(JOBSET_NAME_LABEL)
        for view in builtins.list(self.views.get(job or "", ())):
            view.tell_pod_event(kind, pod)

    # --- watching --------------------------------------------------------------------------------
    def answered(self) -> None:
        self.answered_at = time.monotonic()

    def server_answers(self) -> bool:
        """Whether the API server answered lately, asking it if not (``ANSWERED_WITHIN_S``)."""
        if time.monotonic() - self.answered_at < ANSWERED_WITHIN_S:
            return True
        with self.asking:
            if time.monotonic() - self.answered_at < ANSWERED_WITHIN_S:
                return True  # another view asked while this one waited
            answers = getattr(self.cluster, "answers", None)
            if answers is None or not answers():
                return False
            self.answered()
            return True

    def ensure_watching(self) -> None:
        self.last_read = time.monotonic()
        with self.lock:
            if self.stopped is not None:
                return
            with _watching_lock:
                if len(_watching) >= MAX_WATCHED_SETS:
                    return  # reads go to the API server (``_held`` finds nothing current)
                _watching.add(id(self))
            self.refused |= {kind for kind, c in self.collections.items() if c.refused}
            self.collections = fresh = self._new_collections()
            self.stopped = stopped = threading.Event()
        label = self.experiment or self.job
        for kind, collection in fresh.items():
            if kind not in self.refused:
                threading.Thread(
                    target=collection.run, args=(stopped,), daemon=True, name=f"watch-{kind.lower()}-{label}"
                ).start()
        threading.Thread(target=self._stop_when_idle, args=(stopped,), daemon=True, name=f"watch-idle-{label}").start()

    def watch_listed(self, kind: str) -> None:
        """Watch the namespace's ``kind`` (a view lists it) from now on, with the other kinds."""
        with self.lock:
            if kind in self.listed_kinds:
                return
            self.listed_kinds.add(kind)
            stopped = self.stopped
            if stopped is None:  # the next start watches it
                return
            collection = self._collection(kind, None, None)
            self.collections = {**self.collections, kind: collection}
        label = self.experiment or self.job
        threading.Thread(
            target=collection.run, args=(stopped,), daemon=True, name=f"watch-{kind.lower()}-{label}"
        ).start()

    def pause(self) -> None:
        """Stop watching until the next read (nobody reads: ``IDLE_STOP_S``; nobody views: for good)."""
        with self.lock:
            stopped, self.stopped = self.stopped, None
            with _watching_lock:
                _watching.discard(id(self))
        if stopped is not None:
            stopped.set()
            for collection in self.collections.values():
                collection.stop()

    def _stop_when_idle(self, stopped: threading.Event) -> None:
        while not stopped.wait(min(IDLE_STOP_S, 10.0)):
            if time.monotonic() - self.last_read > IDLE_STOP_S:
                self.pause()

    def _new_collections(self) -> dict[str, _Collection]:
        """What one start watches (each start its own: a stopped one's thread may still be ending): kind ->
        (label selector, field selector)."""
        if self.experiment:
            selectors: dict[str, tuple[Optional[str], Optional[str]]] = {
                TRAINJOB_KIND: (f"{EXPERIMENT_LABEL}={self.experiment}", None),
                JOBSET_KIND: (None, None),  # the namespace's: Trainer puts no label of ours on them
                "Pod": (JOBSET_NAME_LABEL, None),  # every pod that has a JobSet: they carry no experiment label
            }
        else:
            by_name = (None, f"metadata.name={self.job}")
            selectors = {TRAINJOB_KIND: by_name, JOBSET_KIND: by_name, "Pod": (f"{JOBSET_NAME_LABEL}={self.job}", None)}
        selectors.update({kind: (None, None) for kind in sorted(self.listed_kinds)})
        return {kind: self._collection(kind, labels, fields) for kind, (labels, fields) in selectors.items()}

    def _collection(self, kind: str, labels: Optional[str], fields: Optional[str]) -> _Collection:
        pods = {"on_event": self.pod_event, "shape": self.pod_shape, "index_label": JOBSET_NAME_LABEL}
        return _Collection(
            self.cluster,
            kind,
            self.namespace,
            self.answered,
            label_selector=labels,
            field_selector=fields,
            **(pods if kind == "Pod" else {}),  # type: ignore[arg-type]
        )


class WatchedJob:
    """A ``ClusterReader`` for one job's repeated looks: its TrainJob, JobSet and pods from watches while
    they are current, everything else (and those too, while not) from ``cluster``. ``stop`` when done.

    With ``experiment`` (the TrainJob's ``EXPERIMENT_LABEL``), the watches are those of the experiment's tasks,
    shared with their ``WatchedJob`` in this process (``_Watches``); without, the job's own. With ``pod_shape``,
    only what it keeps of each pod is held and answered (``log_follower.JobLogFollower``'s lists of a large job:
    names, labels and phases): a reader for the one who chose the shape, no other."""

    def __init__(
        self,
        cluster: ClusterReader,
        namespace: str,
        name: str,
        *,
        experiment: Optional[str] = None,
        pod_shape: Optional[Callable[[dict], dict]] = None,
    ) -> None:
        self.cluster, self.namespace, self.name = cluster, namespace, name
        self._pod_label = f"{JOBSET_NAME_LABEL}={name}"
        self._closed = False
        self._direct_until = 0.0
        self._pod_listeners: builtins.list[Callable[[str, dict], None]] = []
        #: Why reads of a watched kind went to the API server, and how many (for ``--verbose``, benchmarks).
        self.sent_to_server: collections.Counter[str] = collections.Counter()
        self._watches = _Watches.joined(self, experiment, pod_shape)

    # --- the reads --------------------------------------------------------------------------------
    def get(self, kind: str, name: str, namespace: Optional[str] = None) -> Optional[dict]:
        held = self._held(kind, namespace) if name == self.name else None
        if held is not None:
            with held.lock:
                if held.current:
                    return held_copy(held.objects.get(name))
        with self._answering():
            return self.cluster.get(kind, name, namespace)

    def list(
        self,
        kind: str,
        namespace: Optional[str],
        label_selector: Optional[str] = None,
        field_selector: Optional[str] = None,
        limit: Optional[int] = None,
    ) -> builtins.list[dict]:
        found = self._pods(kind, namespace, label_selector, field_selector)
        if found is None and kind == WORKLOAD_KIND and not (label_selector or field_selector):
            found = self._workloads_of_job(namespace)
        if found is None:
            with self._answering():
                return self.cluster.list(kind, namespace, label_selector, field_selector, limit)
        return held_copy(found[:limit])

    def _workloads_of_job(self, namespace: Optional[str]) -> Optional[builtins.list[dict]]:
        """The held Workloads a TrainJob named as this job owns, or None where they are not held. A look lists the
        namespace's Workloads for the one its TrainJob owns (``owned_workload``): those are what it gets, not a
        copy of each of a sweep's 1,000 Workloads at each look (most of a queued task's look then)."""
        listed = self._listed(WORKLOAD_KIND, namespace)
        if listed is None:
            return None
        return [
            workload
            for workload in listed
            if any(
                ref.get("kind") == TRAINJOB_KIND and ref.get("name") == self.name
                for ref in workload["metadata"].get("ownerReferences") or ()
            )
        ]

    def list_metadata(
        self,
        kind: str,
        namespace: Optional[str],
        label_selector: Optional[str] = None,
        field_selector: Optional[str] = None,
    ) -> builtins.list[dict]:
        found = self._pods(kind, namespace, label_selector, field_selector)
        if found is None:
            with self._answering():
                return self.cluster.list_metadata(kind, namespace, label_selector, field_selector)
        return partial_metadata(found)

    def pending_workloads(self, namespace: str, queue: str) -> Optional[builtins.list[dict]]:
        """Kueue's pending workloads of ``queue``: read again only when the watched Workloads changed since (the
        places move only when a Workload does), and at most every ``PLACES_EVERY_S``; else from the API server at
        each call."""
        held = self._listed(WORKLOAD_KIND, namespace) is not None and self._collections.get(WORKLOAD_KIND)
        if not held:
            with self._answering():
                return self.cluster.pending_workloads(namespace, queue)
        changes, now = held.changes, time.monotonic()
        kept = self._watches.pending.get(queue)
        if kept is not None and (kept[0] == changes or now - kept[1] < PLACES_EVERY_S):
            return held_copy(kept[2])
        with self._answering():
            found = self.cluster.pending_workloads(namespace, queue)
        self._watches.pending[queue] = (changes, now, found)
        return held_copy(found)

    def pod_log(self, name: str, namespace: str, **options: Any) -> Iterator[str]:
        with self._answering():
            return self.cluster.pod_log(name, namespace, **options)

    def pod_log_stream(self, name: str, namespace: str, **options: Any) -> LogStream:
        with self._answering():
            return self.cluster.pod_log_stream(name, namespace, **options)

    @property
    def server_reader(self) -> ClusterReader:
        """The reader of the API server itself, for reads that must not come from held copies."""
        return self.cluster

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self.cluster, attribute)  # what else a reader of ours asks (served versions, access)

    # --- what it holds --------------------------------------------------------------------------
    @property
    def answered_at(self) -> float:
        """When the API server last answered a view of these watches (one ping for the experiment's tasks)."""
        return self._watches.answered_at

    @property
    def _collections(self) -> dict[str, _Collection]:
        return self._watches.collections

    @property
    def _refused(self) -> set[str]:
        return self._watches.refused

    @property
    def _stopped(self) -> Optional[threading.Event]:
        return self._watches.stopped

    def wrote(self) -> None:
        """This process just wrote to the job (a repair, a cancel): read from the API server for a moment."""
        self._direct_until = time.monotonic() + DIRECT_AFTER_WRITE_S

    def stop(self) -> None:
        """Stop reading from the watches (the last view of them stops them): reads go to the API server."""
        if not self._closed:
            self._closed = True
            self._watches.left(self)

    def on_pod_event(self, listener: Callable[[str, dict], None]) -> None:
        """Tell ``listener(type, pod)`` of each pod of the job the pod watch lists ("LISTED", each time it lists)
        and each change it sees ("ADDED", "MODIFIED", "DELETED"), from the watching thread, as they come."""
        self._pod_listeners.append(listener)

    def off_pod_event(self, listener: Callable[[str, dict], None]) -> None:
        with contextlib.suppress(ValueError):
            self._pod_listeners.remove(listener)

    def pod_events_flow(self) -> bool:
        """Whether the pods' changes reach ``on_pod_event``'s listeners: the job is watched (not stopped, not
        paused, not over the per-process cap) and the server lets us list and watch pods. While the watch is
        broken it lists again on reconnecting, and each pod listed is told then."""
        pods = self._collections.get("Pod")
        return (
            not self._closed
            and self._stopped is not None
            and "Pod" not in self._refused
            and pods is not None
            and not pods.refused
        )

    def tell_pod_event(self, kind: str, pod: dict) -> None:
        """One of the job's pods listed or changed (``_Watches.pod_event``): tell this view's listeners."""
        for listener in builtins.list(self._pod_listeners):
            listener(kind, pod)

    def wait_held(self, kind: str, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the watch of ``kind`` to hold it (its first list answered), watching it if not
        yet; whether reads of ``kind`` are answered from the watch now. A view made for one look at once (a log
        follower's of a large job) waits here instead of listing beside the watch's own first list (the same
        objects twice: 8 MB each at 1,024 pods); it returns at once where the watch cannot answer (refused, over the
        per-process cap, stopped)."""
        if kind not in self._collections or self._closed:
            return False
        self._watches.ensure_watching()
        deadline = time.monotonic() + timeout
        while True:
            collection = self._collections[kind]  # the newest start's
            if (
                collection.current
                or collection.refused
                or kind in self._refused
                or self._stopped is None
                or time.monotonic() >= deadline
            ):
                return self._why_not_held(kind, collection) is None
            time.sleep(0.02)

    def current(self) -> dict[str, bool]:
        """Kind -> whether its reads are answered from the watch now (for tests and ``--verbose``)."""
        return {kind: c.current and not self._closed for kind, c in self._collections.items()}

    def _held(self, kind: str, namespace: Optional[str]) -> Optional[_Collection]:
        """The collection that may answer a read of ``kind`` in ``namespace`` (watching it, if not yet)."""
        if kind not in self._collections or namespace != self.namespace or self._closed:
            return None
        self._watches.ensure_watching()
        collection = self._collections[kind]
        why = self._why_not_held(kind, collection)
        if why is not None:
            self.sent_to_server[why] += 1
            log.debug("%s of %s/%s read from the API server: %s", kind, self.namespace, self.name, why)
            return None
        return collection

    def _why_not_held(self, kind: str, collection: _Collection) -> Optional[str]:
        """Why a read of ``kind`` cannot be answered from what it holds now; None when it can."""
        if kind in self._refused or collection.refused:  # refused by an earlier start, or by this one
            return "its watch was refused"
        if self._stopped is None:
            return f"not watched ({MAX_WATCHED_SETS} other experiments or jobs are, in this process)"
        if not collection.current:
            return "not listed yet, or its watch broke"
        if time.monotonic() < self._direct_until:
            return f"this process wrote to the job within {DIRECT_AFTER_WRITE_S:g} s"
        if not self._watches.server_answers():
            return f"the API server did not answer within {ANSWERED_WITHIN_S:g} s"
        return None

    @contextlib.contextmanager
    def _answering(self) -> Iterator[None]:
        """A request through this reader: an answer, refusals included, says the API server answers."""
        try:
            yield
        except ClusterUnreachableError:
            raise
        except ClusterError:
            self._watches.answered()
            raise
        self._watches.answered()

    def _listed(self, kind: str, namespace: Optional[str]) -> Optional[builtins.list[dict]]:
        """The namespace's ``kind`` held by the set's watch of it (started by this first list), or None."""
        if namespace != self.namespace or self._closed:
            return None
        self._watches.watch_listed(kind)
        held = self._held(kind, namespace)
        if held is None:
            return None
        with held.lock:
            return [held.objects[n] for n in sorted(held.objects)] if held.current else None

    def _pods(
        self, kind: str, namespace: Optional[str], label_selector: Optional[str], field_selector: Optional[str]
    ) -> Optional[builtins.list[dict]]:
        """The held pods a list selects, in the API server's order (by name); None where it must ask. Only the
        job's own pods are looked at (held by their JobSet's name), however many tasks share the watch."""
        if kind != "Pod":
            return None
        match = _pod_matcher(self._pod_label, label_selector, field_selector)
        held = self._held(kind, namespace) if match is not None else None
        if held is None or match is None:
            return None
        with held.lock:
            if not held.current:
                return None
            return [p for p in held.grouped(self.name) if match(p)]


def held_copy(value: Any) -> Any:
    """A copy of what a list or watch holds, for a look to keep: JSON data, which ``marshal`` copies about 5 times
    as fast as ``copy.deepcopy`` (a status of 1,000 tasks copies each task's objects: 0.8 s of its 3 s before)."""
    try:
        return marshal.loads(marshal.dumps(value))
    except ValueError:  # not JSON data after all
        return copy.deepcopy(value)


def partial_metadata(objects: list[dict]) -> list[dict]:
    """Copies of the objects' metadata, as a metadata-only list answers them (``list_metadata``)."""
    return [
        {"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": held_copy(o["metadata"])}
        for o in objects
    ]


def _pod_matcher(
    job_label: str, label_selector: Optional[str], field_selector: Optional[str]
) -> Optional[Callable[[dict], bool]]:
    """A test of a held pod for a list of the job's pods with these selectors; None for a selector not of the
    job's pods (no ``job_label`` term) or with a form not evaluated here (set-based terms, other fields)."""
    labels = _equality_terms(label_selector)
    fields = _equality_terms(field_selector)
    if (
        labels is None
        or fields is None
        or (job_label.split("=", 1)[0], True, job_label.split("=", 1)[1]) not in labels
        or any(path not in _POD_FIELDS for path, _, _ in fields)
    ):
        return None

    def matches(pod: dict) -> bool:
        pod_labels = pod["metadata"].get("labels") or {}
        return all((pod_labels.get(key) == value) == equal for key, equal, value in labels) and all(
            (_POD_FIELDS[path](pod) == value) == equal for path, equal, value in fields
        )

    return matches


def _equality_terms(selector: Optional[str]) -> Optional[list[tuple[str, bool, str]]]:
    """``a=b,c!=d`` as (key, equal, value) terms; None for any other form (``in``, ``notin``, existence)."""
    terms = []
    for part in filter(None, (p.strip() for p in (selector or "").split(","))):
        term = _EQUALITY_TERM.match(part)
        if term is None:
            return None
        terms.append((term["key"], term["operator"] != "!=", term["value"]))
    return terms


_EQUALITY_TERM = re.compile(r"^(?P<key>[A-Za-z0-9./_-]+)\s*(?P<operator>==|!=|=)\s*(?P<value>[A-Za-z0-9._-]*)$")
