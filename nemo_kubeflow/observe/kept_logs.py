"""The nodes' logs kept: next to the job on disk (``node_log_path``: what following writes, a repair step
saves, a finished job's reader falls back to), and in memory while a job is waited for (``NodeLogKeeper``:
each node's last lines, through the job's ``JobLogFollower``, for a node whose pod goes away).
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from collections import deque
from typing import Collection, Iterable, Iterator

from nemo_kubeflow.cluster.client import ClusterReader
from nemo_kubeflow.constants import TRAINER_NODE
from nemo_kubeflow.errors import ClusterError
from nemo_kubeflow.observe.followed_node import KEEP_LINES
from nemo_kubeflow.observe.log_follower import JobLogFollower, subscribe_node

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
    Without those events (no ``watch`` right on pods, more experiments watched than ``MAX_WATCHED_SETS``) they are
    read in rounds, at the keeper's pace (``KEEP_READS_PER_SECOND``)."""

    def __init__(self, cluster: ClusterReader, namespace: str, trainjob: str, nodes: int, directory: str) -> None:
        self.directory = directory
        self._lines = {i: _KeptLines(on_trouble=i > 0) for i in range(min(nodes, MAX_KEPT_NODES))}
        self._followers = {i: subscribe_node(cluster, namespace, trainjob, i, kept) for i, kept in self._lines.items()}
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
        """Node index -> the lines kept so far (for ``restarts``: ft_launcher's restarts while running), once
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
