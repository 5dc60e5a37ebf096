"""Every example in examples/kubeflow/, run as a user runs it: dry runs offline, real runs on
the local cluster (over HTTP, pods as local processes)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from torchx.specs import AppState

from nemo_kubeflow.config.factories import LOCAL_KUBECONFIG_ENV
from nemo_kubeflow.constants import EXPERIMENT_LABEL, TASK_LABEL
from nemo_kubeflow.observe.status import job_status
from nemo_kubeflow.schema.validation import check_manifests

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples" / "kubeflow"


def run_example(script: str, *args: str, nemorun_home: Path, cluster=None) -> str:
    env = {**os.environ, "NEMORUN_HOME": str(nemorun_home), "COLUMNS": "400"}
    env.pop(LOCAL_KUBECONFIG_ENV, None)
    if cluster is not None:
        env[LOCAL_KUBECONFIG_ENV] = str(cluster.kubeconfig_path)
    # One stream: NeMo-Run prints task logs on stderr and everything else on stdout.
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=240,
        cwd=REPO,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-6000:]
    return proc.stdout


def load_manifests(directory: str) -> list[dict]:
    files = sorted(Path(directory).glob("*.yaml"))
    assert files, f"no manifests in {directory}"
    objs = [yaml.safe_load(f.read_text()) for f in files]
    check_manifests(objs)
    return objs


def trainjobs_of(cluster, experiment: str, task: str) -> list[dict]:
    """The TrainJobs of one task of the experiments titled ``experiment``."""

    def matches(job: dict) -> bool:
        labels = job["metadata"]["labels"]
        return labels[EXPERIMENT_LABEL].startswith(f"{experiment}_") and labels[TASK_LABEL] == task

    return [job for job in cluster.objects("trainjobs", "default") if matches(job)]


def test_main_example_prints_each_log_line_with_one_prefix(nemorun_home):
    # As the README runs it: its own local cluster, NeMo-Run following the logs of both nodes.
    out = re.sub(r"\x1b\[[0-9;]*m", "", run_example("hello_kubeflow.py", nemorun_home=nemorun_home))
    assert "OK: every rank saw the same sum" in out, out[-3000:]
    lines = out.splitlines()
    for rank in range(4):
        node = rank // 2  # static rendezvous: node i holds ranks 2i and 2i+1
        assert f"allreduce/{node} [rank{rank}]:rank {rank}/4 on node {node}: all_reduce sum = 10" in lines, out[-6000:]
    # NeMo-Run's `<task>/<node>` alone: no TrainJob id cut to 10 characters, no second node prefix, no local rank.
    assert not re.search(r"\[node-\d\]|\[default\d\]:|^\S+/\d \S+/\d ", out, re.MULTILINE), out[-6000:]
    # torch warns at import in every process when NumPy is missing; the set-up commands install it.
    assert "Failed to initialize NumPy" not in out, out[-6000:]


def test_train_entrypoint_dry_run_with_the_gpu_factory(nemorun_home):
    out = run_example(
        "train_entrypoint.py",
        "run.executor=kubeflow_gpu",
        "run.executor.nodes=2",
        "steps=7",
        "--dryrun",
        nemorun_home=nemorun_home,
    )
    assert "Dry run for task __main__:train" in out
    assert re.search(r"│ steps\s+│ 7\s+│", out)
    assert "KubeflowExecutor(" in out and "nodes=2" in out and "gpus_per_node=8" in out


@pytest.mark.needs_torch
def test_train_entrypoint_runs_on_the_local_cluster(cluster, nemorun_home):
    out = run_example(
        "train_entrypoint.py",
        "run.executor=kubeflow_local",
        "run.executor.nodes=2",
        "--yes",
        nemorun_home=nemorun_home,
        cluster=cluster,
    )
    # Gradients are all-reduced, so both ranks converge to the same weights.
    assert "rank 0/2: w=3.000 b=1.000" in out and "rank 1/2: w=3.000 b=1.000" in out, out[-3000:]
    [job] = trainjobs_of(cluster, "train", "train")
    assert job["spec"]["trainer"]["numNodes"] == 2
    assert job_status(job).state == AppState.SUCCEEDED


@pytest.mark.needs_torch
def test_recipe_runs_with_torchrun_on_the_local_cluster(cluster, nemorun_home):
    out = run_example("recipe.py", nemorun_home=nemorun_home, cluster=cluster)
    assert "pretrain finished: SUCCEEDED" in out
    checksums = re.findall(r"rank (\d)/2: loss=[\d.]+ weights checksum=(-?[\d.]+)", out)
    assert sorted(rank for rank, _ in checksums) == ["0", "1"], out[-3000:]
    assert len({c for _, c in checksums}) == 1  # DDP kept the replicas identical
    [job] = trainjobs_of(cluster, "recipe", "pretrain")
    assert job["spec"]["trainer"]["numProcPerNode"] == 2
    assert "fdl_runner" in job["spec"]["trainer"]["args"][0]


def test_multi_task_dry_run_writes_every_tasks_manifests(nemorun_home):
    out = run_example("multi_task.py", "--factory", "kubeflow_cpu", "--dryrun", nemorun_home=nemorun_home)
    dirs = dict(re.findall(r"^(\w+): manifests in (\S+)$", out, re.MULTILINE))
    assert sorted(dirs) == ["check", "prepare", "train"]
    manifests = {task: load_manifests(d) for task, d in dirs.items()}
    runtimes = {
        o["metadata"]["name"] for objs in manifests.values() for o in objs if o["kind"] == "ClusterTrainingRuntime"
    }
    assert len(runtimes) == 1  # identical settings share one runtime
    [train] = [o for o in manifests["train"] if o["kind"] == "TrainJob"]
    assert "nemo_run.core.runners.fdl_runner" in train["spec"]["trainer"]["args"][0]


def test_multi_task_runs_its_dependency_graph_on_the_local_cluster(cluster, nemorun_home):
    out = run_example("multi_task.py", nemorun_home=nemorun_home, cluster=cluster)
    for task in ("prepare", "train", "check"):
        assert f"{task}: SUCCEEDED" in out
    assert "train: epoch 1 over 3 shards" in out and "train: done" in out
    [prepare] = trainjobs_of(cluster, "multi-task", "prepare")
    [train] = trainjobs_of(cluster, "multi-task", "train")
    finished = max(c["lastTransitionTime"] for c in prepare["status"]["conditions"])
    assert train["metadata"]["creationTimestamp"] >= finished  # train waited for prepare


def test_tcpxo_dry_run_prints_where_the_manifests_are(nemorun_home):
    out = run_example("tcpxo_dryrun.py", nemorun_home=nemorun_home)
    [directory] = re.findall(r"^manifests written to (\S+):$", out, re.MULTILINE)
    objs = load_manifests(directory)
    runtime = next(o for o in objs if o["kind"] == "ClusterTrainingRuntime")
    job = next(o for o in objs if o["kind"] == "TrainJob")
    pod = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    assert "networking.gke.io/interfaces" in pod["metadata"]["annotations"]
    assert any(c["name"] == "tcpxo-daemon" for c in pod["spec"]["initContainers"])
    assert pod["spec"]["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-h100-mega-80gb"}
    assert job["spec"]["trainer"]["numNodes"] == 2 and job["spec"]["trainer"]["numProcPerNode"] == 8
    assert job["spec"]["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == "8"
