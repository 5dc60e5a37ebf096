"""Queues (Kueue), gang scheduling, placement and the timeout defaults: the manifests they render,
and Kueue's admission on the local cluster (docs/scheduling.md)."""

import os
import subprocess
import sys
from pathlib import Path

import builders
import nemo_run as run
import pytest
from kubernetes import client
from kueue_api import kueue_version
from polling import wait_for_status
from torchx.specs import AppState, parse_app_handle

from nemo_kubeflow import KubeflowExecutor
from nemo_kubeflow.build.packaging import BundleFile
from nemo_kubeflow.build.plan import build_submission
from nemo_kubeflow.build.yamlio import dump_all
from nemo_kubeflow.cluster.client import KubernetesCluster
from nemo_kubeflow.cluster.submit import submit
from nemo_kubeflow.constants import TIMEOUT_DEFAULTS
from nemo_kubeflow.errors import ConfigError, NotFoundError
from nemo_kubeflow.nemo_run.scheduler import create_scheduler
from nemo_kubeflow.observe.status import owned_workload, queue_wait_message
from nemo_kubeflow.schema.validation import check_manifests

GOLDEN = Path(__file__).parent / "golden"
IMAGE = "nvcr.io/nvidia/nemo:25.02"
FILES = [BundleFile("code/train.py", b"print('hello')\n", 0o644)]
GPU = dict(container_image=IMAGE, nodes=4, nprocs_per_node=8, gpus_per_node=8, namespace="team-a")

CONFIGS = {
    "kueue": dict(queue_name="team-a-queue", workload_priority_class="high-priority"),
    "coscheduling": dict(pod_group_policy="coscheduling", schedule_timeout_seconds=300,
                         priority_class_name="training-high"),
    "volcano": dict(pod_group_policy="volcano", queue_name="team-a-queue"),
    "topology": dict(topology_key="cloud.google.com/gce-topology-block", pod_group_policy="coscheduling",
                     scheduler_name="default-scheduler"),
}


torchrun_role = builders.torchrun_role


def build(task_env=None, **kw):
    executor = KubeflowExecutor(**{**GPU, **kw}, experiment_id="sched_1700000000")
    executor.validate()
    role = torchrun_role(executor.nodes, executor.nprocs_per_node, task_env)
    return build_submission(executor, role, FILES, task_name="train")


def pod_spec(runtime):
    return runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


def patched_pod_spec(trainjob):
    [patch] = trainjob["spec"]["runtimePatches"]
    return patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


# --- manifests -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_golden_manifests_pass_offline_validation(config):
    sub = build(**CONFIGS[config])
    check_manifests(sub.manifests())
    text = dump_all(sub.manifests())
    path = GOLDEN / f"scheduling_{config}.yaml"
    if os.environ.get("NEMO_KUBEFLOW_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"manifests changed; regenerate {path} with NEMO_KUBEFLOW_UPDATE_GOLDEN=1"


def test_queue_and_priority_labels_on_the_trainjob():
    sub = build(**CONFIGS["kueue"])
    labels = sub.trainjob["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/queue-name"] == "team-a-queue"
    assert labels["kueue.x-k8s.io/priority-class"] == "high-priority"
    assert sub.trainjob["spec"]["suspend"] is True
    assert sub.summary["queue"] == "Kueue LocalQueue team-a-queue, priority high-priority"
    # Nothing of Kueue's reaches the shared runtime: queued and unqueued jobs share it.
    assert build().runtime["metadata"]["name"] == sub.runtime["metadata"]["name"]


def test_gang_policies_render_into_the_runtime():
    cosched = build(**CONFIGS["coscheduling"]).runtime
    assert cosched["spec"]["podGroupPolicy"] == {"coscheduling": {"scheduleTimeoutSeconds": 300}}
    assert pod_spec(cosched)["schedulerName"] == "scheduler-plugins-scheduler"
    assert pod_spec(cosched)["priorityClassName"] == "training-high"
    volcano = build(**CONFIGS["volcano"]).runtime
    assert volcano["spec"]["podGroupPolicy"] == {"volcano": {}}
    assert pod_spec(volcano)["schedulerName"] == "volcano"
    plain = build().runtime
    assert "podGroupPolicy" not in plain["spec"]
    assert not {"schedulerName", "priorityClassName"} & set(pod_spec(plain))
    assert build(pod_group_policy="coscheduling").runtime["spec"]["podGroupPolicy"] == {"coscheduling": {}}


def test_topology_key_keeps_the_jobs_pods_together():
    sub = build(**CONFIGS["topology"])
    affinity = patched_pod_spec(sub.trainjob)["affinity"]
    [term] = affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term == {"labelSelector": {"matchLabels": {"jobset.sigs.k8s.io/jobset-name": sub.name,
                                                      "jobset.sigs.k8s.io/replicatedjob-name": "node"}},
                    "topologyKey": "cloud.google.com/gce-topology-block"}
    assert "podAntiAffinity" in affinity  # GPU jobs still spread one pod per node
    assert pod_spec(sub.runtime)["schedulerName"] == "default-scheduler"


@pytest.mark.parametrize("kw, problem", [
    (dict(pod_group_policy="gang"), "pod_group_policy='gang': must be one of none, coscheduling, volcano"),
    (dict(schedule_timeout_seconds=30), "schedule_timeout_seconds applies to pod_group_policy='coscheduling'"),
    (dict(workload_priority_class="high"), "workload_priority_class needs queue_name"),
    (dict(queue_name="Team_A"), "queue_name='Team_A': must be a Kubernetes object name"),
    (dict(topology_key="block topology"), "topology_key='block topology': must be a node label key"),
    (dict(runtime_name="torch-distributed", pod_group_policy="volcano"), "pod_group_policy goes into the rendered"),
    (dict(queue_name="a", labels={"kueue.x-k8s.io/queue-name": "b"}), "disagree"),
])
def test_bad_scheduling_settings_are_refused(kw, problem):
    with pytest.raises(ConfigError) as info:
        KubeflowExecutor(**{**GPU, **kw}).validate()
    assert problem in str(info.value)


def _workload(*conditions):
    return {"metadata": {"ownerReferences": [{"kind": "TrainJob", "uid": "u1"}]},
            "status": {"conditions": [dict(zip(("type", "status", "reason", "message"), c)) for c in conditions]}}


@pytest.mark.parametrize("conditions, message", [
    ((), "waiting for queue q to admit it"),
    ((("QuotaReserved", "False", "Pending", "couldn't assign flavors to pod set node: insufficient unused quota "
       "for nvidia.com/gpu in flavor h100, 8 more needed"),),
     "waiting for queue q to admit it: Pending: couldn't assign flavors to pod set node: insufficient unused quota "
     "for nvidia.com/gpu in flavor h100, 8 more needed"),
    ((("QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue cq"),
      ("Admitted", "False", "NoChecks", "The workload has not all checks ready")),
     "waiting for queue q to admit it: quota reserved, waiting for admission checks "
     "(NoChecks: The workload has not all checks ready)"),
    ((("Evicted", "True", "Preempted", "Preempted to accommodate a workload (UID: x) due to prioritization"),
      ("QuotaReserved", "False", "Pending", "Preempted")),
     "preempted, waiting for queue q to admit it again (Preempted: Preempted to accommodate a workload (UID: x) "
     "due to prioritization)"),
    ((("Evicted", "True", "PodsReadyTimeout", "Exceeded the PodsReady timeout"),),
     "waiting for queue q to admit it again (evicted: PodsReadyTimeout: Exceeded the PodsReady timeout)"),
])
def test_queue_wait_message_carries_kueues_reason(conditions, message):
    trainjob = {"metadata": {"uid": "u1"}}
    workload = owned_workload([_workload(*conditions), {"metadata": {"ownerReferences": [{"uid": "other"}]}}], trainjob)
    assert queue_wait_message("q", workload) == message
    assert owned_workload([], trainjob) is None


# --- timeout defaults ---------------------------------------------------------------------------------


def test_timeout_defaults_are_exported_unless_the_task_sets_them():
    script = build().launch.args[0]
    for name, value in TIMEOUT_DEFAULTS.items():
        assert f"export {name}=" in script and value in script
    # Set by the task (under torch's older spelling too): not exported, the task's value stands.
    sub = build(env_vars={"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "1200"},
                task_env={"NCCL_ASYNC_ERROR_HANDLING": "1", "PET_RDZV_CONF": "timeout=60"})
    script = sub.launch.args[0]
    assert "export TORCH_NCCL_ENABLE_MONITORING=" in script
    for name in ("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "PET_RDZV_CONF"):
        assert f"export {name}=" not in script
    env = {e["name"]: e.get("value") for e in sub.trainjob["spec"]["trainer"]["env"]}
    assert env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] == "1200" and env["PET_RDZV_CONF"] == "timeout=60"
    # Off, or nothing distributed: none.
    assert "TORCH_NCCL" not in build(timeout_defaults=False).launch.args[0]
    assert "TORCH_NCCL" not in build(nodes=1, nprocs_per_node=1, gpus_per_node=1).launch.args[0]


def test_exported_defaults_yield_to_the_environment_at_run_time():
    """The image or an envFrom Secret may set them too: the script only fills in what is unset."""
    script = build().launch.args[0]
    exports = "\n".join(line for line in script.splitlines() if line.startswith("export TORCH_NCCL")
                        or line.startswith("export PET_RDZV_CONF"))
    show = 'echo "$TORCH_NCCL_ASYNC_ERROR_HANDLING $TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC $PET_RDZV_CONF"'
    env = {"PATH": os.environ["PATH"], "NCCL_ASYNC_ERROR_HANDLING": "1", "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "90"}
    out = subprocess.run(["bash", "-c", exports + "\n" + show], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "90", "timeout=1800"]


@pytest.mark.needs_torch
def test_torch_reads_the_rendezvous_timeout_from_pet_rdzv_conf():
    """torchrun's flags fall back to PET_<FLAG>, and the static rendezvous reads `timeout` from it."""
    code = ("from torch.distributed.run import get_args_parser;"
            "from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import _default_timeout_seconds;"
            "a = get_args_parser().parse_args(['--nnodes', '2', '--node-rank', '0', 'x.py']);"
            "print(a.rdzv_backend, a.rdzv_conf, _default_timeout_seconds)")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PET_RDZV_CONF": "timeout=1800"},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["static", "timeout=1800", "600"]


# --- Kueue on the local cluster ------------------------------------------------------------------------


def queues(local):
    return client.CustomObjectsApi(local.api_client())


def create_queue(local, name, stop_policy="None"):
    version = kueue_version(local.api_client())
    queues(local).create_namespaced_custom_object("kueue.x-k8s.io", version, "default", "localqueues", {
        "apiVersion": f"kueue.x-k8s.io/{version}", "kind": "LocalQueue", "metadata": {"name": name},
        "spec": {"clusterQueue": "cluster-queue", "stopPolicy": stop_policy}})


def local_executor(local, **kw):
    return KubeflowExecutor(**{"container_image": "python:3.11", "nodes": 2, "shm_size": None,
                               "kubeconfig": str(local.kubeconfig_path), **kw})


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
    local.inject_fault(resource="localqueues", status=404, reason="NotFound",
                       message="the server could not find the requested resource", times=2)
    local.clear_requests()
    with pytest.raises(NotFoundError, match=r"serves none of Kueue's LocalQueue APIs \(kueue.x-k8s.io v1beta2 or v1beta1\)"):
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
    assert workload["spec"]["queueName"] == "held" and workload["spec"]["priorityClassRef"]["name"] == "low"  # v1beta2, as stored
    assert workload["spec"]["podSets"][0]["count"] == 2
    assert local.objects("pods", "default") == []

    # The queue is deleted: Kueue's own words for it.
    queues(local).delete_namespaced_custom_object("kueue.x-k8s.io", kueue_version(local.api_client()), "default",
                                                  "localqueues", "held")
    wait_for_status(create_scheduler("t"), app_id,
                    lambda d: d.msg.endswith("Inadmissible: LocalQueue held doesn't exist"), "Kueue to say the queue is gone")

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
    executor = local_executor(local, pod_group_policy="coscheduling", priority_class_name="training-high",
                              topology_key="kubernetes.io/hostname")
    with run.Experiment("gang", executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(inline="echo gang-ran"), name="gang")
        exp.run(detach=True)
    app_id = parse_app_handle(exp.jobs[0].handle)[2]
    wait_for_status(create_scheduler("t"), app_id, lambda d: d.state == AppState.SUCCEEDED, "the job to succeed")
    name = app_id.split(":")[1]
    pods = [p for p in local.objects("pods", "default")
            if p["metadata"]["labels"].get("jobset.sigs.k8s.io/jobset-name") == name]
    assert len(pods) == 2
    for pod in pods:
        assert pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == name
        assert pod["spec"]["schedulerName"] == "scheduler-plugins-scheduler"
        assert pod["spec"]["priorityClassName"] == "training-high"
        assert pod["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
