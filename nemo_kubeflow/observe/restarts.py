"""How often a job restarted, of which kind, and why (``Restarts``): the gang restarts JobSet makes (its
restart count, the pods' attempt labels, the Job controller's events about each attempt's failed Job), the
worker-group restarts ft_launcher makes inside the running pods (``InJobRestarts``, read from a node's log),
and the kubelet's container restarts in place. Pure: ``JobView.restarts`` gives them what it read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Mapping, Optional, Sequence

from nemo_kubeflow.constants import JOBSET_RESTARTING_CONDITION, RESTART_ATTEMPT_ENV, TRAINER_NODE
from nemo_kubeflow.observe.events import event_object, event_text, event_time
from nemo_kubeflow.observe.pod_states import NodeFailure
from nemo_kubeflow.observe.status import nested, true_condition
from nemo_kubeflow.parts.naming import pod_completion_index
from nemo_kubeflow.pod.warm_start import NOT_APPLIED

if TYPE_CHECKING:
    from nemo_kubeflow.observe.kept_logs import NodeLogKeeper


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
WORKER_EXIT = re.compile(r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<local>\d+)")
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
    """ "local rank 1 killed by signal 9" from torchelastic's line for a worker that died (``WORKER_EXIT``)."""
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
        if m := WORKER_EXIT.search(line):
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
    m = _FAIL_JOB_MESSAGE.search(event_text(event))
    if event.get("reason") == "PodFailurePolicy" and m and m["container"] == TRAINER_NODE:
        index = pod_completion_index(m["pod"], trainjob, TRAINER_NODE)
        return NodeFailure("?" if index is None else str(index), m["pod"], int(m["code"]), "").detail(), True
    return f"a pod of Job {event_object(event).get('name')} failed ({event.get('reason')})", False


def _named_after(event: dict, trainjob: str) -> bool:
    """Whether the event is about the TrainJob or an object named after it (its JobSet, Jobs, pods)."""
    name = event_object(event).get("name", "")
    return name == trainjob or name.startswith(f"{trainjob}-")


def _events_of_job(events: Sequence[dict], trainjob: str) -> list[dict]:
    """The events about the TrainJob and the objects named after it, oldest first."""
    return sorted(
        (e for e in events if _named_after(e, trainjob)),
        key=lambda e: (event_time(e), nested(e, "metadata", "name", default="")),
    )


def _is_job_failure(event: dict) -> bool:
    """The Job controller's event for a Job that failed (``JOB_FAILURE_EVENTS``)."""
    return event_object(event).get("kind") == "Job" and event.get("reason") in JOB_FAILURE_EVENTS


def _failed_job_events(mine: Sequence[dict], gang: int, current_jobs: frozenset[str]) -> list[dict]:
    """The failure event of each of the last ``gang`` Jobs that failed (one per Job uid, the running attempt's
    Jobs left out), oldest first."""
    incarnations: dict[str, dict] = {}
    for i, e in enumerate(mine):
        uid = event_object(e).get("uid")
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
    obj, reason = event_object(event), event.get("reason", "")
    if obj.get("kind") != "Job":
        return ""
    if reason == "PodFailurePolicy":
        return f"Job {obj.get('name')}{_often(event)}: {event_text(event)}"
    if reason in JOB_FAILURE_EVENTS:
        # The pod that failed went with its attempt, and its exit code with it.
        return f"a pod of Job {obj.get('name')} failed{_often(event)} ({reason})"
    return ""


def _event_note(event: dict, used: set[int], current_jobs: frozenset[str]) -> str:
    """What an event about the job's objects says of a restart ("" for nothing): a pod that Kubernetes took
    away (``DISRUPTION_EVENTS``); a Job that failed, unless its event already told an attempt's cause
    (``used``) or the Job is the running attempt's."""
    obj, reason = event_object(event), event.get("reason", "")
    if reason in DISRUPTION_EVENTS and obj.get("kind") == "Pod":
        return f"pod {obj.get('name')} {DISRUPTION_EVENTS[reason]}{_often(event)}: {event_text(event)}".rstrip(": ")
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
