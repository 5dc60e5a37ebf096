"""Training progress from inside the pod: ``progress.report(step, total_steps, **metrics)``.

Runs in the training process, so it uses the standard library only (like ``pod/warm_start.py``); an image
can get it with ``pip install --no-deps nemo-kubeflow``, or by copying this one file next to the script.
Status (``nemo experiment status``, ``nemo-kubeflow status`` and ``watch``) shows what it reports: step N of
M, the rate, the ETA and the latest metrics (docs/progress.md).

* **Does nothing outside a TrainJob** (no ``PET_NNODES`` nor Trainer status server in the environment),
  and nothing on any rank but global rank 0 (``RANK``; else node 0, local rank 0).
* **Cheap**: at most one write per ``interval`` seconds (30 s by default; the last step is always written);
  calls in between only note the step. A step held back is written when the interval ends even if no call
  comes (a timer thread, armed once per interval): a loop that hangs is seen at the last step it reached.
* **Never crashes or blocks training**: the status server is written from a background thread (the call
  only hands over the latest report); every error is caught, logged once, and the server is tried again
  only after a backoff (doubling up to ``MAX_BACKOFF_S``); meanwhile reports go to the log line.

Two transports, chosen at run time:

1. **Trainer's status server** (Trainer >= v2.2 with the alpha feature gate ``TrainJobStatus``): the pods
   get ``KUBEFLOW_TRAINER_SERVER_URL``, ``KUBEFLOW_TRAINER_SERVER_CA_CERT`` (a file) and
   ``KUBEFLOW_TRAINER_SERVER_TOKEN`` (a projected service-account token file, rotated by the kubelet).
   A report is the Kubeflow SDK's request: ``POST`` of ``{"trainerStatus": {...}}`` with the token as a
   bearer token, verified against that CA; Trainer applies it to the TrainJob's ``status.trainerStatus``,
   which status reads with the TrainJob itself (no extra request).
2. **A marked line on rank 0's log** (``LINE_MARKER`` + JSON), where the gate is off: no cluster feature,
   no RBAC. Status reads it from node 0's log (one short log read per look at a running job), or from the
   node where rank 0 runs (ft_launcher can rank any node's agent first: observe/progress_view.py).
"""

from __future__ import annotations

import json
import logging
import math
import os
import ssl
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import IO, Any, Callable, Iterator, Mapping, Optional

#: Set by Trainer's TrainJobStatus plugin in the trainer containers (the status endpoint of this TrainJob).
SERVER_URL_ENV = "KUBEFLOW_TRAINER_SERVER_URL"
#: The path of the status server's CA certificate (a projected ConfigMap).
SERVER_CA_CERT_ENV = "KUBEFLOW_TRAINER_SERVER_CA_CERT"
#: The path of the projected service-account token (audience: this TrainJob's status endpoint).
SERVER_TOKEN_ENV = "KUBEFLOW_TRAINER_SERVER_TOKEN"
#: Set by Trainer's torch plugin in every trainer container: we run in a TrainJob.
TRAINJOB_ENV = "PET_NNODES"
#: ``off`` turns reporting off; ``log`` writes the log line even where the status server is offered.
MODE_ENV = "NEMO_KUBEFLOW_PROGRESS"
#: The start of a progress line on rank 0's log; the rest of the line is JSON (``LINE_FIELDS``).
LINE_MARKER = "[nemo-kubeflow progress] "
#: The JSON fields of a progress line (and of ``Report.as_line``).
LINE_FIELDS = ("step", "total_steps", "steps_per_second", "eta_seconds", "metrics", "time")
#: The metric names a status-server report carries besides the user's metrics (``status.trainerStatus``
#: has only a percentage, an ETA and named string metrics: step, total and rate travel as metrics).
STEP_METRIC, TOTAL_METRIC, RATE_METRIC = "step", "total_steps", "steps_per_second"
DEFAULT_INTERVAL_S = 30.0
#: The longest wait before the status server is tried again after failures.
MAX_BACKOFF_S = 600.0
#: Limits of ``status.trainerStatus.metrics`` (Trainer's CRD): items, and characters of a name or value.
MAX_METRICS, MAX_METRIC_CHARS = 256, 64
#: The SDK's request timeout; the request runs in the background thread, never in the training loop.
REQUEST_TIMEOUT_S = 5.0

log = logging.getLogger(__name__)


def in_trainjob(env: Mapping[str, str]) -> bool:
    """Whether this process runs in a TrainJob's trainer container."""
    return bool(env.get(TRAINJOB_ENV) or env.get(SERVER_URL_ENV))


def is_rank_zero(env: Mapping[str, str]) -> bool:
    """Global rank 0: ``RANK`` (torchrun's workers), else node 0's local rank 0 (a process torchrun did not start)."""
    if env.get("RANK") not in (None, ""):
        return env.get("RANK") == "0"
    node = env.get("PET_NODE_RANK") or env.get("JOB_COMPLETION_INDEX") or "0"
    return node == "0" and env.get("LOCAL_RANK", "0") == "0"


def _number(value: Any) -> Any:
    """A tensor or numpy scalar as a Python number (``.item()``); anything else as is."""
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return item()
        except Exception:  # a tensor of more than one element: shown as text
            return value
    return value


def metric_text(value: Any) -> str:
    """A metric's value as Trainer stores it: a string of at most 64 characters."""
    value = _number(value)
    if isinstance(value, float):
        text = "nan" if math.isnan(value) else format(value, ".6g")
    else:
        text = str(value)
    return text[:MAX_METRIC_CHARS] or "-"


def percent_done(step: Optional[int], total_steps: Optional[int]) -> Optional[int]:
    """``step`` of ``total_steps`` in whole percent, 0 to 100; None without both."""
    if step is None or not total_steps:
        return None
    return max(0, min(100, int(step * 100 // total_steps)))


def _rate(since: tuple[int, float], step: int, now: float) -> Optional[float]:
    """Steps per second from ``since`` (a step and its time) to ``step`` at ``now``; None without a new step
    or time between them."""
    if now <= since[1] or step <= since[0]:
        return None
    return (step - since[0]) / (now - since[1])


def _rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat()


class Report:
    """One progress report: the step reached, when, and what it implies."""

    def __init__(
        self,
        step: int,
        total_steps: Optional[int],
        metrics: Mapping[str, Any],
        at: float,
        steps_per_second: Optional[float],
    ):
        self.step, self.total_steps, self.at, self.steps_per_second = step, total_steps, at, steps_per_second
        self.metrics = {str(k)[:MAX_METRIC_CHARS]: metric_text(v) for k, v in metrics.items() if str(k)}

    @property
    def eta_seconds(self) -> Optional[int]:
        if not self.total_steps or not self.steps_per_second:
            return None
        return max(0, int(round((self.total_steps - self.step) / self.steps_per_second)))

    @property
    def percent(self) -> Optional[int]:
        return percent_done(self.step, self.total_steps)

    def trainer_status(self) -> dict:
        """``status.trainerStatus`` as the Kubeflow SDK's ``update_trainjob_status`` sends it."""
        status: dict[str, Any] = {"lastUpdatedTime": _rfc3339(self.at)}
        if self.percent is not None:
            status["progressPercentage"] = self.percent
        if self.eta_seconds is not None:
            status["estimatedRemainingSeconds"] = min(self.eta_seconds, 2**31 - 1)
        ours = self._own_metrics()
        metrics = {**ours, **{k: v for k, v in self.metrics.items() if k not in ours}}
        status["metrics"] = [{"name": k, "value": v} for k, v in list(metrics.items())[:MAX_METRICS]]
        return status

    def _own_metrics(self) -> dict[str, str]:
        """Step, total and rate, as metrics: ``status.trainerStatus`` has no field for them."""
        ours = {STEP_METRIC: str(self.step)}
        if self.total_steps:
            ours[TOTAL_METRIC] = str(self.total_steps)
        if self.steps_per_second is not None:
            ours[RATE_METRIC] = metric_text(float(self.steps_per_second))
        return ours

    def as_line(self) -> str:
        """The marked log line: ``LINE_MARKER`` then one JSON object of ``LINE_FIELDS``."""
        fields = dict(
            zip(
                LINE_FIELDS,
                (self.step, self.total_steps, self.steps_per_second, self.eta_seconds, self.metrics, _rfc3339(self.at)),
            )
        )
        return LINE_MARKER + json.dumps(fields, separators=(",", ":"))


class StatusServer:
    """Trainer's status server, written from one background thread with the newest pending report."""

    def __init__(
        self, url: str, ca_file: Optional[str], token_file: Optional[str], on_failure: Callable[[Report, str], None]
    ):
        self.url, self.ca_file, self.token_file, self._on_failure = url, ca_file, token_file, on_failure
        self._pending: Optional[Report] = None
        self._wake = threading.Condition()
        self._thread: Optional[threading.Thread] = None
        self.sent = 0

    def submit(self, report: Report) -> None:
        """Hand over ``report`` (replacing one not yet sent); never waits for the network."""
        with self._wake:
            self._pending = report
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="nemo-kubeflow-progress", daemon=True)
                self._thread.start()
            self._wake.notify()

    def flush(self, timeout: float) -> None:
        """Wait up to ``timeout`` for the pending report to be sent (at the end of training only)."""
        deadline = time.monotonic() + timeout
        with self._wake:
            while self._pending is not None and time.monotonic() < deadline:
                self._wake.wait(0.05)

    def _run(self) -> None:
        while True:
            with self._wake:
                while self._pending is None:
                    self._wake.wait()
                report = self._pending
            try:
                self.send(report)
                self.sent += 1
            except Exception as error:  # noqa: BLE001 - nothing may reach the training loop
                self._on_failure(report, describe_error(error))
            with self._wake:
                if self._pending is report:
                    self._pending = None
                self._wake.notify_all()

    def send(self, report: Report) -> None:
        """One POST, as the SDK makes it; raises on anything but 200. The token is read at each send (the
        kubelet rotates it); a 401 or 403 to a token that has changed since it was read (rotated meanwhile)
        is tried once more with the new one."""
        body = json.dumps({"trainerStatus": report.trainer_status()}).encode()
        token = self._token()
        try:
            self._post(body, token)
        except urllib.error.HTTPError as error:
            if error.code not in (401, 403) or self._token() == token:
                raise
            self._post(body, self._token())

    def _token(self) -> str:
        if not self.token_file:
            raise OSError(f"{SERVER_TOKEN_ENV} is not set")
        with open(self.token_file, encoding="utf-8") as f:
            return f.read().strip()

    def _post(self, body: bytes, token: str) -> None:
        # The CA file is read at each send too: Trainer's certificate can be renewed (the ConfigMap follows).
        context = ssl.create_default_context(
            cafile=self.ca_file if self.ca_file and os.path.exists(self.ca_file) else None
        )
        request = urllib.request.Request(
            self.url,
            data=body,
            method="POST",
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S, context=context) as response:
            response.read()


def describe_error(error: BaseException) -> str:
    """An error in a few words, without the request's headers (the token)."""
    if isinstance(error, urllib.error.HTTPError):
        try:
            message = json.loads(error.read() or b"{}").get("message", "")
        except Exception:  # noqa: BLE001
            message = ""
        return f"HTTP {error.code}" + (f": {message}" if message else "")
    if isinstance(error, urllib.error.URLError):
        return f"{type(error.reason).__name__}: {error.reason}"
    return f"{type(error).__name__}: {error}"


class Reporter:
    """Progress of one training run. ``report`` is safe to call every step, from rank 0 or any rank."""

    def __init__(
        self,
        total_steps: Optional[int] = None,
        *,
        interval: float = DEFAULT_INTERVAL_S,
        env: Optional[Mapping[str, str]] = None,
        stream: Optional[IO[str]] = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        timer: Optional[Callable[[float, Callable[[], None]], None]] = None,
    ):
        """``timer(delay, write)`` calls ``write`` after ``delay`` seconds of ``clock`` (the held-back step's
        write); by default a daemon thread, with the default clock only (a test's own clock brings its timer)."""
        env = os.environ if env is None else env
        self._timer = timer if timer is not None else (_thread_timer if clock is time.monotonic else None)
        self._timer_armed = False
        self.total_steps, self.interval = total_steps, max(0.0, float(interval))
        self._stream, self._clock, self._wall = stream, clock, wall_clock
        mode = (env.get(MODE_ENV) or "").strip().lower()
        self.enabled = mode != "off" and in_trainjob(env) and is_rank_zero(env)
        self.server = self._status_server(env, mode)
        self._lock = threading.Lock()
        self._first: Optional[tuple[int, float]] = None
        self._written: Optional[tuple[int, float]] = None
        self._unwritten: Optional[Report] = None
        self._unwritten_at = 0.0
        self._server_back_at = float("-inf")
        self._backoff = 0.0
        self._failed_said = False
        self.writes = 0

    def _status_server(self, env: Mapping[str, str], mode: str) -> Optional[StatusServer]:
        """Trainer's status server, where the pod is offered one and ``MODE_ENV`` does not force the log line."""
        if not self.enabled or mode == "log" or not env.get(SERVER_URL_ENV):
            return None
        return StatusServer(
            env[SERVER_URL_ENV], env.get(SERVER_CA_CERT_ENV), env.get(SERVER_TOKEN_ENV), self._server_failed
        )

    @property
    def transport(self) -> str:
        """``status-server``, ``log`` or ``off`` (what the next write uses)."""
        if not self.enabled:
            return "off"
        return "status-server" if self.server is not None and self._clock() >= self._server_back_at else "log"

    def report(self, step: int, total_steps: Optional[int] = None, **metrics: Any) -> bool:
        """Note that ``step`` is reached (of ``total_steps``); write it when the interval has passed or it is
        the last step. Returns whether this call wrote. Never raises."""
        if not self.enabled:
            return False
        try:
            return self._report(int(_number(step)), total_steps, metrics)
        except Exception as error:  # noqa: BLE001 - a bad metric must not stop training
            self._say_once(f"progress report failed ({describe_error(error)}); training goes on")
            return False

    def _report(self, step: int, total_steps: Optional[int], metrics: Mapping[str, Any]) -> bool:
        now = self._clock()
        with self._lock:
            if total_steps is not None:
                self.total_steps = int(_number(total_steps)) or None
            if self._first is None:
                self._first = (step, now)
            if self._written is not None and step == self._written[0]:
                return False  # no new step: nothing new to say (status sees the step's time)
            rate = _rate(self._written or self._first, step, now)
            report = Report(step, self.total_steps, metrics, self._wall(), rate)
            if not self._due(step, now):
                self._unwritten, self._unwritten_at = report, now
                self._arm_timer(now)
                return False
            self._written, self._unwritten = (step, now), None
        self._write(report)
        return True

    def _arm_timer(self, now: float) -> None:
        """Have the held-back report written when the interval ends (once armed, until it fires). Under the lock."""
        if self._timer is None or self._timer_armed or self._written is None:
            return
        self._timer_armed = True
        self._timer(max(0.0, self._written[1] + self.interval - now), self._write_held)

    def _write_held(self) -> None:
        """The timer's: write the report the interval held back, unless a call wrote since (or the interval has
        not ended since the last write: armed again for the rest). Never raises."""
        try:
            with self._lock:
                self._timer_armed = False
                report, now = self._unwritten, self._clock()
                if report is None or self._written is None:
                    return
                if now - self._written[1] < self.interval:
                    self._arm_timer(now)
                    return
                # When the step was reached: the next rate is measured from it.
                self._written, self._unwritten = (report.step, self._unwritten_at), None
            self._write(report)
        except Exception as error:  # noqa: BLE001
            self._say_once(f"progress report failed ({describe_error(error)}); training goes on")

    def _due(self, step: int, now: float) -> bool:
        """Whether ``step`` is written now: the first write, the interval passed since the last, or the last step."""
        if self._written is None or now - self._written[1] >= self.interval:
            return True
        return self.total_steps is not None and step >= self.total_steps

    def flush(self, timeout: float = 2 * REQUEST_TIMEOUT_S) -> None:
        """Write the newest report the interval held back (at the end of training), and wait for it."""
        if not self.enabled:
            return
        with self._lock:
            report, self._unwritten = self._unwritten, None
        try:
            if report is not None:
                self._write(report)
            if self.server is not None:
                self.server.flush(timeout)
        except Exception as error:  # noqa: BLE001
            self._say_once(f"progress report failed ({describe_error(error)}); training goes on")

    def _write(self, report: Report) -> None:
        self.writes += 1
        if self.transport == "status-server" and self.server is not None:
            self.server.submit(report)
        else:
            self._line(report)

    def _line(self, report: Report) -> None:
        stream = self._stream or sys.stdout
        stream.write(report.as_line() + "\n")
        stream.flush()

    def _server_failed(self, report: Report, why: str) -> None:
        """From the sender thread: say it once, back off, and put this report on the log instead."""
        self._backoff = min(MAX_BACKOFF_S, max(self.interval, 1.0) if not self._backoff else self._backoff * 2)
        self._server_back_at = self._clock() + self._backoff
        self._say_once(
            f"cannot write progress to Trainer's status server ({why}); writing it to this log "
            f"instead, and trying the server again after a backoff"
        )
        try:
            self._line(report)
        except Exception:  # noqa: BLE001
            pass

    def _say_once(self, message: str) -> None:
        if not self._failed_said:
            self._failed_said = True
            log.warning("nemo-kubeflow progress: %s", message)


def _thread_timer(delay: float, call: Callable[[], None]) -> None:
    """``Reporter``'s default timer: ``call`` in a daemon thread after ``delay`` seconds."""
    thread = threading.Timer(delay, call)
    thread.daemon = True
    thread.start()


_default: Optional[Reporter] = None
_default_lock = threading.Lock()


def reporter() -> Reporter:
    """The process's reporter (made at the first call, from this process's environment)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Reporter()
        return _default


def report(step: int, total_steps: Optional[int] = None, **metrics: Any) -> bool:
    """Report that training reached ``step`` of ``total_steps``, with ``metrics`` (loss=..., lr=...).

    A no-op outside a TrainJob and on every rank but 0; throttled (``DEFAULT_INTERVAL_S``); never raises."""
    return reporter().report(step, total_steps, **metrics)


@contextmanager
def reporting(total_steps: Optional[int] = None, *, interval: float = DEFAULT_INTERVAL_S) -> Iterator[Reporter]:
    """A reporter for one training run; writes what the interval held back when the block ends."""
    global _default
    made = Reporter(total_steps, interval=interval)
    with _default_lock:
        previous, _default = _default, made
    try:
        yield made
    finally:
        made.flush()
        with _default_lock:
            _default = previous


# --- adapters for the loops users already have --------------------------------------------------------------


def _scalar_metrics(values: Mapping[str, Any]) -> dict[str, Any]:
    """The metrics that are one number (a tensor of one element, a float, an int)."""
    found = {}
    for name, value in values.items():
        value = _number(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            found[str(name)] = value
    return found


def lightning_callback(total_steps: Optional[int] = None, *, interval: float = DEFAULT_INTERVAL_S) -> Any:
    """A PyTorch Lightning callback that reports each training batch's global step and logged metrics.

    Imports ``lightning.pytorch`` (else ``pytorch_lightning``) only when called. The total is
    ``total_steps``, else the trainer's ``max_steps``, else its ``estimated_stepping_batches``."""
    try:
        from lightning.pytorch import Callback
    except ImportError:
        from pytorch_lightning import Callback

    class ProgressCallback(Callback):
        def __init__(self) -> None:
            super().__init__()
            self.reporter = Reporter(total_steps, interval=interval)

        def _total(self, trainer: Any) -> Optional[int]:
            if total_steps:
                return total_steps
            max_steps = getattr(trainer, "max_steps", -1) or -1
            if max_steps > 0:
                return int(max_steps)
            estimated = getattr(trainer, "estimated_stepping_batches", None)
            return int(estimated) if isinstance(estimated, (int, float)) and math.isfinite(estimated) else None

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            if getattr(trainer, "global_rank", 0) != 0:
                return
            try:
                metrics = _scalar_metrics(getattr(trainer, "callback_metrics", None) or {})
                self.reporter.report(trainer.global_step, self._total(trainer), **metrics)
            except Exception as error:  # noqa: BLE001
                self.reporter._say_once(f"progress report failed ({describe_error(error)}); training goes on")

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            self.reporter.flush()

    return ProgressCallback()


def hf_callback(total_steps: Optional[int] = None, *, interval: float = DEFAULT_INTERVAL_S) -> Any:
    """A transformers ``TrainerCallback`` that reports each optimizer step's ``global_step`` with the last logged
    scalars (``loss``, ``learning_rate``, ``grad_norm``...), as ``lightning_callback`` does for Lightning.

    Imports ``transformers`` only when called. The total is ``total_steps``, else the trainer's ``max_steps``.
    Where Trainer's status server is offered, transformers adds its own ``KubeflowCallback`` as well (status reads
    either as step N of M; this one adds the rate, the log line where there is no server, and our interval)."""
    from transformers import TrainerCallback

    class ProgressCallback(TrainerCallback):
        def __init__(self) -> None:
            super().__init__()
            self.reporter = Reporter(total_steps, interval=interval)
            self.metrics: dict[str, Any] = {}

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            if getattr(state, "is_world_process_zero", True) and logs:
                self.metrics.update(_scalar_metrics(logs))

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if not getattr(state, "is_world_process_zero", True):
                return
            try:
                max_steps = getattr(state, "max_steps", 0) or 0
                total = total_steps or (int(max_steps) if max_steps > 0 else None)
                self.reporter.report(state.global_step, total, **self.metrics)
            except Exception as error:  # noqa: BLE001
                self.reporter._say_once(f"progress report failed ({describe_error(error)}); training goes on")

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.reporter.flush()

    return ProgressCallback()


def step_hook(total_steps: Optional[int] = None, *, interval: float = DEFAULT_INTERVAL_S) -> Callable[..., bool]:
    """A step-end hook for NeMo / Megatron-Bridge style loops: ``hook(step_or_context, total_steps=None, **metrics)``.

    Given a Megatron-Bridge callback context (``context.state.train_state.step``, the total from
    ``context.state.cfg.train.train_iters``, metrics from ``context.loss_dict``), it reads those; given an
    int, it reports that step. Register it as Megatron-Bridge's ``on_train_step_end`` callback, or call it
    from your own loop. A ``total_steps`` given to the hook is the run's total, as ``report``'s (not a metric):
    it replaces the one given to ``step_hook`` and the context's."""
    hook_reporter = Reporter(total_steps, interval=interval)
    hook_total = total_steps

    def hook(context: Any, total_steps: Optional[int] = None, **metrics: Any) -> bool:
        try:
            if isinstance(context, int):
                return hook_reporter.report(context, total_steps, **metrics)
            state = getattr(context, "state", None)
            train_state = getattr(state, "train_state", None)
            step = getattr(train_state, "step", None)
            if step is None:
                return False
            total = total_steps or hook_total
            total = total or getattr(getattr(getattr(state, "cfg", None), "train", None), "train_iters", None)
            found = _scalar_metrics(getattr(context, "loss_dict", None) or {})
            return hook_reporter.report(step, total, **{**found, **metrics})
        except Exception as error:  # noqa: BLE001
            hook_reporter._say_once(f"progress report failed ({describe_error(error)}); training goes on")
            return False

    hook.reporter = hook_reporter  # type: ignore[attr-defined]
    hook.flush = hook_reporter.flush  # type: ignore[attr-defined]
    return hook
