"""What a namespace's own rules refuse reaches status in the admission's words, at the first look after the Job
controller's first ``FailedCreate``: a ResourceQuota the job does not fit (PENDING), one that fits one pod of two
(PENDING, naming the quota, not only "1/2 nodes running"), Pod Security's ``restricted`` level for pods without
``restricted_security`` (FAILED, with that fix), a ServiceAccount that does not exist, a LimitRange's
limit/request ratio and a ValidatingAdmissionPolicy that denies the pods (FAILED). Each on both back ends (the
`backend` fixture): on the real control plane, kube-apiserver's ResourceQuota, PodSecurity, LimitRanger,
ServiceAccount and ValidatingAdmissionPolicy admission and kube-controller-manager's quota controller decide.

The rule is put in place after the submission and before any pod exists, so that what refuses the pods is the
admission, not a check of the submission: the job waits in a held Kueue queue (stopPolicy Hold) while the rule is
made, then the queue lets it go. Each look is from a new process (`nemo-kubeflow status`), and the looks of this
process (the scheduler's describe) say the same."""

import json
import os
import subprocess
import threading

import nemo_run as run
import pytest
from backends import app_id_of, trainjob_of, wait_for
from kubernetes import client
from kubernetes.config import new_client_from_config

from nemo_kubeflow.nemo_run.scheduler import create_scheduler

HELD = "ar-held"
QUOTA = "team-quota"


@pytest.fixture()
def status_cli(console_script, nemorun_home):
    """`nemo-kubeflow status EXPERIMENT` in a new process: (state, why) of its one task."""
    tool = console_script("nemo-kubeflow")
    env = {**os.environ, "NEMORUN_HOME": str(nemorun_home), "COLUMNS": "400"}

    def status(exp_id: str) -> tuple[str, str]:
        out = subprocess.run([tool, "status", exp_id], env=env, capture_output=True, text=True, timeout=120)
        lines = out.stdout.splitlines()
        state = next((line.split(":", 1)[1].strip() for line in lines if line.strip().startswith("state:")), "")
        why = " ".join(line.split(":", 1)[1].strip() for line in lines if line.strip().startswith("why:"))
        assert state, (out.returncode, out.stdout, out.stderr[-3000:])
        return state, why

    return status


def held_queue(backend) -> None:
    """A LocalQueue that holds what is submitted to it until `release`."""
    backend.queue(HELD, {"clusterQueue": backend.provide_cluster_queue(), "stopPolicy": "Hold"})


def release(backend) -> None:
    backend.queue(HELD, {"stopPolicy": "None"})


def submit_held(backend, name: str, script: str = "sleep 120", **executor):
    """A job submitted to the held queue; it waits there, no pod made."""
    held_queue(backend)
    with run.Experiment(name, executor=backend.executor(queue_name=HELD, **executor), log_level="WARN") as exp:
        exp.add(run.Script(inline=script), name="t")
        exp.run(detach=True)
    job = exp.jobs[0]
    wait_for(
        lambda: create_scheduler("t").describe(app_id_of(job)).msg.startswith(f"waiting for queue {HELD}"),
        "the job to wait in the held queue",
    )
    assert backend.objects("pods", trainjob_of(job)) == []
    return exp._id, job


def first_failed_create(backend, job) -> str:
    """Waits for the Job controller's first FailedCreate about one of the job's Jobs; its message."""
    name = trainjob_of(job)

    def found():
        return [
            e
            for e in backend.objects("events")
            if e.get("reason") == "FailedCreate"
            and (e.get("involvedObject") or {}).get("kind") == "Job"
            and (e.get("involvedObject") or {}).get("name", "").startswith(f"{name}-")
        ]

    events = wait_for(found, "the Job controller's first FailedCreate", timeout=60)
    return events[0]["message"]


def make_quota(backend, cpu: str) -> None:
    """A ResourceQuota on requests.cpu; waits for the quota controller to fill its status (admission refuses every
    pod of a namespace whose quota has no status.hard yet)."""
    core = backend.core()
    core.create_namespaced_resource_quota(
        backend.namespace, {"metadata": {"name": QUOTA}, "spec": {"hard": {"requests.cpu": cpu}}}
    )

    def filled():
        status = core.read_namespaced_resource_quota(QUOTA, backend.namespace).status  # None until the first fill
        return status is not None and (status.hard or {}).get("requests.cpu")

    wait_for(filled, "the quota controller to fill the quota's status")


def looked(backend, status_cli, exp_id: str, job) -> tuple[str, str]:
    """One look from a new process; this process's look says the same."""
    state, why = status_cli(exp_id)
    desc = create_scheduler("t").describe(app_id_of(job))
    assert (desc.state.name, same(desc.msg)) == (state, same(why)), (desc, state, why)
    return state, why


def same(message: str) -> str:
    return " ".join(message.split())


def cancel(job) -> None:
    create_scheduler("t").cancel(app_id_of(job))


def test_a_quota_the_job_does_not_fit_is_pending_in_the_quotas_words(backend, status_cli):
    exp_id, job = submit_held(backend, "ar-quota", cpu_request="1")
    make_quota(backend, "500m")
    in_force(backend, f"exceeded quota: {QUOTA}", {"requests": {"cpu": "1"}})
    release(backend)
    refused = first_failed_create(backend, job)
    assert f"exceeded quota: {QUOTA}" in refused, refused
    state, why = looked(backend, status_cli, exp_id, job)
    assert state == "PENDING", (state, why)
    assert (
        f"exceeded quota: {QUOTA}, requested: requests.cpu=1, used: requests.cpu=0, limited: requests.cpu=500m" in why
    ), why
    assert "the job's 2 pods ask requests.cpu=2 in all" in why and "fix: ask for less" in why, why
    cancel(job)


def test_a_quota_that_fits_one_pod_of_two_names_the_quota(backend, status_cli):
    exp_id, job = submit_held(backend, "ar-half", cpu_request="1")
    make_quota(backend, "1500m")
    in_force(backend, f"exceeded quota: {QUOTA}", {"requests": {"cpu": "2"}})
    release(backend)
    wait_for(lambda: backend.objects("pods", trainjob_of(job)), "the pod that fits")
    refused = first_failed_create(backend, job)
    assert f"exceeded quota: {QUOTA}" in refused and "used: requests.cpu=1," in refused, refused
    state, why = looked(backend, status_cli, exp_id, job)
    assert state == "PENDING", (state, why)
    assert f"exceeded quota: {QUOTA}" in why and "used: requests.cpu=1," in why, why
    assert f"more requests.cpu than quota {QUOTA} allows" in why, why
    cancel(job)


def test_pod_security_restricted_fails_a_job_without_restricted_security_with_the_fix(
    backend, status_cli, console_script, nemorun_home
):
    exp_id, job = submit_held(backend, "ar-psa")
    backend.core().patch_namespace(
        backend.namespace, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}
    )
    in_force(backend, 'violates PodSecurity "restricted:latest"')
    release(backend)
    refused = first_failed_create(backend, job)
    assert 'violates PodSecurity "restricted:latest"' in refused, refused
    state, why = looked(backend, status_cli, exp_id, job)
    assert state == "FAILED", (state, why)
    assert 'violates PodSecurity "restricted:latest": ' in why and "allowPrivilegeEscalation != false" in why, why
    assert "fix: set restricted_security=True" in why and "it can never start as configured" in why, why
    # A look that repairs (`nemo-kubeflow watch`, as an attached wait) deletes it: nothing is left waiting, and
    # later looks still say why it failed.
    watched = subprocess.run(
        [console_script("nemo-kubeflow"), "watch", exp_id, "--interval", "1"],
        env={**os.environ, "NEMORUN_HOME": str(nemorun_home), "COLUMNS": "400"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert watched.returncode != 0 and "repaired: deleted TrainJob" in watched.stdout, watched.stdout[-3000:]
    wait_for(lambda: not backend.objects("trainjobs", trainjob_of(job)), "the TrainJob to be gone")
    state, why = status_cli(exp_id)
    assert state == "FAILED" and 'violates PodSecurity "restricted:latest"' in why, (state, why)


def test_an_attached_wait_ends_failed_in_pod_securitys_words(backend):
    """The attached `exp.run()` (the wait in this process, which repairs) ends at the refusal: FAILED in
    PodSecurity's words with the fix, the TrainJob deleted, instead of waiting with 0/2 nodes running. The rule is
    put in place from another thread once the TrainJob waits in the held queue."""
    held_queue(backend)
    failures: list[BaseException] = []

    def rule_then_release() -> None:
        try:
            wait_for(lambda: backend.objects("trainjobs", "ar-attached"), "the TrainJob to be submitted", timeout=120)
            backend.core().patch_namespace(
                backend.namespace, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}
            )
            in_force(backend, 'violates PodSecurity "restricted:latest"')
            release(backend)
        except BaseException as error:  # said by the test below, not lost in the thread
            failures.append(error)

    helper = threading.Thread(target=rule_then_release, daemon=True)
    helper.start()
    with run.Experiment("ar-attached", executor=backend.executor(queue_name=HELD), log_level="WARN") as exp:
        exp.add(run.Script(inline="sleep 120"), name="t")
        exp.run(detach=False)
    helper.join(timeout=60)
    assert not failures, failures
    job = exp.jobs[0]
    desc = create_scheduler("t").describe(app_id_of(job))
    assert desc.state.name == "FAILED", desc
    assert 'violates PodSecurity "restricted:latest"' in desc.msg and "restricted_security=True" in desc.msg, desc
    assert not backend.objects("trainjobs", trainjob_of(job)), "the attached wait's repair deletes the TrainJob"


def test_a_service_account_that_does_not_exist_fails_the_job(backend, status_cli):
    core = backend.core()
    core.create_namespaced_service_account(backend.namespace, {"metadata": {"name": "ar-trainer"}})
    exp_id, job = submit_held(backend, "ar-sa", service_account="ar-trainer")
    core.delete_namespaced_service_account("ar-trainer", backend.namespace)
    in_force(backend, 'serviceaccount "ar-trainer" not found', serviceAccountName="ar-trainer")
    release(backend)
    refused = first_failed_create(backend, job)
    assert 'serviceaccount "ar-trainer" not found' in refused, refused
    state, why = looked(backend, status_cli, exp_id, job)
    assert state == "FAILED", (state, why)
    assert (
        f'error looking up service account {backend.namespace}/ar-trainer: serviceaccount "ar-trainer" not found' in why
    )
    assert f"fix: create ServiceAccount ar-trainer in namespace {backend.namespace}" in why, why
    cancel(job)


def test_a_limit_range_ratio_fails_the_job_with_its_bounds(backend, status_cli):
    # A LimitRange's maximum made while the job is held kept the job from being admitted by Kueue on the real
    # control plane (no pod made in 60 s: Kueue weighs a LimitRange's bounds before it admits); a limit/request
    # ratio is left to the LimitRanger admission of each pod, which refuses it.
    exp_id, job = submit_held(backend, "ar-limits", cpu_request="500m", cpu_limit="1")
    backend.core().create_namespaced_limit_range(
        backend.namespace,
        {
            "metadata": {"name": "ar-bounds"},
            "spec": {"limits": [{"type": "Container", "maxLimitRequestRatio": {"cpu": "1"}}]},
        },
    )
    in_force(backend, "max limit to request ratio", {"requests": {"cpu": "500m"}, "limits": {"cpu": "1"}})
    release(backend)
    refused = first_failed_create(backend, job)
    assert "cpu max limit to request ratio per Container is 1, but provided ratio is 2" in refused, refused
    state, why = looked(backend, status_cli, exp_id, job)
    assert state == "FAILED", (state, why)
    assert "cpu max limit to request ratio per Container is 1, but provided ratio is 2" in why, why
    assert f"within the namespace's LimitRange (`kubectl describe limitrange -n {backend.namespace}`)" in why, why
    cancel(job)


def test_a_validating_admission_policy_that_denies_the_pods_fails_the_job_in_its_words(backend, status_cli):
    policy, binding = f"{backend.namespace}-no-pods", f"{backend.namespace}-no-pods-binding"
    api = client.AdmissionregistrationV1Api(new_client_from_config(config_file=backend.kubeconfig))
    exp_id, job = submit_held(backend, "ar-policy")
    api.create_validating_admission_policy(
        {
            "metadata": {"name": policy},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
                    ]
                },
                "validations": [{"expression": "false", "message": "training pods need the platform team's label"}],
            },
        }
    )
    try:
        api.create_validating_admission_policy_binding(
            {
                "metadata": {"name": binding},
                "spec": {
                    "policyName": policy,
                    "validationActions": ["Deny"],
                    "matchResources": {
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": backend.namespace}}
                    },
                },
            }
        )
        in_force(backend, f"ValidatingAdmissionPolicy '{policy}'")
        release(backend)
        refused = first_failed_create(backend, job)
        assert f"ValidatingAdmissionPolicy '{policy}' with binding '{binding}' denied request" in refused, refused
        state, why = looked(backend, status_cli, exp_id, job)
        assert state == "FAILED", (state, why)
        assert "denied request: training pods need the platform team's label" in why, why
        assert f"`kubectl get validatingadmissionpolicy {policy} -o yaml`" in why, why
        cancel(job)
    finally:
        for delete, name in (
            (api.delete_validating_admission_policy_binding, binding),
            (api.delete_validating_admission_policy, policy),
        ):
            try:
                delete(name)
            except client.ApiException as error:
                if error.status != 404:
                    raise


def in_force(backend, words: str, resources: dict = None, **spec) -> None:
    """Waits until the API server refuses a pod like the job's with `words` (a pod created with dryRun: nothing is
    stored). A rule takes a moment to reach kube-apiserver's admission (its caches of namespaces, LimitRanges,
    ServiceAccounts, policies): a pod made before that would be admitted."""
    container = {"name": "node", "image": "python:3.11", "resources": resources or {}}
    probe = {"metadata": {"name": "ar-probe"}, "spec": {"containers": [container], **spec}}

    def refused() -> bool:
        try:
            backend.core().create_namespaced_pod(backend.namespace, probe, dry_run="All")
        except client.ApiException as error:
            return words in json.loads(error.body or "{}").get("message", "")
        return False

    wait_for(refused, f"the API server to refuse pods with {words!r}")
