"""The pure checks a submission runs before writing (schema/job_pods.py, pod_security.py, namespace_fit.py):
the pods we render, Pod Security in the admission's words, LimitRanges and ResourceQuotas against the job.
The admission's own words are checked against the real PodSecurity, LimitRanger and ResourceQuota admission
by test/test_admission_presubmit.py (`-m real`)."""

from builders import submission

from nemo_kubeflow import KubeflowExecutor
from nemo_kubeflow.schema import namespace_fit, pod_security, policy_match
from nemo_kubeflow.schema.job_pods import job_pods, merge

GPU = "nvidia.com/gpu"


def pods_of(**fields):
    executor = KubeflowExecutor(**{"container_image": "python:3.11", "nodes": 2, **fields})
    sub = submission(executor)
    return job_pods(sub.trainjob, sub.runtime)


def quota(hard, used=None, name="team-quota", **spec):
    return {"metadata": {"name": name}, "spec": {"hard": hard, **spec}, "status": {"used": used or {}}}


def limit_range(*items, name="limits"):
    return {"metadata": {"name": name}, "spec": {"limits": list(items)}}


# ------------------------------------------------------------------------------------------------ the pods


def test_the_node_pods_carry_the_trainjob_settings_and_count_one_per_node():
    (node,) = pods_of(nodes=3, cpu_request="1", memory_limit="2Gi", preflight=True)
    assert (node.job, node.count, node.after) == ("node", 3, ())
    container = next(c for c in node.spec["containers"] if c["name"] == "node")
    assert container["image"] == "python:3.11"
    assert container["resources"] == {"requests": {"cpu": "1"}, "limits": {"memory": "2Gi"}}
    assert [c["name"] for c in node.spec["initContainers"]] == ["preflight"]


def test_a_patch_merges_named_items_by_name_and_replaces_the_rest():
    base = {"containers": [{"name": "a", "image": "x", "env": [{"name": "A", "value": "1"}]}], "hostIPC": True}
    patch = {"containers": [{"name": "a", "env": [{"name": "B", "value": "2"}]}, {"name": "b"}], "hostIPC": False}
    merged = merge(base, patch)
    assert merged["hostIPC"] is False
    assert merged["containers"] == [
        {"name": "a", "image": "x", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]},
        {"name": "b"},
    ]


# ------------------------------------------------------------------------------------------- Pod Security


def test_default_pods_pass_baseline_and_fail_restricted_in_the_admissions_words():
    (node,) = pods_of()
    assert pod_security.violations("baseline", node.spec) == []
    found = pod_security.violations("restricted", node.spec)
    assert pod_security.message("restricted", "latest", found) == (
        'violates PodSecurity "restricted:latest": '
        'allowPrivilegeEscalation != false (container "node" must set securityContext.allowPrivilegeEscalation=false), '
        'unrestricted capabilities (container "node" must set securityContext.capabilities.drop=["ALL"]), '
        'runAsNonRoot != true (pod or container "node" must set securityContext.runAsNonRoot=true), '
        'seccompProfile (pod or container "node" must set securityContext.seccompProfile.type to "RuntimeDefault" '
        'or "Localhost")'
    )
    assert pod_security.fixes(found) == [pod_security.RESTRICTED_FIX]


def test_restricted_security_pods_pass_restricted_with_every_container_named():
    for fields in ({}, {"preflight": True}):
        (node,) = pods_of(restricted_security=True, **fields)
        assert pod_security.violations("restricted", node.spec) == [], fields
    (node,) = pods_of(preflight=True)
    first = pod_security.violations("restricted", node.spec)[0]
    assert first.detail == 'containers "preflight", "node" must set securityContext.allowPrivilegeEscalation=false'


def test_run_as_user_zero_names_run_as_user():
    (node,) = pods_of(run_as_user=0)
    found = next(v for v in pod_security.violations("restricted", node.spec) if v.check == "runAsUser")
    assert str(found) == "runAsUser=0 (pod must not set runAsUser=0)"
    assert "run_as_user" in found.fix


def test_baseline_refuses_host_namespaces_paths_privileges_and_added_capabilities():
    pod = {
        "hostNetwork": True,
        "hostIPC": True,
        "volumes": [{"name": "dev", "hostPath": {"path": "/dev"}}, {"name": "tmp", "emptyDir": {}}],
        "containers": [
            {
                "name": "node",
                "ports": [{"containerPort": 80, "hostPort": 8080}],
                "securityContext": {"privileged": True, "capabilities": {"add": ["IPC_LOCK", "CHOWN"]}},
            }
        ],
    }
    assert [str(v) for v in pod_security.violations("baseline", pod)] == [
        'non-default capabilities (container "node" must not include "IPC_LOCK" in securityContext.capabilities.add)',
        "host namespaces (hostNetwork=true, hostIPC=true)",
        'hostPath volumes (volume "dev")',
        'hostPort (container "node" uses hostPort 8080)',
        'privileged (container "node" must not set securityContext.privileged=true)',
    ]
    restricted = [v.check for v in pod_security.violations("restricted", pod)]
    assert "restrictedVolumes" in restricted and "hostPathVolumes" not in restricted
    assert "capabilities_restricted" in restricted and "capabilities_baseline" not in restricted


def test_a_namespace_without_the_label_enforces_privileged():
    assert pod_security.enforced_level({"metadata": {}}) == ("privileged", "latest")
    labels = {pod_security.ENFORCE_LABEL: "baseline", pod_security.ENFORCE_VERSION_LABEL: "v1.30"}
    assert pod_security.enforced_level({"metadata": {"labels": labels}}) == ("baseline", "v1.30")
    assert pod_security.violations("privileged", {"hostNetwork": True}) == []


# ------------------------------------------------------------------------------------------- LimitRanges


def test_limit_range_defaults_fill_what_a_container_does_not_set():
    pods = pods_of(cpu_limit="2")
    lr = limit_range({"type": "Container", "default": {"memory": "1Gi"}, "defaultRequest": {"memory": "512Mi"}})
    (node,) = namespace_fit.with_limit_range_defaults(pods, [lr])
    resources = node.spec["containers"][0]["resources"]
    assert resources == {"limits": {"cpu": "2", "memory": "1Gi"}, "requests": {"cpu": "2", "memory": "512Mi"}}


def test_limit_range_bounds_in_the_plugins_words_with_the_field_to_change():
    pods = pods_of(cpu_request="1", cpu_limit="4", memory_request="64Mi", memory_limit="1Gi")
    lr = limit_range(
        {"type": "Container", "max": {"cpu": "2"}, "min": {"memory": "128Mi"}, "maxLimitRequestRatio": {"memory": "4"}}
    )
    problems = namespace_fit.limit_range_problems(pods, [lr], GPU)
    assert problems == [
        "LimitRange 'limits' (Container): minimum memory usage per Container is 128Mi, but request is 64Mi "
        '(container "node" of replicated job "node"); fix: set memory_request, within its bounds (min 128Mi, max none)',
        "LimitRange 'limits' (Container): maximum cpu usage per Container is 2, but limit is 4 "
        '(container "node" of replicated job "node"); fix: set cpu_limit, within its bounds (min none, max 2)',
        "LimitRange 'limits' (Container): memory max limit to request ratio per Container is 4, but provided ratio "
        'is 16.000000 (container "node" of replicated job "node"); fix: set memory_limit, within its bounds '
        "(min 128Mi, max none)",
    ]


def test_a_pod_limit_range_counts_the_whole_pod():
    pods = pods_of(cpu_request="1", cpu_limit="1", preflight=True)
    lr = limit_range({"type": "Pod", "max": {"cpu": "500m"}})
    defaulted = namespace_fit.with_limit_range_defaults(pods, [lr])
    (problem,) = namespace_fit.limit_range_problems(defaulted, [lr], GPU)
    assert 'maximum cpu usage per Pod is 500m, but limit is 1 (the pods of replicated job "node")' in problem
    assert "fix: set cpu_limit" in problem


# ---------------------------------------------------------------------------------------- ResourceQuotas


def test_a_job_over_a_quotas_hard_limit_is_refused_with_the_numbers_and_field():
    pods = pods_of(cpu_request="1", memory_request="1Gi", gpus_per_node=4)
    fit = namespace_fit.quota_fit(pods, [quota({"requests.cpu": "500m", f"requests.{GPU}": "4"})], GPU)
    assert fit.refusals == [
        "ResourceQuota 'team-quota': the job's pods that run at once (2 pod(s) of replicated job \"node\") ask "
        "requests.cpu=2, more than its hard limit requests.cpu=500m: the quota would never admit them all; fix: "
        "lower cpu_request or nodes, or ask an admin to raise the quota",
        "ResourceQuota 'team-quota': the job's pods that run at once (2 pod(s) of replicated job \"node\") ask "
        f"requests.{GPU}=8, more than its hard limit requests.{GPU}=4: the quota would never admit them all; fix: "
        "lower gpus_per_node or nodes, or ask an admin to raise the quota",
    ]
    assert fit.warnings == []


def test_a_job_over_what_is_free_now_is_a_warning():
    pods = pods_of(cpu_request="1", memory_request="1Gi")
    fit = namespace_fit.quota_fit(pods, [quota({"cpu": "4", "pods": "10"}, {"cpu": "3", "pods": "1"})], GPU)
    assert fit.refusals == []
    assert fit.warnings == [
        "ResourceQuota 'team-quota': the job's pods (2 pod(s) of replicated job \"node\") ask cpu=2, more than is "
        "free now (1 of 4; 3 used): they wait until other pods in the namespace end; fix: wait, or lower "
        "cpu_request or nodes"
    ]


def test_a_quota_on_cpu_needs_every_container_to_set_it():
    pods = pods_of(memory_request="1Gi", preflight=True)
    fit = namespace_fit.quota_fit(pods, [quota({"limits.cpu": "8", "count/pods": "4"})], GPU)
    (refusal,) = fit.refusals
    assert "failed quota: team-quota: must specify limits.cpu for: preflight,node" in refusal
    assert "set cpu_limit" in refusal and "preflight=False" in refusal
    # a LimitRange default sets it: admitted
    lr = limit_range({"type": "Container", "default": {"cpu": "1"}})
    defaulted = namespace_fit.with_limit_range_defaults(pods, [lr])
    assert namespace_fit.quota_fit(defaulted, [quota({"limits.cpu": "8"})], GPU).refusals == []


def test_a_quota_counts_only_the_pods_in_its_scopes():
    pods = pods_of(cpu_request="4", priority_class_name="high")
    other = {
        "scopeSelector": {"matchExpressions": [{"scopeName": "PriorityClass", "operator": "In", "values": ["low"]}]}
    }
    assert namespace_fit.quota_fit(pods, [quota({"cpu": "1"}, **other)], GPU).refusals == []
    assert namespace_fit.quota_fit(pods, [quota({"cpu": "1"}, scopes=["Terminating"])], GPU).refusals == []
    assert namespace_fit.quota_fit(pods, [quota({"cpu": "1"}, scopes=["NotTerminating"])], GPU).refusals


def test_quota_lines_say_used_hard_and_what_one_job_asks():
    pods = pods_of(cpu_request="1500m", memory_request="1Gi")
    lines = namespace_fit.quota_lines(
        pods, [quota({"requests.cpu": "8", "pods": "10", "services": "2"}, {"requests.cpu": "1"})]
    )
    assert [str(line) for line in lines] == [
        "ResourceQuota team-quota: requests.cpu used 1 of 8; one job asks 3",
        "ResourceQuota team-quota: pods used 0 of 10; one job asks 2",
    ]


# ------------------------------------------------------------------------------------ the policies that match


POD_RULE = {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}


def test_webhooks_match_by_rule_and_namespace_selector():
    labels = {"team": "a"}
    configs = [
        {
            "metadata": {"name": "kyverno"},
            "webhooks": [
                {
                    "name": "all",
                    "rules": [{**POD_RULE, "apiGroups": ["*"], "resources": ["*"]}],
                    "failurePolicy": "Fail",
                },
                {"name": "updates", "rules": [{**POD_RULE, "operations": ["UPDATE"]}]},
                {"name": "other-team", "rules": [POD_RULE], "namespaceSelector": {"matchLabels": {"team": "b"}}},
                {
                    "name": "not-system",
                    "rules": [{**POD_RULE, "apiGroups": ["batch"], "resources": ["jobs"]}],
                    "namespaceSelector": {"matchExpressions": [{"key": "system", "operator": "DoesNotExist"}]},
                    "failurePolicy": "Ignore",
                },
            ],
        }
    ]
    found = policy_match.matching_webhooks("ValidatingWebhookConfiguration", configs, labels)
    assert [str(m) for m in found] == [
        "ValidatingWebhookConfiguration kyverno/all matches trainjobs, jobsets, jobs, pods (failurePolicy Fail)",
        "ValidatingWebhookConfiguration kyverno/not-system matches jobs (failurePolicy Ignore)",
    ]


def test_a_policy_counts_only_when_a_binding_takes_in_the_namespace():
    policy = {"metadata": {"name": "p"}, "spec": {"matchConstraints": {"resourceRules": [POD_RULE]}}}
    elsewhere = {
        "metadata": {"name": "b1"},
        "spec": {
            "policyName": "p",
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": {"x": "y"}}},
        },
    }
    assert policy_match.matching_policies([policy], [elsewhere], {}) == []
    here = {"metadata": {"name": "b2"}, "spec": {"policyName": "p", "validationActions": ["Warn", "Audit"]}}
    (found,) = policy_match.matching_policies([policy], [elsewhere, here], {})
    assert str(found) == "ValidatingAdmissionPolicy p matches pods (failurePolicy Fail, binding b2: Warn/Audit)"
