"""Log-emitter containers without a process: one thread writes the logs of many pods.

A benchmark of log following at 1,024 nodes needs 1,024 running pods that print, which as 1,024
processes (each under its own init) do not fit a small machine. A container whose environment has
``NEMO_KUBEFLOW_LOCAL_LOG_EMITTER="LINES RATE"`` is therefore not exec'd: the kubelet hands it to the
one ``LogEmitters`` thread of the node, which appends the lines due to the container run's log
(the same ``ContainerLog`` a process's output goes to, so ``pods/{name}/log`` with ``follow``,
``sinceTime``, ``tailLines`` serves them as it serves any container), ``LINES`` lines at ``RATE``
lines/s, each ``LOG <node> 0 <seq> <unix time>`` as ``benchmarks/log_emitter.py`` prints them
(node: the container's ``PET_NODE_RANK``, else ``JOB_COMPLETION_INDEX``, else 0). Everything else
about the pod is the kubelet's as usual: scheduling, volumes, environment, status (running, then
``Completed`` with exit code 0 once every line is out), events, deletion (143 on SIGTERM, 137 on
SIGKILL, at once: there is no program to wait for).
"""

from __future__ import annotations

import itertools
import subprocess
import threading
import time
from typing import Optional

from nemo_kubeflow_local.apiserver.container_logs import ContainerLog

#: The container variable that makes a container an emulated log emitter: "LINES RATE".
EMITTER_ENV = "NEMO_KUBEFLOW_LOCAL_LOG_EMITTER"
#: Seconds between the emitter's rounds: the lines due are written together, each with its own time.
TICK_SECONDS = 0.1
#: Exit codes of a run ended by SIGTERM and by SIGKILL (128 + the signal, as a shell reports them).
TERMINATED, KILLED = 143, 137


class EmitterSpecError(OSError):
    """The variable's value cannot be read: the container fails to start (StartError)."""


def parse_spec(value: str) -> tuple[int, float]:
    """``"LINES RATE"`` -> (lines, lines per second)."""
    parts = value.split()
    try:
        lines, rate = int(parts[0]), float(parts[1])
        if len(parts) != 2 or lines < 0 or rate <= 0:
            raise ValueError
    except (ValueError, IndexError):
        raise EmitterSpecError(
            f'{EMITTER_ENV}="{value}": expected "LINES RATE" (a count >= 0 and lines per second > 0)'
        ) from None
    return lines, rate


class EmitterRun:
    """One emulated container run: what the kubelet uses of a ``ContainerRun`` (``running``,
    ``terminate``, ``kill``, ``wait``, ``process.wait``, ``container_id``, ``log``)."""

    _ids = itertools.count(1)

    def __init__(self, env: dict[str, str], log: ContainerLog, emitters: "LogEmitters"):
        self.lines, self.rate = parse_spec(env[EMITTER_ENV])
        self.node = env.get("PET_NODE_RANK") or env.get("JOB_COMPLETION_INDEX") or "0"
        self.log = log
        self.container_id = f"local://emitter-{next(self._ids)}"
        self.process = self  # `run.process.wait(timeout)` as for a process
        self.start = time.time()
        self.written = 0
        self._code: Optional[int] = None
        self._ended = threading.Event()
        self._emitters = emitters
        emitters.add(self)

    def running(self) -> bool:
        return self._code is None

    def terminate(self) -> None:
        self._end(TERMINATED)

    def kill(self) -> None:
        self._end(KILLED)

    def wait(self, timeout: Optional[float] = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"emitter {self.container_id}", timeout or 0.0)
        assert self._code is not None
        return self._code

    def poll(self) -> Optional[int]:
        return self._code

    def emit(self, now: float) -> None:
        """Write the lines due by ``now`` (called by the emitters' thread only); end after the last."""
        due = min(self.lines, int((now - self.start) * self.rate) + 1)
        if due > self.written:
            stamp = f"{now:.6f}"
            self.log.write_lines([f"LOG {self.node} 0 {n} {stamp}".encode() for n in range(self.written, due)])
            self.written = due
        if self.written >= self.lines:
            self._end(0)

    def _end(self, code: int) -> None:
        with self._emitters.lock:
            if self._code is not None:
                return
            self._code = code
        self._emitters.remove(self)
        self.log.finish()
        self._ended.set()


class LogEmitters:
    """The node's one thread that writes every emulated emitter's lines, every ``TICK_SECONDS``.
    Started with the first run, ended by ``stop``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._runs: dict[int, EmitterRun] = {}
        self._thread: Optional[threading.Thread] = None
        self._stopped = threading.Event()

    def add(self, run: EmitterRun) -> None:
        with self.lock:
            self._runs[id(run)] = run
            if self._thread is None and not self._stopped.is_set():
                self._thread = threading.Thread(target=self._loop, daemon=True, name="log-emitters")
                self._thread.start()

    def remove(self, run: EmitterRun) -> None:
        with self.lock:
            self._runs.pop(id(run), None)

    def count(self) -> int:
        """Runs emitting now."""
        with self.lock:
            return len(self._runs)

    def stop(self) -> None:
        """Kill every run still emitting and end the thread."""
        self._stopped.set()
        with self.lock:
            runs = list(self._runs.values())
        for run in runs:
            run.kill()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def _loop(self) -> None:
        while not self._stopped.wait(TICK_SECONDS):
            with self.lock:
                runs = list(self._runs.values())
            now = time.time()
            for run in runs:
                if run.running():
                    run.emit(now)
