"""`nemo-kubeflow doctor`: one line per check with its fix, exit code 0 when a job can run and 1 otherwise;
on the local cluster (its RBAC denial rules answer SelfSubjectAccessReviews) and on the real control plane,
including as a ServiceAccount with only a namespaced Role."""

import json
import urllib.error

import pytest
import yaml
from kubernetes import client
from kueue_api import kueue_version

from nemo_kubeflow.cli.executor_config import load_executor
from nemo_kubeflow.cli.main import main as cli_main
from nemo_kubeflow.cli.render import render_submission
from nemo_kubeflow.cluster.client import KubernetesCluster
from nemo_kubeflow.constants import KUEUE_GROUP
from nemo_kubeflow_local import LocalCluster

CPU = ["--factory", "kubeflow_cpu", "--set", "shm_size=None"]


def doctor(capsys, kubeconfig, *argv):
    capsys.readouterr()
    code = cli_main(["doctor", *CPU, "--kubeconfig", str(kubeconfig), *argv])
    return code, capsys.readouterr().out.splitlines()


def line(lines, start):
    found = [entry for entry in lines if entry.startswith(start)]
    assert found, "\n".join(lines)
    return found[0]


def test_a_local_cluster_can_run_a_job(local, capsys):
    code, lines = doctor(capsys, local.kubeconfig_path)
    assert code == 0, "\n".join(lines)
    assert "ok    Kubeflow Trainer API served: trainer.kubeflow.org/v1alpha1" in lines
    assert "ok    Kueue serves v1beta2, v1beta1: read in v1beta2" in lines
    assert "ok    Trainer v2.3.0" in lines
    assert "ok    may create trainjobs.trainer.kubeflow.org in default" in lines
    assert line(lines, "ok    dry run of ClusterTrainingRuntime")
    assert lines[-1] == "a job can run; 1 warning(s)"  # the local cluster lists no nodes
    assert not [entry for entry in lines if entry.startswith("FAIL")]


def test_missing_rights_say_what_they_disable_and_a_missing_required_one_fails(local, capsys):
    local.deny("create", "trainjobs", "default")
    local.deny("list", "nodes")
    local.deny("get", "pods/log", "default")
    try:
        code, lines = doctor(capsys, local.kubeconfig_path)
    finally:
        local.allow_all()
    assert code == 1
    assert line(
        lines,
        "FAIL  may not create trainjobs.trainer.kubeflow.org in default: no submitting jobs; "
        "fix: ask an admin for RBAC: create trainjobs.trainer.kubeflow.org in default",
    )
    assert line(lines, "warn  may not get pods/log in default: unavailable: logs (exp.logs, nemo experiment logs)")
    assert line(lines, "warn  may not list nodes: unavailable: checking a moved job still fits")
    assert line(lines, "warn  nodes: could not look")  # a failed look is said, never read as "no nodes"


def test_the_queue_its_cluster_queue_and_kueue_without_v1beta1(tmp_path, capsys):
    with LocalCluster(workdir=tmp_path / "cluster", kueue_versions=("v1beta2",)) as local:
        code, lines = doctor(capsys, local.kubeconfig_path, "--set", "queue_name=team")
        assert code == 1
        assert "ok    Kueue serves v1beta2 (v1beta1 unserved, as Kueue v0.20+ ships): read in v1beta2" in lines
        assert line(lines, "FAIL  no LocalQueue 'team' in namespace default")

        version = kueue_version(local.api_client())
        custom = client.CustomObjectsApi(local.api_client())
        custom.create_namespaced_custom_object(
            KUEUE_GROUP,
            version,
            "default",
            "localqueues",
            {
                "apiVersion": f"{KUEUE_GROUP}/{version}",
                "kind": "LocalQueue",
                "metadata": {"name": "team"},
                "spec": {"clusterQueue": "team-cq"},
            },
        )
        code, lines = doctor(capsys, local.kubeconfig_path, "--set", "queue_name=team")
        assert code == 1
        assert line(lines, "FAIL  LocalQueue team sends jobs to ClusterQueue 'team-cq', which does not exist")

        custom.create_cluster_custom_object(
            KUEUE_GROUP,
            version,
            "clusterqueues",
            {
                "apiVersion": f"{KUEUE_GROUP}/{version}",
                "kind": "ClusterQueue",
                "metadata": {"name": "team-cq"},
                "spec": {
                    "namespaceSelector": {},
                    "resourceGroups": [
                        {
                            "coveredResources": ["cpu"],
                            "flavors": [{"name": "f", "resources": [{"name": "cpu", "nominalQuota": "8"}]}],
                        }
                    ],
                },
            },
        )
        polling_lines = None
        for _ in range(50):  # the local Kueue sets Active on its own thread
            code, polling_lines = doctor(capsys, local.kubeconfig_path, "--set", "queue_name=team")
            if any("FlavorNotFound" in entry for entry in polling_lines):
                break
        assert code == 1 and line(polling_lines, "FAIL  ClusterQueue team-cq is not active (FlavorNotFound: ")
        custom.create_cluster_custom_object(
            KUEUE_GROUP,
            version,
            "resourceflavors",
            {"apiVersion": f"{KUEUE_GROUP}/{version}", "kind": "ResourceFlavor", "metadata": {"name": "f"}},
        )
        for _ in range(50):
            code, lines = doctor(capsys, local.kubeconfig_path, "--set", "queue_name=team")
            if code == 0:
                break
        assert code == 0 and "ok    LocalQueue team -> ClusterQueue team-cq (active)" in lines, "\n".join(lines)


def test_a_named_runtime_with_a_jobset_ttl_on_trainer_2_3_fails(local, capsys):
    cluster = KubernetesCluster(str(local.kubeconfig_path))
    executor = load_executor("kubeflow_cpu", None, ["shm_size=None", "runtime_kind=TrainingRuntime"])
    runtime = render_submission(executor, ["true"], name="t", experiment_id="doctor_1").runtime
    runtime["metadata"] = {"name": "doctor-ttl", "namespace": "default"}
    runtime["spec"]["template"]["spec"]["ttlSecondsAfterFinished"] = 30
    cluster.create(runtime)
    try:
        code, lines = doctor(
            capsys, local.kubeconfig_path, "--set", "runtime_name=doctor-ttl", "--set", "runtime_kind=TrainingRuntime"
        )
    finally:
        cluster.delete("TrainingRuntime", "doctor-ttl", "default")
    assert code == 1
    assert line(
        lines,
        "FAIL  TrainingRuntime 'doctor-ttl' sets a JobSet ttlSecondsAfterFinished (30) and this "
        "cluster's Trainer is v2.3.0",
    )


# --- the real control plane ------------------------------------------------------------------------------


ML_USER_RULES = [  # what a namespace admin typically grants an ML user: namespaced, no nodes, no CRDs
    {
        "apiGroups": ["trainer.kubeflow.org"],
        "resources": ["trainjobs", "trainingruntimes"],
        "verbs": ["create", "get", "list", "watch", "patch", "delete"],
    },
    {
        "apiGroups": [""],
        "resources": ["configmaps", "secrets", "pods", "pods/log", "events"],
        "verbs": ["create", "get", "list", "watch"],
    },
]


def _service_account_kubeconfig(cp, namespace, tmp_path):
    cp.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": "ml-user"}})
    cp.request(
        "POST",
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles",
        {"metadata": {"name": "ml-user"}, "rules": ML_USER_RULES},
    )
    cp.request(
        "POST",
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings",
        {
            "metadata": {"name": "ml-user"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "ml-user"},
            "subjects": [{"kind": "ServiceAccount", "name": "ml-user", "namespace": namespace}],
        },
    )
    token = cp.request(
        "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/ml-user/token", {"spec": {"expirationSeconds": 3600}}
    )["status"]["token"]
    admin = yaml.safe_load(cp.kubeconfig_path.read_text())
    admin["users"] = [{"name": "ml-user", "user": {"token": token}}]
    for ctx in admin["contexts"]:
        ctx["context"]["user"] = "ml-user"
    path = tmp_path / "ml-user.kubeconfig"
    path.write_text(json.dumps(admin))
    return path


@pytest.mark.real
def test_on_the_real_control_plane_as_admin_a_job_can_run(real_control_plane, real_namespace, capsys):
    code, lines = doctor(capsys, real_control_plane.kubeconfig_path, "--namespace", real_namespace)
    assert "ok    Trainer v2.3.0" in lines, "\n".join(lines)
    assert "ok    TrainJob CRD has spec.runtimePatches" in lines
    assert line(lines, "ok    dry run of TrainJob")
    assert code == 0, "\n".join(lines)


@pytest.mark.real
def test_on_the_real_control_plane_as_a_namespaced_service_account(
    real_control_plane, real_namespace, capsys, tmp_path
):
    try:
        kubeconfig = _service_account_kubeconfig(real_control_plane, real_namespace, tmp_path)
    except urllib.error.HTTPError as e:
        raise AssertionError(e.read().decode()) from None
    code, lines = doctor(capsys, kubeconfig, "--namespace", real_namespace, "--set", "runtime_kind=TrainingRuntime")
    text = "\n".join(lines)
    assert "ok    Trainer v2.3.0" in lines, text  # the public ConfigMap: readable by every authenticated user
    assert f"ok    may create trainjobs.trainer.kubeflow.org in {real_namespace}" in lines, text
    assert line(
        lines,
        f"warn  may not delete jobsets.jobset.x-k8s.io in {real_namespace}: unavailable: moving a "
        "job off a failed node",
    )
    assert line(lines, "warn  may not list nodes: unavailable:")
    assert line(lines, f"warn  may not create persistentvolumeclaims in {real_namespace}: unavailable:")
    assert line(lines, "warn  nodes: could not look")
    assert line(lines, f"warn  Pod Security of namespace {real_namespace} unknown")
    assert line(lines, "ok    dry run of TrainingRuntime")
    assert code == 0, text
