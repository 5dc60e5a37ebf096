"""The README's main job (2 nodes x 2 processes, gloo all-reduce) and the Kubeflow SDK on top."""

from __future__ import annotations

import pytest
from kubeflow.common.types import KubernetesBackendConfig
from kubeflow.trainer import TrainerClient
from localcluster_helpers import (
    ALL_REDUCE_SCRIPT,
    condition,
    create_runtime,
    create_trainjob,
    pods_of,
    runtime,
    trainjob,
    unique,
    wait_finished,
)

TORCHRUN = (
    "torchrun --nnodes $PET_NNODES --nproc-per-node $PET_NPROC_PER_NODE --node-rank $PET_NODE_RANK "
    "--master-addr $PET_MASTER_ADDR --master-port $PET_MASTER_PORT /workspace/script.py"
)


@pytest.mark.needs_torch
def test_torchrun_all_reduce_across_two_nodes(cluster, core, custom, ns):
    name = unique("torch")
    create_runtime(
        custom,
        runtime(
            name,
            volumes=({"name": "code", "configMap": {"name": "script"}},),
            mounts=({"name": "code", "mountPath": "/workspace"},),
        ),
    )
    core.create_namespaced_config_map(ns, {"metadata": {"name": "script"}, "data": {"script.py": ALL_REDUCE_SCRIPT}})
    body = trainjob("allreduce", name, ["bash", "-c", TORCHRUN])
    body["spec"]["trainer"]["numProcPerNode"] = 2
    create_trainjob(custom, ns, body)
    job = wait_finished(cluster, custom, ns, "allreduce", timeout=60)
    logs = "".join(core.read_namespaced_pod_log(p.metadata.name, ns) for p in pods_of(core, ns, "allreduce"))
    assert condition(job, "Complete")["status"] == "True", logs
    assert sorted(line for line in logs.splitlines() if "sum=" in line) == [
        f"rank {rank} of 4: sum=10" for rank in range(4)
    ]


def test_kubeflow_sdk_reads_a_finished_job(cluster, core, custom, ns):
    name = unique("sdk")
    create_runtime(custom, runtime(name))
    create_trainjob(custom, ns, trainjob("sdkjob", name, ["bash", "-c", "echo line one; echo rank $PET_NODE_RANK"]))
    wait_finished(cluster, custom, ns, "sdkjob")
    sdk = TrainerClient(KubernetesBackendConfig(namespace=ns, client_configuration=cluster.configuration()))
    job = sdk.get_job("sdkjob")
    assert job.status == "Complete" and job.num_nodes == 2 and job.runtime.name == name
    assert sorted(step.name for step in job.steps) == ["node-0", "node-1"]
    assert {step.pod_name for step in job.steps} == {p.metadata.name for p in pods_of(core, ns, "sdkjob")}
    assert list(sdk.get_job_logs("sdkjob")) == ["line one", "rank 0"]
    assert list(sdk.get_job_logs("sdkjob", step="node-1", follow=True)) == ["line one", "rank 1"]
    assert [j.name for j in sdk.list_jobs()] == ["sdkjob"]
