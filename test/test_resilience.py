"""Resilience on the local cluster (real HTTP, real processes): in-job restarts with ft_launcher."""

import os
import signal
import time

import nemo_run as run
import pytest
from kubernetes import client
from torchx.specs import AppState

import workloads
from test_e2e import wait_for
from nemo_kubeflow import ConfigMapPackager, KubeflowExecutor
from nemo_kubeflow.local import LocalCluster

pytest.importorskip("nvidia_resiliency_ext", reason="ft_launcher: pip install --no-deps nvidia-resiliency-ext "
                    "(docs/resilience.md lists its dependencies)")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(workdir=tmp_path_factory.mktemp("local-cluster")) as c:
        yield c


def core_api(cluster) -> client.CoreV1Api:
    return client.CoreV1Api(client.ApiClient(cluster.configuration()))


def pid_files(directory):
    """The ranks' pid files, oldest first."""
    return sorted(directory.glob("rank*.pid"), key=lambda p: p.stat().st_mtime_ns)


def test_killed_rank_is_restarted_inside_the_running_pods(cluster, tmp_path):
    executor = KubeflowExecutor(
        container_image="python:3.11", nodes=2, nprocs_per_node=1, kubeconfig=str(cluster.kubeconfig_path),
        shm_size=None, packager=ConfigMapPackager(relative_path="test", include_pattern="workloads.py"),
        launcher=run.FaultTolerance(max_restarts=2, initial_rank_heartbeat_timeout=120, rank_heartbeat_timeout=60),
    )
    task = run.Partial(workloads.fault_tolerant_steps, steps=40, pid_dir=str(tmp_path))
    core = core_api(cluster)
    with run.Experiment("ft-inj", executor=executor, log_level="WARN") as exp:
        exp.add(task, name="train")
        exp.run(sequential=True)
        first = wait_for(lambda: len(pid_files(tmp_path)) == 2 and pid_files(tmp_path), timeout=120)
        pods_before = {p.metadata.name: p.metadata.uid for p in core.list_namespaced_pod("default").items
                       if p.metadata.labels.get("jobset.sigs.k8s.io/jobset-name", "").startswith("ft-inj")}
        assert len(pods_before) == 2
        killed_at = time.monotonic()
        os.kill(int(first[1].read_text()), signal.SIGKILL)
        try:
            wait_for(lambda: len(pid_files(tmp_path)) == 4, timeout=120)
        except AssertionError:
            raise AssertionError("".join(core.read_namespaced_pod_log(n, "default") for n in pods_before)) from None
        recovery = time.monotonic() - killed_at
        job = exp.jobs[0]
    assert exp.status(return_dict=True)[job.id]["status"] == AppState.SUCCEEDED
    pods = [p for p in core.list_namespaced_pod("default").items if p.metadata.name in pods_before]
    # The same pods, never restarted: the rank came back inside them.
    assert {p.metadata.name: p.metadata.uid for p in pods} == pods_before
    assert all(s.restart_count == 0 for p in pods for s in p.status.container_statuses)
    logs = "".join(core.read_namespaced_pod_log(name, "default") for name in pods_before)
    # ft_launcher prefixes each worker's lines (`--tee 3`): "[default0]:rank 0 finished 40 steps".
    assert sorted(line.rsplit(":", 1)[-1] for line in logs.splitlines() if "finished 40 steps" in line) == [
        f"rank {r} finished 40 steps" for r in range(2)], logs
    # Every rank was restarted once (the killed one and its peer), as new processes.
    assert {p.name.split("-")[0] for p in pid_files(tmp_path)[2:]} | {p.name.split("-")[0] for p in first} == {
        "rank0", "rank1"}
    assert "Worker group FAILED. 2/2 attempts left; will restart worker group" in logs
    print(f"in-job recovery (SIGKILL to every rank training again): {recovery:.1f}s")
