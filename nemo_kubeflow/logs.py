"""Reading the logs of a TrainJob's nodes through the ``Cluster`` interface.

Pods are found by the labels JobSet and the Job controller put on them (TrainJob
labels do not reach pods). Unlike the Kubeflow SDK, which returns nothing for a
Pending pod, following a node waits for its pod to start, and follows the node's
newest pod across gang restarts until the job ends.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import deque
from typing import Callable, Iterator, Optional

from nemo_kubeflow.cluster import Cluster
from nemo_kubeflow.errors import ClusterError
from nemo_kubeflow.constants import (
    COMPLETION_INDEX_LABEL,
    JOBSET_NAME_LABEL,
    REPLICATED_JOB_LABEL,
    TRAINER_NODE,
    TRAINJOB_KIND,
)
from nemo_kubeflow.status import job_status, newest_pods_by_node


def node_selector(trainjob: str, index: Optional[int] = None) -> str:
    selector = f"{JOBSET_NAME_LABEL}={trainjob},{REPLICATED_JOB_LABEL}={TRAINER_NODE}"
    if index is not None:
        selector += f",{COMPLETION_INDEX_LABEL}={index}"
    return selector


def _newest_pod(cluster: Cluster, namespace: str, trainjob: str, index: int) -> Optional[dict]:
    pods = cluster.list("Pod", namespace, node_selector(trainjob, index))
    return newest_pods_by_node(pods).get(index)


def node_log_lines(
    cluster: Cluster,
    namespace: str,
    trainjob: str,
    index: int,
    *,
    follow: bool = False,
    poll: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
    stall_after: Optional[float] = None,
) -> Iterator[str]:
    """Lines (ending in newline) of node ``index``, as the node printed them: every reader of a
    scheduler's log (NeMo-Run, ``torchx log``) puts its own ``<role>/<replica>`` prefix before each,
    the node's index; lines that torchrun tees start with the global rank, ``[rank<N>]:``
    (``command.RANK_PREFIX_TEMPLATE``). Following, a warning line comes after every ``stall_after``
    seconds in which the running node printed nothing."""
    seen_pod: Optional[str] = None
    while True:
        pod = _newest_pod(cluster, namespace, trainjob, index)
        phase = ((pod or {}).get("status") or {}).get("phase")
        name = (pod or {}).get("metadata", {}).get("name")
        if pod is not None and phase != "Pending" and name != seen_pod:
            if seen_pod is not None:
                restart = pod["metadata"].get("labels", {}).get("jobset.sigs.k8s.io/restart-attempt", "?")
                yield f"--- gang restart: following pod {name} (restart attempt {restart}) ---\n"
            seen_pod = name
            lines = cluster.pod_log(name, namespace, container=TRAINER_NODE, follow=follow)
            if follow and stall_after:
                lines = warn_when_silent(lines, stall_after, lambda silent: (
                    f"--- warning: node {index} (pod {name}) has printed nothing for {silent:.0f} s while "
                    "running: a hung collective or a stuck data loader? ---"))
            for line in lines:
                yield line + "\n"
            if not follow:
                return
            continue
        if not follow:
            return
        # Following: stop once the job is over and no newer pod will come.
        state = job_status(cluster.get(TRAINJOB_KIND, trainjob, namespace), name=trainjob).state
        if state.name in ("SUCCEEDED", "FAILED", "CANCELLED"):
            return
        sleep(poll)


def warn_when_silent(lines: Iterator[str], seconds: float, warning: Callable[[float], str]) -> Iterator[str]:
    """``lines``, plus ``warning(silent seconds)`` after each ``seconds`` without a line.

    The blocking log stream is read by a thread, so that silence can be noticed while it waits.
    """
    items: queue.Queue = queue.Queue()
    end = object()

    def pump() -> None:
        try:
            for line in lines:
                items.put(line)
            items.put(end)
        except BaseException as error:  # noqa: BLE001 - handed to the reader, raised there
            items.put(error)

    threading.Thread(target=pump, name="log-silence", daemon=True).start()
    last = time.monotonic()
    while True:
        try:
            item = items.get(timeout=seconds)
        except queue.Empty:
            yield warning(time.monotonic() - last)
            continue
        if item is end:
            return
        if isinstance(item, BaseException):
            raise item
        last = time.monotonic()
        yield item


log = logging.getLogger(__name__)


def node_log_path(job_dir: str, index: int) -> str:
    return os.path.join(job_dir, "logs", f"node-{index}.log")


def save_node_logs(cluster: Cluster, namespace: str, pods: dict[int, dict], directory: str) -> str:
    """Write the log of each node that has no file yet (following logs writes them as it
    goes) to ``directory/node-<i>.log``; the directory, or "" if it cannot be written."""
    try:
        os.makedirs(directory, exist_ok=True)
        for index, pod in sorted(pods.items()):
            path = os.path.join(directory, f"node-{index}.log")
            if os.path.exists(path):
                continue
            try:
                lines = list(cluster.pod_log(pod["metadata"]["name"], namespace, container=TRAINER_NODE))
            except ClusterError as e:
                # e.g. 400 PodInitializing: a failed init container (preflight) kept `node` from starting.
                lines = [f"(no log of node {index}: {e.server_message or e})"]
            with open(path, "w") as f:
                f.writelines(line + "\n" for line in lines)
        return directory
    except OSError as e:
        log.warning("could not save the node logs to %s: %s", directory, e)
        return ""


def tee_to_file(lines: Iterator[str], path: str) -> Iterator[str]:
    """Pass ``lines`` through, appending each to ``path`` (the node's log next to the job)."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        out = open(path, "a")
    except OSError as e:
        log.warning("not saving the log to %s: %s", path, e)
        yield from lines
        return
    with out:
        for line in lines:
            out.write(line)
            out.flush()
            yield line


#: Lines of each node kept in memory while a job is watched (``NodeLogKeeper``).
KEEP_LINES = 2000
#: Nodes followed by a ``NodeLogKeeper``: one streaming request each.
MAX_KEPT_NODES = 64


class _KeeperStopped(Exception):
    pass


class NodeLogKeeper:
    """While a job is waited for: follow each node's log in a daemon thread, keeping its last
    ``KEEP_LINES`` lines in memory, so that a node whose pod is deleted when another node fails
    (the Job controller deletes a failed Job's running pods, logs and all) still has its last
    lines to save. ``save`` writes them to ``<directory>/node-<i>.log`` for the nodes that have
    no file there yet (log following with ``tail_logs`` writes the whole log itself)."""

    def __init__(self, cluster: Cluster, namespace: str, trainjob: str, nodes: int, directory: str) -> None:
        self.directory = directory
        self._lines = {i: deque(maxlen=KEEP_LINES) for i in range(min(nodes, MAX_KEPT_NODES))}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        for index in self._lines:
            threading.Thread(target=self._follow, args=(cluster, namespace, trainjob, index), daemon=True,
                             name=f"keep-log-{trainjob}-{index}").start()

    def _follow(self, cluster: Cluster, namespace: str, trainjob: str, index: int) -> None:
        def sleep(seconds: float) -> None:
            if self._stopped.wait(seconds):
                raise _KeeperStopped

        try:
            for line in node_log_lines(cluster, namespace, trainjob, index, follow=True, sleep=sleep):
                with self._lock:
                    self._lines[index].append(line)
                if self._stopped.is_set():
                    return
        except _KeeperStopped:
            return
        except Exception as e:  # noqa: BLE001 - a lost stream only loses what it would have kept
            log.debug("stopped keeping the log of node %d of %s: %s", index, trainjob, e)

    def stop(self) -> None:
        """Stop following (a stream that is still open ends with its pod)."""
        self._stopped.set()

    def kept_lines(self) -> dict[int, list[str]]:
        """Node index -> the lines kept so far (for ``diagnosis``: ft_launcher's restarts while running)."""
        with self._lock:
            return {i: list(lines) for i, lines in self._lines.items()}

    def save(self) -> list[int]:
        """Write the kept lines of each node without a file yet; the nodes written."""
        written = []
        try:
            os.makedirs(self.directory, exist_ok=True)
            with self._lock:
                kept = {i: list(lines) for i, lines in self._lines.items() if lines}
            for index, lines in sorted(kept.items()):
                path = os.path.join(self.directory, f"node-{index}.log")
                if os.path.exists(path):
                    continue
                with open(path, "w") as f:
                    f.writelines(lines)
                written.append(index)
        except OSError as e:
            log.warning("could not save the node logs to %s: %s", self.directory, e)
        return written
