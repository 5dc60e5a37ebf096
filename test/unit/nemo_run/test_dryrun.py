"""Dry runs through NeMo-Run: every manifest lands in <job_dir>/manifests/, nothing is sent."""

import re
from pathlib import Path

import nemo_run as run
import pytest
import workloads
import yaml

from nemo_kubeflow import ConfigMapPackager, KubeflowExecutor, PVCMount
from nemo_kubeflow.schema.validation import check_manifests

CONFIGS = {
    "gpu": dict(container_image="nvcr.io/nvidia/nemo:25.02", nodes=2, nprocs_per_node=8, gpus_per_node=8),
    "cpu": dict(container_image="python:3.11", nodes=2, nprocs_per_node=2, cpu_request="2", memory_request="4Gi"),
    "tcpxo": dict(
        container_image="nvcr.io/nvidia/nemo:25.02", nodes=2, nprocs_per_node=8, gpus_per_node=8, enable_tcpxo=True
    ),
    "pvc_secret": dict(
        container_image="nvcr.io/nvidia/nemo:25.02",
        nodes=2,
        nprocs_per_node=8,
        gpus_per_node=8,
        pvc_mounts=[PVCMount(claim_name="ckpt", mount_path="/ckpt", create=True, size="1Ti")],
        secret_env_vars={"HF_TOKEN": "env:HF_TOKEN"},
    ),
}


def manifests_of(exp_dir: Path, task: str) -> list[dict]:
    files = sorted((exp_dir / task / "manifests").glob("*.yaml"))
    assert files, f"no manifests written for {task}"
    return [yaml.safe_load(f.read_text()) for f in files]


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_experiment_dryrun_writes_valid_manifests(config, monkeypatch, capsys):
    monkeypatch.setenv("HF_TOKEN", "canary-d41d8c")
    executor = KubeflowExecutor(
        **CONFIGS[config],
        kubeconfig="/nonexistent/kubeconfig",  # a dry run must not need one
        packager=ConfigMapPackager(relative_path="test", include_pattern="workloads.py"),
    )
    with run.Experiment(f"dry-{config}", executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(inline="echo step one\ntorchrun train.py"), name="script")
        exp.add(run.Partial(workloads.greet, name="kubeflow"), name="partial", executor=executor.clone())
        exp.dryrun(delete_exp_dir=False)  # NeMo-Run deletes the experiment dir by default
        exp_dir = Path(exp._exp_dir)

    for task in ("script", "partial"):
        objs = manifests_of(exp_dir, task)
        check_manifests(objs)
        kinds = [o["kind"] for o in objs]
        assert "TrainJob" in kinds and "ConfigMap" in kinds and "ClusterTrainingRuntime" in kinds
        text = "".join(f.read_text() for f in (exp_dir / task / "manifests").glob("*.yaml"))
        assert "canary-d41d8c" not in text
    partial_job = next(o for o in manifests_of(exp_dir, "partial") if o["kind"] == "TrainJob")
    script = partial_job["spec"]["trainer"]["args"][0]
    # The fiddle config is read from the pod path, not from this machine's job_dir.
    assert "/nemo_run/partial/configs/partial_fn_or_script" in script
    assert str(exp_dir) not in script
    out = capsys.readouterr()
    assert "canary-d41d8c" not in out.out + out.err


def test_dryrun_summary_lists_objects(capsys):
    executor = KubeflowExecutor(container_image="python:3.11", nodes=2, nprocs_per_node=2)
    run.run(run.Script(inline="echo hi"), executor=executor, name="summary", dryrun=True)
    # NeMo-Run prints through rich: undo its wrapping and its "file.py:line" column.
    out = " ".join(re.sub(r"\S+\.py:\d+", " ", capsys.readouterr().out).split())
    assert "Kubeflow Trainer submission (dry run: nothing was sent to any cluster)" in out
    assert "TrainJob" in out and "ConfigMap" in out


def test_dryrun_rejects_missing_image_before_anything():
    with pytest.raises(Exception, match="container_image is not set"):
        run.run(run.Script(inline="echo hi"), executor=KubeflowExecutor(nodes=1), name="noimg", dryrun=True)
