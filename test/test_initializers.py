"""Dataset and model initializers on the local cluster: run before training (from ``file://`` sources,
with the stand-in of nemo_kubeflow_local.kubelet.initializer_image), and a failing one failing the job.
The pure builders (the SDK's types, the runtime's initializer jobs, the golden file) are in
test/unit/parts/test_initializers.py."""

import nemo_run as run
from kubeflow.trainer import (
    HuggingFaceDatasetInitializer,
    HuggingFaceModelInitializer,
    Initializer,
)
from kubernetes import client
from torchx.specs import AppState, parse_app_handle

from nemo_kubeflow import KubeflowExecutor
from nemo_kubeflow.nemo_run.scheduler import create_scheduler
from nemo_kubeflow.observe.pod_states import failed_step
from nemo_kubeflow.parts import initializers as inits
from nemo_kubeflow.parts.steps import step_selector
from nemo_kubeflow_local.kubelet import initializer_image as local_initializer

# --- the local cluster's stand-in of the initializer images ----------------------------------------------


def test_local_initializer_copies_a_file_source(tmp_path, monkeypatch):
    src = tmp_path / "src"
    (src / "shards").mkdir(parents=True)
    (src / "shards" / "0.jsonl").write_text("{}\n")
    (src / "weights.bin").write_text("ignored")
    monkeypatch.setenv("STORAGE_URI", f"file://{src}")
    monkeypatch.setenv("IGNORE_PATTERNS", "*.bin")
    assert local_initializer.main(["model", str(tmp_path / "out")]) == 0
    assert sorted(p.name for p in (tmp_path / "out").rglob("*") if p.is_file()) == ["0.jsonl"]
    monkeypatch.setenv("STORAGE_URI", "hf://org/model")
    assert local_initializer.main(["model", str(tmp_path / "out")]) == 1


# --- on the local cluster ------------------------------------------------------------------------------


def local_executor(cluster, dataset_uri: str, model_uri: str) -> KubeflowExecutor:
    return KubeflowExecutor(
        container_image="python:3.11",
        nodes=2,
        kubeconfig=str(cluster.kubeconfig_path),
        shm_size=None,
        initializer=Initializer(
            dataset=HuggingFaceDatasetInitializer(storage_uri=dataset_uri),
            model=HuggingFaceModelInitializer(storage_uri=model_uri),
        ),
        initializer_settings=inits.InitializerSettings(
            claim_name="init-cache",
            create_claim=True,
            claim_size="1Gi",
            dataset_command=local_initializer.command("dataset"),
            model_command=local_initializer.command("model"),
        ),
    )


def run_task(executor, name: str, script: str):
    with run.Experiment(name, executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(inline=script), name="t")
        exp.run(sequential=True)
        job = exp.jobs[0]
    return exp.status(return_dict=True)["t"]["status"], parse_app_handle(job.handle)[2]


def test_local_cluster_runs_the_initializers_before_training(cluster, tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text('{"text": "hello"}\n')
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{"layers": 2}\n')
    ex = local_executor(cluster, f"file://{tmp_path / 'data'}", f"file://{tmp_path / 'model'}")
    state, app_id = run_task(ex, "init-ok", "cat /workspace/dataset/train.jsonl /workspace/model/config.json")
    assert state == AppState.SUCCEEDED
    lines = "".join(create_scheduler("t").log_iter(app_id, "t", 1))
    assert '{"text": "hello"}' in lines and '{"layers": 2}' in lines
    # Each step's pod is found by the JobSet labels, and its container bears the step's name.
    core = client.CoreV1Api(cluster.api_client())
    name = app_id.split(":", 1)[1]
    for step in ("dataset-initializer", "model-initializer"):
        [step_pod] = core.list_namespaced_pod("default", label_selector=step_selector(name, step)).items
        log = core.read_namespaced_pod_log(step_pod.metadata.name, "default", container=step)
        assert "copied 1 file(s)" in log
        node_pods = core.list_namespaced_pod("default", label_selector=step_selector(name, "node")).items
        assert all(
            p.metadata.creation_timestamp >= step_pod.status.container_statuses[0].state.terminated.finished_at
            for p in node_pods
        )


def test_a_failing_initializer_fails_the_job_with_its_message(cluster, tmp_path):
    ex = local_executor(cluster, f"file://{tmp_path / 'missing'}", f"file://{tmp_path}")
    state, app_id = run_task(ex, "init-bad", "echo never")
    assert state == AppState.FAILED
    name = app_id.split(":", 1)[1]
    desc = create_scheduler("t").describe(app_id)
    assert f"{name}-dataset-initializer-0" in desc.msg  # Trainer's condition names the step's job
    pods = [
        p
        for p in cluster.objects("pods", "default")
        if p["metadata"]["labels"].get("jobset.sigs.k8s.io/jobset-name") == name
    ]
    detail = failed_step(pods)
    assert detail.startswith("dataset-initializer (pod ") and f"{tmp_path / 'missing'} does not exist" in detail
    assert not any(p["metadata"]["labels"]["jobset.sigs.k8s.io/replicatedjob-name"] == "node" for p in pods)
