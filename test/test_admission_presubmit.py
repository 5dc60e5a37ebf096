"""A submission refuses, before writing anything, what its namespace would refuse: a Pod Security level the pods
break, a ResourceQuota the job exceeds, a LimitRange bound, a ServiceAccount or PriorityClass that does not
exist; it warns of a quota the job waits for and of an image pull Secret that is missing; a read RBAC denies is
a note, never a failure. On both back ends (`backend`); the words of each check are compared with the real
admission plugins' own (PodSecurity, LimitRanger, ResourceQuota) on the real control plane (`-m real`)."""

import copy
import json
import logging

import pytest
from backends import wait_for
from builders import submission
from kubernetes import client
from kubernetes.config import new_client_from_config

from nemo_kubeflow import ConfigMapPackager, KubeflowExecutor
from nemo_kubeflow.cluster.client import KubernetesCluster
from nemo_kubeflow.cluster.submit import submit
from nemo_kubeflow.errors import NotAdmittedError
from nemo_kubeflow.schema import namespace_fit, pod_security
from nemo_kubeflow.schema.job_pods import job_pods

OURS = "app.kubernetes.io/managed-by"


def submit_to(backend, *, resume=True, task="train", **fields):
    """Submit a job of ``fields`` to the back end's namespace through the product's submission."""
    sub = submission(backend.executor(**fields), task=task)
    return submit(KubernetesCluster(backend.kubeconfig), sub, resume=resume)


def refused(backend, **fields) -> NotAdmittedError:
    with pytest.raises(NotAdmittedError) as err:
        submit_to(backend, **fields)
    assert_nothing_written(backend)
    return err.value


def assert_nothing_written(backend):
    """No TrainJob, and none of our ConfigMaps or Secrets, in the test's namespace."""
    assert backend.objects("trainjobs") == []
    for resource in ("configmaps", "secrets"):
        assert [o for o in backend.objects(resource) if OURS in (o["metadata"].get("labels") or {})] == []


def label_pod_security(backend, level):
    backend.core().patch_namespace(backend.namespace, {"metadata": {"labels": {pod_security.ENFORCE_LABEL: level}}})


def create_quota(backend, hard, name="team-quota"):
    backend.core().create_namespaced_resource_quota(
        backend.namespace, {"metadata": {"name": name}, "spec": {"hard": hard}}
    )


def occupy(backend, pods, quota):
    """``pods`` pods of someone else's in the namespace, once the quota controller counts them in ``quota``."""
    core = backend.core()
    for i in range(pods):
        core.create_namespaced_pod(
            backend.namespace,
            {
                "metadata": {"name": f"other-{i}"},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": "python:3.11", "command": ["sleep", "600"]}],
                },
            },
        )
    wait_for(
        lambda: (
            (getattr(core.read_namespaced_resource_quota(quota, backend.namespace).status, "used", None) or {}).get(
                "pods"
            )
            == str(pods)
        ),
        f"the quota controller to count {pods} pods in {quota}",
    )


# --------------------------------------------------------------------------------------------- both back ends


def test_a_restricted_namespace_refuses_a_job_without_restricted_security_before_writing(backend):
    label_pod_security(backend, "restricted")
    error = refused(backend)
    (problem,) = error.problems
    assert f"namespace {backend.namespace!r} enforces Pod Security 'restricted'" in problem
    assert 'violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false (container "node"' in problem
    assert problem.endswith(f"fix: {pod_security.RESTRICTED_FIX}")
    assert "nothing was written" in str(error)
    # with the field the fix names, the same namespace takes the job
    result = submit_to(backend, restricted_security=True, resume=False)
    assert ("create", "TrainJob", result.trainjob["metadata"]["name"]) in result.actions


def test_exp_run_raises_the_refusal_and_writes_nothing(backend):
    import nemo_run as run

    label_pod_security(backend, "baseline")
    executor = backend.executor(network_fabric="none", service_account="not-here")
    with pytest.raises(NotAdmittedError, match="ServiceAccount 'not-here' does not exist"):
        with run.Experiment("refused", executor=executor, log_level="WARN") as exp:
            exp.add(run.Script(inline="echo never"), name="never")
            exp.run(detach=True)
    assert_nothing_written(backend)


def test_a_job_over_a_quota_is_refused_and_one_over_what_is_free_now_is_warned(backend, caplog):
    create_quota(backend, {"requests.cpu": "1500m"}, name="hard-cap")
    error = refused(backend, cpu_request="1")
    assert error.problems == [
        "ResourceQuota 'hard-cap': the job's pods that run at once (2 pod(s) of replicated job \"node\") ask "
        "requests.cpu=2, more than its hard limit requests.cpu=1500m: the quota would never admit them all; fix: "
        "lower cpu_request or nodes, or ask an admin to raise the quota"
    ]
    caplog.set_level(logging.WARNING, logger="nemo_kubeflow")
    result = submit_to(backend, cpu_request="500m", image_pull_secrets=["no-such-pull-secret"], resume=False)
    assert result.trainjob["metadata"]["name"]
    assert "ResourceQuota 'hard-cap'" not in caplog.text
    assert (
        f"image pull Secret 'no-such-pull-secret' does not exist in namespace {backend.namespace!r}: the pods are "
        "created, but a private image cannot be pulled without it; fix: create the Secret, or drop it from "
        "image_pull_secrets"
    ) in caplog.text
    backend.core().delete_namespaced_resource_quota("hard-cap", backend.namespace)
    caplog.clear()
    create_quota(backend, {"pods": "4"}, name="busy")
    occupy(backend, 3, "busy")
    submit_to(backend, cpu_request="500m", resume=False, task="second")
    assert (
        "ResourceQuota 'busy': the job's pods (2 pod(s) of replicated job \"node\") ask pods=2, more than is free "
        "now (1 of 4; 3 used): they wait until other pods in the namespace end; fix: wait, or lower nodes"
    ) in caplog.text


def test_a_quota_that_counts_cpu_refuses_a_job_that_sets_none(backend):
    create_quota(backend, {"limits.cpu": "8"})
    (problem,) = refused(backend).problems
    assert "failed quota: team-quota: must specify limits.cpu for: node" in problem
    assert "fix: set cpu_limit" in problem


def test_a_limit_range_maximum_refuses_before_writing(backend):
    backend.core().create_namespaced_limit_range(
        backend.namespace,
        {"metadata": {"name": "bounds"}, "spec": {"limits": [{"type": "Container", "max": {"cpu": "2"}}]}},
    )
    (problem,) = refused(backend, cpu_request="1", cpu_limit="4").problems
    assert problem == (
        "LimitRange 'bounds' (Container): maximum cpu usage per Container is 2, but limit is 4 (container \"node\" "
        'of replicated job "node"); fix: set cpu_limit, within its bounds (min none, max 2)'
    )
    # its default limit (its max) is taken when the job sets none: admitted
    submit_to(backend, cpu_request="1", resume=False)


def test_a_missing_service_account_and_priority_class_refuse_before_writing(backend):
    priority = f"{backend.namespace}-none"
    problems = refused(backend, service_account="no-such-sa", priority_class_name=priority).problems
    assert problems == [
        f"ServiceAccount 'no-such-sa' does not exist in namespace {backend.namespace!r} (error looking up service "
        f'account {backend.namespace}/no-such-sa: serviceaccount "no-such-sa" not found); fix: set service_account '
        "to one that exists, or ask an admin to create it",
        f"PriorityClass {priority!r} does not exist (no PriorityClass with name {priority} was found); fix: set "
        "priority_class_name to one that exists (kubectl get priorityclasses), or leave it unset",
    ]
    backend.core().create_namespaced_service_account(backend.namespace, {"metadata": {"name": "trainer"}})
    submit_to(backend, service_account="trainer", resume=False)


def test_an_admin_runtime_container_a_baseline_namespace_refuses_is_named_by_the_submission_and_doctor(backend, capsys):
    from unit.schema.test_validation import TORCH_DISTRIBUTED

    from nemo_kubeflow.cli.main import main as cli_main

    runtime = copy.deepcopy(TORCH_DISTRIBUTED)
    runtime["metadata"]["name"] = name = f"{backend.namespace}-with-fetch"  # cluster-scoped: one per test
    pod = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    fetch = {"name": "fetch", "image": "busybox", "command": ["true"], "securityContext": {"privileged": True}}
    pod["initContainers"] = [fetch]
    custom = backend.custom_objects()
    custom.create_cluster_custom_object("trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes", runtime)
    label_pod_security(backend, "baseline")
    words = 'violates PodSecurity "baseline:latest": privileged (container "fetch" must not set securityContext.privileged=true)'
    try:
        (problem,) = refused(backend, runtime_name=name).problems
        assert words in problem and pod_security.ADMIN_RUNTIME_NOTE in problem
        capsys.readouterr()
        code = cli_main(
            ["doctor", "--factory", "kubeflow_cpu", "--kubeconfig", backend.kubeconfig, "-n", backend.namespace]
            + ["--set", f"runtime_name={name}"]
        )
        lines = capsys.readouterr().out.splitlines()
    finally:
        custom.delete_cluster_custom_object("trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes", name)
    assert code == 1
    assert (
        f'FAIL  namespace {backend.namespace} refuses the pods of replicated job "node": {words}; fix: '
        f"{pod_security.PRIVILEGE_FIX}; or {pod_security.ADMIN_RUNTIME_NOTE}"
    ) in lines, "\n".join(lines)


# ----------------------------------------------------------------------------------- the local cluster's RBAC


def test_a_read_rbac_denies_is_a_note_and_the_job_is_submitted(local, cluster, caplog):
    ns = "admission-denied"
    local.create_namespace(ns)
    core = client.CoreV1Api(new_client_from_config(config_file=str(local.kubeconfig_path)))
    core.create_namespaced_resource_quota(ns, {"metadata": {"name": "q"}, "spec": {"hard": {"requests.cpu": "1m"}}})
    caplog.set_level(logging.WARNING, logger="nemo_kubeflow")
    local.deny("list", "resourcequotas", ns)
    try:
        executor = submission_executor(local, ns)
        result = submit(KubernetesCluster(str(local.kubeconfig_path)), submission(executor), resume=False)
    finally:
        local.allow_all()
    assert result.trainjob["metadata"]["name"]
    assert (
        f"cannot list resourcequotas in namespace {ns!r} (Forbidden), so whether the job fits the namespace's "
        "ResourceQuotas was not checked before submitting (the cluster still enforces it); ask an admin for "
        f"'list resourcequotas' in namespace {ns!r} to have it checked"
    ) in caplog.text


def submission_executor(local, namespace):
    return KubeflowExecutor(
        container_image="python:3.11",
        nodes=2,
        namespace=namespace,
        kubeconfig=str(local.kubeconfig_path),
        shm_size=None,
        cpu_request="1",
        packager=ConfigMapPackager(relative_path="test", include_pattern="workloads.py"),
    )


# ------------------------------------------------------------------ our words against the real admission plugins


def dry_run_pod(api: client.ApiClient, namespace: str, spec: dict) -> str:
    """The real API server's answer to creating a pod of ``spec`` with dryRun=All: its refusal's message."""
    core = client.CoreV1Api(api)
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"}, "spec": spec}
    with pytest.raises(client.ApiException) as err:
        core.create_namespaced_pod(namespace, body, dry_run="All")
    return json.loads(err.value.body)["message"]


def node_pod(**fields):
    sub = submission(KubeflowExecutor(container_image="python:3.11", nodes=2, shm_size=None, **fields))
    (pods,) = job_pods(sub.trainjob, sub.runtime)
    return pods


BASELINE_BREAKER = {
    "hostNetwork": True,
    "hostPID": True,
    "volumes": [{"name": "dev", "hostPath": {"path": "/dev"}}],
    "containers": [
        {
            "name": "node",
            "image": "python:3.11",
            "ports": [{"containerPort": 8080, "hostPort": 8080}],
            "securityContext": {"privileged": True, "capabilities": {"add": ["IPC_LOCK", "SYS_ADMIN"]}},
        }
    ],
}


@pytest.mark.real
@pytest.mark.parametrize(
    "level, pod",
    [
        ("restricted", lambda: node_pod().spec),
        ("restricted", lambda: node_pod(preflight=True).spec),
        ("restricted", lambda: node_pod(run_as_user=0).spec),
        ("baseline", lambda: BASELINE_BREAKER),
        ("restricted", lambda: BASELINE_BREAKER),
    ],
    ids=["default", "preflight", "root", "baseline-breaker", "restricted-breaker"],
)
def test_pod_security_words_are_the_real_admissions(real_control_plane, real_namespace, level, pod):
    api = new_client_from_config(config_file=str(real_control_plane.kubeconfig_path))
    client.CoreV1Api(api).patch_namespace(real_namespace, {"metadata": {"labels": {pod_security.ENFORCE_LABEL: level}}})
    spec = pod()
    ours = pod_security.message(level, "latest", pod_security.violations(level, spec))
    assert ours in dry_run_pod(api, real_namespace, spec)


@pytest.mark.real
def test_limit_range_and_quota_words_are_the_real_plugins(real_control_plane, real_namespace):
    api = new_client_from_config(config_file=str(real_control_plane.kubeconfig_path))
    core = client.CoreV1Api(api)
    limit_range = {"metadata": {"name": "bounds"}, "spec": {"limits": [{"type": "Container", "max": {"cpu": "2"}}]}}
    core.create_namespaced_limit_range(real_namespace, limit_range)
    pods = [node_pod(cpu_request="1", cpu_limit="4")]
    stored = api.sanitize_for_serialization(core.read_namespaced_limit_range("bounds", real_namespace))
    (problem,) = namespace_fit.limit_range_problems(pods, [stored], "nvidia.com/gpu")
    words = problem.split(": ", 1)[1].split(" (container")[0]
    assert words in dry_run_pod(api, real_namespace, pods[0].spec)
    core.delete_namespaced_limit_range("bounds", real_namespace)
    quota = {"metadata": {"name": "team-quota"}, "spec": {"hard": {"limits.cpu": "8"}}}
    core.create_namespaced_resource_quota(real_namespace, quota)
    real_control_plane.wait_for(
        lambda: getattr(core.read_namespaced_resource_quota("team-quota", real_namespace).status, "hard", None),
        "the quota controller to write the quota's status",
        timeout=60,
        component="kube-controller-manager",
    )
    pods = [node_pod(cpu_request="1")]
    fit = namespace_fit.quota_fit(pods, [quota], "nvidia.com/gpu")
    (refusal,) = fit.refusals
    words = refusal.split("must set it: ", 1)[1].split(" (replicated job")[0]
    assert words in dry_run_pod(api, real_namespace, pods[0].spec)


# ------------------------------------------------------------------------------- doctor: quota, LimitRange, policies


def test_doctor_reports_quota_headroom_limit_ranges_and_the_policies_that_match(backend, capsys):
    from nemo_kubeflow.cli.main import main as cli_main

    ns = backend.namespace
    core = backend.core()
    core.create_namespaced_limit_range(
        ns, {"metadata": {"name": "bounds"}, "spec": {"limits": [{"type": "Container", "max": {"cpu": "4"}}]}}
    )
    create_quota(backend, {"requests.cpu": "8", "pods": "10"}, name="roomy")
    create_quota(backend, {"requests.cpu": "500m"}, name="tight")
    admission = client.AdmissionregistrationV1Api(new_client_from_config(config_file=backend.kubeconfig))
    mine = {"matchLabels": {"kubernetes.io/metadata.name": ns}}
    pods_rule = {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
    policy, binding, hooks = f"{ns}-policy", f"{ns}-binding", f"{ns}-hooks"
    admission.create_validating_admission_policy(
        {
            "metadata": {"name": policy},
            "spec": {
                "matchConstraints": {"resourceRules": [pods_rule]},
                "validations": [{"expression": "true", "message": "never refuses"}],
            },
        }
    )
    admission.create_validating_admission_policy_binding(
        {
            "metadata": {"name": binding},
            "spec": {
                "policyName": policy,
                "validationActions": ["Deny"],
                "matchResources": {"namespaceSelector": mine},
            },
        }
    )
    admission.create_validating_webhook_configuration(
        {
            "metadata": {"name": hooks},
            "webhooks": [
                {
                    "name": "pods.example.com",
                    "clientConfig": {"url": "https://127.0.0.1:1/validate"},
                    "rules": [pods_rule],
                    "namespaceSelector": mine,
                    "failurePolicy": "Ignore",
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                }
            ],
        }
    )
    try:
        capsys.readouterr()
        code = cli_main(
            ["doctor", "--factory", "kubeflow_cpu", "--set", "nodes=2", "--kubeconfig", backend.kubeconfig, "-n", ns]
        )
        lines = capsys.readouterr().out.splitlines()
    finally:
        admission.delete_validating_webhook_configuration(hooks)
        admission.delete_validating_admission_policy_binding(binding)
        admission.delete_validating_admission_policy(policy)
    text = "\n".join(lines)
    assert code == 1, text
    # kube-apiserver stores the LimitRange with its defaults (default and defaultRequest from max): said too
    assert any(entry.startswith("ok    LimitRange bounds (Container): max cpu=4") for entry in lines), text
    assert "ok    ResourceQuota roomy: requests.cpu used 0 of 8; one job asks 2" in lines, text
    assert "ok    ResourceQuota roomy: pods used 0 of 10; one job asks 2" in lines, text
    assert (
        "FAIL  ResourceQuota tight: requests.cpu used 0 of 500m; one job asks 2: more than its hard limit; fix: "
        "lower what one job asks (nodes, resources), or ask an admin to raise the quota"
    ) in lines, text
    assert (
        f"ok    admission: ValidatingAdmissionPolicy {policy} matches pods (failurePolicy Fail, binding {binding}: "
        f"Deny) in {ns}"
    ) in lines, text
    assert (
        f"ok    admission: ValidatingWebhookConfiguration {hooks}/pods.example.com matches pods (failurePolicy "
        f"Ignore) in {ns}"
    ) in lines, text
    assert lines[-1].startswith("1 check(s) failed"), text
    assert all("; fix: " in entry for entry in lines if entry.startswith(("warn  ", "FAIL  "))), text


def test_the_tasks_of_one_process_read_the_namespaces_rules_once(local, cluster):
    ns = "admission-reads"
    local.create_namespace(ns)
    rules_read: dict = {}
    reads = []
    for task in ("first", "second"):
        local.clear_requests()
        submit(
            KubernetesCluster(str(local.kubeconfig_path)),
            submission(submission_executor(local, ns), task=task),
            resume=False,
            rules_read=rules_read,
        )
        reads.append(sorted(r.resource for r in local.requests if r.verb in ("get", "list")))
    assert reads[0] == ["limitranges", "namespaces", "resourcequotas"]
    assert reads[1] == []


def test_doctor_says_which_policy_kinds_it_could_not_list_never_none(local, cluster, capsys):
    from nemo_kubeflow.cli.main import main as cli_main

    local.deny("list", "validatingwebhookconfigurations")
    local.deny("list", "validatingadmissionpolicies")
    try:
        capsys.readouterr()
        cli_main(["doctor", "--factory", "kubeflow_cpu", "--kubeconfig", str(local.kubeconfig_path)])
        lines = capsys.readouterr().out.splitlines()
    finally:
        local.allow_all()
    assert (
        "warn  admission: could not list validatingwebhookconfigurations (Forbidden), validatingadmissionpolicies "
        "(Forbidden): the policy engines that may refuse a job's objects in default are unknown; fix: ask an admin "
        "for a ClusterRole with list on those admissionregistration.k8s.io resources, or which webhooks and "
        "policies apply to the namespace"
    ) in lines, "\n".join(lines)
    assert not [entry for entry in lines if "no webhook or ValidatingAdmissionPolicy matches" in entry]


@pytest.mark.real
def test_as_a_namespaced_service_account_the_denied_reads_are_notes_and_the_job_is_submitted(
    real_control_plane, real_namespace, tmp_path, caplog
):
    from test_doctor import _service_account_kubeconfig

    kubeconfig = _service_account_kubeconfig(real_control_plane, real_namespace, tmp_path)
    executor = KubeflowExecutor(
        container_image="python:3.11",
        nodes=2,
        namespace=real_namespace,
        kubeconfig=str(kubeconfig),
        shm_size=None,
        runtime_kind="TrainingRuntime",  # the Role allows these, not ClusterTrainingRuntimes
        packager=ConfigMapPackager(relative_path="test", include_pattern="workloads.py"),
    )
    caplog.set_level(logging.WARNING, logger="nemo_kubeflow")
    result = submit(KubernetesCluster(str(kubeconfig)), submission(executor), resume=False)
    assert ("create", "TrainJob", result.trainjob["metadata"]["name"]) in result.actions
    for read in (
        "cannot get namespaces (Forbidden), so the namespace's Pod Security level was not checked",
        f"cannot list limitranges in namespace {real_namespace!r} (Forbidden), so whether the pods keep within the "
        "LimitRanges' bounds was not checked",
        f"cannot list resourcequotas in namespace {real_namespace!r} (Forbidden)",
    ):
        assert read in caplog.text, caplog.text
