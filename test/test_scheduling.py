"""Queues (Kueue), gang scheduling and the timeout defaults at run time: the exported defaults in bash and
torch, and Kueue's admission on the local cluster (docs/scheduling.md). The manifests they render are
checked in test/unit/build/test_scheduling.py."""

import os
import subprocess
import sys

import nemo_run as run
import pytest
from kubernetes import client
from kueue_api import kueue_version
from polling import wait_for_status
from torchx.specs import AppState, parse_app_handle
from unit.build.test_scheduling import FILES, build, torchrun_role

from nemo_kubeflow import KubeflowExecutor
from nemo_kubeflow.build.plan import build_submission
from nemo_kubeflow.cluster.client import KubernetesCluster
from nemo_kubeflow.cluster.submit import submit
from nemo_kubeflow.errors import NotFoundError
from nemo_kubeflow.nemo_run.scheduler import create_scheduler

# --- timeout defaults ---------------------------------------------------------------------------------


def test_exported_defaults_yield_to_the_environment_at_run_time():
    """The image or an envFrom Secret may set them too: the script only fills in what is unset."""
    script = build().launch.args[0]
    exports = "\n".join(
        line
        for line in script.splitlines()
        if line.startswith("export TORCH_NCCL") or line.startswith("export PET_RDZV_CONF")
    )
    show = 'echo "$TORCH_NCCL_ASYNC_ERROR_HANDLING $TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC $PET_RDZV_CONF"'
    env = {"PATH": os.environ["PATH"], "NCCL_ASYNC_ERROR_HANDLING": "1", "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "90"}
    out = subprocess.run(["bash", "-c", exports + "\n" + show], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "90", "timeout=1800"]


@pytest.mark.needs_torch
def test_torch_reads_the_rendezvous_timeout_from_pet_rdzv_conf():
    """torchrun's flags fall back to PET_<FLAG>, and the static rendezvous reads `timeout` from it."""
    code = (
        "from torch.distributed.run import get_args_parser;"
        "from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import _default_timeout_seconds;"
        "a = get_args_parser().parse_args(['--nnodes', '2', '--node-rank', '0', 'x.py']);"
        "print(a.rdzv_backend, a.rdzv_conf, _default_timeout_seconds)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PET_RDZV_CONF": "timeout=1800"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["static", "timeout=1800", "600"]


# --- Kueue on the local cluster ------------------------------------------------------------------------


def queues(local):
    return client.CustomObjectsApi(local.api_client())


def create_queue(local, name, stop_policy="None"):
    version = kueue_version(local.api_client())
    queues(local).create_namespaced_custom_object(
        "kueue.x-k8s.io",
        version,
        "default",
        "localqueues",
        {
            "apiVersion": f"kueue.x-k8s.io/{version}",
            "kind": "LocalQueue",
            "metadata": {"name": name},
            "spec": {"clusterQueue": "cluster-queue", "stopPolicy": stop_policy},
        },
    )


def local_executor(local, **kw):
    return KubeflowExecutor(
        **{
            "container_image": "python:3.11",
            "nodes": 2,
            "shm_size": None,
            "kubeconfig": str(local.kubeconfig_path),
            **kw,
        }
    )


WRITES = ("create", "update", "patch", "delete", "deletecollection")


def test_missing_queue_is_refused_before_anything_is_written(local):
    create_queue(local, "other-queue")
    executor = local_executor(local, queue_name="missing-queue", experiment_id="noqueue_1")
    sub = build_submission(executor, torchrun_role(2, 1), FILES, task_name="t")
    local.clear_requests()
    with pytest.raises(NotFoundError) as info:
        submit(KubernetesCluster(str(local.kubeconfig_path)), sub)
    message = str(info.value)
    assert "no Kueue LocalQueue 'missing-queue' in namespace 'default'" in message
    assert "queues in this namespace: other-queue" in message
    assert [r for r in local.requests if r.verb in WRITES] == []
    assert local.objects("trainjobs") == [] and local.objects("clustertrainingruntimes") == []


def test_queue_check_tells_when_kueue_is_not_installed(local):
    executor = local_executor(local, queue_name="any-queue", experiment_id="nokueue_1")
    sub = build_submission(executor, torchrun_role(2, 1), FILES, task_name="t")
    local.inject_fault(
        resource="localqueues",
        status=404,
        reason="NotFound",
        message="the server could not find the requested resource",
        times=2,
    )
    local.clear_requests()
    with pytest.raises(
        NotFoundError, match=r"serves none of Kueue's LocalQueue APIs \(kueue.x-k8s.io v1beta2 or v1beta1\)"
    ):
        submit(KubernetesCluster(str(local.kubeconfig_path)), sub)
    assert [r for r in local.requests if r.verb in WRITES] == []


def test_unreadable_queue_does_not_block_submission(local):
    """Without permission to read LocalQueues (403), submit anyway: Kueue reports a missing queue itself."""
    local.deny("get", "localqueues")
    try:
        executor = local_executor(local, queue_name="unreadable", experiment_id="forbidden_1")
        sub = build_submission(executor, torchrun_role(2, 1), FILES, task_name="t")
        cluster = KubernetesCluster(str(local.kubeconfig_path))
        result = submit(cluster, sub)
    finally:
        local.allow_all()
    assert ("patch", "TrainJob", sub.name) not in result.actions  # left for Kueue to admit
    cluster.delete("TrainJob", sub.name, "default")


def test_held_queue_then_released_runs_without_our_resume(local):
    create_queue(local, "held", stop_policy="Hold")
    executor = local_executor(local, queue_name="held", workload_priority_class="low")
    local.clear_requests()
    with run.Experiment("queued", executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(inline="echo queued-ran"), name="queued")
        exp.run(detach=True)
    app_id = parse_app_handle(exp.jobs[0].handle)[2]
    name = app_id.split(":")[1]

    desc = wait_for_status(create_scheduler("t"), app_id, lambda d: "is inactive" in d.msg, "the queue to be inactive")
    assert desc.state == AppState.PENDING
    assert desc.msg == "waiting for queue held to admit it: Inadmissible: LocalQueue held is inactive"
    [workload] = local.objects("workloads", "default")
    assert workload["metadata"]["ownerReferences"][0]["name"] == name
    assert (
        workload["spec"]["queueName"] == "held" and workload["spec"]["priorityClassRef"]["name"] == "low"
    )  # v1beta2, as stored
    assert workload["spec"]["podSets"][0]["count"] == 2
    assert local.objects("pods", "default") == []

    # The queue is deleted: Kueue's own words for it.
    queues(local).delete_namespaced_custom_object(
        "kueue.x-k8s.io", kueue_version(local.api_client()), "default", "localqueues", "held"
    )
    wait_for_status(
        create_scheduler("t"),
        app_id,
        lambda d: d.msg.endswith("Inadmissible: LocalQueue held doesn't exist"),
        "Kueue to say the queue is gone",
    )

    create_queue(local, "held")  # back, and open: Kueue admits and unsuspends the job
    desc = wait_for_status(create_scheduler("t"), app_id, lambda d: d.state == AppState.SUCCEEDED, "the job to succeed")
    patches = [r for r in local.requests if r.resource.startswith("trainjobs") and r.verb in ("patch", "update")]
    assert patches == [], "NeMo-Run must leave the resume to Kueue"
    [workload] = local.objects("workloads", "default")
    conditions = {c["type"]: (c["status"], c["reason"]) for c in workload["status"]["conditions"]}
    assert conditions["Admitted"] == ("True", "Admitted") and conditions["QuotaReserved"] == ("True", "QuotaReserved")
    assert conditions["Finished"] == ("True", "Succeeded")
    logs = "".join(create_scheduler("t").log_iter(app_id, "queued", k=0))
    assert "queued-ran" in logs


def test_gang_scheduled_job_runs_on_the_local_cluster(local):
    # The pods name a PriorityClass: it must exist (the Priority admission plugin refuses them otherwise).
    client.SchedulingV1Api(local.api_client()).create_priority_class(
        {"metadata": {"name": "training-high"}, "value": 1000}
    )
    executor = local_executor(
        local,
        pod_group_policy="coscheduling",
        priority_class_name="training-high",
        topology_key="kubernetes.io/hostname",
    )
    with run.Experiment("gang", executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(inline="echo gang-ran"), name="gang")
        exp.run(detach=True)
    app_id = parse_app_handle(exp.jobs[0].handle)[2]
    wait_for_status(create_scheduler("t"), app_id, lambda d: d.state == AppState.SUCCEEDED, "the job to succeed")
    name = app_id.split(":")[1]
    pods = [
        p
        for p in local.objects("pods", "default")
        if p["metadata"]["labels"].get("jobset.sigs.k8s.io/jobset-name") == name
    ]
    assert len(pods) == 2
    for pod in pods:
        assert pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == name
        assert pod["spec"]["schedulerName"] == "scheduler-plugins-scheduler"
        assert pod["spec"]["priorityClassName"] == "training-high"
        assert pod["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
