"""Reading the logs of a TrainJob's nodes through the ``Cluster`` interface.

Pods are found by the labels JobSet and the Job controller put on them (TrainJob
labels do not reach pods). Unlike the Kubeflow SDK, which returns nothing for a
Pending pod, following a node waits for its pod to start, and follows the node's
newest pod across gang restarts until the job ends.
"""

from __future__ import annotations

import atexit
import fcntl
import logging
import math
import os
import queue
import threading
import time
from collections import Counter, deque
from typing import Any, Collection, Iterable, Iterator, Optional

from nemo_kubeflow.cluster.client import ClusterReader, LogStream
from nemo_kubeflow.cluster.watched import WatchedJob
from nemo_kubeflow.constants import (
    COMPLETION_INDEX_LABEL,
    JOBSET_NAME_LABEL,
    REPLICATED_JOB_LABEL,
    RESTART_ATTEMPT_LABEL,
    TRAINER_NODE,
    TRAINJOB_KIND,
)
from nemo_kubeflow.errors import ClusterError, NotFoundError
from nemo_kubeflow.observe.status import job_status, newest_pods_by_node


def node_selector(trainjob: str, index: Optional[int] = None) -> str:
    selector = f"{JOBSET_NAME_LABEL}={trainjob},{REPLICATED_JOB_LABEL}={TRAINER_NODE}"
    if index is not None:
        selector += f",{COMPLETION_INDEX_LABEL}={index}"
    return selector


def node_log_lines(
    cluster: ClusterReader,
    namespace: str,
    trainjob: str,
    index: int,
    *,
    follow: bool = False,
    stall_after: Optional[float] = None,
) -> Iterator[str]:
    """Lines (ending in newline) of node ``index``, as the node printed them: every reader of a
    scheduler's log (NeMo-Run, ``torchx log``) puts its own ``<role>/<replica>`` prefix before each,
    the node's index; lines that torchrun tees start with the global rank, ``[rank<N>]:``
    (``command.RANK_PREFIX_TEMPLATE``).

    Without ``follow``: the newest pod's log as it is now (one read). Following: through the
    job's ``JobLogFollower``, shared by every node followed in this process, until the job ends;
    a warning line comes after every ``stall_after`` seconds in which the running node printed
    nothing."""
    if follow:
        yield from _followed(cluster, namespace, trainjob, index, stall_after)
        return
    pod = newest_pods_by_node(cluster.list("Pod", namespace, node_selector(trainjob, index))).get(index)
    if pod is not None and ((pod.get("status") or {}).get("phase")) != "Pending":
        for line in cluster.pod_log(pod["metadata"]["name"], namespace, container=TRAINER_NODE):
            yield line + "\n"


# --- following: a fixed pool of readers for all the nodes of a job ---------------------------------

#: Threads, and so connections, that read the logs of one followed TrainJob, whatever its number of
#: nodes: reader ``w`` reads the nodes ``k`` with ``k % LOG_READERS == w``, one short read each per round.
LOG_READERS = 8
#: A reader's round over its nodes starts at most this often (one that took longer: the next starts at once)...
POLL_SECONDS = 0.15
#: ... and no more often than keeps a job's log reads under this rate (128 nodes: a read of each every 0.5 s).
MAX_READS_PER_SECOND = 256
#: A node whose reads bring nothing new is read less often, the wait doubling up to this: a job of
#: quiet nodes (a training step that prints once a minute) costs a few reads a second, not
#: MAX_READS_PER_SECOND; a line after a quiet spell arrives within this.
IDLE_POLL_MAX_SECONDS = 2.0
#: While every subscriber of a job only keeps lines (``NodeLogKeeper``: an attached wait, ``watch``) and nobody
#: reads them live, the job's log reads stay under this rate instead (64 kept nodes: a read of each every
#: 2 s), and its rounds and pod lists come at most every ``KEEP_POLL_SECONDS``: the keeper is a safety net for
#: a node whose pod a gang restart deletes, not a live view, and it should cost the API server little.
KEEP_READS_PER_SECOND = 32
KEEP_POLL_SECONDS = 2.0
#: The job's pods (one list for all its nodes) are listed about this often: the list of a 128-node
#: job is large, and what it tells (a pod started, ended, replaced) can wait that long...
LIST_SECONDS = 1.0
#: ... and a larger job's less often, so that listing costs the API server about as many pods per second
#: whatever the job's size (1,024 nodes: a list of about 8 MB every 8 s rather than every second).
LISTED_PODS_PER_SECOND = 128
#: Lines asked for (``tailLines``) by a read of a node already being followed, so that the kubelet
#: seeks from the end instead of reading the log from its start (at least this many, and four times
#: what the node's last read brought); a read that returns that many may have cut some off, and is
#: done again without the limit.
TAIL_LINES = 2000
#: A follow stream silent this long is opened again from where it was: a connection dropped
#: without a word (a NAT's or load balancer's idle timeout) cannot hang a node's following, and a
#: quiet node costs one request per this many seconds.
STREAM_IDLE_SECONDS = 300.0
_TERMINAL_PHASES = ("Succeeded", "Failed")
_END = object()
#: Set when the interpreter exits: readers send no new request into a connection being torn down.
_exiting = threading.Event()
atexit.register(_exiting.set)


class _Node:
    """One followed node: the pod read, how far its log was delivered, who gets its lines."""

    def __init__(self, index: int) -> None:
        self.index = index
        #: The newest pod at the last list (None: none), and the one being read.
        self.newest: Optional[dict] = None
        self.pod: Optional[str] = None
        #: Phase of the pod being read at the last list; "" once it is gone from the list.
        self.phase = ""
        #: The second of the newest line delivered ("YYYY-MM-DDTHH:MM:SS"), and its lines with their
        #: times, counted (that second is read again: ``sinceTime`` reaches the kubelet to the second).
        self.second: Optional[str] = None
        self.edge: Counter = Counter()
        self.drained = False  # the pod ended and all its log was delivered
        self.done = False
        self.sinks: list = []
        self.catching_up: list = []  # joined after lines were delivered: get the whole log first
        self.failures = 0
        self.tail = TAIL_LINES
        #: Reads in a row that brought nothing new, and when (monotonic) the node is next read.
        self.quiet_reads = 0
        self.next_read = 0.0
        #: Trouble told (``JobLogFollower.nudge``), and how much of it the node's reads have answered.
        self.nudges = 0
        self.nudges_read = 0
        self._keeps_only = self._on_trouble = False

    def reset(self, pod: str) -> None:
        self.pod, self.second, self.edge, self.drained, self.failures = pod, None, Counter(), False, 0
        self.quiet_reads, self.next_read = 0, 0.0
        self.sinks.extend(self.catching_up)
        self.catching_up = []

    def subscribers(self) -> list:
        return self.sinks + self.catching_up

    def keeps_only(self) -> bool:
        """Whether every subscriber only keeps the last lines (``_KeptLines``): nobody reads them live."""
        return self._keeps_only

    def reads_on_trouble(self) -> bool:
        """Whether every subscriber wants the lines only when the job is in trouble (``_KeptLines`` of a node
        other than node 0): with the job's pod events at hand, the node is read then, not in every round."""
        return self._on_trouble

    def _subscribers_changed(self) -> None:
        """Note what the subscribers want (asked for every node in every round: not worked out each time)."""
        subscribers = self.subscribers()
        self._keeps_only = bool(subscribers) and all(getattr(sink, "keeps_only", False) for sink in subscribers)
        self._on_trouble = bool(subscribers) and all(getattr(sink, "on_trouble", False) for sink in subscribers)

    def nudged(self) -> bool:
        return self.nudges > self.nudges_read

    def followed(self) -> bool:
        return not self.done and bool(self.subscribers())

    def subscribe(self, sink) -> None:
        """Add ``sink``: one that joins after lines were delivered gets the whole log first."""
        (self.catching_up if self.second is not None else self.sinks).append(sink)
        self._subscribers_changed()

    def unsubscribe(self, sink) -> None:
        for bag in (self.sinks, self.catching_up):
            if sink in bag:
                bag.remove(sink)
        self._subscribers_changed()

    def idle(self) -> bool:
        """Whether no pod is being read: none started yet, or the one read ended and all its log was delivered."""
        return self.pod is None or self.drained

    def listed(self, newest: Optional[dict]) -> None:
        """What the job's last pod list says of this node (``_pod_summary`` of its newest pod, None: none): the
        newest pod, and the phase of the one being read ("" once it is gone from the list)."""
        self.newest = newest
        if self.pod is None:
            return
        current = newest if newest is not None and newest["metadata"]["name"] == self.pod else {}
        self.phase = current.get("status", {}).get("phase", "")

    def started_pod(self) -> Optional[dict]:
        """The newest pod at the last list, once it has started (None: no pod, or one still Pending)."""
        if self.newest is None or self.newest.get("status", {}).get("phase") in (None, "Pending"):
            return None
        return self.newest

    def pod_ended(self) -> bool:
        """Whether the pod being read had ended, or was gone, at the last list (before this read)."""
        return self.phase in _TERMINAL_PHASES or self.phase == ""

    def due(self, ended: bool) -> bool:
        """Whether the node is read this round: its pod ended, a late joiner waits for the whole log, or
        its quiet wait (``read_later``) is over."""
        return ended or bool(self.catching_up) or time.monotonic() >= self.next_read

    def read_window(self) -> tuple[bool, Optional[str], Optional[int]]:
        """What the next read asks for: (whole, sinceTime, tailLines). The whole log for the first read and
        for a late joiner (the last ``KEEP_LINES`` lines only where every subscriber keeps no more); else from
        the second of the last line delivered, its tail only."""
        if self.second is None or self.catching_up:
            return True, None, KEEP_LINES if self.keeps_only() else None
        return False, self.second + "Z", self.tail

    def read_later(self, new: bool, poll: float) -> None:
        """After a read (or a stream's end) that brought new lines or not: when to read next."""
        self.quiet_reads = 0 if new else self.quiet_reads + 1
        self.next_read = (
            time.monotonic() + min(IDLE_POLL_MAX_SECONDS, poll * 2**self.quiet_reads) if self.quiet_reads else 0.0
        )

    def put(self, item) -> None:
        for sink in self.subscribers():
            sink.put(item)

    def put_fresh(self, fresh: list[str]) -> None:
        """Hand the subscribers that are up to date the new lines of a read or chunk, as one list each."""
        if fresh:
            for sink in self.sinks:
                sink.put(fresh)

    def catch_up(self, everything: list[str]) -> None:
        """Hand the late joiners the whole log (read for them): from now on they get lines as the others do."""
        for sink in self.catching_up:
            if everything:
                sink.put(everything)
        self.sinks.extend(self.catching_up)
        self.catching_up = []

    def read_up_to(self, newest: str, lines: list[str]) -> None:
        """A read (``lines``: from the second of the last line delivered on, all of it) delivered up to
        second ``newest``: every line of that second is in it, counted in ``edge``."""
        self.edge = Counter(raw for raw in lines if _second_of(raw) == newest)
        self.second = newest

    def count_delivered(self, second: Optional[str], raw: str) -> None:
        """Count a line (``raw``, of ``second``) that a stream delivered in ``edge`` if it is of the newest
        second delivered (a newer second starts the count again)."""
        if second is None:
            return
        if self.second is None or second > self.second:
            self.second, self.edge = second, Counter()
        if second == self.second:
            self.edge[raw] += 1


#: Failures in a row of the job's pod list, and of the final read of a pod that ended, that end the
#: following (``_gives_up``); other reads are tried again each round.
LIST_FAILURES = 5
FINAL_READ_FAILURES = 3


def _gives_up(error: ClusterError, failures: int, allowed: float = math.inf) -> bool:
    """Whether a request that failed (``failures`` in a row) ends the following: refused credentials (401,
    403) at once, other errors after ``allowed`` failures in a row."""
    return error.status in (401, 403) or failures >= allowed


class JobLogFollower:
    """Follows the log of every node of one TrainJob that someone reads, with at most
    ``LOG_READERS`` threads and connections whatever the number of nodes.

    At most every ``LIST_SECONDS`` (and at once after a stream ended), one pod list for the whole job (and, once
    every node's pod has ended, one GET of the TrainJob) says which pod each node runs. Reader ``w`` follows the
    nodes ``k`` with ``k % readers == w``. A reader with one node (every reader of a job of at most ``readers``
    nodes) follows its running pod with one ``follow`` stream (``timestamps``, and ``sinceTime`` when it
    resumes): lines arrive as the kubelet sends them, and a quiet node costs no request. A reader with more nodes
    reads each in turn every round (``POLL_SECONDS``, slower above ``MAX_READS_PER_SECOND``; a quiet node less
    often, up to ``IDLE_POLL_MAX_SECONDS``), each in a slot of its own spread over the round, with one short
    request (``timestamps``, ``sinceTime`` and ``tailLines``). Either way the lines go to the node's subscribers,
    and the timestamps make reads and streams join without gaps or duplicates: a stream the server closes (or
    that ends with its container run) is resumed from the second of the last line delivered, and the lines of
    that second already delivered are dropped. A node whose newest pod changes (a gang restart) gets its old
    pod's last lines, a marker, and the new pod's log. A subscriber's ``put`` gets lists of lines ending in
    newline (one per read or chunk) and marker lines, then ``_END`` (or an exception).

    A stream is closed here (``LogStream.close``, from the thread that asks) when the follower
    stops, when its reader gets a second node (it reads them in turn then), and when a subscriber
    joins late (the reader reads the whole log for it, then streams again)."""

    def __init__(
        self,
        cluster: ClusterReader,
        namespace: str,
        trainjob: str,
        *,
        readers: int = LOG_READERS,
        poll: float = POLL_SECONDS,
    ) -> None:
        self.cluster, self.namespace, self.trainjob = cluster, namespace, trainjob
        self.readers, self.poll = readers, poll
        #: Reader -> (node index, its open stream).
        self._streams: dict[int, tuple[int, LogStream]] = {}
        self._lock = threading.Lock()
        self._refreshing = threading.Lock()
        self._nodes: dict[int, _Node] = {}
        self._threads: dict[int, threading.Thread] = {}
        self._refreshed_at = float("-inf")
        #: How often the job is looked at, as worked out at the last look (``_refresh``).
        self._refresh_period = 0.0
        self._refresh_failures = 0
        #: What the background look gave up on, for the next reader to raise.
        self._list_failed: Optional[Exception] = None
        self._job_over = False
        self.stopped = False
        #: The job's pods (and TrainJob) from watches of this follower's own (``_job_reader``), once made.
        self._watched: Optional[WatchedJob] = None

    # -- subscribers --

    def subscribe(self, index: int, sink) -> bool:
        """Send node ``index``'s lines to ``sink.put``; False if this follower cannot any more
        (the node is done, or the follower stopped): use a new one."""
        with self._lock:
            if self.stopped:
                return False
            node = self._nodes.setdefault(index, _Node(index))
            if node.done:
                return False
            node.subscribe(sink)
            worker = index % self.readers
            streamed, stream = self._streams.get(worker, (None, None))
            if stream is not None and (streamed != index or node.catching_up):
                stream.close()  # its reader reads its nodes in turn now, or the whole log for the newcomer
            self._start_reader(worker)
            return True

    def _start_reader(self, worker: int) -> None:
        """Start reader ``worker``'s thread unless it runs (under ``_lock``)."""
        thread = self._threads.get(worker)
        if thread is None or not thread.is_alive():
            thread = self._threads[worker] = threading.Thread(
                target=self._read_loop, args=(worker,), daemon=True, name=f"logs-{self.trainjob}-{worker}"
            )
            thread.start()

    def unsubscribe(self, index: int, sink) -> None:
        with self._lock:
            node = self._nodes.get(index)
            if node is not None:
                node.unsubscribe(sink)
            if not any(n.subscribers() for n in self._nodes.values()):
                self.stopped = True
                if self._watched is not None:
                    self._watched.stop()
            self._close_unfollowed_streams()

    def _close_unfollowed_streams(self) -> None:
        """Close the streams of the nodes nobody follows any more, every stream once stopped (under ``_lock``)."""
        for streamed, stream in self._streams.values():
            if self.stopped or not self._nodes[streamed].followed():
                stream.close()

    def running_pod(self, index: int) -> Optional[str]:
        """Node ``index``'s pod if it was running at the last list."""
        with self._lock:
            node = self._nodes.get(index)
            return node.pod if node is not None and not node.idle() and node.phase == "Running" else None

    # -- the readers --

    def _read_loop(self, worker: int) -> None:
        while True:
            started = time.monotonic()
            mine = self._round_of(worker)
            if not mine:
                return
            stream_worker = worker if len(mine) == 1 else None
            period, keeping = self._round_period()
            # A live round gives each node a slot of its own (``_slot``); a keeper's reads go at once, as
            # trouble's must while the pods are still there.
            slot = 0.0 if keeping else period / len(mine)
            for place, node in enumerate(mine):
                if place and slot and not self._slot(started + place * slot):
                    break
                self._visit_or_fail(node, stream_worker)
            period, keeping = self._round_period()
            self._pause(started + period, keeping)

    def _round_period(self) -> tuple[float, bool]:
        """(How often a reader's round starts at most, whether only keepers follow) for the nodes followed now."""
        with self._lock:
            followed, (poll, reads_per_second, keeping) = self._unfinished(), self._pace()
        return max(poll, followed / reads_per_second), keeping

    def _slot(self, at: float) -> bool:
        """Wait for a node's slot in a live round (its place among the reader's nodes times the period over
        their number): reads spread over the round instead of in a burst at its start, so that the time
        between two reads of a node stays one period when reads slow down for a while (a burst shifts the
        last node of a round by the slowdown of every read before it), and the API server gets an even rate.
        False if the follower stopped meanwhile (the rest of the round is not read)."""
        if (left := at - time.monotonic()) > 0:
            time.sleep(left)
        return not (self.stopped or _exiting.is_set())

    def _round_of(self, worker: int) -> list[_Node]:
        """Reader ``worker``'s nodes for its next round; none once it ends (no followed node left, the
        follower stopped, the interpreter exits): its thread is then gone from ``_threads``."""
        with self._lock:
            mine = self._share(worker)
            if not mine or self.stopped or _exiting.is_set():
                self._threads.pop(worker, None)
                return []
            return mine

    def _visit_or_fail(self, node: _Node, stream_worker: Optional[int]) -> None:
        """The round's look at the job, then ``_visit``; an error ends the node, handed to its readers
        (raised there)."""
        try:
            self._refresh()
            self._visit(node, stream_worker)
        except Exception as error:  # noqa: BLE001 - handed to the node's readers, raised there
            with self._lock:
                node.done = True
                node.put(error)

    def _unfinished(self) -> int:
        """The nodes not done, those that wait for trouble left out (under ``_lock``)."""
        flow = self._events_flow()
        return sum(1 for n in self._nodes.values() if not n.done and not self._waits_for_trouble(n, flow))

    def _pace(self) -> tuple[float, int, bool]:
        """(Under ``_lock``) the pace of the moment: (round period at least, log reads per second at most,
        whether only keepers follow): a keeper's slower one while nobody reads live."""
        if self._only_kept():
            return KEEP_POLL_SECONDS, KEEP_READS_PER_SECOND, True
        return self.poll, MAX_READS_PER_SECOND, False

    def _pause(self, until: float, keeping: bool) -> None:
        """Sleep until ``until``; a keeper's longer pause ends early (in ``POLL_SECONDS`` steps) once the
        follower stops or someone reads live."""
        while (left := until - time.monotonic()) > 0:
            time.sleep(min(left, self.poll) if keeping else left)
            if keeping:
                with self._lock:
                    if self.stopped or not self._only_kept():
                        return

    def _only_kept(self) -> bool:
        """Whether the followed nodes' subscribers all only keep lines (under ``_lock``): nobody reads this
        job's logs live."""
        followed = [n for n in self._nodes.values() if n.followed()]
        return bool(followed) and all(n.keeps_only() for n in followed)

    def _share(self, worker: int) -> list[_Node]:
        """The followed nodes of reader ``worker``, those that wait for trouble left out (under ``_lock``)."""
        flow = self._events_flow()
        return [
            n
            for i, n in sorted(self._nodes.items())
            if i % self.readers == worker and n.followed() and not self._waits_for_trouble(n, flow)
        ]

    # -- reading on trouble --

    def _events_flow(self) -> bool:
        """Whether the job's pod events reach this process (``WatchedJob.pod_events_flow``)."""
        flow = getattr(self.cluster, "pod_events_flow", None)
        return flow is not None and flow()

    def _on_trouble(self, node: _Node) -> bool:
        """Whether ``node`` is read only when trouble is told (under ``_lock``): its subscribers want it so and
        the job's pod events reach this process (else it is read in rounds)."""
        return node.reads_on_trouble() and self._events_flow()

    def _waits_for_trouble(self, node: _Node, flow: bool) -> bool:
        """Whether ``node`` is read on trouble and none is told that its reads have not answered, ``flow`` being
        ``_events_flow()`` (under ``_lock``)."""
        return flow and node.reads_on_trouble() and not node.nudged()

    def nudge(self) -> None:
        """Trouble in the job (a pod failed or is being deleted: ``NodeLogKeeper``): read each node that is read
        on trouble once, now, while its pod is still there."""
        with self._lock:
            if self.stopped:
                return
            for node in self._nodes.values():
                if node.followed() and node.reads_on_trouble():
                    node.nudges += 1
                    node.next_read = 0.0
            for worker in {i % self.readers for i, n in self._nodes.items() if n.nudged()}:
                open_stream = self._streams.get(worker)
                if open_stream is not None and self._share(worker) != [self._nodes[open_stream[0]]]:
                    open_stream[1].close()  # its reader reads its nodes in turn now
                self._start_reader(worker)

    def ensure_readers(self) -> None:
        """Start the reader of each worker that has nodes to read and no thread: one that ended while its nodes
        waited for trouble, which pod events no longer tell (the pod watch refused, paused or over the cap)."""
        with self._lock:
            if self.stopped:
                return
            for worker in {i % self.readers for i in self._nodes}:
                if self._share(worker):
                    self._start_reader(worker)

    def nudges_answered(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the reads of the trouble told so far; whether they are done."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if self.stopped or not any(n.nudged() and n.followed() for n in self._nodes.values()):
                    return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def _refresh(self) -> None:
        """One round's look at the job, by whichever reader comes first: the TrainJob's state once
        every node is idle (read before the pods: a job over has all its pods listed), then its pods.
        A job whose readers poll (more nodes than readers) is looked at by a thread of its own (one at a
        time), so that no reader's round waits for the list of a large job; a failure it gives up on
        is raised by the next reader that comes here."""
        failed, self._list_failed = self._list_failed, None
        if failed is not None:
            raise failed
        if not self._refreshing.acquire(blocking=False):
            return
        background = False
        try:
            if time.monotonic() - self._refreshed_at < self._refresh_period * 0.9:
                return  # as most visits of a round do: no count of the nodes (a large job's thousand) each time
            with self._lock:
                followed, (poll, _, _) = self._unfinished(), self._pace()
            self._refresh_period = max(poll, LIST_SECONDS, followed / LISTED_PODS_PER_SECOND)
            if time.monotonic() - self._refreshed_at < self._refresh_period * 0.9:
                return
            self._refreshed_at = time.monotonic()
            if followed > self.readers:
                background = True
                threading.Thread(
                    target=self._look_in_background,
                    args=(self._job_reader(),),
                    daemon=True,
                    name=f"loglist-{self.trainjob}",
                ).start()
                return
            self._look(self.cluster)
        finally:
            if not background:
                self._refreshing.release()

    def _job_reader(self) -> ClusterReader:
        """What a job followed in rounds (more nodes than readers) is looked at through: watches of the
        follower's own, holding each pod's name, labels and phase (``_listed_shape``), instead of a list of
        every pod each look (1,024 nodes: 8 MB); a reader that answers from watches already (a waiting
        process's ``WatchedJob``) as it is."""
        if hasattr(self.cluster, "on_pod_event"):
            return self.cluster
        if self._watched is None:
            self._watched = WatchedJob(self.cluster, self.namespace, self.trainjob, pod_shape=_listed_shape)
        return self._watched

    def _look_in_background(self, reader: ClusterReader) -> None:
        try:
            self._look(reader)
        except Exception as e:  # noqa: BLE001 - raised by the next reader, as an inline look's would be
            self._list_failed = e
        finally:
            self._refreshing.release()

    def _look(self, reader: ClusterReader) -> None:
        """Read the TrainJob (once every node is idle) and list the job's pods through ``reader``; raises a
        ClusterError after ``LIST_FAILURES`` failures in a row (at once for 401/403)."""
        try:
            over = self._trainjob_over(reader)
            pods = {
                index: _pod_summary(pod)
                for index, pod in newest_pods_by_node(
                    reader.list("Pod", self.namespace, node_selector(self.trainjob))
                ).items()
            }
            with self._lock:
                for index, node in self._nodes.items():
                    node.listed(pods.get(index))
                self._job_over = self._job_over or over
            self._refresh_failures = 0
        except ClusterError as e:
            self._refresh_failures += 1
            if _gives_up(e, self._refresh_failures, LIST_FAILURES):
                raise
            log.debug("listing the pods of %s: %s", self.trainjob, e)

    def _trainjob_over(self, reader: ClusterReader) -> bool:
        """Whether the TrainJob has ended (one GET), asked only once every node is idle and until it is over."""
        with self._lock:
            flow = self._events_flow()
            idle = all(n.idle() or self._waits_for_trouble(n, flow) for n in self._nodes.values())
        if not idle or self._job_over:
            return False
        trainjob = reader.get(TRAINJOB_KIND, self.trainjob, self.namespace)
        return job_status(trainjob, name=self.trainjob).state.name in ("SUCCEEDED", "FAILED", "CANCELLED")

    def _visit(self, node: _Node, stream_worker: Optional[int] = None) -> None:
        """One round's work for ``node``: its pod changed, new lines, its end. With ``stream_worker``
        (the reader has no other node), a running pod is followed with a stream until it ends."""
        with self._lock:
            started, job_over, nudges = node.started_pod(), self._job_over, node.nudges
            if self._on_trouble(node):
                stream_worker = None  # read once for the trouble told, not followed
        if started is not None and started["metadata"]["name"] != node.pod:
            self._switch_pod(node, started)
        if node.pod is not None and not node.drained:
            self._catch_up(node, node.pod, stream_worker)
        with self._lock:
            node.nudges_read = max(node.nudges_read, nudges)  # one try for the trouble told: the next is told anew
        if job_over and node.idle():
            # Over, and every line of its newest pod delivered (a newer pod that started was switched to above).
            with self._lock:
                node.done = True
                node.put(_END)

    def _switch_pod(self, node: _Node, newest: dict) -> None:
        """Follow ``newest`` (started) from now on: the old pod's last lines first."""
        name = newest["metadata"]["name"]
        if node.pod is not None:
            if not node.drained:
                self._read(node, node.pod, final=True)  # the old pod's last lines
            restart = newest["metadata"].get("labels", {}).get(RESTART_ATTEMPT_LABEL, "?")
            with self._lock:
                node.put(f"--- gang restart: following pod {name} (restart attempt {restart}) ---\n")
        with self._lock:
            node.reset(name)
            node.phase = (newest.get("status") or {}).get("phase", "")

    def _catch_up(self, node: _Node, pod: str, stream_worker: Optional[int]) -> None:
        """Read (or stream, with ``stream_worker``) ``pod``'s new lines if they are due."""
        with self._lock:
            ended = node.pod_ended()  # as listed before this read
            due = node.due(ended)
            stream = not ended and not node.catching_up
        if not due:
            return
        if stream and stream_worker is not None:
            self._stream(node, pod, stream_worker)
        elif self._read(node, pod, final=ended) and ended:
            node.drained = True

    def _read(self, node: _Node, pod: str, final: bool = False) -> bool:
        """Deliver the new lines of node's ``pod`` (one request, or two when a tail may have cut some off).
        False if the log cannot be read now (the container waits to start); a pod gone reads as empty."""
        with self._lock:
            whole, since, tail = node.read_window()
        try:
            lines = self._read_log(pod, since, tail)
        except NotFoundError:
            return True
        except ClusterError as e:
            node.failures += 1
            if _gives_up(e, node.failures, FINAL_READ_FAILURES if final else math.inf):
                raise
            log.debug("reading the log of %s: %s", node.pod, e)
            return False
        node.failures = 0
        node.tail = max(TAIL_LINES, 4 * len(lines))
        with self._lock:
            node.read_later(_deliver(node, lines, whole), self.poll)
        return True

    def _read_log(self, pod: str, since: Optional[str], tail: Optional[int]) -> list[str]:
        """``pod``'s log lines with their times from second ``since`` on, the last ``tail`` of them; read
        again without the limit when it returns that many (it may have cut some off)."""
        lines = list(
            self.cluster.pod_log(
                pod, self.namespace, container=TRAINER_NODE, timestamps=True, since_time=since, tail_lines=tail
            )
        )
        if tail is None or since is None or len(lines) < tail:
            return lines  # without ``since``: a tail asked for (``read_window``), meant to cut
        return list(
            self.cluster.pod_log(pod, self.namespace, container=TRAINER_NODE, timestamps=True, since_time=since)
        )

    def _stream(self, node: _Node, pod: str, worker: int) -> None:
        """Follow node's ``pod`` with one stream from the second of the last line delivered, until the
        stream ends: its container run ended, the server closed it or it broke, or it was closed here."""
        with self._lock:
            floor, skip = node.second, Counter(node.edge)
        stream = self._open_stream(node, pod, floor)
        if stream is None:
            return
        new = self._drain(node, stream, worker, floor, skip)
        if stream.interrupted:
            return
        with self._lock:
            # Ended by itself: at once again if it brought lines (the server closed it mid-run), later
            # if not (its container has ended, which the pod list, made at once, will say).
            node.read_later(new, self.poll)
        self._refreshed_at = float("-inf")

    def _open_stream(self, node: _Node, pod: str, floor: Optional[str]) -> Optional[LogStream]:
        """A follow stream of ``pod`` from second ``floor`` on (the whole log: None); None if it cannot be
        opened now (the pod is gone: the next list says so; or the request failed): tried again later."""
        try:
            with self._lock:
                tail = KEEP_LINES if floor is None and node.keeps_only() else None
            stream = self.cluster.pod_log_stream(
                pod,
                self.namespace,
                container=TRAINER_NODE,
                since_time=floor + "Z" if floor else None,
                tail_lines=tail,
                idle_timeout=STREAM_IDLE_SECONDS,
            )
            node.failures = 0
            return stream
        except NotFoundError:
            pass
        except ClusterError as e:
            node.failures += 1
            if _gives_up(e, node.failures):
                raise
            log.debug("following the log of %s: %s", node.pod, e)
        with self._lock:
            node.read_later(False, self.poll)
        return None

    def _drain(self, node: _Node, stream: LogStream, worker: int, floor: Optional[str], skip: Counter) -> bool:
        """Deliver ``stream``'s lines (see ``_deliver_streamed``) until it ends; True if it brought any. Open,
        it is ``worker``'s stream, which other threads close; closed at once if the node's subscribers
        changed while it opened."""
        from urllib3.exceptions import HTTPError as Urllib3Error  # loaded with the kubernetes client already

        self._hold(node, stream, worker)
        new = False
        try:
            for lines in stream:
                with self._lock:
                    new = _deliver_streamed(node, lines, floor, skip) or new
        except (Urllib3Error, OSError) as e:  # broken or timed out: resumed by the next round
            if not stream.interrupted:
                log.debug("the log stream of %s broke: %s", node.pod, e)
        finally:
            with self._lock:
                if self._streams.get(worker, (None, None))[1] is stream:
                    del self._streams[worker]
            stream.close()
        return new

    def _hold(self, node: _Node, stream: LogStream, worker: int) -> None:
        """Make ``stream`` reader ``worker``'s open stream (other threads close it there), or close it at once
        if the node's subscribers changed while it opened: a second node, a late joiner, a stop."""
        with self._lock:
            if self.stopped or _exiting.is_set() or node.catching_up or self._share(worker) != [node]:
                stream.close()
            else:
                self._streams[worker] = (node.index, stream)


def _pod_summary(pod: dict) -> dict:
    """What following needs of a listed pod (name, restart attempt, phase), in the pod's shape: a
    follower of a 1,024-node job keeps 1,024 of them, not 1,024 whole pods."""
    metadata = pod.get("metadata") or {}
    labels = {k: v for k, v in (metadata.get("labels") or {}).items() if k == RESTART_ATTEMPT_LABEL}
    return {
        "metadata": {"name": metadata.get("name"), "labels": labels},
        "status": {"phase": (pod.get("status") or {}).get("phase")},
    }


def _listed_shape(pod: dict) -> dict:
    """What a follower's own watch holds of a pod (``JobLogFollower._job_reader``): what its lists select on
    and ``newest_pods_by_node`` and ``_pod_summary`` read."""
    metadata = pod.get("metadata") or {}
    return {
        "metadata": {
            key: metadata[key]
            for key in ("name", "namespace", "labels", "creationTimestamp", "deletionTimestamp", "resourceVersion")
            if key in metadata
        },
        "spec": {"nodeName": (pod.get("spec") or {}).get("nodeName")},
        "status": {"phase": (pod.get("status") or {}).get("phase")},
    }


def _second_of(raw: str) -> Optional[str]:
    """The second of a line read with ``timestamps`` ("YYYY-MM-DDTHH:MM:SS": the time's first 19 characters,
    so that most lines are not parsed at all); None for a line without a time (the rest of a partial one)."""
    return raw[:19] if raw[19:20] in (".", "Z") else None


def _stamped(raw: str) -> tuple[Optional[str], str]:
    """A line read with ``timestamps`` as (its second, its text without the time)."""
    second = _second_of(raw)
    return second, (raw[raw.find(" ") + 1 :] if second else raw)


def _delivered_before(second: Optional[str], raw: str, floor: Optional[str], skip: Counter) -> bool:
    """Whether a line (``raw``, of ``second``) of a read from second ``floor`` on was delivered before: one
    of an earlier second, or one of the copies (time and text) of the lines of ``floor`` that ``skip``
    counts; each copy dropped uses up one count, so a line of ``floor`` is new once there are more copies
    of it than were delivered."""
    if second is None or floor is None:
        return False
    if second < floor:
        return True
    if second == floor and skip[raw] > 0:
        skip[raw] -= 1
        return True
    return False


def _undelivered(lines: list[str], floor: Optional[str], skip: Counter) -> list[tuple[Optional[str], str, str]]:
    """The lines of a read or a stream's chunk (``timestamps``; from second ``floor`` on, or the whole log)
    not delivered before (``_delivered_before``), as (second, line, text)."""
    fresh = []
    for raw in lines:
        second, text = _stamped(raw)
        if not _delivered_before(second, raw, floor, skip):
            fresh.append((second, raw, text))
    return fresh


def _deliver(node: _Node, lines: list[str], whole: bool) -> bool:
    """Hand ``node``'s subscribers the lines of a read (``timestamps``, from the second of the last
    line delivered on, or the whole log) that they have not had yet, as one list each; True if
    there were any.

    Only the lines of that second were delivered before: a line of it is new once there are more
    copies of it (time and text) in this read than were delivered."""
    fresh = _undelivered(lines, node.second, Counter(node.edge))
    newest = max((second for second, _, _ in fresh if second is not None), default=node.second)
    if newest is not None:
        node.read_up_to(newest, lines)
    node.put_fresh([text + "\n" for _, _, text in fresh])
    if whole:
        node.catch_up([_stamped(raw)[1] + "\n" for raw in lines])
    return bool(fresh)


def _deliver_streamed(node: _Node, lines: list[str], floor: Optional[str], skip: Counter) -> bool:
    """Hand ``node``'s subscribers the lines of a stream's chunk (``timestamps``; from second
    ``floor`` on, or the whole log) that they have not had; True if there were any. ``skip``
    counts the lines of ``floor`` delivered before the stream opened: the stream sends them first,
    and those copies are dropped (``_deliver`` explains the count)."""
    fresh = _undelivered(lines, floor, skip)
    for second, raw, _ in fresh:
        node.count_delivered(second, raw)
    node.put_fresh([text + "\n" for _, _, text in fresh])
    return bool(fresh)


_followers_lock = threading.Lock()
_followers: dict[tuple, list[JobLogFollower]] = {}


def _subscribe(cluster: ClusterReader, namespace: str, trainjob: str, index: int, sink) -> JobLogFollower:
    """The job's follower in this process that can take ``sink`` for node ``index`` (a new one if none can). A
    reader that answers from watches (``cluster/watched.py``: its ``cluster`` is the client it reads through)
    shares the follower of that client: a waiting process keeping node logs and following them live reads
    each log once."""
    key = (id(getattr(cluster, "cluster", cluster)), namespace, trainjob)
    with _followers_lock:
        followers = _followers.setdefault(key, [])
        followers[:] = [f for f in followers if not f.stopped]
        for follower in followers:
            if follower.subscribe(index, sink):
                return follower
        follower = JobLogFollower(cluster, namespace, trainjob)
        follower.subscribe(index, sink)
        followers.append(follower)
        return follower


def _followed(
    cluster: ClusterReader, namespace: str, trainjob: str, index: int, stall_after: Optional[float]
) -> Iterator[str]:
    sink: queue.SimpleQueue = queue.SimpleQueue()
    follower = _subscribe(cluster, namespace, trainjob, index, sink)
    try:
        last = time.monotonic()
        while (item := _next_item(sink, stall_after)) is not _END:
            if item is None:
                yield from _stall_warning(follower, index, last)
                continue
            if isinstance(item, BaseException):
                raise item
            last = time.monotonic()
            yield from item if isinstance(item, list) else [item]
    finally:
        follower.unsubscribe(index, sink)


def _next_item(sink: queue.SimpleQueue, stall_after: Optional[float]) -> Any:
    """The next item a follower put in ``sink``; None after ``stall_after`` seconds without one."""
    try:
        return sink.get(timeout=stall_after) if stall_after else sink.get()
    except queue.Empty:
        return None


def _stall_warning(follower: JobLogFollower, index: int, since: float) -> list[str]:
    """The warning line for node ``index``, silent since ``since`` (monotonic), if its pod is running."""
    pod = follower.running_pod(index)
    if not pod:
        return []
    return [
        f"--- warning: node {index} (pod {pod}) has printed nothing for {time.monotonic() - since:.0f} s "
        "while running: a hung collective or a stuck data loader? ---\n"
    ]


log = logging.getLogger(__name__)


def node_log_path(job_dir: str, index: int) -> str:
    return os.path.join(job_dir, "logs", f"node-{index}.log")


def save_node_logs(
    cluster: ClusterReader, namespace: str, pods: dict[int, dict], directory: str, kept: Collection[int] = ()
) -> str:
    """Write the log of each node that has no file yet (following logs writes them as it
    goes) to ``directory/node-<i>.log``; the directory, or "" if it cannot be written. A node whose
    pod cannot be read (gone since it was listed, a failed preflight that kept ``node`` from starting)
    gets a line saying why, unless it is one of the nodes whose last lines are ``kept`` by this process
    (``NodeLogKeeper.save`` writes those)."""
    try:
        os.makedirs(directory, exist_ok=True)
        for index, pod in sorted(pods.items()):
            path = os.path.join(directory, f"node-{index}.log")
            if os.path.exists(path):
                continue
            try:
                lines = list(cluster.pod_log(pod["metadata"]["name"], namespace, container=TRAINER_NODE))
            except ClusterError as e:
                if index in kept:
                    continue
                # e.g. 400 PodInitializing: a failed init container (preflight) kept `node` from starting.
                lines = [f"(no log of node {index}: {e.server_message or e})"]
            with open(path, "w") as f:
                f.writelines(line + "\n" for line in lines)
        return directory
    except OSError as e:
        log.warning("could not save the node logs to %s: %s", directory, e)
        return ""


def tee_to_file(lines: Iterable[str], path: str) -> Iterator[str]:
    """Pass ``lines`` through, appending each to ``path`` (the node's log next to the job). One writer at
    a time (an exclusive lock on the file): a second follower of the node, in this process or another
    (the submitting run and ``nemo-kubeflow logs -f``), passes its lines through without writing them twice."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        out = open(path, "a")
    except OSError as e:
        log.warning("not saving the log to %s: %s", path, e)
        yield from lines
        return
    with out:
        try:
            fcntl.flock(out, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield from lines  # another follower is writing this file
            return
        for line in lines:
            out.write(line)
            out.flush()
            yield line


def kept_node_log(job_dir: str, index: int) -> list[str]:
    """The log a follower or a failure summary kept of node ``index`` next to the job (``node_log_path``),
    after a line saying where it comes from; none when there is no such file."""
    path = node_log_path(job_dir, index)
    try:
        with open(path) as f:
            lines = f.readlines()
    except OSError:
        return []
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    return [f"--- node {index} has no pod to read; the log kept in {path}:\n", *lines]


#: Lines of each node kept in memory while a job is watched (``NodeLogKeeper``).
KEEP_LINES = 2000
#: Nodes whose last lines a ``NodeLogKeeper`` keeps (memory: up to KEEP_LINES lines each).
MAX_KEPT_NODES = 64


#: How long ``NodeLogKeeper.kept_lines`` and ``save`` wait for the reads that trouble asked for.
TROUBLE_READS_WAIT_S = 5.0


class NodeLogKeeper:
    """While a job is waited for: keep each node's last ``KEEP_LINES`` lines in memory (through the job's
    ``JobLogFollower``, so no thread or connection of its own), so that a node whose pod is deleted when
    another node fails (the Job controller deletes a failed Job's running pods, logs and all) still has its
    last lines to save. ``save`` writes them to ``<directory>/node-<i>.log`` for the nodes that have no file
    there yet (log following with ``tail_logs`` writes the whole log itself).

    Node 0 (progress lines, ft_launcher's restarts) is followed: one stream. The others are read when the
    job is in trouble: where ``cluster`` tells the job's pod events (``WatchedJob.on_pod_event``), a pod
    that fails, or is marked for deletion, has each of them read once at once (its last lines; a pod being
    deleted serves its log until its containers have stopped), and nothing is read while all goes well.
    Without those events (no ``watch`` right on pods, more jobs watched than ``MAX_WATCHED_JOBS``) they are
    read in rounds, at the keeper's pace (``KEEP_READS_PER_SECOND``)."""

    def __init__(self, cluster: ClusterReader, namespace: str, trainjob: str, nodes: int, directory: str) -> None:
        self.directory = directory
        self._lines = {i: _KeptLines(on_trouble=i > 0) for i in range(min(nodes, MAX_KEPT_NODES))}
        self._followers = {i: _subscribe(cluster, namespace, trainjob, i, kept) for i, kept in self._lines.items()}
        self._cluster = cluster
        #: The pods whose trouble was told (each told once).
        self._troubled: set[str] = set()
        self._stopped = False
        listen = getattr(cluster, "on_pod_event", None)
        if listen is not None:
            listen(self._pod_event)

    def stop(self) -> None:
        """Stop following."""
        self._stopped = True
        stop_listening = getattr(self._cluster, "off_pod_event", None)
        if stop_listening is not None:
            stop_listening(self._pod_event)
        for index, follower in self._followers.items():
            follower.unsubscribe(index, self._lines[index])

    def _pod_event(self, kind: str, pod: dict) -> None:
        """A pod of the job listed or changed: trouble (``pod_in_trouble``) has every node read once."""
        name = (pod.get("metadata") or {}).get("name") or ""
        if self._stopped or name in self._troubled or not pod_in_trouble(kind, pod):
            return
        self._troubled.add(name)
        for follower in self._distinct_followers():
            follower.nudge()

    def read_every_node(self) -> None:
        """Read the nodes read on trouble once, now, and wait for it (``TROUBLE_READS_WAIT_S`` at most): trouble
        no pod event tells, such as an in-job restart in node 0's lines, whose cause is in the failing node's."""
        if not self._stopped:
            for follower in self._distinct_followers():
                follower.nudge()
        self._trouble_read()

    def _distinct_followers(self) -> list[JobLogFollower]:
        return list({id(f): f for f in self._followers.values()}.values())

    def _trouble_read(self) -> None:
        for follower in self._distinct_followers():
            follower.ensure_readers()  # each look: the nodes are read in rounds again once pod events stop
            follower.nudges_answered(TROUBLE_READS_WAIT_S)

    def kept_lines(self) -> dict[int, list[str]]:
        """Node index -> the lines kept so far (for ``diagnosis``: ft_launcher's restarts while running), once
        the reads that trouble asked for are done."""
        self._trouble_read()
        return {i: lines.snapshot() for i, lines in self._lines.items()}

    def kept_nodes(self) -> set[int]:
        """The nodes whose last lines are kept (``kept_lines``: once the reads trouble asked for are done)."""
        return {i for i, lines in self.kept_lines().items() if lines}

    def save(self) -> list[int]:
        """Write the kept lines of each node without a file yet; the nodes written."""
        written = []
        self._trouble_read()
        try:
            os.makedirs(self.directory, exist_ok=True)
            kept = {i: lines.snapshot() for i, lines in self._lines.items()}
            for index, lines in sorted(kept.items()):
                path = os.path.join(self.directory, f"node-{index}.log")
                if not lines or os.path.exists(path):
                    continue
                with open(path, "w") as f:
                    f.writelines(lines)
                written.append(index)
        except OSError as e:
            log.warning("could not save the node logs to %s: %s", self.directory, e)
        return written


def pod_in_trouble(kind: str, pod: dict) -> bool:
    """Whether a pod event (``WatchedJob.on_pod_event``) says the job is in trouble, so that its nodes' logs
    may soon be gone: the pod failed, a container of it ended in error or restarted, or the pod is being
    deleted (a gang restart, a failed job's cleanup, a preemption) or is gone."""
    status = pod.get("status") or {}
    if kind == "DELETED" or (pod.get("metadata") or {}).get("deletionTimestamp") or status.get("phase") == "Failed":
        return True
    for container in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        ended = (container.get("state") or {}).get("terminated") or {}
        if ended.get("exitCode") or container.get("restartCount"):
            return True
    return False


class _KeptLines:
    """A subscriber that keeps a node's last ``KEEP_LINES`` lines (``on_trouble``: wanted only when the job is in
    trouble, see ``NodeLogKeeper``)."""

    #: Nobody reads these lines live: the follower may read this job at the keeper's pace.
    keeps_only = True

    def __init__(self, on_trouble: bool = False) -> None:
        self.on_trouble = on_trouble
        self._lines: deque = deque(maxlen=KEEP_LINES)
        self._lock = threading.Lock()

    def put(self, item) -> None:
        if isinstance(item, (str, list)):
            with self._lock:
                self._lines.extend([item] if isinstance(item, str) else item)

    def snapshot(self) -> list[str]:
        with self._lock:
            return list(self._lines)
