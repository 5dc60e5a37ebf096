"""What progress reporting (nemo_kubeflow.progress) costs: requests per minute per job, and the training
process's CPU per ``report()`` call (every step pays it) and per write (the status-server POST, the log line).

Baseline: the Kubeflow SDK's ``update_trainjob_status`` (kubeflow 0.5), the other way to write trainerStatus:
one POST per 5 s at most, with a kept-alive ``requests`` session. Both write to the local cluster's emulation of
Trainer v2.3.0's status server (gate ``TrainJobStatus``), in this process: CPU is ``time.process_time``, so
the server's share is in it too, for both alike (measured alternately).
"""

from __future__ import annotations

import io
import os
import tempfile
import time
from pathlib import Path

from harness import Detail, Metric, median

NAME = "progress"
#: A step every 0.1 s: 600 calls per simulated minute.
STEPS_PER_SECOND = 10


def _writes_per_minute(interval: float) -> float:
    """Writes of a reporter called every step for ten simulated minutes (a clock that only moves with steps)."""
    from nemo_kubeflow import progress

    now = [0.0]
    reporter = progress.Reporter(
        10**9, interval=interval, env={"PET_NNODES": "1"}, stream=io.StringIO(), clock=lambda: now[0]
    )
    minutes = 10
    for step in range(minutes * 60 * STEPS_PER_SECOND):
        now[0] = step / STEPS_PER_SECOND
        reporter.report(step, loss=1.0)
    return reporter.writes / minutes


def _cpu_per_call(calls: int) -> float:
    """CPU (µs) of one throttled ``report()`` call: what every training step pays."""
    from nemo_kubeflow import progress

    reporter = progress.Reporter(10**9, env={"PET_NNODES": "1"}, stream=io.StringIO())
    reporter.report(0)
    started = time.process_time()
    for step in range(1, calls + 1):
        reporter.report(step, loss=0.5, lr=3e-4)
    return (time.process_time() - started) / calls * 1e6


def _cpu_per_log_write(writes: int) -> float:
    from nemo_kubeflow import progress

    reporter = progress.Reporter(10**9, interval=0, env={"PET_NNODES": "1"}, stream=io.StringIO())
    started = time.process_time()
    for step in range(writes):
        reporter.report(step, loss=0.5, lr=3e-4)
    return (time.process_time() - started) / writes * 1e6


def run(ctx):
    from kubeflow.trainer.backends.kubernetes import utils as sdk

    from nemo_kubeflow import progress
    from nemo_kubeflow.build.plan import build_submission
    from nemo_kubeflow_local import LocalCluster
    from nemo_kubeflow_local.controllers import trainjob_status as ts

    posts = 10 if ctx.quick else 40
    ours_rate, sdk_rate = _writes_per_minute(progress.DEFAULT_INTERVAL_S), 60.0 / sdk._MIN_UPDATE_INTERVAL_SECONDS
    yield Metric(
        "progress: status-server writes per minute per job (a step every 0.1 s)",
        ours_rate,
        sdk_rate,
        "req/min",
        at_most=2.0,
        note="baseline: the Kubeflow SDK's update_trainjob_status (5 s); ours 30 s by default; each is one API write "
        "(Trainer's server-side apply) and costs status looks nothing (trainerStatus is in the TrainJob)",
    )
    yield Metric(
        "progress: client CPU per report() call (throttled step)",
        median([_cpu_per_call(20000) for _ in range(ctx.repeat)]),
        None,
        "µs",
        at_most=20.0,
        note="what every training step pays",
    )
    yield Metric(
        "progress: client CPU per log-line write",
        median([_cpu_per_log_write(2000) for _ in range(ctx.repeat)]),
        None,
        "µs",
        at_most=200.0,
        note="the fallback transport (no gate): one line on rank 0's stdout",
    )

    with (
        tempfile.TemporaryDirectory(prefix="nk-bench-progress-", dir=ctx.workdir) as workdir,
        LocalCluster(Path(workdir) / "cluster", feature_gates=(ts.FEATURE_GATE,)) as cluster,
    ):
        from torchx.specs import Role

        from nemo_kubeflow import KubeflowExecutor
        from nemo_kubeflow.cluster.client import KubernetesCluster
        from nemo_kubeflow.cluster.submit import submit
        from nemo_kubeflow.config.packager import BundleFile

        cluster.create_namespace("bench")
        executor = KubeflowExecutor(container_image="img", nodes=1, shm_size=None, namespace="bench")
        sub = build_submission(
            executor,
            Role(name="t", image="", entrypoint="bash", args=["-c", "sleep 300"]),
            [BundleFile("code/a.py", b"\n")],
            task_name="t",
            experiment_id="bench-progress",
        )
        submit(KubernetesCluster(kubeconfig=str(cluster.kubeconfig_path)), sub)
        token, ca = Path(workdir) / "token", Path(workdir) / "ca.crt"
        token.write_text(cluster.tokens.issue("bench", "default", ts.token_audience("bench", sub.name), 3600))
        ca.write_bytes(cluster.status_server.credentials.ca_pem)
        env = {
            progress.SERVER_URL_ENV: cluster.status_server.url + ts.status_path("bench", sub.name),
            progress.SERVER_TOKEN_ENV: str(token),
            progress.SERVER_CA_CERT_ENV: str(ca),
        }
        reporter = progress.Reporter(10**9, interval=0, env={"PET_NNODES": "1", **env})
        assert reporter.server is not None
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        ours, theirs = [], []
        try:
            for step in range(posts):  # alternated, one request each
                started = time.process_time()
                reporter.server.send(progress.Report(step, 10**9, {"loss": 0.5, "lr": 3e-4}, time.time(), 10.0))
                ours.append(time.process_time() - started)
                sdk._last_update_time = 0.0  # its throttle: every call here is one it would send
                started = time.process_time()
                if not sdk.update_trainjob_status(
                    progress_percent=1, estimated_remaining_seconds=100, metrics={"step": step, "loss": 0.5, "lr": 3e-4}
                ):
                    raise RuntimeError("the SDK's update_trainjob_status did not write")
                theirs.append(time.process_time() - started)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        applied = cluster.status_server.applied
    yield Metric(
        "progress: client CPU per status-server write",
        median(ours) * 1000,
        median(theirs) * 1000,
        "ms",
        at_most=50.0,
        note="baseline: the SDK's update_trainjob_status; token read, TLS connection, POST of trainerStatus (the server's share included); "
        "the SDK keeps its connection alive, ours opens one per write (two a minute)",
    )
    yield Detail(
        "Progress reporting",
        [
            f"- status-server writes applied in this run: {applied} ({posts} ours, {posts} the SDK's)",
            "- a status look at a running job: no extra request when the TrainJob carries `trainerStatus` (the gate on); "
            "otherwise a log read of node 0 (its last 500 lines, at most 16 KiB; a second, smaller one where those are more; "
            "none when the process already follows the node logs)",
        ],
    )
