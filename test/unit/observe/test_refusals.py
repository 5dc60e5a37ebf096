"""The refusals of the chain TrainJob -> JobSet -> Jobs -> pods (observe/refusals.py) and what a waiting look says
of them (``job_view.why_waiting``), from the events and objects as the API server returns them. The messages are
the admission plugins' own (kube-apiserver v1.36: ResourceQuota, PodSecurity, ServiceAccount, LimitRanger,
ValidatingAdmissionPolicy, a webhook), as the Job controller records them in its ``FailedCreate`` events."""

import pytest
from torchx.specs import AppState

from nemo_kubeflow.observe.job_view import JobView, why_waiting
from nemo_kubeflow.observe.refusals import chain_refusal, refusal_fix

POD = 'pods "j-node-0-0-x7k2p" is forbidden: '
QUOTA = POD + "exceeded quota: team-quota, requested: requests.cpu=1, used: requests.cpu=0, limited: requests.cpu=500m"
QUOTA_ONE_OF_TWO = (
    POD + "exceeded quota: team-quota, requested: requests.cpu=1, used: requests.cpu=1, limited: requests.cpu=1500m"
)
PSA = (
    POD + 'violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false (container "node" must set '
    'securityContext.allowPrivilegeEscalation=false), unrestricted capabilities (container "node" must set '
    'securityContext.capabilities.drop=["ALL"]), runAsNonRoot != true (pod or container "node" must set '
    'securityContext.runAsNonRoot=true), seccompProfile (pod or container "node" must set '
    'securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")'
)
SERVICE_ACCOUNT = POD + 'error looking up service account ns/trainer: serviceaccount "trainer" not found'
LIMIT_RANGE = POD + "maximum cpu usage per Container is 1, but limit is 2"
POLICY = POD + "ValidatingAdmissionPolicy 'no-root' with binding 'no-root-binding' denied request: run as non-root"


#: The refused pod as a look names it: the random characters the API server adds to its name change at each try.
def shown(message):
    return message.replace("-x7k2p", "-*")


WEBHOOK = 'admission webhook "validate.kyverno.svc-fail" denied the request: policy require-labels: team is required'


def jobset(created="2026-01-01T00:00:00Z", restarts=0, nodes=2):
    return {
        "metadata": {"name": "j", "namespace": "ns", "uid": "js-1", "creationTimestamp": created},
        "spec": {"replicatedJobs": [{"name": "node", "replicas": 1, "template": {"spec": {"parallelism": nodes}}}]},
        "status": {"restarts": restarts},
    }


def trainjob(created="2026-01-01T00:00:00Z", nodes=2):
    return {
        "metadata": {"name": "j", "namespace": "ns", "uid": "tj-1", "creationTimestamp": created},
        "spec": {"trainer": {"numNodes": nodes}},
    }


def failed_create(message, at="2026-01-01T00:00:05Z", job="j-node-0"):
    return {
        "type": "Warning",
        "reason": "FailedCreate",
        "message": "Error creating: " + message,
        "involvedObject": {"kind": "Job", "name": job, "namespace": "ns"},
        "lastTimestamp": at,
    }


def node_pod(index, created="2026-01-01T00:00:02Z", phase="Running"):
    return {
        "metadata": {
            "name": f"j-node-0-{index}-abcde",
            "creationTimestamp": created,
            "labels": {
                "batch.kubernetes.io/job-completion-index": str(index),
                "jobset.sigs.k8s.io/replicatedjob-name": "node",
                "jobset.sigs.k8s.io/restart-attempt": "0",
            },
        },
        "status": {"phase": phase},
    }


def looked(events, pods=(), with_jobset=True, nodes=2):
    view = JobView(
        cluster=None,
        trainjob=trainjob(nodes=nodes),
        pods=list(pods),
        _events=list(events),
        jobset=jobset(nodes=nodes) if with_jobset else None,
    )
    return why_waiting(view, nodes, AppState.SUBMITTED)


def test_a_quota_the_job_does_not_fit_is_pending_with_the_quotas_words_what_the_job_asks_and_the_fix():
    verdict = looked([failed_create(QUOTA)])
    assert verdict.state == AppState.PENDING and not verdict.fatal
    assert verdict.message == (
        "the Job controller cannot create the node pods (Job j-node-0, FailedCreate): "
        + shown(QUOTA)
        + "; the job's 2 pods "
        "ask requests.cpu=2 in all; more requests.cpu than quota team-quota allows: it starts only once the quota is "
        "raised or the job asks for less; fix: ask for less (cpu_request, memory_request, gpus_per_node, nodes) or a "
        "larger quota (`kubectl describe resourcequota team-quota -n ns` shows what is used)"
    )


def test_a_quota_that_fits_one_pod_of_two_names_the_quota_not_only_the_nodes_running():
    verdict = looked([failed_create(QUOTA_ONE_OF_TWO)], pods=[node_pod(0)])
    assert verdict.state == AppState.PENDING and not verdict.fatal
    assert "exceeded quota: team-quota" in verdict.message and "used: requests.cpu=1" in verdict.message
    assert "the job's 2 pods ask requests.cpu=2 in all" in verdict.message
    # Both pods together ask more than the quota's limit: the gang can never run whole under it.
    assert "more requests.cpu than quota team-quota allows: it starts only once the quota" in verdict.message
    # A quota that other pods fill: it may free up.
    in_use = (
        POD + "exceeded quota: team-quota, requested: requests.cpu=1, used: requests.cpu=3, limited: requests.cpu=4"
    )
    verdict = looked([failed_create(in_use)], pods=[node_pod(0)])
    assert verdict.state == AppState.PENDING and "the job's 2 pods ask requests.cpu=2 in all" in verdict.message
    assert "it waits until pods of namespace ns free quota team-quota" in verdict.message


@pytest.mark.parametrize(
    "message, fix",
    [
        (PSA, "namespace ns enforces the Pod Security level 'restricted'; fix: set restricted_security=True"),
        (SERVICE_ACCOUNT, "fix: create ServiceAccount trainer in namespace ns, or set service_account"),
        (LIMIT_RANGE, "fix: keep cpu_request, cpu_limit, memory_request and memory_limit within the namespace's"),
        (POLICY, "fix: change what the policy's message asks for and submit again (`kubectl get "),
        (WEBHOOK, "fix: change what the message of the admission webhook validate.kyverno.svc-fail asks for"),
    ],
)
def test_a_pod_the_namespace_never_admits_fails_the_job_in_the_admissions_words_with_the_fix(message, fix):
    verdict = looked([failed_create(message)])
    assert verdict.state == AppState.FAILED and verdict.fatal
    assert shown(message) in verdict.message and fix in verdict.message, verdict.message


def test_a_refusal_reads_the_same_at_each_try_of_the_job_controller():
    again = failed_create(QUOTA.replace("x7k2p", "b9q4z"), at="2026-01-01T00:00:07Z")
    again["message"] = "(combined from similar events): " + again["message"]
    assert looked([again]).message == looked([failed_create(QUOTA)]).message
    assert 'pods "j-node-0-0-*" is forbidden: exceeded quota' in looked([again]).message


def test_a_series_of_events_is_as_new_as_its_last_observation():
    # JobSet records with events.k8s.io: a repeated refusal is one event whose series says when it was last seen.
    jobset_event = {
        "type": "Warning",
        "reason": "JobCreationFailed",
        "note": 'jobs.batch "j-node-0" is forbidden: exceeded quota: jobs, requested: count/jobs.batch=1, used: '
        "count/jobs.batch=4, limited: count/jobs.batch=4",
        "regarding": {"kind": "JobSet", "name": "j"},
        "eventTime": "2026-01-01T00:00:01.000000Z",
        "series": {"count": 5, "lastObservedTime": "2026-01-01T00:00:09.000000Z"},
    }
    refusal = chain_refusal([failed_create(PSA), jobset_event], trainjob(), jobset(), [])
    assert refusal is not None and refusal.when == "2026-01-01T00:00:09" and "exceeded quota: jobs" in refusal.message


def test_the_newest_refusal_of_the_chain_is_the_one_said():
    older, newer = failed_create(QUOTA, at="2026-01-01T00:00:05Z"), failed_create(PSA, at="2026-01-01T00:00:09Z")
    assert "violates PodSecurity" in looked([newer, older]).message
    assert "exceeded quota" in looked([failed_create(QUOTA, at="2026-01-01T00:00:10Z"), older]).message


def test_a_refusal_that_has_passed_is_not_said():
    # The quota freed: every pod was created after the last refusal.
    pods = [node_pod(0, phase="Pending"), node_pod(1, created="2026-01-01T00:00:07Z", phase="Pending")]
    assert chain_refusal([failed_create(QUOTA)], trainjob(), jobset(), pods) is None
    assert looked([failed_create(QUOTA)], pods).message == "0/2 nodes running"
    # Events of an earlier TrainJob of the same name (before this JobSet was created) are not this job's.
    assert chain_refusal([failed_create(QUOTA, at="2025-12-31T23:59:00Z")], trainjob(), jobset(), []) is None
    # A refusal of the first attempt that had passed (its pods came after it) is not said while a gang restart's
    # new pods are not made yet.
    restarted = {**jobset(), "status": {"restarts": 1}}
    first_attempt = [node_pod(0, created="2026-01-01T00:00:07Z"), node_pod(1, created="2026-01-01T00:00:07Z")]
    assert chain_refusal([failed_create(QUOTA)], trainjob(), restarted, first_attempt) is None
    # Events about another job's Jobs are not this job's.
    assert chain_refusal([failed_create(PSA, job="j-other-node-0")], trainjob(), jobset(), []) is None


def test_jobsets_and_trainers_warnings_are_said_while_the_object_below_is_missing():
    jobset_event = {
        "type": "Warning",
        "reason": "JobCreationFailed",
        "message": 'jobs.batch "j-node-0" is forbidden: ' + POLICY.split("forbidden: ")[1],
        "involvedObject": {"kind": "JobSet", "name": "j"},
        "lastTimestamp": "2026-01-01T00:00:04Z",
    }
    verdict = looked([jobset_event])
    assert verdict.state == AppState.FAILED
    assert verdict.message.startswith("JobSet j cannot create its Jobs (JobSet j, JobCreationFailed): jobs.batch")
    # JobSet's other Warnings say no refusal: a gang restart's, while the new attempt's pods are not made yet.
    restart = {
        **jobset_event,
        "reason": "RestartJobSetAction",
        "message": "restarting jobset, first failed job: j-node-0",
    }
    assert chain_refusal([restart], trainjob(), jobset(), []) is None
    trainer_event = {
        "type": "Warning",
        "reason": "TrainJobResourcesCreationFailed",
        "message": "TrainJob resources reconciliation failed: configmaps already exists",
        "involvedObject": {"kind": "TrainJob", "name": "j"},
        "lastTimestamp": "2026-01-01T00:00:04Z",
    }
    verdict = looked([trainer_event], with_jobset=False)
    assert verdict.state == AppState.PENDING
    assert verdict.message.startswith("TrainJobResourcesCreationFailed: TrainJob resources reconciliation failed")


def test_a_waiting_job_never_steps_back_from_pending_to_submitted():
    # Pending pods, then none (deleted, or refused once the quota filled up): the JobSet's Jobs still make its pods.
    assert looked([], pods=[node_pod(0, phase="Pending")]).state == AppState.PENDING
    assert looked([]).state == AppState.PENDING
    # Only before its JobSet exists is a job merely submitted.
    assert looked([], with_jobset=False).state == AppState.SUBMITTED
    # A JobSet built again (a move off failed nodes deletes it) was counted by Trainer before: still PENDING.
    counted = JobView(None, {**trainjob(), "status": {"jobsStatus": [{"name": "node", "active": 0}]}}, [], _events=[])
    assert why_waiting(counted, 2, AppState.SUBMITTED).state == AppState.PENDING


def test_what_is_not_an_admission_rule_waits():
    assert refusal_fix('Internal error occurred: failed calling webhook "x": connection refused', "ns") == (
        "fix: see `kubectl get events -n ns --field-selector type=Warning`",
        False,
    )
    fix, fatal = refusal_fix(POD + "failed quota: team-quota: must specify requests.cpu for: node", "ns")
    assert fatal and fix.startswith("fix: set the requests and limits the quota names")
