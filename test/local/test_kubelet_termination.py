"""Deleting a pod, stopping the cluster or killing its owner leaves no process of the pod behind,
also processes that trap SIGTERM and start sessions of their own (as torchrun's workers do)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import nemo_run as run
import workloads
from kubernetes import client, config
from localcluster_helpers import (
    alive,
    create_runtime,
    create_trainjob,
    pods_of,
    recorded_pids,
    runtime,
    stubborn_pod,
    trainjob,
    unique,
    wait_gone,
)

from nemo_kubeflow import ConfigMapPackager, KubeflowExecutor
from nemo_kubeflow_local import LocalCluster


def test_deleting_a_pod_sigterms_every_process_then_kills_them_after_the_grace_period(cluster, core, ns, tmp_path):
    create = core.create_namespaced_pod(ns, stubborn_pod("stubborn", tmp_path, grace=2))
    assert create.spec.termination_grace_period_seconds == 2
    pids = recorded_pids(tmp_path, 3)
    assert len({os.getsid(pid) for pid in pids}) == 3  # three sessions: no group holds them all
    core.delete_namespaced_pod("stubborn", ns)
    # Every process got SIGTERM, and each survives it (it traps it) until the grace period ends.
    deadline = time.monotonic() + 10
    while len(list(tmp_path.glob("term-*"))) < 3:
        assert time.monotonic() < deadline, sorted(tmp_path.iterdir())
        time.sleep(0.05)
    assert sorted(int(p.name.split("-")[1]) for p in tmp_path.glob("term-*")) == pids
    assert core.read_namespaced_pod("stubborn", ns).metadata.deletion_timestamp is not None
    wait_gone(pids)
    cluster.wait_for(lambda: not core.list_namespaced_pod(ns).items)


def test_cancelling_a_torchrun_job_kills_a_worker_that_ignores_sigterm(cluster, core, custom, ns, tmp_path):
    """torchrun starts each worker in a session of its own, and waits 30 s for workers it asked to stop."""
    name = unique("torchrun-rt")
    create_runtime(custom, runtime(name, pod_extra={"terminationGracePeriodSeconds": 2}))
    worker = (
        "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        f"open(os.path.join({str(tmp_path)!r}, f'pid-{{os.getpid()}}'), 'w').close(); time.sleep(600)"
    )
    (tmp_path / "worker.py").write_text(worker)
    create_trainjob(
        custom,
        ns,
        trainjob(
            "stubborn",
            name,
            ["torchrun", "--standalone", "--nproc-per-node=2", str(tmp_path / "worker.py")],
            num_nodes=1,
        ),
    )
    workers = recorded_pids(tmp_path, 2, timeout=120)
    assert all(os.getsid(pid) == pid for pid in workers)  # each in a session of its own
    custom.delete_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", ns, "trainjobs", "stubborn")
    wait_gone(workers)
    cluster.wait_for(lambda: not pods_of(core, ns, "stubborn"), timeout=15)


def test_stopping_the_cluster_leaves_no_process(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    cluster = LocalCluster(tmp_path / "cluster").start()
    try:
        core = client.CoreV1Api(cluster.api_client())
        core.create_namespaced_pod("default", stubborn_pod("stubborn", out, grace=600))
        pids = recorded_pids(out, 3)
    finally:
        cluster.stop()
    assert [pid for pid in pids if alive(pid)] == []  # stop() returns once they are gone


def test_killing_the_clusters_owner_leaves_no_process(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    workdir = tmp_path / "cluster"
    owner = subprocess.Popen(
        [sys.executable, "-m", "nemo_kubeflow_local", "serve", "--workdir", str(workdir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not (workdir / "kubeconfig").exists():
            assert owner.poll() is None and time.monotonic() < deadline, "the cluster did not start"
            time.sleep(0.1)
        configuration = client.Configuration()
        config.load_kube_config(str(workdir / "kubeconfig"), client_configuration=configuration)
        core = client.CoreV1Api(client.ApiClient(configuration))
        core.create_namespaced_pod("default", stubborn_pod("stubborn", out, grace=600))
        pids = recorded_pids(out, 3)
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        wait_gone(pids)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()


def test_stopping_the_cluster_under_a_detached_experiment_kills_torchrun_ranks_that_ignore_sigterm(tmp_path):
    """As a user meets it: `exp.run(detach=True)` of a torchrun task, then the local cluster stops."""
    out = tmp_path / "out"
    out.mkdir()
    cluster = LocalCluster(tmp_path / "cluster").start()
    try:
        executor = KubeflowExecutor(
            container_image="python:3.11",
            nodes=2,
            nprocs_per_node=1,
            launcher="torchrun",
            kubeconfig=str(cluster.kubeconfig_path),
            shm_size=None,
            packager=ConfigMapPackager(relative_path="test", include_pattern="workloads.py"),
        )
        with run.Experiment("stubborn", executor=executor, log_level="WARN") as exp:
            exp.add(run.Partial(workloads.ignore_sigterm, pid_dir=str(out)), name="stubborn")
            exp.run(detach=True)
        ranks = recorded_pids(out, 2, timeout=120)
        assert all(os.getsid(pid) == pid for pid in ranks)  # torchrun gave each a session of its own
    finally:
        cluster.stop()
    assert [pid for pid in ranks if alive(pid)] == []
