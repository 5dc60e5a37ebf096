"""The nemo-kubeflow command as a console script (render in a process of its own) and gc on the local
cluster, over HTTP (render and validate in this process: test/unit/cli/test_render.py)."""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from unit.cli.test_render import COMMAND, TRAIN_PY, load_dir

from nemo_kubeflow.cli import main as console
from nemo_kubeflow.cli.nemo_run_import import NEMO_RUN_DEFERRED
from nemo_kubeflow.cluster.client import KubernetesCluster
from nemo_kubeflow.schema.validation import validate_manifest


def test_render_console_script_prints_yaml_for_kubectl(tmp_path, nemorun_home, console_script):
    tolerations = '[{"key": "pool", "operator": "Equal", "value": "a3", "effect": "NoSchedule"}]'
    proc = subprocess.run(
        [
            console_script("nemo-kubeflow"),
            "render",
            "--factory",
            "kubeflow_tcpxo",
            "--set",
            "nodes=4",
            "--set",
            "namespace=x",
            "--set",
            f"tolerations={tolerations}",
            "--",
            "python",
            "pretrain.py",
            "--steps",
            "10",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "NEMORUN_HOME": str(nemorun_home)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    objs = list(yaml.safe_load_all(proc.stdout))
    assert proc.stdout.count("\n---\n") == len(objs) - 1
    assert [o["kind"] for o in objs] == ["ClusterTrainingRuntime", "TrainJob"]
    runtime, job = objs
    pod = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["tolerations"] == yaml.safe_load(tolerations)
    assert any(c["name"] == "tcpxo-daemon" for c in pod["initContainers"])
    assert job["spec"]["trainer"]["numNodes"] == 4 and job["metadata"]["namespace"] == "x"
    assert all(validate_manifest(o) == [] for o in objs)


_RENDER_AND_REPORT_IMPORTS = """
import json, sys
from nemo_kubeflow.cli.main import main
from nemo_kubeflow.cli.nemo_run_import import NEMO_RUN_DEFERRED
code = main(sys.argv[1:])
imported = sorted({name.partition(".")[0] for name in sys.modules} & set(NEMO_RUN_DEFERRED))
print(json.dumps(imported), file=sys.stderr)
sys.exit(code)
"""


def test_render_defers_what_nemo_run_imports_for_other_executors_and_renders_the_same(tmp_path, nemorun_home):
    """render imports NeMo-Run with the packages of NEMO_RUN_DEFERRED (Lepton's SDK, paramiko, kubernetes,
    libcst, ...) as stand-ins (most of its import time): the manifests are the same as with everything
    imported."""
    (tmp_path / "train.py").write_text(TRAIN_PY)
    argv = ["render", "--factory", "kubeflow_tcpxo", "--set", "nodes=2", "--", *COMMAND]
    outputs = {}
    for mode, extra_env in (("deferred", {}), ("full", {"NEMO_KUBEFLOW_FULL_IMPORT": "1"})):
        proc = subprocess.run(
            [sys.executable, "-c", _RENDER_AND_REPORT_IMPORTS, *argv],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
            env={**os.environ, "NEMORUN_HOME": str(nemorun_home), **extra_env},
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        outputs[mode] = (proc.stdout, json.loads(proc.stderr.strip().splitlines()[-1]))
    assert outputs["deferred"][1] == []
    assert outputs["full"][1] == sorted(NEMO_RUN_DEFERRED)
    assert outputs["deferred"][0] == outputs["full"][0]
    assert [o["kind"] for o in yaml.safe_load_all(outputs["deferred"][0])] == [
        "ClusterTrainingRuntime",
        "TrainJob",
        "ConfigMap",
    ]


# --- gc, on the local cluster ---------------------------------------------------------------


def rendered(tmp_path: Path, *sets: str) -> tuple[dict, dict]:
    """The runtime and the (suspended) TrainJob of a render."""
    out = tmp_path / "-".join(sets).replace("=", "_")
    argv = ["render", "--factory", "kubeflow_cpu", "--name", "task", "--out", str(out)]
    for s in sets:
        argv += ["--set", s]
    assert console.main([*argv, "--", "echo hi"]) == 0
    objs = load_dir(out)
    return objs[0], objs[1]


def names(cluster, resource: str, namespace=None) -> set[str]:
    return {o["metadata"]["name"] for o in cluster.objects(resource, namespace)}


def test_gc_deletes_unreferenced_rendered_runtimes_and_keeps_the_rest(cluster, tmp_path, capsys):
    client = KubernetesCluster(kubeconfig=str(cluster.kubeconfig_path))
    used_runtime, job = rendered(tmp_path, "nodes=1")
    unused_runtime, _ = rendered(tmp_path, "nodes=2")
    foreign = copy.deepcopy(unused_runtime)  # somebody else's runtime: not ours to delete
    foreign["metadata"] = {"name": "hand-made", "labels": {"trainer.kubeflow.org/framework": "torch"}}
    for obj in (used_runtime, unused_runtime, foreign, job):
        client.create(obj)
    used, unused = used_runtime["metadata"]["name"], unused_runtime["metadata"]["name"]
    kubeconfig = ["--kubeconfig", str(cluster.kubeconfig_path)]
    capsys.readouterr()

    # Just created: a submission may be about to reference them.
    assert console.main(["gc", "--all-namespaces", *kubeconfig]) == 0
    assert "deleted 0, kept 1 in use, 1 younger than 300s" in capsys.readouterr().err

    assert console.main(["gc", "--all-namespaces", "--dry-run", "--min-age", "0", *kubeconfig]) == 0
    assert capsys.readouterr().out == f"would delete ClusterTrainingRuntime/{unused}\n"
    assert {used, unused, "hand-made"} <= names(cluster, "clustertrainingruntimes")

    assert console.main(["gc", "--all-namespaces", "--min-age", "0", *kubeconfig]) == 0
    out, err = capsys.readouterr()
    assert out == f"deleted ClusterTrainingRuntime/{unused}\n"
    assert "deleted 1, kept 1 in use" in err
    remaining = names(cluster, "clustertrainingruntimes")
    assert used in remaining and "hand-made" in remaining and unused not in remaining


def test_gc_of_a_namespace_collects_its_training_runtimes_only(cluster, tmp_path, capsys):
    cluster.create_namespace("team")
    client = KubernetesCluster(kubeconfig=str(cluster.kubeconfig_path))
    namespaced, _ = rendered(tmp_path, "runtime_kind=TrainingRuntime", "namespace=team")
    cluster_wide, _ = rendered(tmp_path, "nodes=3")
    client.create(namespaced)
    client.create(cluster_wide)
    capsys.readouterr()

    argv = ["gc", "--namespace", "team", "--min-age", "0", "--kubeconfig", str(cluster.kubeconfig_path)]
    assert console.main(argv) == 0
    out, err = capsys.readouterr()
    assert out == f"deleted TrainingRuntime/{namespaced['metadata']['name']} (namespace team)\n"
    assert "ClusterTrainingRuntimes skipped" in err and "--all-namespaces" in err
    assert cluster_wide["metadata"]["name"] in names(cluster, "clustertrainingruntimes")
    assert names(cluster, "trainingruntimes", "team") == set()
