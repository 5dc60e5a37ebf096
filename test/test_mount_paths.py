"""A path under a claim's mount path inside a `run.Partial`'s arguments (NeMo-Run ships them zlib+base64, where
no path rewriting reaches) lands in the claim, on both back ends (the node agent runs the real tier's pods
with the same kubelet); on a machine without mount namespaces (forced with NEMO_KUBEFLOW_LOCAL_MOUNT_NAMESPACE=0)
the task fails before it runs, saying why and what to do. Either way nothing reaches the host's own path."""

import os
import uuid

import nemo_run as run
import workloads
from backends import app_id_of, logs
from torchx.specs import AppState

from nemo_kubeflow import ConfigMapPackager, KubeflowExecutor, PVCMount
from nemo_kubeflow.nemo_run.scheduler import create_scheduler
from nemo_kubeflow_local.kubelet.mounts import MODE_ENV


def claim_executor(backend, top: str):
    backend.provide_volume("be-mounts", "1Gi")
    return backend.executor(
        pvc_mounts=[PVCMount(claim_name="be-mounts", mount_path=f"/{top}", create=True, size="1Gi")]
    )


def test_a_partial_argument_under_a_claim_mount_writes_into_the_claim(backend):
    top = "nkf-e2e-" + uuid.uuid4().hex[:8]
    path = f"/{top}/node-0/last.ckpt"
    with run.Experiment("be-mounts", executor=claim_executor(backend, top), log_level="WARN") as exp:
        exp.add(run.Partial(workloads.write_file, path=path, text="weights"), name="write")
        # Read back by a script, whose path the kubelet rewrites to the claim's directory anyway.
        exp.add(run.Script(inline=f"cat {path}; echo"), name="read")
        exp.run(sequential=True)
        write, read = exp.jobs
    status = exp.status(return_dict=True)
    assert status[write.id]["status"] == AppState.SUCCEEDED, logs(write, "write")
    assert status[read.id]["status"] == AppState.SUCCEEDED, logs(read, "read")
    assert f"[node-0] wrote {path}\n" in logs(write, "write")
    assert "[node-0] weights\n" in logs(read, "read") and "[node-1] weights\n" in logs(read, "read")
    assert not os.path.lexists(f"/{top}")


def test_without_a_mount_namespace_the_task_fails_before_it_runs_saying_why(cluster, monkeypatch):
    # The switch acts on the kubelet of this process: the local cluster's (the real tier's node agent runs apart).
    monkeypatch.setenv(MODE_ENV, "0")
    top = "nkf-e2e-" + uuid.uuid4().hex[:8]
    path = f"/{top}/last.ckpt"
    executor = KubeflowExecutor(
        container_image="python:3.11",  # ignored by the local cluster
        nodes=1,
        kubeconfig=str(cluster.kubeconfig_path),
        shm_size=None,
        packager=ConfigMapPackager(relative_path="test", include_pattern="workloads.py"),
        pvc_mounts=[PVCMount(claim_name="mounts-off", mount_path=f"/{top}", create=True, size="1Gi")],
    )
    with run.Experiment("mounts-off", executor=executor, log_level="WARN") as exp:
        exp.add(run.Partial(workloads.write_file, path=path, text="weights"), name="write")
        exp.run(sequential=True)
        job = exp.jobs[0]
    assert exp.status(return_dict=True)[job.id]["status"] == AppState.FAILED
    desc = create_scheduler("t").describe(app_id_of(job))
    assert f'error mounting "pvc-0" to rootfs at "/{top}"' in desc.msg, desc.msg
    assert f"{MODE_ENV}=rewrite" in desc.msg and "user namespaces" in desc.msg, desc.msg
    assert not any("wrote" in line for line in logs(job, "write"))
    assert not os.path.lexists(f"/{top}")
