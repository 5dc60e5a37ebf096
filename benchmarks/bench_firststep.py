"""Time to first step: from submission to every rank running user code, ours against a bare pod.

Both run the same command: a shell line that prints when the user's shell started
(``SHELL <node> $EPOCHREALTIME``), then the user code (``first_step.py``: prints when it started,
then ends) through ``torchrun`` (8 nodes: torchrun's start and its rendezvous included) or
``python3`` (the larger job: 128 torchruns, each importing torch, do not fit 2 cores).

- **bare**: a hand-written TrainJob on Trainer's ``torch-distributed`` runtime (as Trainer's
  manifests install it; ``trainer.command`` is the command above, the file given by its host path:
  no packaging, no prologue).
- **ours**: ``KubeflowExecutor`` shipping ``first_step.py`` in a ConfigMap (plain), ``run.Script``
  of the same lines, submitted with ``run.Experiment(...).run(detach=True)``; also with the code
  sharded (``ConfigMapPackager(mode="sharded")``: unpacked in bash) and with ``preflight=True``.

Milestones, the slowest pod (or rank) of the job each: the TrainJob's POST reaches the server (the
server's request log), every pod bound (``spec.nodeName``), every ``node`` container running (a pod
watch, started before submission: ConfigMap volumes written by the kubelet, init containers such
as preflight, the container's start), every user shell started (``SHELL``: our prologue ran) and
every rank's user code running (``FIRST``: launcher and rendezvous done).
"""

from __future__ import annotations

import threading
import time
import uuid

from harness import (
    BENCH_DIR,
    NAMESPACE,
    UPSTREAM_RUNTIME,
    Detail,
    Metric,
    cpu_hog,
    interleaved,
    launch,
    median,
    nemorun_home,
    ours,
)

NAME = "firststep"
WORKLOAD = "first_step.py"
#: What the user's shell prints first, in both: our prologue ends where it starts.
MARK = 'echo "SHELL ${PET_NODE_RANK:-0} $EPOCHREALTIME"'
STAGES = (
    ("api", "API (submission -> TrainJob POST)"),
    ("schedule", "controllers + scheduling"),
    ("start", "container start (volumes, init containers)"),
    ("prologue", "prologue (our launch script)"),
    ("launch", "launcher + rendezvous"),
)
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"


class Target:
    """Where the jobs run: the local cluster (``ctx.cluster``) or a real API server with the node agent."""

    def __init__(self, api, kubeconfig: str, namespace: str = NAMESPACE, runtime: str = UPSTREAM_RUNTIME) -> None:
        self.api, self.kubeconfig, self.namespace, self.runtime = api, kubeconfig, namespace, runtime

    def wait_finished(self, name: str, timeout: float) -> None:
        from kubernetes import client

        custom = client.CustomObjectsApi(self.api)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, "trainjobs", name)
            if any(
                c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
                for c in (job.get("status") or {}).get("conditions") or []
            ):
                return
            time.sleep(0.2)
        raise RuntimeError(f"TrainJob {name} did not finish within {timeout:.0f} s")

    def delete_all(self, timeout: float = 120.0) -> None:
        """Delete every TrainJob of the namespace and wait until their pods are gone."""
        from kubernetes import client

        client.CustomObjectsApi(self.api).delete_collection_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "trainjobs", propagation_policy="Background"
        )
        core = client.CoreV1Api(self.api)
        deadline = time.monotonic() + timeout
        while core.list_namespaced_pod(self.namespace).items and time.monotonic() < deadline:
            time.sleep(0.2)


class Watches:
    """When (client clock) each TrainJob was first seen, and each pod first seen bound and with its
    ``node`` container running: watches of the namespace's TrainJobs and pods, started before the
    submission (so the same on the local cluster and on a real API server)."""

    def __init__(self, api, namespace: str) -> None:
        from kubernetes import client, watch

        self.namespace = namespace
        self._core, self._custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        self._watches = [watch.Watch(), watch.Watch()]
        self.created: dict[str, float] = {}
        self.bound: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self.jobset: dict[str, str] = {}
        self._ready = threading.Barrier(3)
        for target in (self._pods, self._trainjobs):
            threading.Thread(target=target, daemon=True).start()
        self._ready.wait(30)

    def _pods(self) -> None:
        listed = self._core.list_namespaced_pod(self.namespace)
        self._ready.wait(30)
        # Plain JSON (no models): a 128-node job's events are read as they come, not behind a parse.
        for event in self._watches[0].stream(
            self._core.list_namespaced_pod,
            self.namespace,
            deserialize=False,
            resource_version=listed.metadata.resource_version,
            timeout_seconds=900,
        ):
            now = time.time()
            pod = event["object"]
            name = pod["metadata"]["name"]
            self.jobset.setdefault(name, (pod["metadata"].get("labels") or {}).get(JOBSET_LABEL, ""))
            if pod["spec"].get("nodeName"):
                self.bound.setdefault(name, now)
            for status in (pod.get("status") or {}).get("containerStatuses") or []:
                if status["name"] == "node" and ({"running", "terminated"} & set(status.get("state") or {})):
                    self.running.setdefault(name, now)

    def seen(self, trainjob: str, nodes: int) -> list[str]:
        """The job's pods, once the watch has seen ``nodes`` of them running (waits up to 60 s)."""
        deadline = time.monotonic() + 60
        while True:
            pods = [n for n, js in dict(self.jobset).items() if js == trainjob]
            if sum(1 for p in pods if p in self.running) >= nodes or time.monotonic() > deadline:
                return pods
            time.sleep(0.1)

    def _trainjobs(self) -> None:
        args = (GROUP, VERSION, self.namespace, "trainjobs")
        listed = self._custom.list_namespaced_custom_object(*args)
        self._ready.wait(30)
        for event in self._watches[1].stream(
            self._custom.list_namespaced_custom_object,
            *args,
            resource_version=listed["metadata"]["resourceVersion"],
            timeout_seconds=900,
            deserialize=False,
        ):
            self.created.setdefault(event["object"]["metadata"]["name"], time.time())

    def stop(self) -> None:
        for w in self._watches:
            w.stop()


def _bare(target: Target, nodes: int, launcher: str) -> str:
    """Create the hand-written TrainJob; returns its name."""
    from kubernetes import client

    name = f"bare-{uuid.uuid4().hex[:8]}"
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {
            "runtimeRef": {"name": target.runtime},
            "trainer": {
                "numNodes": nodes,
                "numProcPerNode": 1,
                "image": "python:3.11",
                "command": ["bash", "-c", f"{MARK}\n{launcher} {BENCH_DIR / WORKLOAD}"],
            },
        },
    }
    client.CustomObjectsApi(target.api).create_namespaced_custom_object(
        GROUP, VERSION, target.namespace, "trainjobs", body
    )
    return name


def _ours(target: Target, nodes: int, launcher: str, **settings) -> str:
    import nemo_run as run

    from nemo_kubeflow import ConfigMapPackager

    packager = ConfigMapPackager(
        relative_path=str(BENCH_DIR), include_pattern=WORKLOAD, mode=settings.pop("mode", "auto")
    )
    executor = ours(
        target.kubeconfig, nodes=nodes, nprocs_per_node=1, packager=packager, namespace=target.namespace, **settings
    )
    _, exp = launch(executor, 1, "bench-first", task=lambda: run.Script(inline=f"{MARK}\n{launcher} {WORKLOAD}"))
    _, _, app_id = exp._runner._scheduler_app_id(exp.jobs[0].handle, check_session=False)
    return app_id.split(":", 1)[1]


def _one(target: Target, nodes: int, submit) -> dict[str, float]:
    """Submit one job (``submit()`` returns its TrainJob's name), wait for its end; its milestones."""
    from kubernetes import client

    core = client.CoreV1Api(target.api)
    watch = Watches(target.api, target.namespace)
    try:
        started = time.time()
        trainjob = submit()
        target.wait_finished(trainjob, timeout=120 + nodes)
        pods = watch.seen(trainjob, nodes)
    finally:
        watch.stop()
    try:
        shells, firsts = [], []
        for pod in pods:
            for line in core.read_namespaced_pod_log(pod, target.namespace, container="node").splitlines():
                parts = line.split()
                if len(parts) == 3 and parts[0] == "SHELL":
                    shells.append(float(parts[2]))
                elif len(parts) == 4 and parts[0] == "FIRST":
                    firsts.append(float(parts[3]))
        if len(pods) != nodes or len(firsts) != nodes or len(shells) != nodes:
            raise RuntimeError(
                f"{trainjob}: {len(pods)} pods, {len(shells)} shells, {len(firsts)} ranks started, {nodes} expected"
            )
        marks = {
            "api": watch.created[trainjob],
            "schedule": max(watch.bound[p] for p in pods),
            "start": max(watch.running[p] for p in pods),
            "prologue": max(shells),
            "launch": max(firsts),
        }
    finally:
        target.delete_all()
    times, before = {"total": marks["launch"] - started}, started
    for stage, _ in STAGES:
        times[stage], before = marks[stage] - before, marks[stage]
    return times


def _load() -> str:
    return " ".join(open("/proc/loadavg").read().split()[:3])


def _variants(target: Target, nodes: int, launcher: str, extras: bool) -> dict:
    variants = {
        "bare": lambda: _one(target, nodes, lambda: _bare(target, nodes, launcher)),
        "ours": lambda: _one(target, nodes, lambda: _ours(target, nodes, launcher)),
    }
    if extras:
        variants["ours, sharded code"] = lambda: _one(
            target, nodes, lambda: _ours(target, nodes, launcher, mode="sharded")
        )
        variants["ours, preflight"] = lambda: _one(
            target, nodes, lambda: _ours(target, nodes, launcher, preflight=True)
        )
    return variants


def _warm_up(target: Target) -> None:
    """One untimed 2-node job of each variant: this process's first submission (its imports) and each
    configuration's first (its runtime is created; later jobs find it) are not what a job's start costs."""
    for submit in _variants(target, 2, "python3", extras=True).values():
        submit()


def _median_times(samples: list[dict]) -> dict[str, float]:
    return {key: median(s[key] for s in samples) for key in samples[0]}


#: Runs of each variant in a full run (not ``--quick``), at least. On 2 cores a job's start varies by a second
#: or more between runs (torchrun's import of torch; at 128 nodes, the emulated controllers' and kubelet's share
#: of the cores): medians of 2 at 128 nodes moved from +0.16 s to +2.06 s between two full runs, against a 1 s
#: target; of 5, they came within 0.3 s of each other.
SAMPLES = 5


def _samples(ctx) -> int:
    return ctx.repeat if ctx.quick else max(ctx.repeat, SAMPLES)


def _spread(runs: list[dict]) -> str:
    totals = [r["total"] for r in runs]
    return f"{min(totals):.2f}-{max(totals):.2f}"


def run(ctx):
    sizes = (
        ((4, "torchrun", True), (32, "python3", False))
        if ctx.quick
        else ((8, "torchrun", True), (128, "python3", False))
    )
    rows: list[str] = []
    target = Target(ctx.cluster.api, ctx.cluster.kubeconfig_path)
    with nemorun_home():
        _warm_up(target)
        for nodes, launcher, extras in sizes:
            repeat = _samples(ctx)
            for loaded in (False, True):
                load_before = _load()
                if loaded:
                    with cpu_hog() as hogs:
                        samples = interleaved(repeat, **_variants(target, nodes, launcher, extras=False))
                    where = f"beside {hogs} busy loops"
                else:
                    samples = interleaved(repeat, **_variants(target, nodes, launcher, extras))
                    where = "quiet"
                medians = {name: _median_times(s) for name, s in samples.items()}
                bare, mine = medians["bare"]["total"], medians["ours"]["total"]
                extra = mine - bare
                yield Metric(
                    f"time to first step, {nodes} nodes ({launcher}), {where}: ours - bare",
                    extra,
                    None,
                    "s",
                    at_most=1.0,
                    note=f"ours {mine:.2f} s ({_spread(samples['ours'])}), bare {bare:.2f} s "
                    f"({_spread(samples['bare'])}), ratio {mine / bare:.2f}x, medians of {repeat} "
                    f"(range); load {load_before}",
                )
                shell = {name: median(r["total"] - r["launch"] for r in runs) for name, runs in samples.items()}
                yield Metric(
                    f"  of which before the launcher (submission -> every user shell), {where}: ours - bare",
                    shell["ours"] - shell["bare"],
                    None,
                    "s",
                    note=f"ours {shell['ours']:.2f} s, bare {shell['bare']:.2f} s: what ours adds, without "
                    "the launcher's own start (the same command in both; torch's import in torchrun "
                    "varies by seconds on a busy machine)",
                )
                for name, times in medians.items():
                    rows.append(
                        f"| {nodes} | {launcher} | {where} | {name} | {times['total']:.2f} | "
                        + " | ".join(f"{times[s]:.2f}" for s, _ in STAGES)
                        + f" | {load_before} |"
                    )
    yield Detail(
        "Time to first step: where it goes (seconds, medians; each milestone is the job's slowest pod)",
        [
            "| nodes | launcher | machine | variant | total | "
            + " | ".join(label for _, label in STAGES)
            + " | load (1/5/15 min) |",
            "|---|---|---|---|---|" + "---|" * len(STAGES) + "---|",
        ]
        + rows,
    )


# --- the real control plane beside the local cluster (not a family of run.py: it needs the build) ---


def _table(where: str, nodes: int, samples: dict[str, list[dict]]) -> list[str]:
    rows = []
    for name, runs in samples.items():
        times = _median_times(runs)
        rows.append(
            f"| {where} | {nodes} | {name} | {times['total']:.2f} | "
            + " | ".join(f"{times[s]:.2f}" for s, _ in STAGES)
            + f" | {_load()} |"
        )
    return rows


def real(sizes: tuple[int, ...], repeat: int) -> list[str]:
    """Time to first step (torchrun) at ``sizes`` nodes on the local cluster, then on the upstream
    control plane (test/controlplane: built once, ``python test/controlplane/build.py``) with the
    node agent running the pods; a markdown table. On a shared machine run it under
    ``flock /tmp/nkf-real.lock`` (one real control plane at a time)."""
    import sys
    import tempfile
    from pathlib import Path

    from harness import REPO, ClusterProcess, use_kubeconfig

    sys.path.insert(0, str(REPO / "test"))
    from controlplane import RealControlPlane, ensure_built
    from kubernetes import config

    from nemo_kubeflow_local.kubelet.nodeagent import NodeAgent, NodeSpec

    rows = [
        "| cluster | nodes | variant | total | " + " | ".join(label for _, label in STAGES) + " | load |",
        "|---|---|---|---|" + "---|" * len(STAGES) + "---|",
    ]
    with tempfile.TemporaryDirectory(prefix="nk-bench-first-") as workdir, nemorun_home():
        cluster = ClusterProcess(str(Path(workdir) / "local"))
        try:
            use_kubeconfig(cluster.kubeconfig_path)
            cluster.ensure_upstream_runtime()
            target = Target(cluster.api, cluster.kubeconfig_path)
            _warm_up(target)
            for nodes in sizes:
                rows += _table("local", nodes, interleaved(repeat, **_variants(target, nodes, "torchrun", False)))
        finally:
            cluster.stop()
        with RealControlPlane(ensure_built(out=sys.stderr), Path(workdir) / "real") as cp:
            cp.install_trainer_runtimes()
            namespace = cp.create_namespace("bench")
            serving = cp.certs.issue("node-agent", "nemo-kubeflow-node-agent")
            agents = [NodeSpec(f"agent-{i}", cpu="8", memory="32Gi") for i in range(max(sizes))]
            with NodeAgent(cp.kubeconfig_path, agents, Path(workdir) / "agent", serving_cert=serving):
                use_kubeconfig(str(cp.kubeconfig_path))
                api = config.new_client_from_config(config_file=str(cp.kubeconfig_path))
                target = Target(api, str(cp.kubeconfig_path), namespace, "torch-distributed")
                _warm_up(target)
                for nodes in sizes:
                    rows += _table(
                        "real + node agent", nodes, interleaved(repeat, **_variants(target, nodes, "torchrun", False))
                    )
    return rows


if __name__ == "__main__":
    import argparse
    import warnings

    parser = argparse.ArgumentParser(
        description="Time to first step on the local cluster and on the real "
        "control plane with the node agent (torchrun)."
    )
    parser.add_argument("--sizes", default="2,4", help="node counts (default 2,4: what the node agent holds)")
    parser.add_argument("--repeat", type=int, default=3)
    options = parser.parse_args()
    warnings.filterwarnings("ignore")
    from harness import silence_nemo_run

    silence_nemo_run()
    print("\n".join(real(tuple(int(n) for n in options.sizes.split(",")), options.repeat)))
