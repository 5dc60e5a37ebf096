"""Queues (Kueue), gang scheduling, placement and the timeout defaults: the manifests they render,
pinned against golden YAML, and the settings refused (test/test_scheduling.py runs them on the local
cluster; docs/scheduling.md)."""

import os

import builders
import pytest
from locations import GOLDEN

from nemo_kubeflow import KubeflowExecutor
from nemo_kubeflow.build.plan import build_submission
from nemo_kubeflow.config.packager import BundleFile
from nemo_kubeflow.constants import TIMEOUT_DEFAULTS
from nemo_kubeflow.errors import ConfigError
from nemo_kubeflow.parts.yamlio import dump_all
from nemo_kubeflow.schema.validation import check_manifests

IMAGE = "nvcr.io/nvidia/nemo:25.02"


FILES = [BundleFile("code/train.py", b"print('hello')\n", 0o644)]


GPU = dict(container_image=IMAGE, nodes=4, nprocs_per_node=8, gpus_per_node=8, namespace="team-a")


CONFIGS = {
    "kueue": dict(queue_name="team-a-queue", workload_priority_class="high-priority"),
    "coscheduling": dict(
        pod_group_policy="coscheduling", schedule_timeout_seconds=300, priority_class_name="training-high"
    ),
    "volcano": dict(pod_group_policy="volcano", queue_name="team-a-queue"),
    "topology": dict(
        topology_key="cloud.google.com/gce-topology-block",
        pod_group_policy="coscheduling",
        scheduler_name="default-scheduler",
    ),
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
    assert term == {
        "labelSelector": {
            "matchLabels": {"jobset.sigs.k8s.io/jobset-name": sub.name, "jobset.sigs.k8s.io/replicatedjob-name": "node"}
        },
        "topologyKey": "cloud.google.com/gce-topology-block",
    }
    assert "podAntiAffinity" in affinity  # GPU jobs still spread one pod per node
    assert pod_spec(sub.runtime)["schedulerName"] == "default-scheduler"


@pytest.mark.parametrize(
    "kw, problem",
    [
        (dict(pod_group_policy="gang"), "pod_group_policy='gang': must be one of none, coscheduling, volcano"),
        (dict(schedule_timeout_seconds=30), "schedule_timeout_seconds applies to pod_group_policy='coscheduling'"),
        (dict(workload_priority_class="high"), "workload_priority_class needs queue_name"),
        (dict(queue_name="Team_A"), "queue_name='Team_A': must be a Kubernetes object name"),
        (dict(topology_key="block topology"), "topology_key='block topology': must be a node label key"),
        (dict(runtime_name="torch-distributed", pod_group_policy="volcano"), "pod_group_policy goes into the rendered"),
        (dict(queue_name="a", labels={"kueue.x-k8s.io/queue-name": "b"}), "disagree"),
    ],
)
def test_bad_scheduling_settings_are_refused(kw, problem):
    with pytest.raises(ConfigError) as info:
        KubeflowExecutor(**{**GPU, **kw}).validate()
    assert problem in str(info.value)


# --- timeout defaults ---------------------------------------------------------------------------------


def test_timeout_defaults_are_exported_unless_the_task_sets_them():
    script = build().launch.args[0]
    for name, value in TIMEOUT_DEFAULTS.items():
        assert f"export {name}=" in script and value in script
    # Set by the task (under torch's older spelling too): not exported, the task's value stands.
    sub = build(
        env_vars={"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "1200"},
        task_env={"NCCL_ASYNC_ERROR_HANDLING": "1", "PET_RDZV_CONF": "timeout=60"},
    )
    script = sub.launch.args[0]
    assert "export TORCH_NCCL_ENABLE_MONITORING=" in script
    for name in ("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "PET_RDZV_CONF"):
        assert f"export {name}=" not in script
    env = {e["name"]: e.get("value") for e in sub.trainjob["spec"]["trainer"]["env"]}
    assert env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] == "1200" and env["PET_RDZV_CONF"] == "timeout=60"
    # Off, or nothing distributed: none.
    assert "TORCH_NCCL" not in build(timeout_defaults=False).launch.args[0]
    assert "TORCH_NCCL" not in build(nodes=1, nprocs_per_node=1, gpus_per_node=1).launch.args[0]
