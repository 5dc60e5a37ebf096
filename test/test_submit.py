"""Submission against the local cluster: request budget, faults at every step, rollback, bad input."""

import pytest
from torchx.specs import Role

from nemo_kubeflow import KubeflowExecutor
from nemo_kubeflow.cluster import KubernetesCluster
from nemo_kubeflow.errors import (
    AlreadyExistsError,
    ClusterUnreachableError,
    KubeconfigError,
    NotFoundError,
    PermissionDeniedError,
    SubmissionError,
)
from nemo_kubeflow.local import LocalCluster
from nemo_kubeflow.packaging import BundleFile
from nemo_kubeflow.plan import build_submission
from nemo_kubeflow.submit import submit

RESOURCES = ("configmaps", "secrets", "persistentvolumeclaims", "trainjobs", "clustertrainingruntimes",
             "trainingruntimes")


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    with LocalCluster(workdir=tmp_path_factory.mktemp("submit-cluster")) as c:
        yield c


@pytest.fixture()
def cluster(local):
    local.allow_all()
    local.clear_requests()
    return KubernetesCluster(kubeconfig=str(local.kubeconfig_path), backoff=0.01, max_backoff=0.05)


def snapshot(local):
    return {r: sorted(o["metadata"]["name"] for o in local.objects(r, None)) for r in RESOURCES}


def plan(task="t", experiment="exp", **kw):
    executor = KubeflowExecutor(container_image="img", nodes=1, shm_size=None, **kw)
    role = Role(name=task, image="", entrypoint="bash", args=["-c", "sleep 30"])
    files = [BundleFile("code/a.py", b"print(1)\n")]
    return build_submission(executor, role, files, task_name=task, experiment_id=experiment)


def writes(local):
    return [(r.verb, r.resource) for r in local.requests if r.verb not in ("get", "list")]


def test_request_budget_and_owner_references(local, cluster):
    result = submit(cluster, plan("budget"))
    assert writes(local) == [("create", "clustertrainingruntimes"), ("create", "trainjobs"),
                             ("create", "configmaps"), ("patch", "trainjobs")]
    uid = result.trainjob["metadata"]["uid"]
    code_cm = result.trainjob["metadata"]["name"] + "-code"
    [cm] = [c for c in local.objects("configmaps", "default") if c["metadata"]["name"] == code_cm]
    assert cm["metadata"]["ownerReferences"][0]["uid"] == uid
    # A second task with the same settings reuses the runtime (409) and creates no other.
    local.clear_requests()
    submit(cluster, plan("budget2"))
    runtime_creates = [r.status_code for r in local.requests if r.resource == "clustertrainingruntimes"]
    assert runtime_creates == [409]


STEPS = [("create", "clustertrainingruntimes"), ("create", "trainjobs"), ("create", "configmaps"),
         ("create", "secrets"), ("patch", "trainjobs"), ("create", "persistentvolumeclaims")]


def plan_with_everything(task):
    from nemo_kubeflow import PVCMount

    return plan(task, experiment=f"faults-{task}", secret_env_vars={"TOKEN": "env:FAULT_TOKEN"},
                pvc_mounts=[PVCMount(claim_name=f"claim-{task}", mount_path="/d", create=True, size="1Gi")])


@pytest.mark.parametrize("verb, resource", STEPS)
@pytest.mark.parametrize("status", [403, 422])
def test_permanent_fault_at_each_step_leaves_nothing(local, cluster, monkeypatch, verb, resource, status):
    monkeypatch.setenv("FAULT_TOKEN", "canary-5f2a")
    before = snapshot(local)
    local.inject_fault(verb=verb, resource=resource, status=status, message="injected failure")
    task = f"p{status}-{resource[:6]}-{verb}"
    with pytest.raises(SubmissionError) as err:
        submit(cluster, plan_with_everything(task))
    assert "injected failure" in str(err.value) and "nothing was left" in str(err.value)
    assert "canary-5f2a" not in str(err.value)
    assert snapshot(local) == before


@pytest.mark.parametrize("verb, resource", STEPS)
@pytest.mark.parametrize("fault", [dict(status=503), dict(status=500), dict(status=429, retry_after=0),
                                   dict(drop_connection=True)])
def test_transient_fault_at_each_step_is_retried(local, cluster, monkeypatch, verb, resource, fault):
    monkeypatch.setenv("FAULT_TOKEN", "x")
    local.inject_fault(verb=verb, resource=resource, **fault)
    task = f"t{'-'.join(str(v) for v in fault.values())}-{resource[:6]}-{verb}".lower()
    result = submit(cluster, plan_with_everything(task))
    assert result.trainjob["spec"]["suspend"] is False


def test_existing_trainjob_is_never_touched(local, cluster):
    first = submit(cluster, plan("dup", experiment="again"))
    uid = first.trainjob["metadata"]["uid"]
    before = snapshot(local)
    with pytest.raises(SubmissionError) as err:
        submit(cluster, plan("dup", experiment="again"))
    assert isinstance(err.value.__cause__, AlreadyExistsError)
    assert "already exists" in str(err.value) and "left untouched" in str(err.value)
    [job] = [j for j in local.objects("trainjobs", "default") if j["metadata"]["name"] == first.trainjob["metadata"]["name"]]
    assert job["metadata"]["uid"] == uid
    assert snapshot(local) == before


def test_rbac_denial_says_what_to_ask_for(local, cluster):
    local.deny("create", "clustertrainingruntimes")
    before = snapshot(local)
    with pytest.raises(SubmissionError) as err:
        submit(cluster, plan("rbac", experiment="rbac"))
    assert isinstance(err.value.__cause__, PermissionDeniedError)
    assert "runtime_kind='TrainingRuntime'" in str(err.value) and "forbidden" in str(err.value)
    assert snapshot(local) == before


def test_missing_namespace(local, cluster):
    with pytest.raises(SubmissionError, match="create the namespace"):
        submit(cluster, plan("ns", namespace="does-not-exist", runtime_kind="TrainingRuntime"))


def test_missing_existing_runtime_lists_the_available_ones(local, cluster):
    with pytest.raises(NotFoundError, match="runtime_name='torch-distributd'.*available") as err:
        submit(cluster, plan("rt", runtime_name="torch-distributd"))
    assert writes(local) == []
    assert "fix runtime_name" in str(err.value)


def test_unreachable_server(tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {token: t}}]\n"
    )
    cluster = KubernetesCluster(kubeconfig=str(kubeconfig), backoff=0.01, max_attempts=2, request_timeout=2)
    with pytest.raises(SubmissionError) as err:
        submit(cluster, plan("unreach"))
    assert isinstance(err.value.__cause__, ClusterUnreachableError)
    assert "127.0.0.1:9" in str(err.value) and "did not answer" in str(err.value)


def test_missing_kubeconfig_and_context(tmp_path, local):
    with pytest.raises(KubeconfigError, match="does not exist"):
        KubernetesCluster(kubeconfig=str(tmp_path / "nope")).get("ConfigMap", "x", "default")
    with pytest.raises(KubeconfigError, match="context 'nope'"):
        KubernetesCluster(kubeconfig=str(local.kubeconfig_path), context="nope").get("ConfigMap", "x", "default")


def test_missing_secret_source_fails_before_any_request(local, cluster, monkeypatch):
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    with pytest.raises(Exception, match=r"reads \$NOT_SET_ANYWHERE, which is not set"):
        submit(cluster, plan("sec", secret_env_vars={"TOKEN": "env:NOT_SET_ANYWHERE"}))
    assert local.requests == []


def test_webhook_denial_is_not_reported_as_rbac(local, cluster):
    from nemo_kubeflow.errors import AdmissionDeniedError

    local.inject_fault(verb="create", resource="trainjobs", status=403,
                       message='admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request: bad')
    with pytest.raises(SubmissionError) as err:
        submit(cluster, plan("webhook", experiment="webhook"))
    assert isinstance(err.value.__cause__, AdmissionDeniedError)
    assert "admission webhook refused the object" in str(err.value) and "RBAC" not in str(err.value)
