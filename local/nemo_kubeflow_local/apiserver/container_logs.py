"""Container logs: written like the kubelet's CRI log files, served like `pods/{name}/log`.

Each container run (restart) gets its own file, `<pod dir>/logs/<container>/<restartCount>.log`, in
the CRI format `<RFC3339Nano time> stdout <F|P> <text>` (P marks a line split without a newline).

The kubelet writes them (kubelet/process.py, log_emitters.py) and the API server serves them: the store
of logs sits with the API server, below the kubelet (docs/local-cluster.md, "Layers").
"""

from __future__ import annotations

import bisect
import datetime as dt
import os
import threading
from array import array
from pathlib import Path
from typing import Iterator, Optional

from nemo_kubeflow_local.apiserver import resources as R
from nemo_kubeflow_local.apiserver.apierrors import ApiError, bad_request
from nemo_kubeflow_local.apiserver.store import Store

#: containerd splits lines longer than this into partial (P) records.
MAX_LINE = 16 * 1024
#: A follow stream sends what gathered in this long after it woke up: one chunk per batch of a
#: chatty container's lines rather than one per line (128 such streams stay cheap).
FOLLOW_BATCH_S = 0.05


class ContainerLog:
    """The log of one container run; readers wait on it while the run goes on.

    An index of where each record starts (and where each second starts) lets a read with
    `tailLines` or `sinceTime` seek to its first record instead of reading the whole file: a
    follower that polls a long log pays for what it gets, not for the log's length."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = open(path, "ab")
        self._cond = threading.Condition()
        self._size = 0
        #: Offset of each record.
        self._starts = array("q")
        #: (second "YYYY-MM-DDTHH:MM:SS", index of its first record), in order.
        self._seconds: list[tuple[str, int]] = []
        self.finished = False

    def write(self, text: bytes, partial: bool = False) -> None:
        self.write_lines([text], partial_last=partial)

    def write_lines(self, texts: list[bytes], partial_last: bool = False) -> None:
        """Append one record per text, all stamped now, in one write: the lines that one read of
        the container's pipe brought (a runtime stamps what it reads together alike)."""
        if not texts:
            return
        now = dt.datetime.now(dt.timezone.utc)
        stamp = now.strftime("%Y-%m-%dT%H:%M:%S.%f000Z").encode()
        full, partial = stamp + b" stdout F ", stamp + b" stdout P "
        records = [full + text + b"\n" for text in texts]
        if partial_last:
            records[-1] = partial + texts[-1] + b"\n"
        second = stamp[:19].decode()
        with self._cond:
            if self.finished:
                return
            if not self._seconds or self._seconds[-1][0] != second:
                self._seconds.append((second, len(self._starts)))
            offset = self._size
            for record in records:
                self._starts.append(offset)
                offset += len(record)
            self._file.write(b"".join(records))
            self._file.flush()
            self._size = offset
            self._cond.notify_all()

    def finish(self) -> None:
        with self._cond:
            if not self.finished:
                self.finished = True
                self._file.close()
            self._cond.notify_all()

    def read_from(self, offset: int) -> tuple[bytes, int]:
        """Whole records after `offset`, and the offset after them."""
        with self._cond:
            size = self._size
        with open(self.path, "rb") as f:
            f.seek(offset)
            data = f.read(size - offset)
        return data, offset + len(data)

    def start_offset(self, since: Optional[str] = None, tail: Optional[int] = None) -> int:
        """Where the records a read wants start: the first of second `since` or later, and not
        before the last `tail` records."""
        with self._cond:
            first = 0
            if since is not None:
                at = bisect.bisect_left(self._seconds, (since, -1))
                first = self._seconds[at][1] if at < len(self._seconds) else len(self._starts)
            if tail is not None:
                first = max(first, len(self._starts) - tail)
            return self._starts[first] if first < len(self._starts) else self._size

    def wait_beyond(self, offset: int, timeout: float) -> None:
        with self._cond:
            if self._size <= offset and not self.finished:
                self._cond.wait(timeout)

    def size(self) -> int:
        with self._cond:
            return self._size

    def tail(self, lines: int) -> str:
        """The last `lines` lines as plain text (for termination messages)."""
        if not lines:
            return ""
        data, _ = self.read_from(self.start_offset(tail=lines))
        return "".join(render(data, False)[-lines:])


def render(data: bytes, timestamps: bool, since: Optional[dt.datetime] = None) -> list[str]:
    out = []
    after = since.strftime("%Y-%m-%dT%H:%M:%S") if since is not None else None
    for record in data.decode("utf-8", "replace").splitlines():
        stamp, _, rest = record.partition(" ")
        _stream, _, rest = rest.partition(" ")
        tag, _, text = rest.partition(" ")
        if after is not None and stamp < after:
            continue
        line = text + ("" if tag == "P" else "\n")
        out.append(f"{stamp} {line}" if timestamps else line)
    return out


class SilentLog:
    """The log of a container that runs without a process (``status_only_pods``): what a kubelet serves for a
    running container that prints nothing. A read gets no line; a follow stream stays open, silent, until the
    container is no longer running (its pod ended, was deleted or replaced), as a real one does."""

    def __init__(self, store: Store, namespace: str, name: str, uid: str, container: str) -> None:
        self._store, self._namespace, self._name, self._uid, self._container = store, namespace, name, uid, container

    @property
    def finished(self) -> bool:
        try:
            pod = self._store.snapshot(R.PODS, self._namespace, self._name)
        except ApiError:
            return True
        if pod["metadata"].get("uid") != self._uid:
            return True
        return not _running_container(pod, self._container)

    def read_from(self, offset: int) -> tuple[bytes, int]:
        return b"", offset

    def start_offset(self, since: Optional[str] = None, tail: Optional[int] = None) -> int:
        return 0

    def wait_beyond(self, offset: int, timeout: float) -> None:
        threading.Event().wait(timeout)

    def size(self) -> int:
        return 0


def _running_container(pod: dict, container: str) -> bool:
    status = pod.get("status") or {}
    return any(
        s.get("name") == container and (s.get("state") or {}).get("running") is not None
        for s in (status.get("containerStatuses") or []) + (status.get("initContainerStatuses") or [])
    )


class LogStore:
    """Every container run's log, by pod uid and container name. With ``silent_running`` (status-only pods: no
    process, so no run), a running container without a run reads as one that printed nothing (``SilentLog``)."""

    def __init__(self, silent_running: bool = False) -> None:
        self._lock = threading.Lock()
        self._runs: dict[tuple[str, str], list[ContainerLog]] = {}
        self._silent_running = silent_running
        self._store: Optional[Store] = None

    def start_run(self, pod_uid: str, container: str, path: Path) -> ContainerLog:
        log = ContainerLog(path)
        with self._lock:
            self._runs.setdefault((pod_uid, container), []).append(log)
        return log

    def runs(self, pod_uid: str, container: str) -> list[ContainerLog]:
        with self._lock:
            return list(self._runs.get((pod_uid, container), ()))

    def finish_all(self) -> None:
        with self._lock:
            runs = [log for logs in self._runs.values() for log in logs]
        for log in runs:
            log.finish()

    def select(self, store: Store, namespace: str, name: str, query: dict) -> "ContainerLog | SilentLog":
        """The run `pods/{name}/log` reads, with the API server's errors for the others."""
        self._store = store
        return self.select_for(store.snapshot(R.PODS, namespace, name), query)

    def select_for(self, pod: dict, query: dict) -> "ContainerLog | SilentLog":
        """The run of `pod` a log request (`container`, `previous`) reads; ApiError 400 for none."""
        name = pod["metadata"]["name"]
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        names = [c["name"] for c in spec.get("containers") or []]
        init_names = [c["name"] for c in spec.get("initContainers") or []]
        container = query.get("container")
        if not container:
            if len(names) != 1:
                extra = f" or one of the init containers: [{' '.join(init_names)}]" if init_names else ""
                raise bad_request(
                    f"a container name must be specified for pod {name}, choose one of: [{' '.join(names)}]{extra}"
                )
            container = names[0]
        if container not in names + init_names:
            raise bad_request(f"container {container} is not valid for pod {name}")
        runs = self.runs(pod["metadata"]["uid"], container)
        if query.get("previous") == "true":
            if len(runs) < 2:
                raise bad_request(f'previous terminated container "{container}" in pod "{name}" not found')
            return runs[-2]
        if not runs and self._silent_running and self._store is not None and _running_container(pod, container):
            meta = pod["metadata"]
            return SilentLog(self._store, meta["namespace"], name, meta["uid"], container)
        if not runs:
            statuses = (status.get("containerStatuses") or []) + (status.get("initContainerStatuses") or [])
            state: dict = next((s.get("state", {}) for s in statuses if s.get("name") == container), {})
            reason = (state.get("waiting") or {}).get("reason") or (
                "PodInitializing" if container in names and init_names else "ContainerCreating"
            )
            raise bad_request(f'container "{container}" in pod "{name}" is waiting to start: {reason}')
        return runs[-1]


def stream(
    log: "ContainerLog | SilentLog", query: dict, stopping: threading.Event, cut: Optional[threading.Event] = None
) -> Iterator[bytes]:
    """The body of a log request: everything (or the tail), then new lines while `follow` is set,
    until the container run ends, the server stops, or `cut` is set (a test closing the stream)."""
    cut = cut or threading.Event()
    timestamps = query.get("timestamps") == "true"
    since = None
    if query.get("sinceSeconds"):
        since = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=int(query["sinceSeconds"]))
    elif query.get("sinceTime"):
        since = dt.datetime.fromisoformat(query["sinceTime"].replace("Z", "+00:00"))
    limit = int(query["limitBytes"]) if query.get("limitBytes") else None
    tail = int(query["tailLines"]) if query.get("tailLines") not in (None, "") else None
    # Seek to the first record wanted (the same second as `since` still goes through `render`).
    offset = log.start_offset(
        since.strftime("%Y-%m-%dT%H:%M:%S") if since else None, max(tail, 0) if tail is not None else None
    )
    data, offset = log.read_from(offset)
    lines = render(data, timestamps, since)
    if tail is not None:
        lines = lines[-tail:] if tail > 0 else []
    sent = 0
    chunk = "".join(lines).encode()
    while True:
        if limit is not None:
            chunk = chunk[: max(0, limit - sent)]
        if chunk:
            sent += len(chunk)
            yield chunk
        if query.get("follow") != "true" or (limit is not None and sent >= limit):
            return
        while log.size() <= offset and not log.finished and not stopping.is_set() and not cut.is_set():
            log.wait_beyond(offset, 0.5)
        if log.size() <= offset or cut.is_set():
            return  # this run ended (or the server is stopping, or the stream was cut)
        # Let a busy container's lines gather: one chunk per FOLLOW_BATCH_S, not one per line.
        stopping.wait(FOLLOW_BATCH_S)
        data, offset = log.read_from(offset)
        chunk = "".join(render(data, timestamps, since)).encode()


def pump(fd: int, log: ContainerLog) -> None:
    """Copy a container's output pipe into its log until every writer has closed it: the whole
    lines of each read in one append (a line longer than MAX_LINE in partial records)."""
    pending = b""
    try:
        while True:
            data = os.read(fd, 65536)
            if not data:
                break
            pending += data
            *lines, pending = pending.split(b"\n")
            log.write_lines(lines)
            while len(pending) >= MAX_LINE:
                log.write(pending[:MAX_LINE], partial=True)
                pending = pending[MAX_LINE:]
        if pending:
            log.write(pending, partial=True)
    finally:
        os.close(fd)
        log.finish()
