"""What every benchmark family shares: result rows, timing, the machine, the local cluster (in a
child process) and the two executors under comparison.

"ours" is ``nemo_kubeflow.KubeflowExecutor``; "baseline" is NeMo-Run 0.11.1's built-in
``nemo_run.KubeflowExecutor`` (torchx scheduler ``kubeflow``), which sends one bare TrainJob
that points at an existing runtime and ships no code.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from multiprocessing.managers import BaseManager
from pathlib import Path
from typing import Callable, Iterator, Optional

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
NAMESPACE = "default"
#: The runtime the baseline executor points at (``runtime_ref``), as Trainer's manifests install it.
UPSTREAM_RUNTIME = "torch-distributed"
#: Shipped by "ours" as the task's code (also the log workload).
WORKLOAD_FILE = "log_emitter.py"


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------


@dataclass
class Metric:
    """One row of the results table. Targets apply to ``ours`` (``at_most``/``at_least``) or
    to ``ours / baseline`` (``ratio_at_most``)."""

    name: str
    ours: Optional[float]
    baseline: Optional[float] = None
    unit: str = ""
    at_most: Optional[float] = None
    at_least: Optional[float] = None
    ratio_at_most: Optional[float] = None
    note: str = ""

    @property
    def ratio(self) -> Optional[float]:
        if self.ours is None or not self.baseline:
            return None
        return self.ours / self.baseline

    @property
    def target(self) -> str:
        parts = []
        if self.at_most is not None:
            parts.append(f"<= {fmt(self.at_most)}{_unit(self.unit)}")
        if self.at_least is not None:
            parts.append(f">= {fmt(self.at_least)}{_unit(self.unit)}")
        if self.ratio_at_most is not None:
            parts.append(f"ratio <= {fmt(self.ratio_at_most)}")
        return ", ".join(parts)

    @property
    def met(self) -> Optional[bool]:
        checks = []
        if self.ours is not None:
            if self.at_most is not None:
                checks.append(self.ours <= self.at_most)
            if self.at_least is not None:
                checks.append(self.ours >= self.at_least)
        if self.ratio_at_most is not None and self.ratio is not None:
            checks.append(self.ratio <= self.ratio_at_most)
        return all(checks) if checks else None


@dataclass
class Detail:
    """A titled block of markdown printed after the table (breakdowns, profiles)."""

    title: str
    lines: list[str]


def _unit(unit: str) -> str:
    return f" {unit}" if unit else ""


def fmt(value: Optional[float]) -> str:
    if value is None:
        return "n/a"
    if value == int(value) and abs(value) < 1e6:
        return str(int(value))
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    if abs(value) >= 0.1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table whose columns line up in a terminal too."""
    widths = [max(len(str(r[i])) for r in [headers] + rows) for i in range(len(headers))]

    def line(cells):
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"

    return [line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in rows]


# --------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------


def median(values) -> float:
    return statistics.median(values)


def percentile(values, q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


@contextlib.contextmanager
def stopwatch() -> Iterator[list]:
    """``with stopwatch() as t: ...`` then ``t[0]`` is the elapsed seconds."""
    box: list = [0.0]
    start = time.perf_counter()
    try:
        yield box
    finally:
        box[0] = time.perf_counter() - start


def interleaved(repeat: int, **variants: Callable[[], float]) -> dict[str, list[float]]:
    """Run each variant ``repeat`` times, alternating them (and the order each round), so drift
    from other load on the machine hits every variant alike. Each call returns its measurement."""
    samples: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for i in range(repeat):
        for name in names if i % 2 == 0 else reversed(names):
            samples[name].append(variants[name]())
    return samples


#: A busy loop that looks every million turns (a few hundredths of a second) whether its parent still runs.
_BUSY_LOOP = """
import os
parent = os.getppid()
while os.getppid() == parent:
    for _ in range(1_000_000):
        pass
"""


@contextlib.contextmanager
def cpu_hog(processes: Optional[int] = None) -> Iterator[int]:
    """A busy loop per core (``processes``, default ``os.cpu_count()``) beside what runs inside the
    block, as on a shared or busy machine: a user's own training, a build, other sessions. Normal
    priority, so the scheduler shares the cores fairly between them and the benchmark. Yields how many
    were started; stops exactly those (by process id) when the block ends. Each also ends by itself once its
    parent is gone (a run killed mid-block), so a killed run leaves no busy loop under the next."""
    count = processes or os.cpu_count() or 1
    hogs = [
        subprocess.Popen(
            [sys.executable, "-c", _BUSY_LOOP],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(count)
    ]
    try:
        time.sleep(0.2)  # running, not starting up, when the block begins
        yield count
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()


# --------------------------------------------------------------------------------------------
# The machine
# --------------------------------------------------------------------------------------------

PACKAGES = (
    "nemo-kubeflow",
    "nemo_run",
    "torchx",
    "kubeflow",
    "kubeflow-trainer-api",
    "kubernetes",
    "kubernetes-validate",
    "fiddle",
    "torch",
)


def machine() -> dict[str, str]:
    import importlib.metadata as md

    cpu = platform.processor() or "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    versions = []
    for name in PACKAGES:
        with contextlib.suppress(md.PackageNotFoundError):
            versions.append(f"{name} {md.version(name)}")
    commit = _git("rev-parse", "--short", "HEAD")
    if commit and _git("status", "--porcelain", "--untracked-files=no"):
        commit += " (with uncommitted changes)"
    info = {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "memory": _memory(),
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
        "packages": ", ".join(versions),
    }
    if commit:
        info["commit"] = commit
    return info


def _memory() -> str:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                return f"{int(line.split()[1]) / 1024 / 1024:.0f} GiB"
    return "?"


def _git(*args: str) -> str:
    try:
        out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


# --------------------------------------------------------------------------------------------
# The local cluster, in a child process
# --------------------------------------------------------------------------------------------


class _ClusterService:
    """Runs in the manager's process: a ``LocalCluster`` and the inspection calls we need."""

    def __init__(self) -> None:
        self._cluster = None

    def start(self, workdir: str, status_only_pods: bool = False) -> str:
        from nemo_kubeflow_local import LocalCluster

        self._cluster = LocalCluster(workdir, status_only_pods=status_only_pods).start()
        return str(self._cluster.kubeconfig_path)

    def api_counters(self) -> list[tuple[str, str, int, int]]:
        return [(c.verb, c.resource, c.requests, c.bytes) for c in self._cluster.api_counters()]

    def clear_api_counters(self) -> None:
        self._cluster.clear_api_counters()

    def add_virtual_nodes(self, count: int) -> None:
        self._cluster.add_virtual_nodes(*(f"vnode-{i:04d}" for i in range(count)))

    def end_pods(self, label_selector: str, exit_code: int, namespace: str) -> int:
        return len(self._cluster.end_pods(label_selector, exit_code, namespace))

    def pod_phases(self, namespace: Optional[str] = None) -> dict[str, int]:
        from collections import Counter

        return dict(
            Counter((p.get("status") or {}).get("phase") or "" for p in self._cluster.objects("pods", namespace))
        )

    def stop(self) -> None:
        if self._cluster is not None:
            self._cluster.stop()
            self._cluster = None

    def requests(self) -> list:
        return self._cluster.requests

    def clear_requests(self) -> None:
        self._cluster.clear_requests()

    def objects(self, resource: str, namespace: Optional[str] = None) -> list[dict]:
        return self._cluster.objects(resource, namespace)

    def count(self, resource: str, namespace: Optional[str] = None) -> int:
        return len(self._cluster.objects(resource, namespace))


class _Manager(BaseManager):
    pass


_Manager.register("ClusterService", _ClusterService)


class ClusterProcess:
    """The local cluster (API server, Trainer emulation, kubelet) in a child process, so that
    its threads do not take the GIL from the client being timed. Same inspection API as
    ``LocalCluster``: ``requests``, ``clear_requests()``, ``objects()``, plus ``count()``."""

    def __init__(self, workdir: str, status_only_pods: bool = False):
        self._manager = _Manager(ctx=multiprocessing.get_context("spawn"))
        self._manager.start()
        self._service = self._manager.ClusterService()
        self.kubeconfig_path = self._service.start(workdir, status_only_pods)
        self._api = None
        #: Pods still there well after their TrainJob was deleted, deleted by the harness (0 unless
        #: the local cluster's garbage collection regressed; reported at the end of the results).
        self.orphan_pods = 0

    @property
    def requests(self) -> list:
        return self._service.requests()

    def clear_requests(self) -> None:
        self._service.clear_requests()

    def objects(self, resource: str, namespace: Optional[str] = None) -> list[dict]:
        return self._service.objects(resource, namespace)

    def count(self, resource: str, namespace: Optional[str] = None) -> int:
        return self._service.count(resource, namespace)

    # --- API load (bench_apiload): the server's own counts; status-only pods ---------------
    def api_counters(self) -> list[tuple[str, str, int, int]]:
        """(verb, resource, requests, response body bytes) as the API server counted them."""
        return self._service.api_counters()

    def clear_api_counters(self) -> None:
        self._service.clear_api_counters()

    def add_virtual_nodes(self, count: int) -> None:
        self._service.add_virtual_nodes(count)

    def end_pods(self, label_selector: str, exit_code: int = 0, namespace: str = NAMESPACE) -> int:
        return self._service.end_pods(label_selector, exit_code, namespace)

    def pod_phases(self, namespace: Optional[str] = None) -> dict[str, int]:
        return self._service.pod_phases(namespace)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._service.stop()
        self._manager.shutdown()

    # --- client-side helpers (plain kubernetes client, not the code under test) -------------
    @property
    def api(self):
        if self._api is None:
            from kubernetes import config

            self._api = config.new_client_from_config(config_file=self.kubeconfig_path)
        return self._api

    def ensure_upstream_runtime(self) -> None:
        """The ClusterTrainingRuntime ``torch-distributed`` that the baseline refers to, as
        Trainer's manifests install it (reduced to what the emulation needs)."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        runtime = {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "ClusterTrainingRuntime",
            "metadata": {"name": UPSTREAM_RUNTIME, "labels": {"trainer.kubeflow.org/framework": "torch"}},
            "spec": {
                "mlPolicy": {"numNodes": 1, "torch": {}},
                "template": {
                    "spec": {
                        "replicatedJobs": [
                            {
                                "name": "node",
                                "template": {
                                    "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                                    "spec": {
                                        "template": {
                                            "spec": {
                                                "containers": [
                                                    {
                                                        "name": "node",
                                                        "image": "pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime",
                                                    }
                                                ]
                                            }
                                        }
                                    },
                                },
                            }
                        ]
                    }
                },
            },
        }
        with contextlib.suppress(ApiException):
            client.CustomObjectsApi(self.api).create_cluster_custom_object(
                "trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes", runtime
            )

    def delete_trainjobs(self, namespace: str = NAMESPACE, timeout: float = 30.0) -> None:
        """Delete every TrainJob (their pods, ConfigMaps and Secrets go with them) and wait
        until no pod is left, so the next measurement starts on an idle server.

        A pod still there a second after its TrainJob went would mean the local cluster's garbage
        collection regressed (fixed in bdd4547): it is deleted, so that later waits are not held
        up, and counted in ``orphan_pods``."""
        from kubernetes import client

        client.CustomObjectsApi(self.api).delete_collection_namespaced_custom_object(
            "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs"
        )
        core = client.CoreV1Api(self.api)
        deadline = time.monotonic() + timeout
        gone = None  # when the last TrainJob went
        while time.monotonic() < deadline:
            if self.count("trainjobs", namespace):
                time.sleep(0.1)
                continue
            gone = gone or time.monotonic()
            pods = self.objects("pods", namespace)
            if not pods:
                return
            if time.monotonic() - gone > 1.0:  # the GC has had its chance: what is not being deleted is orphaned
                for pod in pods:
                    if not pod["metadata"].get("deletionTimestamp"):
                        self.orphan_pods += 1
                        with contextlib.suppress(Exception):
                            core.delete_namespaced_pod(pod["metadata"]["name"], namespace, grace_period_seconds=0)
            time.sleep(0.1)

    def wait_finished(self, namespace: str = NAMESPACE, timeout: float = 120.0) -> int:
        """Wait until every TrainJob has a Complete or Failed condition; returns how many did."""

        def finished(job):
            return any(
                c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
                for c in (job.get("status") or {}).get("conditions") or []
            )

        deadline = time.monotonic() + timeout
        while True:
            jobs = self.objects("trainjobs", namespace)
            done = sum(1 for job in jobs if finished(job))
            if done == len(jobs) or time.monotonic() > deadline:
                return done
            time.sleep(0.2)


def use_kubeconfig(path: str) -> None:
    """Make ``path`` the default kubeconfig, also for the baseline executor, which calls
    ``kubernetes.config.load_kube_config()`` without arguments in ``__post_init__``."""
    os.environ["KUBECONFIG"] = path
    module = sys.modules.get("kubernetes.config.kube_config")
    if module is not None:
        module.KUBE_CONFIG_DEFAULT_LOCATION = path


@contextlib.contextmanager
def status_only_cluster(ctx: "Context", prefix: str, nodes: int) -> Iterator["ClusterProcess"]:
    """A local cluster of its own with status-only pods (``LocalCluster(status_only_pods=True)``: the same objects and
    statuses, no process per pod), the upstream runtime and ``nodes`` virtual nodes, as the default kubeconfig; when
    the block ends, stopped and the shared cluster's kubeconfig the default again."""
    import shutil

    workdir = tempfile.mkdtemp(prefix=prefix, dir=ctx.workdir)
    cluster = ClusterProcess(os.path.join(workdir, "cluster"), status_only_pods=True)
    try:
        use_kubeconfig(cluster.kubeconfig_path)
        cluster.ensure_upstream_runtime()
        cluster.add_virtual_nodes(nodes)
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        if ctx._cluster is not None:
            use_kubeconfig(ctx._cluster.kubeconfig_path)


def each_variant(family: str, sizes, measure: Callable) -> dict:
    """``measure(variant, size)`` for each size, ours then the baseline, saying which on stderr; by (variant, size)."""
    results = {}
    for size in sizes:
        for variant in ("ours", "baseline"):
            print(f"        {family}: {variant}, {size}", file=sys.stderr, flush=True)
            results[variant, size] = measure(variant, size)
    return results


@contextlib.contextmanager
def nemorun_home() -> Iterator[str]:
    """A fresh ``NEMORUN_HOME``: experiments, our app records and the baseline's
    ``.kubeflow_jobs.json`` state file start empty, so runs do not slow each other down."""
    from nemo_run.config import get_nemorun_home, set_nemorun_home

    previous, previous_env = get_nemorun_home(), os.environ.get("NEMORUN_HOME")
    with tempfile.TemporaryDirectory(prefix="nk-bench-home-") as home:
        set_nemorun_home(home)
        os.environ["NEMORUN_HOME"] = home
        try:
            yield home
        finally:
            set_nemorun_home(previous)
            if previous_env is None:
                os.environ.pop("NEMORUN_HOME", None)
            else:
                os.environ["NEMORUN_HOME"] = previous_env


# --------------------------------------------------------------------------------------------
# The two executors
# --------------------------------------------------------------------------------------------


def ours(kubeconfig: str, **overrides):
    """Our executor, shipping ``benchmarks/log_emitter.py`` as the task's code."""
    from nemo_kubeflow import ConfigMapPackager, KubeflowExecutor

    settings = dict(
        container_image="python:3.11",  # the local cluster runs host processes
        namespace=NAMESPACE,
        shm_size=None,
        kubeconfig=kubeconfig,
        packager=ConfigMapPackager(relative_path=str(BENCH_DIR), include_pattern=WORKLOAD_FILE),
    )
    settings.update(overrides)
    return KubeflowExecutor(**settings)


def upstream(**overrides):
    """NeMo-Run's built-in executor: a bare TrainJob pointing at ``torch-distributed``."""
    from nemo_run.core.execution.kubeflow import KubeflowExecutor

    settings = dict(image="python:3.11", namespace=NAMESPACE, runtime_ref=UPSTREAM_RUNTIME)
    settings.update(overrides)
    return KubeflowExecutor(**settings)


def quick_task():
    """A task that ends at once, so submissions do not pile up running pods."""
    import nemo_run as run

    return run.Script(inline="true")


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """NeMo-Run prints a line per launched job (rich console): send it to /dev/null."""
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        yield


def launch(executor, tasks: int, title: str, task: Callable = quick_task):
    """``run.Experiment`` with ``tasks`` tasks and ``run(detach=True)``, as a user writes it.

    Returns (seconds from creating the experiment to ``run`` returning, the experiment).
    The baseline cannot detach (NeMo-Run says so and waits in ``__exit__``), so the
    experiment is closed as detached here for both: ``run`` has submitted every task by then.
    """
    import nemo_run as run

    with quiet():
        with stopwatch() as elapsed:
            exp = run.Experiment(title, executor=executor, log_level="WARN")
            exp.__enter__()
            for i in range(tasks):
                exp.add(task(), name=f"t{i}")
            exp.run(detach=True)
        exp.detach = True
        exp._skip_status_at_exit = True
        exp.__exit__(None, None, None)
    return elapsed[0], exp


class TaskSubmitter:
    """Submits single tasks straight through a torchx scheduler (``submit_dryrun`` then
    ``schedule``), as NeMo-Run's runner does, without an Experiment around them."""

    def __init__(self, executor, home: str):
        from nemo_run.run.torchx_backend.schedulers.api import get_executor_str
        from torchx.schedulers import get_scheduler_factories

        self.executor = executor
        self.scheduler = get_scheduler_factories()[get_executor_str(executor)]("bench")
        self.home = home
        self.count = 0
        #: TrainJob names derive from the experiment id and task name: keep them unique.
        self.experiment_id = f"bench-{uuid.uuid4().hex[:8]}"

    def prepare(self):
        """Clone and assign the executor, package the task: NeMo-Run's part, not timed."""
        from nemo_run.run.torchx_backend.packaging import package

        i = self.count
        self.count += 1
        executor = self.executor.clone()
        exp_dir = os.path.join(self.home, self.experiment_id)
        executor.assign(self.experiment_id, exp_dir, f"t{i}", f"t{i}")
        os.makedirs(executor.job_dir, exist_ok=True)
        app = package(f"t{i}", quick_task(), executor=executor, serialize_to_file=True)
        return app, executor

    def submit(self, app, executor) -> tuple[float, float, str]:
        """(dry-run seconds, schedule seconds, app id)."""
        with stopwatch() as dry:
            info = self.scheduler.submit_dryrun(app, executor)
        with stopwatch() as sched:
            app_id = self.scheduler.schedule(info)
        return dry[0], sched[0], app_id


def in_fresh_process(body: str, **values) -> dict:
    """Run ``body`` in a new Python process, after ``import nemo_run`` (untimed), with ``harness``
    importable and ``values`` bound as variables; ``body`` prints one JSON object, returned here."""
    lines = ["import json, sys, time", f"sys.path.insert(0, {str(BENCH_DIR)!r})", "import nemo_run", "import harness"]
    lines += [f"{name} = {value!r}" for name, value in values.items()]
    out = subprocess.run(
        [sys.executable, "-c", "\n".join(lines) + "\n" + body],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    if out.returncode != 0:
        raise RuntimeError(f"fresh process failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


@dataclass
class Context:
    """What the runner hands every family."""

    quick: bool
    repeat: int
    workdir: str
    _cluster: Optional[ClusterProcess] = field(default=None, repr=False)

    @property
    def cluster(self) -> ClusterProcess:
        if self._cluster is None:
            self._cluster = ClusterProcess(os.path.join(self.workdir, "cluster"))
            use_kubeconfig(self._cluster.kubeconfig_path)
            self._cluster.ensure_upstream_runtime()
        return self._cluster

    def repeats(self, heavy: bool = False) -> int:
        """Runs per measurement; heavy ones (100-task experiments) get about half."""
        return max(1, -(-self.repeat // 2)) if heavy else self.repeat

    def close(self) -> None:
        if self._cluster is not None:
            self._cluster.stop()
            self._cluster = None


def silence_nemo_run() -> None:
    """NeMo-Run logs every launch through rich; keep the benchmark's output to the table."""
    import logging

    for name in ("nemo_run", "torchx", "nemo_kubeflow", "kubernetes", "urllib3"):
        logging.getLogger(name).setLevel(logging.ERROR)
