"""Why a job failed: what the failed node's log says (the failed rank, its exception, torchrun's report,
a command the shell could not find), and ``why_failed``, which tells it together with what the pods say
(``pod_states``) and the restarts before (``restarts``).

The parsers of the log (``read_rank_failure``) are pure; ``why_failed`` reads only from a ``JobView``
(``job_view``), plus the failed node's last lines and every node's log, kept next to the job.

The failed node's log. The pod's container status says only how ``node`` ended (exit code 1, or a
signal). What the user needs is in the log:

* torchrun's failure report ends with ``Root Cause (first observed failure):`` and the failed
  worker's global ``rank``, ``local_rank``, ``exitcode`` (negative for a signal, with its name)
  and ``error_file``. When the worker's entrypoint is decorated with
  ``torch.distributed.elastic.multiprocessing.errors.record``, the worker writes its exception to
  the error file (``TORCHELASTIC_ERROR_FILE``, set by torchrun for every worker) and torchrun
  prints that traceback as the report's ``traceback``; otherwise it says "To enable traceback see".
* The worker's own traceback, whose last line is the exception ("RuntimeError: ..."). With
  ``--tee``/``--redirects`` (NeMo-Run's torchrun launcher passes ``--tee 3``) torchrun and ft_launcher
  prefix each line with ``[<role><local_rank>]:``, or with ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``'s
  prefix: ``[rank<global rank>]:`` in this project's pods (``build/command.py``). After
  ``init_process_group``, torch (2.3 on) writes an uncaught exception's traceback with its own
  ``[rank<global rank>]: `` (a space after the colon) before each line, inside the launcher's prefix:
  ``[rank1]:[rank1]: ValueError: ...`` (test/data/torch-output/ holds such logs, as torch 2.4 to 2.13 wrote
  them).
* The launcher's "first observed failure" is the failure of the earliest whole second, then of the lowest rank:
  when the failed rank's peers fail in the same second (a collective whose peer is gone), it may name one of
  them. ``read_rank_failure`` then names the one that did not merely lose its peer (``_PEER_LOST``).
* A shell that cannot find a command exits with 127 and says ``torchrun: command not found``
  (bash) or ``torchrun: not found`` (sh).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from itertools import takewhile
from typing import TYPE_CHECKING, Mapping, Optional, Sequence

from nemo_kubeflow.observe.job_view import JobView
from nemo_kubeflow.observe.pod_states import NodeFailure, failed_nodes, failed_step
from nemo_kubeflow.observe.restarts import (
    WORKER_EXIT,
    InJobRestarts,
    first_failure,
    keeper_in_job_restarts,
    read_in_job_restarts,
)
from nemo_kubeflow.observe.status import nested, true_condition

if TYPE_CHECKING:
    from nemo_kubeflow.observe.kept_logs import NodeLogKeeper

ROOT_CAUSE_HEADER = "Root Cause (first observed failure):"
#: Exceptions the launcher's agent logs that are never the root cause: torchrun's own, raised after a
#: worker failed; ft_launcher's GPU health check on a machine without NVML (logged, then skipped).
_AGENT_ERRORS = ("ChildFailedError", "NVMLError_LibraryNotFound", "libnvidia-ml.so")
#: A log line of torchrun's or ft_launcher's agent (the launcher ran on this node).
_AGENT_LOG = re.compile(r"torch[/.]distributed[/.]elastic|fault_tolerance[/.]")
#: The launcher's prefix of a line it tees: ``[<role><local rank>]:`` or the template's ``[rank<rank>]:``.
_LAUNCHER_PREFIX = re.compile(r"\[(?:rank(?P<rank>\d+)|(?P<role>[A-Za-z_][\w.-]*?)(?P<local>\d+))\]:")
#: torch's own prefix of the lines of an exception its ``sys.excepthook`` writes (after ``init_process_group``).
_TORCH_PREFIX = re.compile(r"\[rank(?P<rank>\d+)\]: ")
_TRACEBACK = "Traceback (most recent call last):"
_FIELD = re.compile(r"^\s+(?P<key>time|rank|exitcode|traceback)\s*:\s?(?P<value>.*)$")
#: The header of the other failures in torchrun's report, and the line that opens each failure: "[1]:".
_OTHER_FAILURES_HEADER = "Failures:"
_REPORT_ENTRY = re.compile(r"^\[\d+\]:\s*$")
#: What a collective raises in a rank whose peer is gone (gloo's words, NCCL's): such a rank failed because
#: another did, never first.
_PEER_LOST = (
    "Connection closed by peer",
    "Connection reset by peer",
    "remote process exited or there was a network error",
)
_EXCEPTION = re.compile(
    r"^(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit|Warning|Failure)\b"
    r"(?::.*)?$|^[A-Za-z_][\w.]*: .+$"
)
_NOT_FOUND = re.compile(r"(?P<cmd>[\w./-]+): (?:command )?not found\s*$")
#: Exit code of a shell whose command was not found.
COMMAND_NOT_FOUND_EXIT = 127


@dataclass(frozen=True)
class RankFailure:
    """What the failed node's log says about its failure ("" / None for what it does not say)."""

    #: Global rank of the failed worker (torchrun's report).
    rank: Optional[int] = None
    local_rank: Optional[int] = None
    #: torchrun's ``exitcode``: negative for a signal.
    exitcode: Optional[int] = None
    signal_name: str = ""
    #: The exception line, "RuntimeError: step 7 got a bad batch".
    error: str = ""
    #: The worker's traceback (its lines, without torchrun's prefix), to quote.
    traceback: tuple[str, ...] = ()
    #: A command the container could not find ("torchrun").
    missing_command: str = ""

    def worker(self) -> str:
        """ "rank 3", else "local rank 0" ("" when the log names neither)."""
        if self.rank is not None:
            return f"rank {self.rank}"
        return f"local rank {self.local_rank}" if self.local_rank is not None else ""

    def where(self, node: Optional[int]) -> str:
        """ "rank 3 on node 1", "local rank 0", "node 1" (what of it is known; "" if nothing)."""
        worker = self.worker()
        if node is None:
            return worker
        return f"{worker} on node {node}" if worker else f"node {node}"

    def what(self) -> str:
        """What ended the worker, the most telling first: a command the shell could not find, the exception,
        the signal, the exit code of a known rank ("" if nothing)."""
        if self.missing_command:
            return missing_command_hint(self.missing_command)
        if self.error:
            return self.error
        if self.signal_name:
            return f"killed by {self.signal_name} (torchrun exitcode {self.exitcode})"
        if self.exitcode is not None and self.worker():
            return f"exited with code {self.exitcode}"
        return ""

    def lost_its_peer(self) -> bool:
        """Whether the worker failed in a collective whose peer was gone: another rank failed first."""
        return _lost_peer_words(self.error)

    def headline(self, node: Optional[int]) -> str:
        """ "rank 3 on node 1: RuntimeError: ..." (or what of it is known; "" if nothing)."""
        what = self.what()
        return f"{self.where(node)}: {what}" if what else ""


def missing_command_hint(command: str) -> str:
    """What a "<command>: not found" in the pod means, and how to fix it."""
    name = command.rsplit("/", 1)[-1]
    if name in ("torchrun", "python", "python3"):
        what = "torch (torchrun comes with PyTorch)" if name == "torchrun" else "Python"
        return (
            f"{name}: command not found in the container: the image has no {what}; use an image that "
            f"has it (e.g. nvcr.io/nvidia/nemo or a pytorch image). On the local cluster, the pods run "
            f"with the submitting Python's environment: install torch in it (pip install torch)"
        )
    return f"{command}: command not found in the container: the image does not have it, or PATH misses it"


def _strip(line: str) -> tuple[Optional[str], str]:
    """(worker key or None, line without its prefixes): the launcher's (``_LAUNCHER_PREFIX``), then torch's
    (``_TORCH_PREFIX``). The key is ``rank<N>`` when a prefix names the global rank, else ``local<N>``.

    A line with torch's prefix alone (no launcher tee), ``[rank1]: Traceback...``, reads as the launcher's
    prefix and " Traceback...": ``_tracebacks`` drops that space from each line of the traceback."""
    key: Optional[str] = None
    if m := _LAUNCHER_PREFIX.match(line):
        key = f"rank{m['rank']}" if m["rank"] is not None else f"local{m['local']}"
        line = line[m.end() :]
    if m := _TORCH_PREFIX.match(line):
        key = f"rank{m['rank']}"
        line = line[m.end() :]
    return key, line


def _last_match(pattern: re.Pattern[str], lines: Sequence[str]) -> Optional[re.Match[str]]:
    """The match of ``pattern`` in the last line of ``lines`` that has one."""
    for line in reversed(lines):
        if m := pattern.search(line):
            return m
    return None


def _is_rule(line: str) -> bool:
    """A line of ``=`` that closes torchrun's failure report."""
    return line.startswith("===") or line.strip().startswith("=====")


def _report_section(lines: Sequence[str]) -> Optional[list[str]]:
    """The lines of torchrun's last root-cause report, between its header and its closing rule (None: no report)."""
    start = _root_cause_start(lines)
    if start is None:
        return None
    return list(takewhile(lambda line: not _is_rule(line), lines[start + 1 :]))


def _root_cause_start(lines: Sequence[str]) -> Optional[int]:
    """The index of the last root-cause header in ``lines`` (None: none)."""
    return max((i for i, line in enumerate(lines) if ROOT_CAUSE_HEADER in line), default=None)


def _other_failures_sections(lines: Sequence[str]) -> list[list[str]]:
    """The lines of each failure torchrun's last report lists besides its root cause ([] when none or no report):
    its "Failures:" part, "[1]:" and the fields of each."""
    end = _root_cause_start(lines)
    if end is None:
        return []
    start = max((i for i, line in enumerate(lines[:end]) if line.strip() == _OTHER_FAILURES_HEADER), default=None)
    if start is None:
        return []
    sections: list[list[str]] = []
    for line in lines[start + 1 : end - 1]:  # up to the rule above the root cause
        if _REPORT_ENTRY.match(line):
            sections.append([])
        elif sections:
            sections[-1].append(line)
    return sections


def _report_rank(value: str) -> dict:
    """The report's ``rank`` field: "3 (local_rank: 1)"."""
    r = re.match(r"(-?\d+)(?:\s*\(local_rank:\s*(\d+)\))?", value)
    if not r:
        return {}
    return {"rank": int(r[1]), "local_rank": int(r[2]) if r[2] else None}


def _report_exitcode(value: str) -> dict:
    """The report's ``exitcode`` field: "1", or "-9 (pid: 812)" with the signal's name "(SIGKILL)"."""
    r = re.match(r"(-?\d+)", value)
    s = re.search(r"\((SIG[A-Z0-9]+)\)", value)
    return {"exitcode": int(r[1]) if r else None, "signal": s[1] if s else ""}


#: The fields of the report read before its traceback (``_FIELD`` matches these and ``traceback``); its ``time``
#: (whole seconds) is kept as written, to compare.
_REPORT_FIELDS = {"time": lambda value: {"time": value}, "rank": _report_rank, "exitcode": _report_exitcode}


def _report_traceback(first: str, rest: Sequence[str]) -> list[str]:
    """The report's ``traceback`` field: its value (unless torchrun says it has none) and every line below it,
    without the report's indent."""
    head = [] if first.startswith("To enable traceback") else [first]
    lines = head + [line.removeprefix("  ") for line in rest]
    return [line for line in lines if line.strip()]


def _root_cause(lines: Sequence[str]) -> dict:
    """torchrun's root-cause fields: time, rank, local_rank, exitcode, signal, traceback lines."""
    section = _report_section(lines)
    return {} if section is None else _report_fields(section)


def _report_failures(lines: Sequence[str]) -> list[dict]:
    """The fields of each failure of torchrun's last report (``_root_cause``'s), its root cause first ([]: none)."""
    root = _root_cause(lines)
    return [root, *map(_report_fields, _other_failures_sections(lines))] if root else []


def _report_fields(section: Sequence[str]) -> dict:
    """The fields of one failure of torchrun's report (its lines below "[0]:")."""
    found: dict = {}
    traceback: list[str] = []
    for i, line in enumerate(section):
        m = _FIELD.match(line)
        if m is None:
            continue
        if m["key"] == "traceback":  # the report's last field: every line below it is the traceback's
            traceback = _report_traceback(m["value"].strip(), section[i + 1 :])
            break
        found.update(_REPORT_FIELDS[m["key"]](m["value"].strip()))
    return {**found, "traceback": traceback}


#: ft_launcher prints no root-cause report; its agent's last word names the failed global ranks, in the order
#: of its failure report: "Some rank(s) exited with non-zero exit code: {1: ProcessFailure(local_rank=0,
#: pid=30546, exitcode=1, ..., timestamp=1796412125), 0: ProcessFailure(...)}".
_FT_FAILURES = re.compile(r"Some rank\(s\) exited with non-zero exit code: \{")
_FT_FAILURE = re.compile(r"(?P<rank>\d+): ProcessFailure\(local_rank=(?P<local>\d+), pid=\d+, exitcode=(?P<code>-?\d+)")
_FT_TIMESTAMP = re.compile(r"\btimestamp=(?P<time>\d+)")


def _signal_name(exitcode: int) -> str:
    """ "SIGKILL" for torchelastic's exitcode -9 ("" for an exit code or an unknown signal)."""
    import signal

    try:
        return signal.Signals(-exitcode).name if exitcode < 0 else ""
    except ValueError:
        return ""


def _launcher_agent_logged(lines: Sequence[str]) -> bool:
    """Whether the log has a line of torchrun's or ft_launcher's agent (the launcher ran on this node)."""
    return any(_AGENT_LOG.search(line) for line in lines)


def _failure_fields(rank: Optional[int], local_rank: int, exitcode: int, time: Optional[str] = None) -> dict:
    """``_root_cause``'s fields for a failure named outside a root-cause report (no traceback quoted)."""
    return {
        "time": time,
        "rank": rank,
        "local_rank": local_rank,
        "exitcode": exitcode,
        "signal": _signal_name(exitcode),
        "traceback": [],
    }


def _ft_launcher_failures(lines: Sequence[str]) -> list[dict]:
    """The fields of ``_root_cause`` of each failure of ft_launcher's last failure line, in its order, else
    (nvidia-resiliency-ext 0.6.0 can end on "Agent run ended with exception, e=AssertionError()" instead) the
    local rank and exit code of torchelastic's last "failed (exitcode: 3) local_rank: 1" line ([] when there is
    neither)."""
    if m := _last_match(_FT_FAILURES, lines):
        text = m.string[m.end() :]
        entries = list(_FT_FAILURE.finditer(text))
        ends = [entry.start() for entry in entries[1:]] + [len(text)]
        failures = []
        for entry, end in zip(entries, ends):
            time = _FT_TIMESTAMP.search(text, entry.end(), end)
            failures.append(
                _failure_fields(int(entry["rank"]), int(entry["local"]), int(entry["code"]), time and time["time"])
            )
        return failures
    worker_exit = _last_match(WORKER_EXIT, lines)
    if worker_exit and _launcher_agent_logged(lines):
        return [_failure_fields(None, int(worker_exit["local"]), int(worker_exit["code"]))]
    return []


def _tracebacks(lines: Sequence[str]) -> dict[Optional[str], list[list[str]]]:
    """Python tracebacks in the log, by worker prefix (``_strip``; None: unprefixed), each as its lines from
    "Traceback (most recent call last):" to the exception line."""
    found: dict[Optional[str], list[list[str]]] = {}
    #: Each worker's open traceback, and what is left of torch's prefix before its lines ("" or " ").
    open_tb: dict[Optional[str], tuple[list[str], str]] = {}
    for raw in lines:
        key, line = _strip(raw)
        opening = line.removeprefix(" ") if key else line
        if opening.startswith(_TRACEBACK):
            open_tb[key] = ([opening], line[: len(line) - len(opening)])
            continue
        if key not in open_tb:
            continue
        current, left = open_tb[key]
        line = line.removeprefix(left)
        current.append(line)
        if line and not line[0].isspace():
            # The first unindented line after the frames is the exception.
            found.setdefault(key, []).append(current)
            del open_tb[key]
    return found


def _exception_line(tb: Sequence[str]) -> str:
    for line in reversed(tb):
        text = line.strip()
        if text and not text.startswith(("File ", "Traceback", "^", "~")) and _EXCEPTION.match(text):
            return text
    return ""


def _agent_error(tb: Sequence[str]) -> bool:
    """Whether a traceback ends on an exception of the launcher's agent (``_AGENT_ERRORS``), never the cause."""
    exception = _exception_line(tb)
    return any(error in exception for error in _AGENT_ERRORS)


def _worker_keys(root: dict) -> list[str]:
    """The failed worker's keys of its lines' prefixes (``_strip``): its global rank's, then its local rank's."""
    return [
        f"{key}{root[field]}"
        for key, field in (("rank", "rank"), ("local", "local_rank"))
        if root.get(field) is not None
    ]


def _traceback_owners(by_worker: Mapping[Optional[str], object], root: dict) -> list[list[Optional[str]]]:
    """Whose tracebacks tell the failure, in order: the failed worker's (by its prefix); without torchrun (no
    report), the process's own, unprefixed; else those of the only worker that has any."""
    prefixed: list[Optional[str]] = [key for key in by_worker if key is not None]
    return [list(_worker_keys(root)), [] if root else [None], prefixed if len(prefixed) == 1 else []]


def _worker_traceback(lines: Sequence[str], root: dict) -> list[str]:
    """The failed worker's own traceback in the log ([] when none), when the failure report quotes none."""
    by_worker = _tracebacks(lines)
    for keys in _traceback_owners(by_worker, root):
        candidates = [tb for key in keys for tb in by_worker.get(key, []) if not _agent_error(tb)]
        if candidates:
            return candidates[-1]
    return []


def _missing_command(lines: Sequence[str], exit_code: Optional[int]) -> str:
    """The command a shell said it could not find in the last lines ("" when none, or when the container's
    exit code is known and not the shell's for it)."""
    if exit_code not in (COMMAND_NOT_FOUND_EXIT, None):
        return ""
    m = _last_match(_NOT_FOUND, lines[-20:])
    return m["cmd"] if m else ""


def _failure_traceback(lines: Sequence[str], failure: dict) -> list[str]:
    """A failure's traceback: the one the launcher's report quotes, else the worker's own in the log ([]: none)."""
    tb: list[str] = list(failure.get("traceback") or [])
    return tb if _exception_line(tb) else _worker_traceback(lines, failure)


def _lost_peer_words(exception: str) -> bool:
    """Whether an exception line is a collective's error of a peer gone (``_PEER_LOST``)."""
    return any(words in exception for words in _PEER_LOST)


def _lost_its_peer(tb: Sequence[str]) -> bool:
    """Whether a traceback ends on a collective's error of a peer gone."""
    return _lost_peer_words(_exception_line(tb))


def _first_failure(lines: Sequence[str], failures: Sequence[dict]) -> tuple[dict, list[str]]:
    """The failure that came first, with its traceback: the launcher's first (torchrun's root cause), unless it
    only lost its peer and another failure of the same second (the launcher cannot order those: it picks the
    lowest rank) did not. ({}, []) when there is no failure."""
    if not failures:
        return {}, []
    first, *others = failures
    tb = _failure_traceback(lines, first)
    if not _lost_its_peer(tb):
        return first, tb
    for other in others:
        if other.get("time") is not None and other.get("time") == first.get("time"):
            other_tb = _failure_traceback(lines, other)
            if _exception_line(other_tb) and not _lost_its_peer(other_tb):
                return other, other_tb
    return first, tb


def read_rank_failure(lines: Sequence[str], exit_code: Optional[int] = None) -> RankFailure:
    """What a failed node's log (its last lines, oldest first) says about why it failed."""
    if missing := _missing_command(lines, exit_code):
        return RankFailure(missing_command=missing)
    failures = _report_failures(lines) or _ft_launcher_failures(lines)
    root, tb = _first_failure(lines, failures)
    if not failures:
        tb = _worker_traceback(lines, root)
    return RankFailure(
        rank=root.get("rank"),
        local_rank=root.get("local_rank"),
        exitcode=root.get("exitcode"),
        signal_name=root.get("signal", ""),
        error=_exception_line(tb),
        traceback=tuple(tb),
    )


# --- why a job failed: the failed node's log, with what the pods say ---------------------------------

#: Lines of the failed node's output quoted in a failure summary.
SUMMARY_TAIL = 10
#: Lines of the failed node's log read to find why it failed (torchrun's report and the traceback).
DIAGNOSIS_TAIL = 300
#: Failed nodes whose logs are read to find the failed rank (more than one only when a launcher agent
#: failed without naming one: ``why_failed``).
MAX_FAILED_NODES_READ = 3


@dataclass(frozen=True)
class _FailureExplained:
    """The failed node whose log tells why the job failed (``why_failed``), and what its log says."""

    node: Optional[NodeFailure] = None
    #: "rank 3 on node 1: RuntimeError: ..." (``RankFailure.headline``).
    headline: str = ""
    #: The lines to quote: the failed rank's traceback, else the node's last lines.
    quoted: tuple[str, ...] = ()
    #: The node's last lines, as read.
    tail: tuple[str, ...] = ()

    @classmethod
    def of(cls, node: NodeFailure, why: RankFailure, lines: Sequence[str]) -> "_FailureExplained":
        quoted = why.traceback[-SUMMARY_TAIL:] or tuple(lines[-SUMMARY_TAIL:])
        return cls(node, why.headline(node.number()), quoted, tuple(lines))

    def quote(self) -> str:
        """ "last lines of node 1:" and the quoted lines ("" when none)."""
        if not self.quoted or self.node is None:
            return ""
        return f"last lines of node {self.node.index}:\n" + "\n".join(f"    {line}" for line in self.quoted)

    def in_job_restarts(self) -> Optional[InJobRestarts]:
        """ft_launcher's restarts in the node's last lines (None when none were read)."""
        if not self.tail or self.node is None:
            return None
        return first_failure({self.node.number() or 0: read_in_job_restarts(self.tail)})


def _explain_failure(view: JobView, failed: Sequence[NodeFailure]) -> _FailureExplained:
    """The first node to fail, with what its log says; unless its log shows a launcher agent but names no
    failed rank, or names a rank that only lost its peer: the first to fail is not always where the failure
    began (when a rank fails, the launcher agents of the other nodes fail too once their rendezvous closes,
    and their ranks in their collectives, sometimes sooner), so the next failed nodes' logs are read (up to
    ``MAX_FAILED_NODES_READ``) and the first that names a rank that did not merely lose its peer explains it,
    else the first that names a rank."""
    read: list[tuple[NodeFailure, RankFailure, list[str]]] = []
    for failure in failed[:MAX_FAILED_NODES_READ]:
        lines = view.node_log(failure.pod, DIAGNOSIS_TAIL) or []
        why = read_rank_failure(lines, failure.exit_code)
        read.append((failure, why, lines))
        if (why.rank is not None and not why.lost_its_peer()) or not _launcher_agent_logged(lines):
            break
    if not read:
        return _FailureExplained()
    named = [node for node in read if node[1].rank is not None]
    cause = next((node for node in named if not node[1].lost_its_peer()), named[0] if named else read[0])
    return _FailureExplained.of(*cause)


def _most_in_job_restarts(kept: Optional[InJobRestarts], read: Optional[InJobRestarts]) -> Optional[InJobRestarts]:
    """The restarts in the lines a keeper holds, unless the failed node's lines just read count more."""
    if read is not None and (kept is None or read.count > kept.count):
        return read
    return kept


def _restarts_note(view: JobView, in_job: Optional[InJobRestarts], seen: Optional[dict[int, str]]) -> str:
    """How often the failed job restarted, and why ("" when neither its pods' attempt labels nor the node logs
    read can tell)."""
    if not (view.attempts_seen() or in_job):
        return ""
    restarts = view.restarts(seen=seen, in_job=in_job, condition_reason=failed_reason(view.trainjob))
    return restarts.note(finished=True)


def _lost_logs_note(view: JobView, job_dir: str, keeper: Optional["NodeLogKeeper"]) -> str:
    """Which nodes' logs are lost, and why ("" when none is)."""
    gone = nodes_without_log(view, job_dir, keeper)
    if not gone:
        return ""
    # The Job controller deletes a failed Job's running pods, and their logs with them.
    return (
        "no log for node(s) " + ", ".join(map(str, gone)) + ": their pods were deleted when the "
        "job failed (follow the logs while it runs to keep them)"
    )


def why_failed(
    view: JobView,
    condition: str,
    job_dir: str = "",
    keeper: Optional["NodeLogKeeper"] = None,
    *,
    seen: Optional[dict[int, str]] = None,
) -> str:
    """Why a job failed: the failed rank and its exception (``read_rank_failure``), Trainer's
    condition, the first node that failed with its exit code or signal (or the initializer or
    preflight check that failed), the restarts before, and that node's last lines (its traceback
    when there is one). Reads only: saving each node's log to ``<job_dir>/logs/node-<i>.log`` (pods and
    their logs vanish when the job is deleted) is a repair step's (``logs_to_keep``)."""
    failed = failed_nodes(list(view.newest_nodes().values()))
    # An initializer or a preflight check that failed explains the failure better than a node.
    step = failed_step(view.pods)
    explained = _explain_failure(view, [] if step else failed)
    in_job = _most_in_job_restarts(keeper_in_job_restarts(keeper), explained.in_job_restarts())
    parts = (
        explained.headline,
        condition,
        step or (failed[0].detail() if failed else ""),
        _restarts_note(view, in_job, seen),
        explained.quote(),
        _lost_logs_note(view, job_dir, keeper),
    )
    return "; ".join(part for part in parts if part)


def _kept_nodes(keeper: Optional["NodeLogKeeper"]) -> set[int]:
    """The nodes whose last lines a ``NodeLogKeeper`` holds."""
    return keeper.kept_nodes() if keeper is not None else set()


def nodes_without_log(view: JobView, job_dir: str, keeper: Optional["NodeLogKeeper"] = None) -> list[int]:
    """The nodes of a finished job whose log nobody can give any more: no pod to read, no file kept next to
    the job, no last lines kept by this process."""
    from nemo_kubeflow.observe.kept_logs import node_log_path

    on_disk = {i for i in range(view.nodes) if os.path.exists(node_log_path(job_dir, i))} if job_dir else set()
    return sorted(set(range(view.nodes)) - set(view.newest_nodes()) - _kept_nodes(keeper) - on_disk)


def logs_to_keep(view: JobView, job_dir: str, keeper: Optional["NodeLogKeeper"] = None) -> list[int]:
    """The nodes of a finished job whose log can still be read (a pod, or lines kept in this process) and has
    no file next to the job yet: what a repair step saves (``repair.steps``)."""
    from nemo_kubeflow.observe.kept_logs import node_log_path

    if not job_dir:
        return []
    readable = set(view.newest_nodes()) | _kept_nodes(keeper)
    return sorted(i for i in readable if not os.path.exists(node_log_path(job_dir, i)))


def failed_reason(trainjob: dict) -> str:
    """The reason of the TrainJob's ``Failed`` condition ("" when it has none)."""
    return nested(true_condition(trainjob, "Failed"), "reason", default="")
