"""A running job's progress, as its rank 0 reports it (``nemo_kubeflow.progress``): step N of M, rate, ETA
and the latest metrics, and the stall warning that progress allows. Reads only.

Where it comes from, cheapest first:

* ``status.trainerStatus`` (Trainer's TrainJobStatus feature gate on): in the TrainJob that ``describe``
  has already read, so no request at all.
* Else rank 0's marked log line (``progress.LINE_MARKER``): from the node lines this process already has
  (a waiting process follows node 0's log; an ft_launcher job's look reads every node's for its restarts),
  else node 0's newest pod's log: its last ``TAIL_LINES`` lines, never more than ``LOG_READ_BYTES`` a read
  (the pod log API's ``limitBytes``), at most once per ``RECHECK_S`` (and, where the look read only the pods
  not running, a metadata-only list of node 0's pods for its name).
* Rank 0 need not run in node 0: ft_launcher ranks its agents by host name, then pid (NVRx 0.4), so global
  rank 0 can run in any node's pod. The node where its line was found is read first at the next look
  (``ProgressSeen.node``); the other nodes are searched (at most ``SEARCH_NODES`` reads a look, and after a
  search that found nothing not again for ``SEARCH_AGAIN_S``) only where
  node 0's agent says it joined the rendezvous as a rank other than 0: a job whose rank 0 runs in node 0
  costs no read more.

A job that reports nothing reads as no progress, and the stall warning then falls back to log silence. A
step that is no longer known to be current (no progress line among the newest lines that could be read)
is shown as such (``Progress.stale``), never as the current step.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Iterable, Optional

from nemo_kubeflow import progress as reporting
from nemo_kubeflow.constants import COMPLETION_INDEX_LABEL, JOBSET_NAME_LABEL, REPLICATED_JOB_LABEL, TRAINER_NODE
from nemo_kubeflow.errors import ClusterError, ClusterUnreachableError
from nemo_kubeflow.observe.status import newest_pods_by_node

if TYPE_CHECKING:
    from nemo_kubeflow.cluster.client import ClusterReader
    from nemo_kubeflow.observe.job_view import JobView
    from nemo_kubeflow.observe.kept_logs import NodeLogKeeper

#: How many of node 0's last lines the fallback reads: a progress line followed by more lines is not seen (the
#: reporter writes one per interval, 30 s by default; the status server has no such limit).
TAIL_LINES = 500
#: The most bytes one read of node 0's log takes (``limitBytes``): a chatty job's 500 lines can be megabytes,
#: and a running job's look is to read little (issue #26: 64 KiB a describe). At most two reads a look.
LOG_READ_BYTES = 16 * 1024
#: A process that keeps looking (an attached wait) reads the log line again at most this often.
RECHECK_S = 10.0
#: The most characters of a metric's name or value that status shows (control characters escaped first).
MAX_SHOWN_CHARS = 80
#: The most nodes one look reads in search of rank 0's line (ft_launcher can rank any node's agent first).
SEARCH_NODES = 8
#: After a search of several nodes found no line, a process that keeps looking reads logs again only this late.
SEARCH_AGAIN_S = 60.0
#: An elastic agent's line as it joins a rendezvous round (torch's c10d handler, and ft_launcher's copy of it):
#: the agent of rank 0 runs global rank 0. ``The node 'host_123_0' has joined round 0 of the rendezvous
#: 'nemo-0' as rank 1 in a world of size 2.``
RENDEZVOUS_RANK = re.compile(r"has joined round \d+ of the rendezvous '[^']*' as rank (\d+) in a world of size")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Progress:
    step: Optional[int]
    total_steps: Optional[int]
    percent: Optional[int]
    steps_per_second: Optional[float]
    eta_seconds: Optional[int]
    #: The user's metrics, as reported (name -> text).
    metrics: dict[str, str]
    #: When rank 0 reached the step (its clock).
    updated: Optional[datetime]
    #: "trainerStatus" or "log".
    source: str
    #: Why this is not known to be the current step ("" when it is): rank 0's newest progress line was not
    #: among the log lines that could be read, so this is the newest one seen, and may be old.
    stale: str = ""

    def age(self, now: datetime) -> Optional[float]:
        return (now - self.updated).total_seconds() if self.updated else None

    def text(self) -> str:
        """``step 250 of 1000 (25%), 2.5 steps/s, ETA 5m 0s; loss=1.23, lr=0.0003 (at 09:00:12 UTC)``: the same
        until rank 0 reports again (a wait and ``watch`` print each change). Not current: ``progress unknown
        (why); rank 0 last reported step 250 of 1000 (25%), ...``."""
        text = ", ".join([self._where(), *self._pace()])
        if self.metrics:
            text += "; " + ", ".join(f"{shown(k)}={shown(v)}" for k, v in self.metrics.items())
        text += f" (at {self.updated.strftime('%H:%M:%S')} UTC)" if self.updated else ""
        return f"progress unknown ({self.stale}); rank 0 last reported {text}" if self.stale else text

    def _where(self) -> str:
        """``step 250 of 1000 (25%)``; without a step, the percentage (another reporter's ``trainerStatus``)."""
        percent = f" ({self.percent}%)" if self.percent is not None else ""
        if self.step is None:
            return f"{self.percent}% done" if self.percent is not None else "progress reported"
        return f"step {self.step}" + (f" of {self.total_steps}" if self.total_steps else "") + percent

    def _pace(self) -> list[str]:
        """The rate and the ETA, those known."""
        pace = [f"{self.steps_per_second:.3g} steps/s"] if self.steps_per_second is not None else []
        return pace + ([f"ETA {format_duration(self.eta_seconds)}"] if self.eta_seconds is not None else [])


def shown(text: str) -> str:
    """A metric's name or value as status prints it, on one line of a terminal: what is not printable (a
    newline, a carriage return, an ANSI escape) escaped as Python writes it (``\\n``, ``\\r``, ``\\x1b``), at
    most ``MAX_SHOWN_CHARS`` characters (cut with "...", ASCII as every terminal can print). Any reporter can write the metrics (Trainer's status
    server takes any text), and a value may be anything the training loop had at hand."""
    safe = "".join(char if char.isprintable() else char.encode("unicode_escape").decode("ascii") for char in text)
    return safe if len(safe) <= MAX_SHOWN_CHARS else safe[: MAX_SHOWN_CHARS - 3] + "..."


def format_duration(seconds: int) -> str:
    """``42 s``, ``5m 3s``, ``2h 5m``, ``3d 4h``."""
    if seconds < 60:
        return f"{seconds} s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {secs}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {minutes}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h"


def _time(text: Optional[str]) -> Optional[datetime]:
    if not text:
        return None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)).astimezone(timezone.utc)


def _int(text: object) -> Optional[int]:
    try:
        return int(str(text))
    except (TypeError, ValueError):
        return None


def _float(text: object) -> Optional[float]:
    try:
        return float(str(text))
    except (TypeError, ValueError):
        return None


def from_trainjob(trainjob: dict) -> Optional[Progress]:
    """``status.trainerStatus`` (written through Trainer's status server), or None."""
    status = (trainjob.get("status") or {}).get("trainerStatus")
    if not status:
        return None
    metrics = _named_metrics(status.get("metrics"))
    eta = status.get("estimatedRemainingSeconds")
    step, total, rate = _step_total_rate(metrics, eta)
    return Progress(
        step,
        total,
        status.get("progressPercentage"),
        rate,
        eta,
        metrics,
        _time(status.get("lastUpdatedTime")),
        "trainerStatus",
    )


#: The step's metric name of each reporter that writes ``trainerStatus``, ours first: transformers' own
#: ``KubeflowCallback`` (``transformers.integrations``, added by ``Trainer`` wherever the status server is offered)
#: sends ``current_step`` and ``total_steps``, an ETA, and no rate (test/data/transformers-status/ has what it sends).
STEP_METRICS = (reporting.STEP_METRIC, "current_step")


def _step_total_rate(
    metrics: dict[str, str], eta: Optional[int]
) -> tuple[Optional[int], Optional[int], Optional[float]]:
    """The step, the total and the rate that ``trainerStatus``'s metrics carry (taken out of ``metrics``: they are
    shown as ``step N of M``, not as metrics), whichever reporter wrote them. Without a rate (transformers'), the
    rate that its ETA implies: the steps left over the seconds left."""
    steps = [_int(metrics.pop(name)) for name in STEP_METRICS if name in metrics]
    step = next((s for s in steps if s is not None), None)
    total, rate = _int(metrics.pop(reporting.TOTAL_METRIC, None)), _float(metrics.pop(reporting.RATE_METRIC, None))
    if rate is None and step is not None and total is not None and isinstance(eta, int) and eta > 0 and total > step:
        rate = (total - step) / eta
    return step, total, rate


def _named_metrics(items: Optional[list]) -> dict[str, str]:
    """``trainerStatus.metrics`` (a list of name and value) as name -> value."""
    return {str(m.get("name")): str(m.get("value")) for m in items or [] if m.get("name")}


def from_log_lines(lines: Iterable[str]) -> Optional[Progress]:
    """The last marked progress line among ``lines`` (a prefix before the marker, torchrun's, is allowed)."""
    found = None
    for line in lines:
        found = _marked_fields(line) or found
    return _from_line_fields(found) if found is not None else None


def _marked_fields(line: str) -> Optional[dict[str, Any]]:
    """The JSON object of a marked progress line; None for any other line (or a broken one)."""
    at = line.find(reporting.LINE_MARKER)
    if at < 0:
        return None
    try:
        fields = json.loads(line[at + len(reporting.LINE_MARKER) :])
    except ValueError:
        return None
    return fields if isinstance(fields, dict) else None


def _from_line_fields(fields: dict[str, Any]) -> Progress:
    step, total = _int(fields.get("step")), _int(fields.get("total_steps"))
    metrics = fields.get("metrics")
    metrics = metrics if isinstance(metrics, dict) else {}
    return Progress(
        step,
        total,
        reporting.percent_done(step, total),
        _float(fields.get("steps_per_second")),
        _int(fields.get("eta_seconds")),
        {str(k): str(v) for k, v in metrics.items()},
        _time(fields.get("time")),
        "log",
    )


@dataclass(frozen=True)
class LogLook:
    """What node 0's log said of progress: the ``current`` line (the last among lines that reach the log's end),
    else ``older``, a line among those that do not (an older step), and ``why`` no current one was found."""

    current: Optional[Progress] = None
    older: Optional[Progress] = None
    why: str = ""


@dataclass
class ProgressSeen:
    """What a process that keeps looking remembers: when it last read the log line, where, and what it found."""

    read_at: float = float("-inf")
    #: The node whose log had rank 0's line last: read first (ft_launcher ranks its agents by host name and
    #: pid, so global rank 0 can run in any node's pod).
    node: int = 0
    #: Kept across looks: a new pod's log (after a gang restart) has no line until rank 0 reports again.
    last: Optional[Progress] = None
    #: What the last look showed (shown again until the next read).
    shown: Optional[Progress] = None

    def note(self, look: LogLook) -> Optional[Progress]:
        """What to show after ``look``: its current line; else the newest step seen (now or before), marked
        not current (``Progress.stale``); else nothing."""
        if look.current is not None:
            self.last = self.shown = look.current
            return self.shown
        newest = _newest(look.older, self.last)
        self.shown = replace(newest, stale=look.why) if newest is not None else None
        return self.shown


def _newest(*found: Optional[Progress]) -> Optional[Progress]:
    """The one reported last (rank 0's clock); the first of those without a time."""
    known = [p for p in found if p is not None]
    return max(known, key=lambda p: p.updated or datetime.min.replace(tzinfo=timezone.utc), default=None)


def read(
    cluster: "ClusterReader",
    view: "JobView",
    seen: Optional[ProgressSeen] = None,
    keeper: Optional["NodeLogKeeper"] = None,
    read_logs: bool = True,
) -> Optional[Progress]:
    """The job's progress: its TrainJob's ``trainerStatus``; else rank 0's log line, in whichever node's log
    it is: from the lines this process already has (the ``keeper`` of a waiting process, or every node's lines
    this look read for ft_launcher's restarts), else (with ``read_logs``) from bounded log reads (throttled with
    ``seen``): node 0's, or the node where it was found last, and the others only where node 0's agent says it is
    not rank 0."""
    reported = from_trainjob(view.trainjob)
    if reported is not None:
        return reported
    seen = seen if seen is not None else ProgressSeen()
    at_hand = _lines_at_hand(view, keeper)
    found = _newest_in_nodes(at_hand, seen)
    if found is None and not read_logs:
        return None
    if found is not None or (0 in at_hand and not _to_read(at_hand, seen, view.nodes)):
        return seen.note(LogLook(found, why="no progress line in the node log lines at hand"))
    if time.monotonic() - seen.read_at < RECHECK_S:
        return seen.shown
    look, reads = _search(cluster, view, seen, at_hand)
    # A search of several nodes that found no line (a job that reports nothing yet) is not made again soon.
    fruitless = reads > 1 and look.current is None and look.older is None
    seen.read_at = time.monotonic() + (SEARCH_AGAIN_S - RECHECK_S if fruitless else 0.0)
    return seen.note(look)


def _to_read(at_hand: dict[int, list[str]], seen: ProgressSeen, nodes: int) -> list[int]:
    """The nodes whose log may hold rank 0's line and is not at hand, in the order to read them: the node
    where it was seen last; then, where node 0's agent says it is not rank 0 of the rendezvous (ft_launcher's
    ranking), each other node, at most ``SEARCH_NODES``. Empty for a job whose rank 0 runs in node 0."""
    order = [seen.node] + ([n for n in range(1, nodes) if n != seen.node] if _rank_zero_elsewhere(at_hand) else [])
    return [n for n in order if n not in at_hand][:SEARCH_NODES]


def _rank_zero_elsewhere(at_hand: dict[int, list[str]]) -> bool:
    """Whether node 0's lines say its agent joined the newest rendezvous round as a rank other than 0."""
    ranks = [int(m.group(1)) for line in at_hand.get(0) or [] if (m := RENDEZVOUS_RANK.search(line))]
    return bool(ranks) and ranks[-1] != 0


def _search(
    cluster: "ClusterReader", view: "JobView", seen: ProgressSeen, at_hand: dict[int, list[str]]
) -> tuple[LogLook, int]:
    """Read the nodes that may hold rank 0's line (``_to_read``; node 0 when its lines are not at hand), one
    bounded read each and at most ``SEARCH_NODES``, until one has it: that node is noted in ``seen``. Node 0's
    lines read here can send the search on (its agent is not rank 0); the remembered node without the line
    (rank 0 moved at an in-job restart) sends it back to node 0. What the first read said when none has it, and
    how many nodes were read."""
    order = _to_read(at_hand, seen, view.nodes) or ([0] if 0 not in at_hand else [])
    looks: dict[int, LogLook] = {}
    while order and len(looks) < SEARCH_NODES:
        node = order.pop(0)
        look, lines = _read_node_log(cluster, view, node)
        looks[node] = look
        if look.current is not None or look.older is not None:
            seen.node = node
            return look, len(looks)
        more = _after_a_miss(node, lines, at_hand, seen, view.nodes)
        order += [n for n in more if n not in order and n not in looks]
    return next(iter(looks.values()), LogLook(why="no progress line in the node log lines at hand")), len(looks)


def _after_a_miss(
    node: int, lines: list[str], at_hand: dict[int, list[str]], seen: ProgressSeen, nodes: int
) -> list[int]:
    """The nodes to read after ``node``'s log had no progress line: the others where node 0's lines, just read,
    say its agent is not rank 0; node 0 where the remembered node had none (rank 0 moved at an in-job restart),
    as a new process would read it."""
    if node == 0:
        return _to_read({**at_hand, 0: lines}, ProgressSeen(), nodes) if lines else []
    if node == seen.node:
        seen.node = 0
        return [0] if 0 not in at_hand else []
    return []


def _lines_at_hand(view: "JobView", keeper: Optional["NodeLogKeeper"]) -> dict[int, list[str]]:
    """The node lines this process already has: those a waiting process keeps, else those the look read
    (every node's, for ft_launcher's restarts)."""
    if keeper is None:
        return view.node_lines
    # The keeper follows node 0 (its lines are at hand, even none); the others are read only in trouble.
    return {node: lines for node, lines in keeper.kept_lines().items() if lines or node == 0}


def _newest_in_nodes(lines_by_node: dict[int, list[str]], seen: ProgressSeen) -> Optional[Progress]:
    """The newest progress line among the nodes' lines (rank 0's clock), wherever rank 0 runs; its node is
    noted in ``seen`` (read first when no lines are at hand)."""
    found = {node: p for node, lines in lines_by_node.items() if (p := from_log_lines(lines)) is not None}
    newest = _newest(*found.values())
    if newest is not None:
        seen.node = next(node for node, p in found.items() if p is newest)
    return newest


def _read_node_log(cluster: "ClusterReader", view: "JobView", node: int) -> tuple[LogLook, list[str]]:
    """Progress in ``node``'s newest lines, at most two reads of ``LOG_READ_BYTES``, and the lines read; a log
    that cannot be read now is no progress to show (not a state); an API server that cannot be reached is
    raised (describe says)."""
    try:
        pod = _node_pod(cluster, view, node)
        if pod is None:
            return LogLook(why=f"node {node} has no pod"), []
        return _look_in_log(cluster, pod["metadata"]["name"], view.namespace, node)
    except ClusterUnreachableError:
        raise
    except ClusterError as error:
        log.debug("cannot read node %d's log of %s: %s", node, view.name, error)
        return LogLook(why=f"node {node}'s log cannot be read now"), []


@dataclass(frozen=True)
class _Tail:
    """Lines of one bounded log read; ``complete`` when they reach the log's end (the read was not cut)."""

    lines: list[str]
    complete: bool


def _read_tail(cluster: "ClusterReader", pod: str, namespace: str, tail_lines: int) -> _Tail:
    """The last ``tail_lines`` lines, cut at ``LOG_READ_BYTES`` as the kubelet cuts them: from the start of the
    tail, so a cut read lacks the newest lines (and its last line is partial: dropped)."""
    lines = list(
        cluster.pod_log(pod, namespace, container=TRAINER_NODE, tail_lines=tail_lines, limit_bytes=LOG_READ_BYTES)
    )
    if sum(len(line.encode()) + 1 for line in lines) < LOG_READ_BYTES:
        return _Tail(lines, True)
    return _Tail(lines[:-1], False)


def _look_in_log(cluster: "ClusterReader", pod: str, namespace: str, node: int) -> tuple[LogLook, list[str]]:
    """The node's last ``TAIL_LINES`` lines; where they are more than ``LOG_READ_BYTES``, a second read of as
    many of the newest lines as are likely to fit (three quarters of what the first read got)."""
    first = _read_tail(cluster, pod, namespace, TAIL_LINES)
    newest = first if first.complete else _read_tail(cluster, pod, namespace, max(1, len(first.lines) * 3 // 4))
    if newest.complete:
        found = from_log_lines(newest.lines)
        why = "" if found else f"no progress line in node {node}'s last {len(newest.lines)} lines"
        return LogLook(found, why=why), newest.lines
    return LogLook(
        older=_newest(from_log_lines(first.lines), from_log_lines(newest.lines)),
        why=f"node {node}'s newest lines are more than the {LOG_READ_BYTES // 1024} KiB a log read takes",
    ), first.lines


def _node_pod(cluster: "ClusterReader", view: "JobView", node: int) -> Optional[dict]:
    """The node's newest pod: among the pods the look read, or, where a running job's look read only the pods
    that are not running (``JobView.read_running``), from the metadata of that node's pods (one small list)."""
    if view.jobset is None:
        return newest_pods_by_node(view.node_pods).get(node)
    selector = f"{JOBSET_NAME_LABEL}={view.name},{REPLICATED_JOB_LABEL}={TRAINER_NODE},{COMPLETION_INDEX_LABEL}={node}"
    return newest_pods_by_node(cluster.list_metadata("Pod", view.namespace, selector)).get(node)


def stall_message(found: Progress, seconds: int, now: datetime) -> str:
    """The stall warning from progress: no new step for ``seconds`` ("" when there was one). For a step known
    to be current: of a ``stale`` one, the caller judges by log silence."""
    age = found.age(now)
    if age is None or age < seconds:
        return ""
    step = f"step {found.step}" if found.step is not None else "its last progress report"
    return (
        f"warning: no new step for {format_duration(int(age))} (stall_warning_seconds={seconds}): rank 0 "
        f"reported {step} last (a hung collective? a stuck data loader?); see the node logs"
    )
