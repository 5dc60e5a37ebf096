"""One node of a followed job (``FollowedNode``): the pod read, how far its log was delivered, who gets its
lines; and the delivery of the lines of a read or a stream's chunk (read with ``timestamps``) without gaps or
duplicates. ``log_follower.JobLogFollower`` reads; this says what of it is new, and hands it on.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Optional

#: A node whose reads bring nothing new is read less often, the wait doubling up to this: a job of
#: quiet nodes (a training step that prints once a minute) costs a few reads a second, not
#: MAX_READS_PER_SECOND; a line after a quiet spell arrives within this.
IDLE_POLL_MAX_SECONDS = 2.0
#: Lines asked for (``tailLines``) by a read of a node already being followed, so that the kubelet
#: seeks from the end instead of reading the log from its start (at least this many, and four times
#: what the node's last read brought); a read that returns that many may have cut some off, and is
#: done again without the limit.
TAIL_LINES = 2000
_TERMINAL_PHASES = ("Succeeded", "Failed")
#: Lines of each node kept in memory while a job is watched (``NodeLogKeeper``).
KEEP_LINES = 2000


class FollowedNode:
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


def deliver(node: FollowedNode, lines: list[str], whole: bool) -> bool:
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


def deliver_streamed(node: FollowedNode, lines: list[str], floor: Optional[str], skip: Counter) -> bool:
    """Hand ``node``'s subscribers the lines of a stream's chunk (``timestamps``; from second
    ``floor`` on, or the whole log) that they have not had; True if there were any. ``skip``
    counts the lines of ``floor`` delivered before the stream opened: the stream sends them first,
    and those copies are dropped (``deliver`` explains the count)."""
    fresh = _undelivered(lines, floor, skip)
    for second, raw, _ in fresh:
        node.count_delivered(second, raw)
    node.put_fresh([text + "\n" for _, _, text in fresh])
    return bool(fresh)
