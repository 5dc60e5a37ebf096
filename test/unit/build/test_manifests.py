"""Pure builders (executor + role + files -> manifests), pinned against golden YAML.

Regenerate the golden files after an intended change with:
    NEMO_KUBEFLOW_UPDATE_GOLDEN=1 pytest test/unit/build/test_manifests.py
and review the diff.
"""

import os

import builders
import pytest
import yaml
from locations import GOLDEN
from torchx.specs import Role

from nemo_kubeflow import KubeflowExecutor, PVCMount, SecretMount
from nemo_kubeflow.build.plan import build_submission
from nemo_kubeflow.config.packager import BundleFile
from nemo_kubeflow.parts.yamlio import dump_all
from nemo_kubeflow.schema.validation import check_manifests

IMAGE = "nvcr.io/nvidia/nemo:25.02"
FILES = [
    BundleFile("code/train.py", b"import torch\nprint('hello')\n", 0o644),
    BundleFile("scripts/pretrain.sh", b"#!/usr/bin/bash\ntorchrun train.py\n", 0o755),
]


def torchrun_role(nodes, nprocs, env=None):
    return builders.torchrun_role(nodes, nprocs, env, args=("--lr", "0.1"))


CONFIGS = {
    "gpu_default": dict(
        executor=dict(container_image=IMAGE, nodes=2, nprocs_per_node=8, gpus_per_node=8, namespace="training"),
        role=lambda: torchrun_role(2, 8, {"WANDB_PROJECT": "demo"}),
    ),
    "cpu_only": dict(
        executor=dict(
            container_image="python:3.11",
            nodes=2,
            nprocs_per_node=2,
            cpu_request="2",
            cpu_limit="4",
            memory_request="4Gi",
            memory_limit="8Gi",
            shm_size="1Gi",
        ),
        role=lambda: Role(
            name="cpu", image="", entrypoint="bash", args=["/nemo_run/scripts/pretrain.sh"], env={"LOGLEVEL": "INFO"}
        ),
    ),
    "tcpxo": dict(
        executor=dict(
            container_image=IMAGE,
            nodes=4,
            nprocs_per_node=8,
            gpus_per_node=8,
            enable_tcpxo=True,
            tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            node_selector={"cloud.google.com/gke-accelerator": "nvidia-h100-mega-80gb"},
            retries=2,
        ),
        role=lambda: torchrun_role(4, 8),
    ),
    "pvc_secret": dict(
        executor=dict(
            container_image=IMAGE,
            nodes=2,
            nprocs_per_node=4,
            gpus_per_node=4,
            namespace="team-a",
            pvc_mounts=[
                PVCMount(claim_name="datasets", mount_path="/data", read_only=True),
                PVCMount(
                    claim_name="ckpt", mount_path="/ckpt", create=True, size="500Gi", storage_class="standard-rwx"
                ),
            ],
            secret_env_vars={"HF_TOKEN": "env:HF_TOKEN"},
            secret_key_refs={"WANDB_API_KEY": "wandb/api-key"},
            secret_env_from=["team-a-creds"],
            secret_mounts=[SecretMount(secret_name="gcs-key", mount_path="/secrets/gcs", keys=["key.json"])],
            image_pull_secrets=["ngc"],
            service_account="trainer",
            active_deadline_seconds=86400,
            labels={"team": "a"},
            pod_labels={"team": "a"},
            pod_annotations={"example.com/owner": "a"},
        ),
        role=lambda: torchrun_role(2, 4),
    ),
}


def build(config: str):
    spec = CONFIGS[config]
    executor = KubeflowExecutor(**spec["executor"], experiment_id="llama3_8b_1700000000")
    return build_submission(executor, spec["role"](), FILES, task_name=config)


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_golden_manifests(config):
    sub = build(config)
    text = dump_all(sub.manifests())
    path = GOLDEN / f"{config}.yaml"
    if os.environ.get("NEMO_KUBEFLOW_UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"manifests changed; see the module docstring to regenerate {path}"


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_manifests_pass_offline_validation(config):
    check_manifests(build(config).manifests())


def test_trainjob_carries_sizes_as_integers():
    job = build("gpu_default").trainjob
    trainer = job["spec"]["trainer"]
    assert trainer["numNodes"] == 2 and trainer["numProcPerNode"] == 8
    assert trainer["resourcesPerNode"] == {"requests": {"nvidia.com/gpu": "8"}, "limits": {"nvidia.com/gpu": "8"}}
    assert job["spec"]["suspend"] is True
    assert not any(e["name"].startswith("PET_") for e in trainer["env"])
    assert {"name": "WANDB_PROJECT", "value": "demo"} in trainer["env"]


def test_runtime_is_shared_by_identical_settings_and_differs_otherwise():
    a, b = build("gpu_default"), build("gpu_default")
    assert a.runtime["metadata"]["name"] == b.runtime["metadata"]["name"]
    other = build_submission(
        KubeflowExecutor(**{**CONFIGS["gpu_default"]["executor"], "shm_size": "32Gi"}, experiment_id="x"),
        torchrun_role(2, 8),
        FILES,
        task_name="other",
    )
    assert other.runtime["metadata"]["name"] != a.runtime["metadata"]["name"]
    # Different tasks, same settings: different TrainJobs and ConfigMaps, one runtime.
    t2 = build_submission(
        KubeflowExecutor(**CONFIGS["gpu_default"]["executor"], experiment_id="llama3_8b_1700000000"),
        torchrun_role(2, 8, {"WANDB_PROJECT": "demo"}),
        FILES,
        task_name="second",
    )
    assert t2.runtime["metadata"]["name"] == a.runtime["metadata"]["name"]
    assert t2.name != a.name and t2.configmaps[0]["metadata"]["name"] != a.configmaps[0]["metadata"]["name"]


def test_runtime_is_cluster_scoped_and_shaped_for_trainer():
    rt = build("gpu_default").runtime
    assert rt["kind"] == "ClusterTrainingRuntime" and "namespace" not in rt["metadata"]
    assert rt["metadata"]["labels"]["trainer.kubeflow.org/framework"] == "torch"
    [job] = rt["spec"]["template"]["spec"]["replicatedJobs"]
    assert job["name"] == "node" and job["replicas"] == 1
    assert job["template"]["metadata"]["labels"]["trainer.kubeflow.org/trainjob-ancestor-step"] == "trainer"
    assert job["template"]["spec"]["backoffLimit"] == 0
    assert [c["name"] for c in job["template"]["spec"]["template"]["spec"]["containers"]] == ["node"]
    assert "numProcPerNode" not in rt["spec"]["mlPolicy"].get("torch", {})


def test_anti_affinity_is_scoped_to_the_jobs_own_pods():
    sub = build("gpu_default")
    patch_spec = sub.trainjob["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
    pod = patch_spec["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    [term] = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["labelSelector"] == {"matchLabels": {"jobset.sigs.k8s.io/jobset-name": sub.name}}
    assert term["topologyKey"] == "kubernetes.io/hostname"
    # CPU-only jobs are not spread by default.
    cpu = build("cpu_only").trainjob["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
    assert "affinity" not in cpu["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


def test_tcpxo_only_when_enabled():
    def pod_spec(sub):
        return sub.runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]

    tcpxo = pod_spec(build("tcpxo"))
    [sidecar] = tcpxo["spec"]["initContainers"]
    assert sidecar["name"] == "tcpxo-daemon" and sidecar["restartPolicy"] == "Always"
    ann = tcpxo["metadata"]["annotations"]
    assert (
        "devices.gke.io/container.tcpxo-daemon" in ann
        and "/dev/nvidia7" in ann["devices.gke.io/container.tcpxo-daemon"]
    )
    interfaces = yaml.safe_load(ann["networking.gke.io/interfaces"])
    assert [i["network"] for i in interfaces] == ["default"] + [f"vpc{i}" for i in range(1, 9)]
    node = tcpxo["spec"]["containers"][0]
    assert {"name": "NCCL_FASTRAK_IFNAME", "value": "eth1,eth2,eth3,eth4,eth5,eth6,eth7,eth8"} in node["env"]
    env = {e["name"]: e.get("value") for e in node["env"]}
    # The plugin's current profile: its guest config checker aborts a job without NVLSTREE_MAX_CHUNKSIZE,
    # and NCCL_ALGO / NCCL_NVLS_ENABLE=0 are no longer part of it.
    assert env["NCCL_NVLSTREE_MAX_CHUNKSIZE"] == "131072"
    assert not {"NCCL_ALGO", "NCCL_NVLS_ENABLE", "NCCL_DYNAMIC_CHUNK_SIZE"} & set(env)
    assert sidecar["args"][0].endswith("/fts/entrypoint_rxdm_container.sh --num_hops=2")
    assert sidecar["image"].endswith("tcpgpudmarxd-dev:v1.0.21")
    assert "LD_LIBRARY_PATH" not in env
    assert (
        'LD_LIBRARY_PATH=/usr/local/nvidia/lib64"${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"'
        in build("tcpxo").launch.args[0]
    )
    assert build("tcpxo").runtime["spec"]["template"]["spec"]["failurePolicy"]["maxRestarts"] == 2

    plain = pod_spec(build("gpu_default"))
    assert "initContainers" not in plain["spec"]
    assert not any("hostPath" in v for v in plain["spec"].get("volumes", []))


def test_secret_values_never_in_manifests(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "canary-8c1f3e")
    sub = build("pvc_secret")
    text = dump_all(sub.manifests())
    assert "canary-8c1f3e" not in text
    assert sub.secret["stringData"] == {"HF_TOKEN": "<masked>"} and "data" not in sub.secret
    env = {e["name"]: e for e in sub.trainjob["spec"]["trainer"]["env"]}
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": sub.secret["metadata"]["name"], "key": "HF_TOKEN"}
    assert env["WANDB_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "wandb", "key": "api-key"}


def test_only_pvcs_marked_create_are_created():
    sub = build("pvc_secret")
    assert [p["metadata"]["name"] for p in sub.pvcs] == ["ckpt"]
    assert sub.pvcs[0]["spec"] == {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": "500Gi"}},
        "storageClassName": "standard-rwx",
    }


def test_namespaced_runtime_option():
    ex = KubeflowExecutor(
        **CONFIGS["cpu_only"]["executor"], runtime_kind="TrainingRuntime", namespace="team-b", experiment_id="e"
    )
    sub = build_submission(ex, CONFIGS["cpu_only"]["role"](), FILES, task_name="t")
    assert sub.runtime["kind"] == "TrainingRuntime" and sub.runtime["metadata"]["namespace"] == "team-b"
    assert sub.trainjob["spec"]["runtimeRef"]["kind"] == "TrainingRuntime"
    check_manifests(sub.manifests())


def test_existing_runtime_is_referenced_not_rendered():
    ex = KubeflowExecutor(**CONFIGS["cpu_only"]["executor"], runtime_name="torch-distributed", experiment_id="e")
    sub = build_submission(ex, CONFIGS["cpu_only"]["role"](), FILES, task_name="t")
    assert sub.runtime is None
    assert sub.trainjob["spec"]["runtimeRef"]["name"] == "torch-distributed"
