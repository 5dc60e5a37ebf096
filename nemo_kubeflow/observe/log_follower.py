"""Reading the logs of a TrainJob's nodes through the ``Cluster`` interface.

Pods are found by the labels JobSet and the Job controller put on them (TrainJob
labels do not reach pods). Unlike the Kubeflow SDK, which returns nothing for a
Pending pod, following a node waits for its pod to start, and follows the node's
newest pod across gang restarts until the job ends: one ``JobLogFollower`` per followed job, shared
by everyone in the process who follows or keeps its nodes' logs.
"""

from __future__ import annotations

import atexit
import logging
import math
import queue
import threading
import time
from collections import Counter
from typing import Any, Iterator, Optional

from nemo_kubeflow.cluster.client import ClusterReader
from nemo_kubeflow.cluster.log_stream import LogStream
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
from nemo_kubeflow.observe.followed_node import KEEP_LINES, TAIL_LINES, FollowedNode, deliver, deliver_streamed
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
#: How long the first look of a job read in rounds waits for the follower's pod watch to list them (``_job_reader``);
#: past it, that look lists them itself.
FIRST_LIST_WAIT_SECONDS = 10.0
#: A follow stream silent this long is opened again from where it was: a connection dropped
#: without a word (a NAT's or load balancer's idle timeout) cannot hang a node's following, and a
#: quiet node costs one request per this many seconds.
STREAM_IDLE_SECONDS = 300.0
_END = object()
#: Set when the interpreter exits: readers send no new request into a connection being torn down.
_exiting = threading.Event()
atexit.register(_exiting.set)

log = logging.getLogger(__name__)


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
        self._nodes: dict[int, FollowedNode] = {}
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
            node = self._nodes.get(index)
            if node is None:
                node = self._nodes[index] = FollowedNode(index)
                # Listed at the next visit, however recent the last list (made before it joined): a node read
                # on trouble that is nudged at once is read, not passed over as having no pod yet.
                self._refreshed_at = float("-inf")
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
            if not self._round_of(worker):
                return  # at once: a reader that paused first outlived its node's end (one per task of a sweep's logs)
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

    def _round_of(self, worker: int) -> list[FollowedNode]:
        """Reader ``worker``'s nodes for its next round; none once it ends (no followed node left, the
        follower stopped, the interpreter exits): its thread is then gone from ``_threads``."""
        with self._lock:
            mine = self._share(worker)
            if not mine or self.stopped or _exiting.is_set():
                self._threads.pop(worker, None)
                return []
            return mine

    def _visit_or_fail(self, node: FollowedNode, stream_worker: Optional[int]) -> None:
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

    def _share(self, worker: int) -> list[FollowedNode]:
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

    def _on_trouble(self, node: FollowedNode) -> bool:
        """Whether ``node`` is read only when trouble is told (under ``_lock``): its subscribers want it so and
        the job's pod events reach this process (else it is read in rounds)."""
        return node.reads_on_trouble() and self._events_flow()

    def _waits_for_trouble(self, node: FollowedNode, flow: bool) -> bool:
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
                if open_stream is not None:
                    streamed = self._nodes[open_stream[0]]
                    if self._share(worker) != [streamed] or self._on_trouble(streamed):
                        # Its reader reads its nodes in turn now; or the node, streamed while the pod events did
                        # not flow (the pod watch not started yet, or over the cap), is read once, as trouble's are.
                        open_stream[1].close()
                    else:
                        # Followed live (no pod events): its stream brings each line as it is logged, and the
                        # visit that holds it ends only with the stream, so the trouble is answered now.
                        streamed.nudges_read = streamed.nudges
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
            # Fewer nodes followed now than readers (the first of a large job's subscribers, or its nodes ending):
            # its pods from the follower's watch once made, not a list of every pod beside it.
            self._look(self._watched if self._watched is not None else self.cluster)
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
            watched = self._watched
            if watched is not None and reader is watched:
                # Its pods from the watch's first list (a list of its own beside it would read them twice).
                watched.wait_held("Pod", FIRST_LIST_WAIT_SECONDS)
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

    def _visit(self, node: FollowedNode, stream_worker: Optional[int] = None) -> None:
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

    def _switch_pod(self, node: FollowedNode, newest: dict) -> None:
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

    def _catch_up(self, node: FollowedNode, pod: str, stream_worker: Optional[int]) -> None:
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

    def _read(self, node: FollowedNode, pod: str, final: bool = False) -> bool:
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
            node.read_later(deliver(node, lines, whole), self.poll)
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

    def _stream(self, node: FollowedNode, pod: str, worker: int) -> None:
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

    def _open_stream(self, node: FollowedNode, pod: str, floor: Optional[str]) -> Optional[LogStream]:
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

    def _drain(self, node: FollowedNode, stream: LogStream, worker: int, floor: Optional[str], skip: Counter) -> bool:
        """Deliver ``stream``'s lines (see ``deliver_streamed``) until it ends; True if it brought any. Open,
        it is ``worker``'s stream, which other threads close; closed at once if the node's subscribers
        changed while it opened."""
        from urllib3.exceptions import HTTPError as Urllib3Error  # loaded with the kubernetes client already

        self._hold(node, stream, worker)
        new = False
        try:
            for lines in stream:
                with self._lock:
                    new = deliver_streamed(node, lines, floor, skip) or new
        except (Urllib3Error, OSError) as e:  # broken or timed out: resumed by the next round
            if not stream.interrupted:
                log.debug("the log stream of %s broke: %s", node.pod, e)
        finally:
            with self._lock:
                if self._streams.get(worker, (None, None))[1] is stream:
                    del self._streams[worker]
            stream.close()
        return new

    def _hold(self, node: FollowedNode, stream: LogStream, worker: int) -> None:
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


_followers_lock = threading.Lock()
_followers: dict[tuple, list[JobLogFollower]] = {}


def subscribe_node(cluster: ClusterReader, namespace: str, trainjob: str, index: int, sink) -> JobLogFollower:
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
    follower = subscribe_node(cluster, namespace, trainjob, index, sink)
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
