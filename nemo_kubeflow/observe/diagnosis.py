"""Why a job waits, why it failed, how often it restarted: the one place that reads a TrainJob's
pods and events for ``describe``, and that tells what they (and the failed node's log) say.

``JobView`` reads the TrainJob's pods once, and its Warning events at most once, per describe;
``why_waiting``, ``why_failed`` and ``JobView.restarts`` read only from it (plus, for a failed job,
the failed node's last lines and every node's log, kept next to the job). The parsers below
(container states, torchrun's report, ft_launcher's restarts) are pure.

What a describe reads in each state is the last column of ``status.py``'s table.

The failed node's log. The pod's container status says only how ``node`` ended (exit code 1, or a
signal). What the user needs is in the log:

* torchrun's failure report ends with ``Root Cause (first observed failure):`` and the failed
  worker's global ``rank``, ``local_rank``, ``exitcode`` (negative for a signal, with its name)
  and ``error_file``. When the worker's entrypoint is decorated with
  ``torch.distributed.elastic.multiprocessing.errors.record``, the worker writes its exception to
  the error file (``TORCHELASTIC_ERROR_FILE``, set by torchrun for every worker) and torchrun
  prints that traceback as the report's ``traceback``; otherwise it says "To enable traceback see".
* The worker's own traceback, whose last line is the exception ("RuntimeError: ..."). With
  ``--tee``/``--redirects`` (NeMo-Run's torchrun launcher passes ``--tee 3``) torchrun prefixes
  each line with ``[<role><local_rank>]:``; newer torch versions may use ``[rank<N>]:``.
* A shell that cannot find a command exits with 127 and says ``torchrun: command not found``
  (bash) or ``torchrun: not found`` (sh).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from itertools import takewhile
from typing import TYPE_CHECKING, Iterable, Mapping, Optional, Sequence

from torchx.specs import AppState

from nemo_kubeflow.constants import (
    COMPLETION_INDEX_LABEL,
    JOBSET_KIND,
    JOBSET_NAME_LABEL,
    JOBSET_RESTARTING_CONDITION,
    JOBSET_UID_LABEL,
    REPLICATED_JOB_LABEL,
    RESTART_ATTEMPT_ENV,
    RESTART_ATTEMPT_LABEL,
    TRAINER_NODE,
)
from nemo_kubeflow.errors import ClusterError
from nemo_kubeflow.observe.status import condition_text, nested, newest_pods_by_node, true_condition
from nemo_kubeflow.parts.naming import pod_completion_index
from nemo_kubeflow.parts.steps import INITIALIZER_STEPS, PREFLIGHT_CONTAINER
from nemo_kubeflow.pod.warm_start import NOT_APPLIED

if TYPE_CHECKING:
    from nemo_kubeflow.cluster.client import ClusterReader
    from nemo_kubeflow.observe.logs import NodeLogKeeper

ROOT_CAUSE_HEADER = "Root Cause (first observed failure):"
#: Exceptions the launcher's agent logs that are never the root cause: torchrun's own, raised after a
#: worker failed; ft_launcher's GPU health check on a machine without NVML (logged, then skipped).
_AGENT_ERRORS = ("ChildFailedError", "NVMLError_LibraryNotFound", "libnvidia-ml.so")
#: A log line of torchrun's or ft_launcher's agent (the launcher ran on this node).
_AGENT_LOG = re.compile(r"torch[/.]distributed[/.]elastic|fault_tolerance[/.]")
_PREFIX = re.compile(r"^\[(?:rank(?P<rank>\d+)|(?P<role>[A-Za-z_][\w.-]*?)(?P<local>\d+))\]:")
_FIELD = re.compile(r"^\s+(?P<key>rank|exitcode|traceback)\s*:\s?(?P<value>.*)$")
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
    """(worker key of torchrun's prefix or None, line without it)."""
    m = _PREFIX.match(line)
    if not m:
        return None, line
    key = f"rank{m['rank']}" if m["rank"] is not None else f"local{m['local']}"
    return key, line[m.end() :]


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
    start = max((i for i, line in enumerate(lines) if ROOT_CAUSE_HEADER in line), default=None)
    if start is None:
        return None
    return list(takewhile(lambda line: not _is_rule(line), lines[start + 1 :]))


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


#: The fields of the report read before its traceback (``_FIELD`` matches these and ``traceback``).
_REPORT_FIELDS = {"rank": _report_rank, "exitcode": _report_exitcode}


def _report_traceback(first: str, rest: Sequence[str]) -> list[str]:
    """The report's ``traceback`` field: its value (unless torchrun says it has none) and every line below it,
    without the report's indent."""
    head = [] if first.startswith("To enable traceback") else [first]
    lines = head + [line.removeprefix("  ") for line in rest]
    return [line for line in lines if line.strip()]


def _root_cause(lines: Sequence[str]) -> dict:
    """torchrun's root-cause fields: rank, local_rank, exitcode, signal, traceback lines."""
    section = _report_section(lines)
    if section is None:
        return {}
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


#: ft_launcher prints no root-cause report; its agent's last word names the failed global rank:
#: "Some rank(s) exited with non-zero exit code: {1: ProcessFailure(local_rank=0, pid=30546, exitcode=1, ...".
_FT_FAILURE = re.compile(
    r"Some rank\(s\) exited with non-zero exit code: \{(?P<rank>\d+): "
    r"ProcessFailure\(local_rank=(?P<local>\d+), pid=\d+, exitcode=(?P<code>-?\d+)"
)


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


def _failure_fields(rank: Optional[int], local_rank: int, exitcode: int) -> dict:
    """``_root_cause``'s fields for a failure named outside a root-cause report (no traceback quoted)."""
    return {
        "rank": rank,
        "local_rank": local_rank,
        "exitcode": exitcode,
        "signal": _signal_name(exitcode),
        "traceback": [],
    }


def _ft_launcher_failure(lines: Sequence[str]) -> dict:
    """The fields of ``_root_cause`` from ft_launcher's last failure line, else (nvidia-resiliency-ext 0.6.0
    can end on "Agent run ended with exception, e=AssertionError()" instead) the local rank and exit code of
    torchelastic's last "failed (exitcode: 3) local_rank: 1" line ({} when there is neither)."""
    if m := _last_match(_FT_FAILURE, lines):
        return _failure_fields(int(m["rank"]), int(m["local"]), int(m["code"]))
    worker_exit = _last_match(_WORKER_EXIT, lines)
    if worker_exit and _launcher_agent_logged(lines):
        return _failure_fields(None, int(worker_exit["local"]), int(worker_exit["code"]))
    return {}


def _tracebacks(lines: Sequence[str]) -> dict[Optional[str], list[list[str]]]:
    """Python tracebacks in the log, by torchrun worker prefix (None: unprefixed), each as its
    lines from "Traceback (most recent call last):" to the exception line."""
    found: dict[Optional[str], list[list[str]]] = {}
    open_tb: dict[Optional[str], list[str]] = {}
    for raw in lines:
        key, line = _strip(raw)
        if line.startswith("Traceback (most recent call last):"):
            open_tb[key] = [line]
            continue
        current = open_tb.get(key)
        if current is None:
            continue
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
    """The failed worker's keys of torchrun's prefix (``_strip``): its global rank's, then its local rank's."""
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


def read_rank_failure(lines: Sequence[str], exit_code: Optional[int] = None) -> RankFailure:
    """What a failed node's log (its last lines, oldest first) says about why it failed."""
    if missing := _missing_command(lines, exit_code):
        return RankFailure(missing_command=missing)
    root = _root_cause(lines) or _ft_launcher_failure(lines)
    tb: list[str] = list(root.get("traceback") or [])
    if not _exception_line(tb):
        tb = _worker_traceback(lines, root)
    return RankFailure(
        rank=root.get("rank"),
        local_rank=root.get("local_rank"),
        exitcode=root.get("exitcode"),
        signal_name=root.get("signal", ""),
        error=_exception_line(tb),
        traceback=tuple(tb),
    )


# --- ft_launcher's in-job restarts, from a node's log ------------------------------------------------

#: What the agent of ft_launcher (and torchrun) logs each time it restarts its worker group: after a
#: failure ("Worker group FAILED. 2/2 attempts left; will restart worker group"), when a peer's agent
#: restarted ("Detected 1 new nodes from group_rank=0; will restart worker group"), or ft_launcher's
#: "1/2 restart attempts left; restarting worker group..."; from nvidia-resiliency-ext 0.6 a healthy node
#: joining a peer's restart logs "[default] Joining cluster restart (group_rank=1)" instead.
_WORKER_GROUP_RESTART = re.compile(
    r"will restart worker group|restart attempts left; restarting worker group"
    r"|Joining cluster restart \(group_rank="
)
#: torchelastic's line for a worker that died: "failed (exitcode: -9) local_rank: 1 (pid: 812) of binary: ...".
_WORKER_EXIT = re.compile(r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<local>\d+)")
#: What the c10d rendezvous of ft_launcher (its own copy of torch's dynamic rendezvous) logs as each agent
#: joins a round: "The node 'x' has joined round 1 of the rendezvous 'train-x-0' as rank 0 in a world of
#: size 2." The first round is 0 and every restart of the worker group needs a new one, so the round is
#: the number of restarts so far, even when the lines of the restarts are no longer at hand (the
#: rendezvous id changes with each gang attempt: see ``command.ft_rendezvous_flags``).
_RENDEZVOUS_ROUND = re.compile(r"has joined round (?P<round>\d+) of the rendezvous")


#: The time at the start of an agent's log line: torch's "E1127 06:23:08.497000 ..." or ft_launcher's
#: "[2026-11-27 06:25:40,359] ...", as a sortable "MMDD HH:MM:SS.ffffff" (the nodes' clocks are the cluster's).
_LINE_TIME = re.compile(
    r"^[EWIFD](?P<md>\d{4}) (?P<t>\d\d:\d\d:\d\d\.\d+)|"
    r"^\[\d{4}-(?P<m>\d\d)-(?P<d>\d\d) (?P<t2>\d\d:\d\d:\d\d),(?P<ms>\d+)\]"
)


def _line_time(line: str) -> str:
    m = _LINE_TIME.match(line)
    if m is None:
        return ""
    if m["md"]:
        return f"{m['md']} {m['t']}"
    return f"{m['m']}{m['d']} {m['t2']}.{m['ms']}"


@dataclass(frozen=True)
class InJobRestarts:
    """The worker-group restarts one node's agent logged (0 when none, or when the log says nothing)."""

    count: int = 0
    #: Why the last one happened, when this node's own worker failed ("local rank 1 killed by signal 9").
    why: str = ""
    #: A warm-start setting the pod did not apply, and why (warm_start.py's ``NOT_APPLIED`` line).
    not_applied: str = ""
    #: When that worker ended ("MMDD HH:MM:SS.ffffff" from the agent's line; "" when the line has no time).
    #: What picks the first failure among the nodes (``first_failure``), not part of what was read.
    at: str = field(default="", compare=False)
    #: Killed by a signal (rather than exited with a code).
    signaled: bool = field(default=False, compare=False)


def _worker_end(worker_exit: re.Match[str]) -> str:
    """ "local rank 1 killed by signal 9" from torchelastic's line for a worker that died (``_WORKER_EXIT``)."""
    code = int(worker_exit["code"])
    how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
    return f"local rank {worker_exit['local']} {how}"


def read_in_job_restarts(lines: Iterable[str]) -> InJobRestarts:
    """How many times ft_launcher (or torchrun with ``--max-restarts``) restarted its workers, from
    a node's log (all of it, or its last lines). Each agent logs every restart of the job (its own
    worker's failure, or a peer's), and the rendezvous round it joins (ft_launcher's c10d)."""
    count, rounds, why, not_applied, at, signaled = 0, 0, "", "", "", False
    for line in lines:
        if NOT_APPLIED in line:
            not_applied = line.split(NOT_APPLIED, 1)[1].strip()
        if m := _WORKER_EXIT.search(line):
            why, at, signaled = _worker_end(m), _line_time(line), int(m["code"]) < 0
        if _WORKER_GROUP_RESTART.search(line):
            count += 1
        elif m := _RENDEZVOUS_ROUND.search(line):
            rounds = max(rounds, int(m["round"]))
    return InJobRestarts(max(count, rounds), why, not_applied, at, signaled)


def _causing_node(by_node: Mapping[int, InJobRestarts]) -> Optional[int]:
    """The node whose worker's end caused the last restart (None when no node says why): one killed by a
    signal over one that exited with a code, then the earliest."""
    causes = [(not r.signaled, r.at or "~", node) for node, r in by_node.items() if r.why]
    return min(causes)[2] if causes else None


def first_failure(by_node: Mapping[int, InJobRestarts]) -> Optional[InJobRestarts]:
    """The nodes' restarts as one: the highest count, and the cause of the last restart named with its node.
    A rank that dies takes its peers' collectives down with it, and they often exit with an error of their
    own: a worker killed by a signal is the cause over one that exited with a code, then the earliest."""
    if not by_node:
        return None
    count = max(r.count for r in by_node.values())
    not_applied = next((r.not_applied for r in by_node.values() if r.not_applied), "")
    node = _causing_node(by_node)
    if node is None:
        return InJobRestarts(count, not_applied=not_applied)
    first = by_node[node]
    # "local rank 0 killed by signal 9" -> "local rank 0 on node 1 killed by signal 9"
    why = re.sub(r"^(local rank \d+)", rf"\1 on node {node}", first.why)
    return InJobRestarts(count, why, not_applied, first.at, first.signaled)


# --- what the pods and events say --------------------------------------------------------------------


def terminated_state(container_status: dict) -> Optional[dict]:
    """The container's terminated state: its current one, else the one before its last restart."""
    return nested(container_status, "state", "terminated") or nested(container_status, "lastState", "terminated")


def failed_containers(pod: dict, *, init: bool = False) -> Iterable[tuple[dict, dict]]:
    """(container status, terminated state) of each container of ``pod`` that ended with a non-zero
    exit code (init containers with ``init``): the one scan of container states for every diagnosis."""
    for cs in nested(pod, "status", "initContainerStatuses" if init else "containerStatuses", default=[]):
        term = terminated_state(cs)
        if term and term.get("exitCode", 0) != 0:
            yield cs, term


def _labels(obj: dict) -> dict:
    return nested(obj, "metadata", "labels", default={})


def _node_index(pod: dict) -> str:
    """The pod's node index, as its label says ("?" when it has none)."""
    return _labels(pod).get(COMPLETION_INDEX_LABEL, "?")


def _step_of(pod: dict) -> Optional[str]:
    return _labels(pod).get(REPLICATED_JOB_LABEL)


def restart_attempt(pod: dict) -> Optional[int]:
    """The gang attempt a pod belongs to (JobSet's label; 0 for the first), None when unlabelled."""
    value = _labels(pod).get(RESTART_ATTEMPT_LABEL, "")
    return int(value) if value.isdigit() else None


@dataclass(frozen=True)
class NodeFailure:
    """The first ``node`` container that ended with a non-zero exit code."""

    index: str
    pod: str
    exit_code: Optional[int]
    #: The kubelet's reason ("Error", "OOMKilled", "StartError"...).
    reason: str
    #: When the container ended (RFC 3339, to the second).
    finished: str = ""

    @classmethod
    def of(cls, pod: dict, term: dict) -> "NodeFailure":
        """The failure of ``pod``'s ``node`` container, from its terminated state."""
        return cls(
            _node_index(pod), _name(pod), term.get("exitCode"), term.get("reason") or "", term.get("finishedAt") or ""
        )

    def number(self) -> Optional[int]:
        """The node index as a number (None when the pod had no index label)."""
        return int(self.index) if self.index.isdigit() else None

    def how(self) -> str:
        code = self.exit_code
        how = (
            f"was killed by signal {code - 128}" if isinstance(code, int) and code > 128 else f"exited with code {code}"
        )
        extra = f" ({self.reason})" if self.reason and self.reason not in ("Error", "Completed") else ""
        return how + extra

    def detail(self) -> str:
        return f"node {self.index} (pod {self.pod}) {self.how()}"


def _ended_by_deletion(pod: dict, term: dict) -> bool:
    """Whether a container ended once its pod was being deleted: the Job controller deletes a failed Job's
    running pods, JobSet a restarted gang's, so such an end follows another node's failure rather than causes
    it. ``finishedAt`` is to the second, and the pods that a failure has deleted often end in its second."""
    deleted = nested(pod, "metadata", "deletionTimestamp", default="")
    return bool(deleted) and (term.get("finishedAt") or deleted) >= deleted


def _end_order(pod: dict, term: dict) -> tuple[str, bool]:
    """A sort key for the ends of containers, the first to end first: when (``finishedAt``, else the pod's
    ``deletionTimestamp``), then, in the same second, one that ended on its own before one its pod's deletion
    ended."""
    return term.get("finishedAt") or nested(
        pod, "metadata", "deletionTimestamp", default=""
    ) or "~", _ended_by_deletion(pod, term)


def failed_nodes(pods: Sequence[dict]) -> list[NodeFailure]:
    """The ``node`` containers that ended with a non-zero exit code, the first to end first (``_end_order``)."""
    failures = [
        (_end_order(pod, term), NodeFailure.of(pod, term))
        for pod in pods
        for cs, term in failed_containers(pod)
        if cs.get("name") == TRAINER_NODE
    ]
    return [failure for _, failure in sorted(failures, key=lambda ended: ended[0])]


def first_failed_node(pods: Sequence[dict]) -> Optional[NodeFailure]:
    """Which node failed first, from the pods' ``node`` container statuses (None if none did)."""
    return next(iter(failed_nodes(pods)), None)


def failure_detail(pods: Sequence[dict]) -> str:
    """Which node failed first and how, from the pods' container statuses ("" if none did).

    Trainer's ``Failed`` condition copies JobSet's text ("first failed job: ..."), which
    names neither the pod nor the exit code; the kubelet's container status has both.
    """
    first = first_failed_node(pods)
    return first.detail() if first else ""


def _failed_step_containers(pod: dict) -> tuple[str, list[dict]]:
    """Where a step ran ("dataset-initializer", "preflight on node 1") and the terminated states of its
    containers that failed (none for a pod of no step)."""
    job = _step_of(pod)
    if job in INITIALIZER_STEPS:
        return str(job), [term for _, term in failed_containers(pod)]
    if job == TRAINER_NODE:  # its preflight check runs as an init container of the node's pod
        return f"preflight on node {_node_index(pod)}", [
            term for cs, term in failed_containers(pod, init=True) if cs.get("name") == PREFLIGHT_CONTAINER
        ]
    return "", []


def _step_failure(where: str, pod: dict, term: dict) -> tuple[str, str]:
    """(when, what) of a step's container that failed: its termination message's headline, else its exit code."""
    why = _headline(term.get("message") or "") or f"exited with code {term.get('exitCode')}"
    return term.get("finishedAt") or "", f"{where} (pod {_name(pod)}): {why}"


def failed_step(pods: Sequence[dict]) -> Optional[str]:
    """What failed first among the initializers and the preflight checks, with its message
    (``None`` if neither did). Give it the TrainJob's pods (``steps.step_selector`` or the JobSet label).

    Trainer's ``Failed`` condition only names the first failed Job; the step's own message is in its
    pod's container status, where the initializer and preflight containers put it
    (``terminationMessagePolicy: FallbackToLogsOnError``; the preflight script writes its verdict to
    the termination log)."""
    failures = []
    for pod in pods:
        where, terms = _failed_step_containers(pod)
        failures += [_step_failure(where, pod, term) for term in terms]
    return min(failures)[1] if failures else None


def _headline(message: str) -> str:
    """The line of a termination message (often a log tail) that says what went wrong: the last
    one mentioning an error (a logged ERROR, ``FooError: ...``), else the last line."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower() or "failed" in line.lower()]
    return (errors or lines or [""])[-1]


def initializer_progress(pods: Sequence[dict]) -> str:
    """``initializing: dataset-initializer Running, ..." while initializer pods exist (``""`` otherwise)."""
    phases = {}
    for pod in pods:
        step = _step_of(pod)
        if step in INITIALIZER_STEPS:
            phases[step] = (pod.get("status") or {}).get("phase", "Pending")
    if not phases:
        return ""
    return "initializing: " + ", ".join(f"{step} {phase}" for step, phase in sorted(phases.items()))


def _event_object(event: dict) -> dict:
    """The object an event is about, from either recorder (core ``involvedObject``, events.k8s.io ``regarding``)."""
    return event.get("involvedObject") or event.get("regarding") or {}


def _event_time(event: dict) -> str:
    return event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp") or ""


def _event_text(event: dict) -> str:
    return event.get("message") or event.get("note") or ""


def _is_about(event: dict, kind: str, name: str) -> bool:
    """Whether the event is about the object of that kind and name."""
    obj = _event_object(event)
    return obj.get("kind") == kind and obj.get("name") == name


def trainjob_warning(events: Sequence[dict], trainjob: str) -> str:
    """The newest Warning event about the TrainJob itself, as "Reason: message" ("" if none).

    Events come from both recorders (core ``firstTimestamp``/``lastTimestamp`` and
    events.k8s.io ``eventTime``), so either time is used to order them.
    """
    warnings = [e for e in events if e.get("type") == "Warning" and _is_about(e, "TrainJob", trainjob)]
    if not warnings:
        return ""
    newest = max(warnings, key=_event_time)
    return f"{newest.get('reason')}: {_event_text(newest)}".rstrip(": ")


# Registry answers that no amount of waiting fixes.
_PERMANENT_PULL_ERRORS = (
    "not found",
    "manifest unknown",
    "unauthorized",
    "denied",
    "no such host",
    "invalid reference format",
)
#: A container's waiting reasons for an image that cannot be pulled.
_PULL_FAILURES = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName")


@dataclass(frozen=True)
class PendingReason:
    message: str
    #: The job can never start as configured (an image that does not exist): stop waiting.
    fatal: bool = False


def _container_waits_for(index: int, pod: dict, cs: dict, events: Sequence[dict]) -> Optional[PendingReason]:
    """Why a container of node ``index`` waits when it waits for what time does not bring: an image that
    cannot be pulled (fatal when the registry says the image does not exist), a missing Secret/ConfigMap
    key (None otherwise)."""
    waiting = nested(cs, "state", "waiting", default={})
    reason, message = waiting.get("reason", ""), waiting.get("message", "")
    if reason in _PULL_FAILURES:
        text = _pull_error(pod, cs["name"], events) or message
        fatal = reason == "InvalidImageName" or any(p in text.lower() for p in _PERMANENT_PULL_ERRORS)
        return PendingReason(f"image {cs.get('image', '')!r} cannot be pulled on node {index}: {text}", fatal)
    if reason == "CreateContainerConfigError":
        return PendingReason(f"node {index} cannot start: {message}")
    return None


def _containers_cannot_start(newest: dict[int, dict], events: Sequence[dict]) -> Optional[PendingReason]:
    """The first node whose container cannot start (``_container_waits_for``)."""
    for index, pod in sorted(newest.items()):
        for cs in nested(pod, "status", "containerStatuses", default=[]):
            if reason := _container_waits_for(index, pod, cs, events):
                return reason
    return None


def _unschedulable(newest: dict[int, dict], events: Sequence[dict]) -> Optional[PendingReason]:
    """The first node that kube-scheduler cannot place (its pod's ``PodScheduled=False``)."""
    for index, pod in sorted(newest.items()):
        for cond in nested(pod, "status", "conditions", default=[]):
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                message = cond.get("message", cond.get("reason", ""))
                return PendingReason(f"node {index} cannot be scheduled: {message}{_unbound_claims(pod, message)}")
    return None


def _mount_failure(newest: dict[int, dict], events: Sequence[dict]) -> Optional[PendingReason]:
    """The kubelet's last ``FailedMount`` event about the nodes' pods."""
    pod_names = {_name(pod) for pod in newest.values()}
    mounts = [e for e in events if e.get("reason") == "FailedMount" and _event_object(e).get("name") in pod_names]
    return PendingReason(f"a volume cannot be mounted: {_event_text(mounts[-1])}") if mounts else None


#: Why a job that has not started waits, in the order checked; the first that applies wins: a container that
#: cannot start (first: an image that does not exist is fatal, it ends the wait), a node that cannot be
#: scheduled, then a volume that cannot be mounted (a pod meets its volumes only once scheduled).
_PENDING_CAUSES = (_containers_cannot_start, _unschedulable, _mount_failure)


def pending_reason(pods: Sequence[dict], events: Sequence[dict], nodes: int) -> PendingReason:
    """Why a job that has not started yet is waiting, from its pods and their events.

    Checked in order: image pulls (fatal when the registry says the image does not exist),
    missing Secret/ConfigMap keys, scheduling, volumes, then "k/N nodes running".
    """
    newest = newest_pods_by_node(pods)
    for cause in _PENDING_CAUSES:
        if reason := cause(newest, events):
            return reason
    running = sum(1 for p in newest.values() if nested(p, "status", "phase") in ("Running", "Succeeded"))
    return PendingReason(f"{running}/{nodes} nodes running")


def _unbound_claims(pod: dict, scheduler_message: str) -> str:
    """kube-scheduler says "pod has unbound immediate PersistentVolumeClaims" without naming them:
    name the pod's claims (a claim binds once a PersistentVolume matches it or a StorageClass
    provisions one)."""
    if "unbound" not in scheduler_message or "PersistentVolumeClaim" not in scheduler_message:
        return ""
    claims = [
        v["persistentVolumeClaim"]["claimName"]
        for v in nested(pod, "spec", "volumes", default=[])
        if "persistentVolumeClaim" in v
    ]
    if not claims:
        return ""
    return (
        f" (the pod's claims: {', '.join(claims)}; a claim is bound once a PersistentVolume matches it or "
        "its StorageClass provisions one: `kubectl get pvc` shows which is Pending)"
    )


def _pull_error(pod: dict, container: str, events: Sequence[dict]) -> str:
    """The kubelet's 'Failed to pull image' event text for this container, if any."""
    for e in reversed(list(events)):
        obj = _event_object(e)
        if (
            e.get("reason") == "Failed"
            and obj.get("name") == _name(pod)
            and container in (obj.get("fieldPath") or "")
            and "pull" in _event_text(e).lower()
        ):
            return _event_text(e)
    return ""


# --- restarts: how many, of which kind, and why ------------------------------------------------------

#: Pod conditions and events that mean Kubernetes took the pod away (not the program failing): each
#: restarts the gang (the ``DisruptionTarget`` rule of the ``node`` Job's podFailurePolicy counts it).
DISRUPTION_EVENTS = {
    "Evicted": "evicted",  # kubelet: node pressure; the API's eviction
    "Preempted": "preempted",  # scheduler: a higher-priority pod needed the node
    "TaintManagerEviction": "deleted by the taint manager",  # its node went away or was tainted NoExecute
    "NodeNotReady": "its node stopped being ready",  # node controller
}
#: The events that say a child Job failed (the gang then restarts, or the JobSet fails).
JOB_FAILURE_EVENTS = ("BackoffLimitExceeded", "PodFailurePolicy", "DeadlineExceeded")
#: JobSet's event for each restart of the gang ("applying RestartJobSet failure policy action ...").
GANG_RESTART_EVENT = "RestartJobSetFailurePolicyAction"
#: JobSet's condition reason (mirrored on the TrainJob) when a ``FailJobSet`` rule matched: our
#: ``userError`` rule, for an exit code in ``fail_fast_exit_codes``.
FAIL_FAST_REASON = "FailJobSetFailurePolicyAction"


def pod_end(pod: dict) -> str:
    """Why a ``node`` pod ended, in a few words ("" while it runs): disrupted (the pod's
    ``DisruptionTarget`` condition, an eviction), else its ``node`` container's exit code."""
    disruption = true_condition(pod, "DisruptionTarget")
    if disruption is not None:
        why = condition_text(disruption)
        return f"was disrupted (DisruptionTarget{', ' + why if why else ''})"
    if nested(pod, "status", "reason") == "Evicted":
        return f"was evicted ({nested(pod, 'status', 'message', default='Evicted')})"
    first = first_failed_node([pod])
    return first.how() if first else ""


def _name(pod: dict) -> str:
    return pod["metadata"]["name"]


def _counted(count: int, noun: str) -> str:
    """ "1 gang restart", "2 gang restarts"."""
    return f"{count} {noun}{'s' if count != 1 else ''}"


@dataclass(frozen=True)
class Restarts:
    """How often a job restarted, of which kind, and why (what of it is known)."""

    #: Restarts of the whole gang by JobSet (``failurePolicy``, up to ``retries``): the newest pods' attempt.
    gang: int = 0
    #: Why each gang restart happened, oldest first, where known: "attempt 0: node 1 (pod p) exited with code 3".
    gang_causes: tuple[str, ...] = ()
    #: Worker-group restarts inside the running pods (ft_launcher), from the node logs read; None: none read.
    in_job: Optional[int] = None
    in_job_cause: str = ""
    #: Containers the kubelet restarted in place (a runtime whose pods use ``restartPolicy: OnFailure``).
    in_place: int = 0
    #: The job failed at once on a user error (a ``fail_fast_exit_codes`` exit code): no restart tried.
    failed_fast: bool = False
    #: A warm-start setting the pods did not apply, and why (``InJobRestarts.not_applied``).
    not_applied: str = ""

    def note(self, *, finished: bool) -> str:
        """ "after 1 gang restart: ...; 2 in-job restarts by ft_launcher" (a failed job always gets
        its gang count, "no gang restart" included; a running one only what happened)."""
        parts = (self._gang_note(finished), self._in_job_note(), self._in_place_note(), self._not_applied_note())
        return "; ".join(part for part in parts if part)

    def _gang_count(self, finished: bool) -> str:
        if not finished:
            return f"{_counted(self.gang, 'gang restart')} so far"
        return f"after {_counted(self.gang, 'gang restart')}" if self.gang else "no gang restart"

    def _gang_note(self, finished: bool) -> str:
        """The gang restarts and their causes; why there was none when the job failed fast."""
        if self.failed_fast and not self.gang:
            return (
                "no gang restart: its exit code is in fail_fast_exit_codes (a user error), so the job "
                "failed at once without using retries"
            )
        if not (self.gang or finished):
            return ""
        return self._gang_count(finished) + (f" ({', '.join(self.gang_causes)})" if self.gang_causes else "")

    def _in_job_note(self) -> str:
        if not self.in_job:
            return ""
        cause = f", the last as {self.in_job_cause}" if self.in_job_cause else ""
        return f"{_counted(self.in_job, 'in-job restart')} by ft_launcher (no pod recreated{cause})"

    def _in_place_note(self) -> str:
        return f"{_counted(self.in_place, 'container restart')} in place by the kubelet" if self.in_place else ""

    def _not_applied_note(self) -> str:
        return f"warning: not applied: {self.not_applied}" if self.not_applied else ""


#: The Job controller's message for a pod that matched a FailJob rule of the Job's podFailurePolicy
#: (kubernetes pkg/controller/job, "Container %s for pod %s/%s failed with exit code %v matching %v rule at
#: index %d"): the Job's ``Failed`` condition, and the Warning event (reason ``PodFailurePolicy``) it records.
_FAIL_JOB_MESSAGE = re.compile(
    r"Container (?P<container>\S+) for pod [^/\s]+/(?P<pod>\S+) failed with exit code "
    r"(?P<code>-?\d+) matching FailJob rule"
)


def job_failure_cause(event: dict, trainjob: str) -> tuple[str, bool]:
    """How a failed Job of the TrainJob ended, from the Job controller's Warning event, and whether that
    names the exit code: ("node 1 (pod p) exited with code 3", True) from a FailJob rule's message (our
    runtime ends the ``node`` Job through one on every exit code), else ("a pod of Job j failed
    (BackoffLimitExceeded)", False): a disrupted pod counts against backoffLimit, no code is kept."""
    m = _FAIL_JOB_MESSAGE.search(_event_text(event))
    if event.get("reason") == "PodFailurePolicy" and m and m["container"] == TRAINER_NODE:
        index = pod_completion_index(m["pod"], trainjob, TRAINER_NODE)
        return NodeFailure("?" if index is None else str(index), m["pod"], int(m["code"]), "").detail(), True
    return f"a pod of Job {_event_object(event).get('name')} failed ({event.get('reason')})", False


def _named_after(event: dict, trainjob: str) -> bool:
    """Whether the event is about the TrainJob or an object named after it (its JobSet, Jobs, pods)."""
    name = _event_object(event).get("name", "")
    return name == trainjob or name.startswith(f"{trainjob}-")


def _events_of_job(events: Sequence[dict], trainjob: str) -> list[dict]:
    """The events about the TrainJob and the objects named after it, oldest first."""
    return sorted(
        (e for e in events if _named_after(e, trainjob)),
        key=lambda e: (_event_time(e), nested(e, "metadata", "name", default="")),
    )


def _is_job_failure(event: dict) -> bool:
    """The Job controller's event for a Job that failed (``JOB_FAILURE_EVENTS``)."""
    return _event_object(event).get("kind") == "Job" and event.get("reason") in JOB_FAILURE_EVENTS


def _failed_job_events(mine: Sequence[dict], gang: int, current_jobs: frozenset[str]) -> list[dict]:
    """The failure event of each of the last ``gang`` Jobs that failed (one per Job uid, the running attempt's
    Jobs left out), oldest first."""
    incarnations: dict[str, dict] = {}
    for i, e in enumerate(mine):
        uid = _event_object(e).get("uid")
        if _is_job_failure(e) and uid not in current_jobs:
            incarnations.setdefault(uid or f"event {i}", e)
    return list(incarnations.values())[-gang:] if gang else []


def _attempt_causes(gang: int, known: dict[int, tuple[str, bool]]) -> tuple[list[str], bool]:
    """The cause of each attempt that is ``known`` (attempt -> (cause, whether it names the exit code)),
    "attempt 0: ...", oldest first, and whether some attempt's exit code is not among them."""
    causes, unexplained = [], False
    for attempt in range(gang):
        text, has_code = known.get(attempt, (None, False))
        if text is not None:
            causes.append(f"attempt {attempt}: {text}")
        unexplained |= not has_code
    return causes, unexplained


def _often(event: dict) -> str:
    """ " (3 times)" for an event the recorder counted more than once."""
    times = event.get("count") or 1
    return f" ({times} times)" if times > 1 else ""


def _job_event_note(event: dict) -> str:
    """What the Job controller's event about a failed Job says ("" for another event)."""
    obj, reason = _event_object(event), event.get("reason", "")
    if obj.get("kind") != "Job":
        return ""
    if reason == "PodFailurePolicy":
        return f"Job {obj.get('name')}{_often(event)}: {_event_text(event)}"
    if reason in JOB_FAILURE_EVENTS:
        # The pod that failed went with its attempt, and its exit code with it.
        return f"a pod of Job {obj.get('name')} failed{_often(event)} ({reason})"
    return ""


def _event_note(event: dict, used: set[int], current_jobs: frozenset[str]) -> str:
    """What an event about the job's objects says of a restart ("" for nothing): a pod that Kubernetes took
    away (``DISRUPTION_EVENTS``); a Job that failed, unless its event already told an attempt's cause
    (``used``) or the Job is the running attempt's."""
    obj, reason = _event_object(event), event.get("reason", "")
    if reason in DISRUPTION_EVENTS and obj.get("kind") == "Pod":
        return f"pod {obj.get('name')} {DISRUPTION_EVENTS[reason]}{_often(event)}: {_event_text(event)}".rstrip(": ")
    if id(event) in used or obj.get("uid") in current_jobs:
        return ""
    return _job_event_note(event)


def gang_causes(
    gang: int, seen: dict[int, str], events: Sequence[dict], trainjob: str, current_jobs: frozenset[str] = frozenset()
) -> tuple[str, ...]:
    """Why each of ``gang`` restarts happened, oldest first: what this process saw of each attempt's failed
    pod (``seen``, attempt -> "node 1 (pod p) exited with code 3"), else the Job controller's event about
    that attempt's failed Job, else what the events about the job's pods still say.

    The failed pods, and the failed Job, go with their attempt; the events outlive them. JobSet deletes
    the failed ``node`` Job at each gang restart and creates it again under the same name, so each
    attempt's Job has its own uid and one failure event: ordered by time, the last ``gang`` of them (the
    running attempt's Job, ``current_jobs``, left out) are attempts 0 to ``gang`` - 1."""
    mine = _events_of_job(events, trainjob)
    failed_jobs = _failed_job_events(mine, gang, current_jobs)
    from_events = {gang - len(failed_jobs) + i: job_failure_cause(e, trainjob) for i, e in enumerate(failed_jobs)}
    # What this process saw of a failed pod names its exit code, and comes first.
    causes, unexplained = _attempt_causes(gang, {**from_events, **{a: (text, True) for a, text in seen.items()}})
    if not unexplained:
        return tuple(causes)
    used = {id(e) for e in failed_jobs}
    said = [note for note in dict.fromkeys(_event_note(e, used, current_jobs) for e in mine) if note]
    return tuple(causes + (["events: " + ", ".join(said)] if said else []))


@dataclass
class JobView:
    """A TrainJob with its pods, read once per describe, and its Warning events, read at most once
    (only the states that need them: waiting, and after a gang restart).

    ``read`` lists every pod of the job. ``read_running`` (a running job, the look a wait repeats) reads
    its JobSet and only the pods that are not running (``NOT_RUNNING``): what a restart, a failed rank or
    a node fault leaves behind; a thousand running pods are not read again on each poll. ``read_waiting``
    (a job not started) reads a sample of the pods that wait; ``read_failed`` the running pods' metadata only."""

    cluster: "ClusterReader"
    trainjob: dict
    pods: list[dict]
    _events: Optional[list[dict]] = field(default=None, repr=False)
    #: Node index -> the last lines of its log, where this look has read them (progress reuses node 0's).
    node_lines: dict[int, list[str]] = field(default_factory=dict, repr=False)
    #: The JobSet, read by ``read_running`` (None: ``pods`` are all the job's pods).
    jobset: Optional[dict] = None
    _current_jobs: Optional[frozenset[str]] = field(default=None, repr=False)
    #: The field selector of the Warning events read (``read_waiting`` leaves out the scheduler's).
    events_selector: str = field(default="type=Warning", repr=False)

    @classmethod
    def read(cls, cluster: "ClusterReader", trainjob: dict) -> "JobView":
        meta = trainjob["metadata"]
        pods = cluster.list("Pod", meta["namespace"], f"{JOBSET_NAME_LABEL}={meta['name']}")
        return cls(cluster, trainjob, pods)

    @classmethod
    def read_running(cls, cluster: "ClusterReader", trainjob: dict) -> "JobView":
        """A running job's JobSet (its restarts, its uid) and its pods that are not running; every pod
        (``read``) when the JobSet is not there or its node pods restart containers in place (their
        restart counts are on the running pods)."""
        meta = trainjob["metadata"]
        jobset = cluster.get(JOBSET_KIND, meta["name"], meta["namespace"])
        if jobset is None or restarts_in_place(jobset):
            return cls.read(cluster, trainjob)
        pods = cluster.list("Pod", meta["namespace"], f"{JOBSET_NAME_LABEL}={meta['name']}", field_selector=NOT_RUNNING)
        return cls(cluster, trainjob, pods, jobset=jobset)

    @classmethod
    def read_waiting(cls, cluster: "ClusterReader", trainjob: dict) -> "JobView":
        """A waiting job's JobSet, its pods that started or ended (``NOT_PENDING``), and a sample of its pods
        that wait (``WAITING_SAMPLE`` of those not placed, as many of those placed and starting): not a thousand
        pods that wait for the same reason. Every pod (``read``) when the JobSet is not there yet."""
        meta = trainjob["metadata"]
        jobset = cluster.get(JOBSET_KIND, meta["name"], meta["namespace"])
        if jobset is None:
            return cls.read(cluster, trainjob)
        selector = f"{JOBSET_NAME_LABEL}={meta['name']}"
        pods = cluster.list("Pod", meta["namespace"], selector, field_selector=NOT_PENDING)
        for waiting in (UNSCHEDULED, STARTING):
            pods += cluster.list("Pod", meta["namespace"], selector, field_selector=waiting, limit=WAITING_SAMPLE)
        return cls(cluster, trainjob, pods, jobset=jobset, events_selector=WAITING_EVENTS)

    @classmethod
    def read_failed(cls, cluster: "ClusterReader", trainjob: dict) -> "JobView":
        """A failed job's JobSet, the metadata of its pods still running (the Job controller deletes a failed
        Job's running pods: their names say which nodes still have a log to read) and its other pods in full
        (those that failed tell how). Every pod (``read``) when the JobSet is not there or its node pods restart
        containers in place (their restart counts are on the running pods)."""
        meta = trainjob["metadata"]
        jobset = cluster.get(JOBSET_KIND, meta["name"], meta["namespace"])
        if jobset is None or restarts_in_place(jobset):
            return cls.read(cluster, trainjob)
        selector = f"{JOBSET_NAME_LABEL}={meta['name']}"
        # The running ones first: a pod that ends between the two reads is in both, and the full one, later in
        # the list, is the one ``newest_pods_by_node`` keeps.
        pods = cluster.list_metadata("Pod", meta["namespace"], selector, field_selector=RUNNING)
        pods += cluster.list("Pod", meta["namespace"], selector, field_selector=NOT_RUNNING)
        return cls(cluster, trainjob, pods, jobset=jobset)

    @property
    def name(self) -> str:
        return self.trainjob["metadata"]["name"]

    @property
    def namespace(self) -> str:
        return self.trainjob["metadata"]["namespace"]

    @property
    def nodes(self) -> int:
        return nested(self.trainjob, "spec", "trainer", "numNodes", default=0)

    @property
    def events(self) -> list[dict]:
        if self._events is None:
            self._events = self.cluster.list("Event", self.namespace, field_selector=self.events_selector)
        return self._events

    @property
    def node_pods(self) -> list[dict]:
        return [p for p in self.pods if _step_of(p) == TRAINER_NODE]

    def newest_nodes(self) -> dict[int, dict]:
        return newest_pods_by_node(self.node_pods)

    def runs_ft_launcher(self) -> bool:
        return runs_ft_launcher(self.trainjob)

    def node_log(self, pod: str, tail_lines: int) -> Optional[list[str]]:
        """The last ``tail_lines`` of a node pod's log (None when it cannot be read)."""
        try:
            return list(self.cluster.pod_log(pod, self.namespace, container=TRAINER_NODE, tail_lines=tail_lines))
        except ClusterError:
            return None

    def in_job_restarts_of_nodes(self) -> Optional[InJobRestarts]:
        """ft_launcher's restarts so far, from the last ``IN_JOB_TAIL`` lines of every node's log (one log
        read per node; None when no log can be read). Every agent logs every restart of the group and the
        rendezvous round it joins, but only the node whose worker died says how: ``first_failure`` names it."""
        found: dict[int, InJobRestarts] = {}
        for node, pod in sorted(self.newest_nodes().items()):
            lines = self.node_log(_name(pod), IN_JOB_TAIL)
            if lines is not None:
                self.node_lines[node] = lines
                found[node] = read_in_job_restarts(lines)
        return first_failure(found)

    def gang_restarts(self) -> int:
        """JobSet's restarts so far: the attempt of the newest pods (JobSet labels each pod with it), or the
        JobSet's own count when it was read."""
        from_pods = max((a for p in self.node_pods if (a := restart_attempt(p)) is not None), default=0)
        return max(from_pods, jobset_restarts(self.jobset)) if self.jobset is not None else from_pods

    def nodes_starting(self) -> int:
        """After a gang restart, the new attempt's ``node`` pods still pending (not being deleted); 0 before any.
        The TrainJob's ``node`` Job counts are mirrored from the JobSet, a reconcile or two behind it: just after
        a gang restart they still say the previous attempt's Job is ready while the new attempt's pods start."""
        attempt = self.gang_restarts()
        if not attempt:
            return 0
        return sum(
            1
            for p in self.node_pods
            if restart_attempt(p) == attempt
            and nested(p, "status", "phase", default="Pending") == "Pending"
            and not p["metadata"].get("deletionTimestamp")
        )

    def _of_newest_attempt(self) -> list[dict]:
        attempt = self.gang_restarts()
        return [p for p in self.node_pods if (restart_attempt(p) or 0) == attempt]

    def failing(self) -> Optional[NodeFailure]:
        """The node whose failure fails the newest attempt's Job while the Job controller stops its other pods
        (None when that is not what the pods show). The Job's Failed condition, and so JobSet's restart or
        verdict, waits until every pod of the Job has ended (Kubernetes 1.31 on, "terminal Job conditions"),
        and meanwhile the TrainJob counts no node active or ready. Shown by a node pod of the attempt that
        failed on its own beside one whose pod is being deleted: a Job that replaces a failed pod instead (an
        admin runtime's ``backoffLimit``) deletes none."""
        pods = self._of_newest_attempt()
        if not any(p["metadata"].get("deletionTimestamp") for p in pods):
            return None
        return first_failed_node([p for p in pods if not p["metadata"].get("deletionTimestamp")])

    def nodes_stopping(self) -> int:
        """The newest attempt's node pods being deleted that have not ended yet."""
        return sum(
            1
            for p in self._of_newest_attempt()
            if p["metadata"].get("deletionTimestamp") and nested(p, "status", "phase") not in ("Succeeded", "Failed")
        )

    def restarting(self) -> bool:
        """Whether a gang restart is under way: JobSet's ``RestartingJobSet`` condition when the JobSet was read
        (v0.12 on: True from the restart until every Job of the new attempt is ready, also before the new pods
        exist), else the new attempt's pods still pending (``nodes_starting``)."""
        return jobset_restarting(self.jobset) or self.nodes_starting() > 0

    def current_jobs(self) -> frozenset[str]:
        """The uids of the Jobs that own the newest ``node`` pods (the current attempt's); without the
        running pods at hand, those of the JobSet's Jobs of its current attempt (one metadata-only list)."""
        if self.jobset is None:
            return _owner_uids(self.newest_nodes().values(), "Job")
        if self._current_jobs is None:
            jobs = self.cluster.list_metadata("Job", self.namespace, f"{JOBSET_NAME_LABEL}={self.name}")
            self._current_jobs = frozenset(
                job["metadata"].get("uid") for job in jobs if _of_current_attempt(job, self.jobset)
            )
        return self._current_jobs

    def attempts_seen(self) -> bool:
        return any(restart_attempt(p) is not None for p in self.node_pods)

    def failures_by_attempt(self) -> dict[int, str]:
        """Attempt -> how its first ``node`` pod ended, for the pods at hand that failed or were disrupted."""
        ends: dict[int, list[tuple[tuple[str, bool], str]]] = {}
        for pod in self.node_pods:
            attempt, end = restart_attempt(pod), _node_pod_end(pod)
            if attempt is not None and end is not None:
                ends.setdefault(attempt, []).append(end)
        # min keeps the first of pods that ended at the same time (``_end_order``).
        return {attempt: min(found, key=lambda end: end[0])[1] for attempt, found in ends.items()}

    def in_place_restarts(self) -> int:
        """The containers the kubelet restarted in place in the newest ``node`` pods."""
        return sum(
            cs.get("restartCount") or 0
            for p in self.newest_nodes().values()
            for cs in nested(p, "status", "containerStatuses", default=[])
        )

    def restarts(
        self,
        *,
        seen: Optional[dict[int, str]] = None,
        in_job: Optional[InJobRestarts] = None,
        condition_reason: str = "",
    ) -> Restarts:
        """How often the job restarted, of which kind, and why. ``seen``: what this process saw of
        earlier attempts' failed pods; ``in_job``: ft_launcher's restarts read from node logs."""
        gang = self.gang_restarts()
        causes = (
            gang_causes(
                gang, {**self.failures_by_attempt(), **(seen or {})}, self.events, self.name, self.current_jobs()
            )
            if gang
            else ()
        )
        restarts = Restarts(
            gang=gang,
            gang_causes=causes,
            in_place=self.in_place_restarts(),
            failed_fast=condition_reason == FAIL_FAST_REASON,
        )
        if in_job is None:
            return restarts
        return replace(restarts, in_job=in_job.count, in_job_cause=in_job.why, not_applied=in_job.not_applied)


def _owner_uids(objs: Iterable[dict], kind: str) -> frozenset[str]:
    """The uids of the owners of kind ``kind`` of ``objs``."""
    return frozenset(
        ref.get("uid")
        for obj in objs
        for ref in nested(obj, "metadata", "ownerReferences", default=[])
        if ref.get("kind") == kind
    )


def _of_current_attempt(job: dict, jobset: dict) -> bool:
    """Whether a Job (its metadata) is one of the JobSet's current attempt: labelled with the JobSet's uid
    and restart count, and not being deleted."""
    labels = _labels(job)
    return (
        not job["metadata"].get("deletionTimestamp")
        and labels.get(RESTART_ATTEMPT_LABEL) == str(jobset_restarts(jobset))
        and labels.get(JOBSET_UID_LABEL) == jobset["metadata"].get("uid")
    )


def _node_pod_end(pod: dict) -> Optional[tuple[tuple[str, bool], str]]:
    """(``_end_order``, how) a ``node`` pod ended: "node 1 (pod p) exited with code 3" (None while it runs)."""
    how = pod_end(pod)
    if not how:
        return None
    term = next((t for _, t in failed_containers(pod)), {})
    return _end_order(pod, term), f"node {_node_index(pod)} (pod {_name(pod)}) {how}"


#: The pods a running job's look reads (``JobView.read_running``): a field selector every API server serves.
NOT_RUNNING = "status.phase!=Running"
#: The pods a failed job's look reads by their metadata only (``JobView.read_failed``).
RUNNING = "status.phase=Running"
#: The pods a waiting job's look reads in full (``JobView.read_waiting``): those that started or ended, and a
#: sample of the pending ones, apart those kube-scheduler has not placed (``spec.nodeName`` empty: why is their
#: ``PodScheduled`` condition) and those placed and starting (why is in their container statuses and events).
NOT_PENDING = "status.phase!=Pending"
UNSCHEDULED = "status.phase=Pending,spec.nodeName="
STARTING = "status.phase=Pending,spec.nodeName!="
#: Pending pods of each kind read (the first chunk of a list, ``limit``). A sample says why the job waits: its
#: ``node`` pods share one template (image, volumes, resources, node selector), so what keeps one from being
#: placed or from starting keeps the others too, and the first in the server's key order is node 0's. What a
#: sample cannot tell, the count of nodes running, comes from the pods that are not pending, read in full.
WAITING_SAMPLE = 8
#: The Warning events a waiting job's look reads: kube-scheduler records a FailedScheduling event for each pod
#: it cannot place (a thousand at 1,024 nodes) and says the same in the pod's ``PodScheduled`` condition, read
#: from the pods; the kubelet's (image pulls, mounts) and Trainer's are kept.
WAITING_EVENTS = "type=Warning,reason!=FailedScheduling"


def runs_ft_launcher(trainjob: dict) -> bool:
    """Whether the job's nodes run ft_launcher (only then does the TrainJob's trainer env carry the gang
    attempt for its rendezvous id)."""
    env = nested(trainjob, "spec", "trainer", "env", default=[])
    return any(e.get("name") == RESTART_ATTEMPT_ENV for e in env)


def jobset_restarts(jobset: dict) -> int:
    """JobSet's gang restarts so far (``status.restarts``: the restart-attempt label of its newest pods)."""
    return int(nested(jobset, "status", "restarts", default=0))


def jobset_restarting(jobset: Optional[dict]) -> bool:
    """Whether the JobSet says its gang restarts (``JOBSET_RESTARTING_CONDITION`` True; False on a JobSet
    older than v0.12, which does not set it)."""
    return true_condition(jobset, JOBSET_RESTARTING_CONDITION) is not None


def restarts_in_place(jobset: dict) -> bool:
    """Whether the JobSet's ``node`` pods may restart containers in place (``restartPolicy`` other than
    Never; JobSet's default is OnFailure): only the running pods then count their restarts."""
    for rjob in nested(jobset, "spec", "replicatedJobs", default=[]):
        if rjob.get("name") == TRAINER_NODE:
            return nested(rjob, "template", "spec", "template", "spec", "restartPolicy") != "Never"
    return True


@dataclass(frozen=True)
class Verdict:
    state: AppState
    message: str
    #: The job can never start as configured: the look recommends deleting it (``repair.steps``).
    fatal: bool = False


def _before_pods(view: JobView) -> str:
    """What a job without ``node`` pods yet waits for: its initializers, else Trainer's Warning about the
    TrainJob (Trainer reports a JobSet it cannot build only as a Warning event on it); "" when neither."""
    return initializer_progress(view.pods) or trainjob_warning(view.events, view.name)


def why_waiting(view: JobView, nodes: int, state: AppState) -> Verdict:
    """What a job whose TrainJob counts no node running waits for: a failure whose Job still stops its other
    nodes (``JobView.failing``: running, failing), its initializers, Trainer's Warning about the TrainJob (a
    JobSet it cannot build), then its pods (``pending_reason``)."""
    if (failed := view.failing()) is not None:
        stopping = view.nodes_stopping()
        stops = (
            f"the Job controller stops its other nodes ({stopping} of {nodes} still stopping)"
            if stopping
            else "its other nodes stopped"
        )
        return Verdict(
            AppState.RUNNING, f"failing: {failed.detail()}; {stops}, then JobSet restarts the gang or fails the job"
        )
    pods = view.node_pods
    if not pods and (waits_for := _before_pods(view)):
        return Verdict(AppState.PENDING, waits_for)
    reason = pending_reason(pods, view.events, nodes)
    if reason.fatal:
        return Verdict(AppState.FAILED, reason.message, fatal=True)
    # JobSet recreates the gang: its new pods wait, the message says why they do.
    restarting = "restarting: " if jobset_restarting(view.jobset) else ""
    return Verdict(AppState.PENDING if pods or restarting else state, restarting + reason.message)


#: Lines of each node's log read to count ft_launcher's restarts of a running job that this process does
#: not follow (``JobView.in_job_restarts_of_nodes``): the rendezvous round of the last restart must be
#: among them, so more than a failure's tail; at most a few hundred KB.
IN_JOB_TAIL = 2000
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
    failed rank: the first to fail is not always where the failure began (when a rank fails, the launcher
    agents of the other nodes fail too once their rendezvous closes, sometimes sooner), so the next failed
    nodes' logs are read (up to ``MAX_FAILED_NODES_READ``) and the first that names the rank explains it."""
    explained = _FailureExplained()
    for failure in failed[:MAX_FAILED_NODES_READ]:
        lines = view.node_log(failure.pod, DIAGNOSIS_TAIL) or []
        why = read_rank_failure(lines, failure.exit_code)
        if failure is failed[0] or why.rank is not None:
            explained = _FailureExplained.of(failure, why, lines)
        if why.rank is not None or not _launcher_agent_logged(lines):
            break
    return explained


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
    from nemo_kubeflow.observe.logs import node_log_path

    on_disk = {i for i in range(view.nodes) if os.path.exists(node_log_path(job_dir, i))} if job_dir else set()
    return sorted(set(range(view.nodes)) - set(view.newest_nodes()) - _kept_nodes(keeper) - on_disk)


def logs_to_keep(view: JobView, job_dir: str, keeper: Optional["NodeLogKeeper"] = None) -> list[int]:
    """The nodes of a finished job whose log can still be read (a pod, or lines kept in this process) and has
    no file next to the job yet: what a repair step saves (``repair.steps``)."""
    from nemo_kubeflow.observe.logs import node_log_path

    if not job_dir:
        return []
    readable = set(view.newest_nodes()) | _kept_nodes(keeper)
    return sorted(i for i in readable if not os.path.exists(node_log_path(job_dir, i)))


def failed_reason(trainjob: dict) -> str:
    """The reason of the TrainJob's ``Failed`` condition ("" when it has none)."""
    return nested(true_condition(trainjob, "Failed"), "reason", default="")


def keeper_in_job_restarts(keeper: Optional["NodeLogKeeper"]) -> Optional[InJobRestarts]:
    """ft_launcher's restarts in the lines a ``NodeLogKeeper`` holds (``first_failure`` of the nodes')."""
    if keeper is None:
        return None
    return first_failure({node: read_in_job_restarts(lines) for node, lines in keeper.kept_lines().items()})


def most_telling(found: Sequence[InJobRestarts]) -> Optional[InJobRestarts]:
    """Of the nodes' counts, the highest; among those, one that says why, and a worker killed by a signal
    over one that exited with a code: a rank that dies takes its peers' collectives down with it, and
    they often exit with an error of their own."""
    return max(found, key=lambda r: (r.count, bool(r.why), "killed by signal" in r.why), default=None)
