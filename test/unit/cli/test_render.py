"""The nemo-kubeflow command in this process: render (the same manifests as NeMo-Run's dry run, secrets
masked, executors from factories and files, --set), validate, and its errors (test/test_console.py runs
the console script and gc on the local cluster)."""

import copy
import textwrap
from pathlib import Path

import nemo_run as run
import pytest
import yaml

from nemo_kubeflow.cli import main as console
from nemo_kubeflow.cli.executor_config import load_executor
from nemo_kubeflow.schema.validation import validate_manifest

TRAIN_PY = "print('training')\n"


COMMAND = ["python", "train.py", "--lr", "0.1"]


def load_dir(directory: Path) -> list[dict]:
    return [yaml.safe_load(f.read_text()) for f in sorted(directory.glob("*.yaml"))]


def by_kind(objs: list[dict], kind: str) -> dict:
    [obj] = [o for o in objs if o["kind"] == kind]
    return obj


def shipped_paths(trainjob: dict) -> list[str]:
    spec = trainjob["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
    pod = spec["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    return sorted(item["path"] for v in pod["volumes"] for item in v["configMap"]["items"])


def without_nemo_run_metadata(trainjob: dict) -> dict:
    """The TrainJob minus NeMo-Run's own records (experiment __main__.py, <task>/configs/*.yaml),
    which a real run ships and `render` leaves out."""
    out = copy.deepcopy(trainjob)
    spec = out["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
    for volume in spec["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["volumes"]:
        items = volume["configMap"]["items"]
        items[:] = [i for i in items if i["path"] != "__main__.py" and "/configs/" not in i["path"]]
    return out


def test_render_matches_the_scheduler_dry_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(TRAIN_PY)
    executor = load_executor("kubeflow_cpu", overrides=["nodes=2", "namespace=team"])
    with run.Experiment("render-match", executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(path="train.py", args=COMMAND[2:], entrypoint="python"), name="train")
        exp.dryrun(delete_exp_dir=False)
        experiment_id = exp._id
        dryrun = load_dir(Path(exp.jobs[0].executor.job_dir) / "manifests")

    out = tmp_path / "rendered"
    code = console.main(
        [
            "render",
            "--factory",
            "kubeflow_cpu",
            "--set",
            "nodes=2",
            "--set",
            "namespace=team",
            "--experiment-id",
            experiment_id,
            "--name",
            "train",
            "--out",
            str(out),
            "--",
            *COMMAND,
        ]
    )
    assert code == 0, capsys.readouterr().err
    rendered = load_dir(out)

    assert (
        [o["kind"] for o in rendered]
        == [o["kind"] for o in dryrun]
        == ["ClusterTrainingRuntime", "TrainJob", "ConfigMap"]
    )
    assert by_kind(rendered, "ClusterTrainingRuntime") == by_kind(dryrun, "ClusterTrainingRuntime")
    job = by_kind(rendered, "TrainJob")
    assert job == without_nemo_run_metadata(by_kind(dryrun, "TrainJob"))
    assert shipped_paths(job) == ["code/train.py"]
    assert job["metadata"]["namespace"] == "team" and job["spec"]["trainer"]["numNodes"] == 2
    assert "/nemo_run/code/train.py --lr 0.1" in job["spec"]["trainer"]["args"][0]
    assert list(by_kind(rendered, "ConfigMap")["data"].values()) == [TRAIN_PY]
    for obj in rendered:
        assert validate_manifest(obj) == []


def test_render_masks_secrets(monkeypatch, capsys):
    monkeypatch.setenv("HF_TOKEN", "canary-5f1d2e")
    code = console.main(
        [
            "render",
            "--factory",
            "kubeflow_cpu",
            "--set",
            'secret_env_vars={"HF_TOKEN": "env:HF_TOKEN"}',
            "--",
            "echo hello",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    secret = next(o for o in yaml.safe_load_all(out) if o["kind"] == "Secret")
    assert secret["stringData"] == {"HF_TOKEN": "<masked>"}
    assert "canary-5f1d2e" not in out


def test_render_from_an_executor_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_executors.py").write_text(
        textwrap.dedent("""
        from nemo_kubeflow import KubeflowExecutor

        def gpu():
            return KubeflowExecutor(container_image="example.com/train:1", nodes=3, nprocs_per_node=4,
                                    gpus_per_node=4, runtime_kind="TrainingRuntime", namespace="team")
    """)
    )
    code = console.main(["render", "--executor-file", "my_executors.py:gpu", "--set", "nodes=2", "--", "echo hi"])
    assert code == 0, capsys.readouterr().err
    objs = list(yaml.safe_load_all(capsys.readouterr().out))
    runtime, job = objs[0], objs[1]
    assert runtime["kind"] == "TrainingRuntime" and runtime["metadata"]["namespace"] == "team"
    assert job["spec"]["trainer"]["numNodes"] == 2 and job["spec"]["trainer"]["image"] == "example.com/train:1"


def test_set_reaches_into_profile_settings_left_at_their_defaults():
    # kubeflow_gpu leaves gke_rdma unset (None: GKERDMAConfig()); --set starts from those defaults.
    executor = load_executor(
        "kubeflow_gpu", overrides=["network_fabric=gke-rdma", "gke_rdma.nic_count=4", "gke_rdma.tuner_config=/t.txtpb"]
    )
    assert (executor.gke_rdma.nic_count, executor.gke_rdma.tuner_config) == (4, "/t.txtpb")
    assert executor.gke_rdma.default_network == "default" and executor.aws_efa is None


@pytest.mark.parametrize(
    "argv, message",
    [
        (["render", "--factory", "nope", "--", "x"], "no executor factory of that name; known: "),
        (
            ["render", "--set", "gke_rdma.nic_cont=4", "--", "x"],
            "GKERDMAConfig has no field 'nic_cont'; did you mean nic_count?",
        ),
        (["render", "--set", "nodes.count=4", "--", "x"], "nodes is not a run.Config in this configuration"),
        (["render", "--set", "nodez=2", "--", "x"], "has no field 'nodez'; did you mean nodes?"),
        (["render", "--set", "nodes=two", "--", "x"], "cannot read 'two' as int"),
        (["render", "--set", "nodes=0", "--", "x"], "nodes=0: must be an integer >= 1"),
        (["render", "--factory", "kubeflow_cpu"], "give the command to run after --"),
        (["render", "--executor-file", "missing.py:gpu", "--", "x"], "missing.py does not exist"),
    ],
)
def test_errors_are_one_message_and_exit_code_2(argv, message, capsys):
    assert console.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("nemo-kubeflow: error: ") and message in err, err
    assert "Traceback" not in err


def test_validate_reports_a_typo_in_a_trainjob_with_exit_code_1(tmp_path, capsys):
    assert console.main(["render", "--factory", "kubeflow_cpu", "--out", str(tmp_path), "--", "echo hi"]) == 0
    [job_file] = tmp_path.glob("*-trainjob-*.yaml")
    name = yaml.safe_load(job_file.read_text())["metadata"]["name"]
    job_file.write_text(job_file.read_text().replace("numProcPerNode:", "numProcsPerNode:"))
    capsys.readouterr()

    files = [str(f) for f in sorted(tmp_path.glob("*.yaml"))]
    assert console.main(["validate", *files]) == 1
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        f"{job_file}: TrainJob/{name}: spec.trainer.numProcsPerNode: unknown field; did you mean numProcPerNode?"
    ]
    assert "1 problem(s) in 3 object(s)" in err


def test_validate_reads_multi_document_yaml_and_reports_unreadable_input(tmp_path, capsys):
    assert console.main(["render", "--factory", "kubeflow_gpu", "--", "echo hi"]) == 0
    bundle = tmp_path / "all.yaml"
    bundle.write_text(capsys.readouterr().out)
    broken = tmp_path / "broken.yaml"
    broken.write_text("kind: [unclosed\n")
    assert console.main(["validate", str(bundle)]) == 0
    assert "3 object(s) valid" in capsys.readouterr().err
    assert console.main(["validate", str(bundle), str(broken), str(tmp_path / "missing.yaml")]) == 1
    out = capsys.readouterr().out
    assert f"{broken}: invalid YAML at line 2" in out
    assert f"{tmp_path / 'missing.yaml'}: cannot read: No such file or directory" in out


TEMPLATE = """\
apiVersion: trainer.kubeflow.org/v1alpha1
kind: {{ kind }}
metadata:
  name: {{ name | tojson }}
  labels:
    trainer.kubeflow.org/framework: torch
{%- for key, value in labels | dictsort %}
    {{ key | tojson }}: {{ value | tojson }}
{%- endfor %}
spec:
  mlPolicy:
    NODES_KEY: {{ nodes }}
    torch: {}
  template:
    spec:
      replicatedJobs:
        - name: node
          template:
            metadata:
              labels:
                trainer.kubeflow.org/trainjob-ancestor-step: trainer
            spec:
              template:
                spec:
                  containers:
                    - name: node
                      image: {{ image | tojson }}
"""


def test_validate_renders_a_user_template_with_an_executor_configuration(tmp_path, capsys):
    good, typo, undefined = tmp_path / "good.yaml.j2", tmp_path / "typo.yaml.j2", tmp_path / "undefined.yaml.j2"
    good.write_text(TEMPLATE.replace("NODES_KEY", "numNodes"))
    typo.write_text(TEMPLATE.replace("NODES_KEY", "numNode"))
    undefined.write_text(TEMPLATE.replace("NODES_KEY", "numNodes").replace("{{ image | tojson }}", '"{{ images }}"'))

    assert console.main(["validate", "--template", str(good), "--factory", "kubeflow_cpu", "--set", "nodes=3"]) == 0
    assert console.main(["validate", "--template", str(typo)]) == 1
    out = capsys.readouterr().out
    assert "spec.mlPolicy.numNode: unknown field; did you mean numNodes?" in out
    assert out.startswith(f"{typo}: ClusterTrainingRuntime/nemo-kubeflow-")
    assert console.main(["validate", "--template", str(undefined)]) == 1
    assert "'images' is undefined" in capsys.readouterr().out


def test_gc_without_a_reachable_cluster_is_a_clear_error(tmp_path, capsys):
    assert console.main(["gc", "--kubeconfig", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("nemo-kubeflow: error: kubeconfig") and "does not exist" in err
