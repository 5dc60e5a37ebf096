"""Pod admission on the local cluster, in the real kube-apiserver's words: LimitRanger (defaults, then bounds),
the ServiceAccount and Priority lookups, PodSecurity (the namespace's labels, `baseline` and `restricted`),
a denying ValidatingAdmissionPolicy and ResourceQuota (with the quota controller's `status.used`).

Each scenario runs through one HTTP client on any API server. Offline, the local cluster must answer what the
real kube-apiserver v1.36 answered (the expected texts below, recorded from it); `-m real` sends the same
requests to the real control plane, which must answer the same: so the emulation is proven, not assumed.
"""

from __future__ import annotations

import json
import time
import urllib.error
from typing import Callable, Optional

import nemo_run as run
import pytest
from kubernetes import client
from torchx.specs import AppState

Send = Callable[[str, str, Optional[dict], str], tuple[int, dict]]
ADMISSION = "/apis/admissionregistration.k8s.io/v1"
MERGE = "application/merge-patch+json"


def local_sender(api: client.ApiClient) -> Send:
    def send(method: str, path: str, body: Optional[dict] = None, content_type: str = "application/json"):
        try:
            response = api.call_api(
                path,
                method,
                body=body,
                auth_settings=["BearerToken"],
                header_params={"Content-Type": content_type},
                _preload_content=False,
            )
            return response[1], json.loads(response[0].data)
        except client.ApiException as error:
            return int(error.status), json.loads(error.body)

    return send


def real_sender(cp) -> Send:
    def send(method: str, path: str, body: Optional[dict] = None, content_type: str = "application/json"):
        try:
            return 200 if method != "POST" else 201, cp.request(method, path, body, content_type)
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    return send


def pod(name: str, generate: bool = False, **spec) -> dict:
    containers = spec.pop("containers", [{"name": "node", "image": "busybox"}])
    meta = {"generateName": name} if generate else {"name": name}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": containers, **spec}}


def container(name: str = "node", **fields) -> dict:
    return {"name": name, "image": "busybox", **fields}


def refusal(send: Send, ns: str, body: dict) -> tuple[int, str]:
    """(code, message) of a pod create, the namespace written as {ns}; (201, "") when admitted."""
    code, answer = send("POST", f"/api/v1/namespaces/{ns}/pods", body)
    return (code, answer.get("message", "").replace(ns, "{ns}")) if code >= 400 else (code, "")


def label(send: Send, ns: str, labels: dict) -> tuple[int, str]:
    code, answer = send("PATCH", f"/api/v1/namespaces/{ns}", {"metadata": {"labels": labels}}, MERGE)
    return (code, answer.get("message", "").replace(ns, "{ns}")) if code >= 400 else (code, "")


# --- the scenarios: each returns what the server answered --------------------------------------------------


def service_account_and_priority(send: Send, ns: str) -> list:
    return [
        refusal(send, ns, pod("sa", serviceAccountName="nope")),
        # a mutating plugin runs before the name is generated: the message names the generateName
        refusal(send, ns, pod("sa-", generate=True, serviceAccountName="nope")),
        refusal(send, ns, pod("pc", priorityClassName="nope")),
        refusal(send, ns, pod("critical", priorityClassName="system-cluster-critical")),
    ]


SERVICE_ACCOUNT_AND_PRIORITY = [
    (403, 'pods "sa" is forbidden: error looking up service account {ns}/nope: serviceaccount "nope" not found'),
    (403, 'pods "sa-" is forbidden: error looking up service account {ns}/nope: serviceaccount "nope" not found'),
    (403, 'pods "pc" is forbidden: no PriorityClass with name nope was found'),
    (201, ""),
]


def pod_security(send: Send, ns: str) -> list:
    restricted_ok = pod(
        "fine",
        securityContext={"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        containers=[container(securityContext={"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}})],
        volumes=[{"name": "e", "emptyDir": {}}, {"name": "c", "persistentVolumeClaim": {"claimName": "x"}}],
    )
    many = pod(
        "many",
        hostNetwork=True,
        volumes=[{"name": "h", "hostPath": {"path": "/tmp"}}],
        initContainers=[container("init")],
        containers=[
            container(
                securityContext={"privileged": True, "runAsUser": 0, "capabilities": {"add": ["SYS_ADMIN"]}},
                ports=[{"containerPort": 80, "hostPort": 80}],
            ),
            container("two"),
        ],
    )
    baseline = pod(
        "base",
        hostNetwork=True,
        volumes=[{"name": "h", "hostPath": {"path": "/tmp"}}],
        containers=[container(securityContext={"privileged": True, "capabilities": {"add": ["SYS_ADMIN", "CHOWN"]}})],
    )
    return [
        label(send, ns, {"pod-security.kubernetes.io/enforce": "bogus"}),
        label(send, ns, {"pod-security.kubernetes.io/enforce-version": "v1"}),
        label(send, ns, {"pod-security.kubernetes.io/enforce": "restricted"}),
        refusal(send, ns, pod("plain")),
        refusal(send, ns, many),
        refusal(send, ns, restricted_ok),
        label(
            send,
            ns,
            {"pod-security.kubernetes.io/enforce": "baseline", "pod-security.kubernetes.io/enforce-version": "v1.30"},
        ),
        refusal(send, ns, baseline),
        refusal(send, ns, pod("plain-under-baseline")),
    ]


_INVALID_LABEL = 'Namespace "{ns}" is invalid: metadata.labels[pod-security.kubernetes.io/enforce'
POD_SECURITY = [
    (422, _INVALID_LABEL + ']: Invalid value: "bogus": must be one of privileged, baseline, restricted'),
    (422, _INVALID_LABEL + '-version]: Invalid value: "v1": must be "latest" or "v1.x"'),
    (200, ""),
    (
        403,
        'pods "plain" is forbidden: violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false '
        '(container "node" must set securityContext.allowPrivilegeEscalation=false), unrestricted capabilities '
        '(container "node" must set securityContext.capabilities.drop=["ALL"]), runAsNonRoot != true (pod or '
        'container "node" must set securityContext.runAsNonRoot=true), seccompProfile (pod or container "node" must '
        'set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")',
    ),
    (
        403,
        'pods "many" is forbidden: violates PodSecurity "restricted:latest": host namespaces (hostNetwork=true), '
        'hostPort (container "node" uses hostPort 80), privileged (container "node" must not set '
        'securityContext.privileged=true), allowPrivilegeEscalation != false (containers "init", "node", "two" must '
        'set securityContext.allowPrivilegeEscalation=false), unrestricted capabilities (containers "init", "node", '
        '"two" must set securityContext.capabilities.drop=["ALL"]; container "node" must not include "SYS_ADMIN" in '
        'securityContext.capabilities.add), restricted volume types (volume "h" uses restricted volume type '
        '"hostPath"), runAsNonRoot != true (pod or containers "init", "node", "two" must set '
        'securityContext.runAsNonRoot=true), runAsUser=0 (container "node" must not set runAsUser=0), seccompProfile '
        '(pod or containers "init", "node", "two" must set securityContext.seccompProfile.type to "RuntimeDefault" '
        'or "Localhost")',
    ),
    (201, ""),
    (200, ""),
    (
        403,
        'pods "base" is forbidden: violates PodSecurity "baseline:v1.30": non-default capabilities (container "node" '
        'must not include "SYS_ADMIN" in securityContext.capabilities.add), host namespaces (hostNetwork=true), '
        'hostPath volumes (volume "h"), privileged (container "node" must not set securityContext.privileged=true)',
    ),
    (201, ""),
]


LIMIT_RANGE = {
    "metadata": {"name": "bounds"},
    "spec": {
        "limits": [
            {
                "type": "Container",
                "max": {"cpu": "1"},
                "min": {"cpu": "100m"},
                "default": {"cpu": "400m"},
                "defaultRequest": {"cpu": "200m", "memory": "100Mi"},
                "maxLimitRequestRatio": {"cpu": "2"},
            },
            {"type": "Pod", "max": {"cpu": "2"}},
        ]
    },
}


def limit_ranges(send: Send, ns: str) -> list:
    send("POST", f"/api/v1/namespaces/{ns}/limitranges", LIMIT_RANGE)
    code, defaulted = send("POST", f"/api/v1/namespaces/{ns}/pods", pod("defaulted"))
    limits = lambda cpu: {"limits": {"cpu": cpu}}  # noqa: E731
    return [
        (
            code,
            defaulted["metadata"]["annotations"]["kubernetes.io/limit-ranger"],
            defaulted["spec"]["containers"][0]["resources"],
        ),
        refusal(send, ns, pod("over", containers=[container(resources=limits("3"))])),
        refusal(send, ns, pod("under", containers=[container(resources={"requests": {"cpu": "10m"}, **limits("1")})])),
        refusal(send, ns, pod("pod", containers=[container(n, resources=limits("1")) for n in ("a", "b", "c")])),
    ]


LIMIT_RANGES = [
    (
        201,
        "LimitRanger plugin set: cpu, memory request for container node; cpu limit for container node",
        {"limits": {"cpu": "400m"}, "requests": {"cpu": "200m", "memory": "100Mi"}},
    ),
    (
        403,
        'pods "over" is forbidden: [maximum cpu usage per Container is 1, but limit is 3, maximum cpu usage per Pod '
        "is 2, but limit is 3]",
    ),
    (
        403,
        'pods "under" is forbidden: [minimum cpu usage per Container is 100m, but request is 10m, cpu max limit to '
        "request ratio per Container is 2, but provided ratio is 100.000000]",
    ),
    (403, 'pods "pod" is forbidden: maximum cpu usage per Pod is 2, but limit is 3'),
]


QUOTA = {
    "metadata": {"name": "team-quota"},
    "spec": {
        "hard": {
            "requests.cpu": "500m",
            "limits.memory": "1Gi",
            "requests.nvidia.com/gpu": "1",
            "count/pods": "5",
            "pods": "1",
        }
    },
}


def _quota_status(send: Send, ns: str, wanted: Callable[[dict], bool]) -> dict:
    deadline = time.monotonic() + 30
    while True:
        status = send("GET", f"/api/v1/namespaces/{ns}/resourcequotas/team-quota", None)[1].get("status") or {}
        if wanted(status) or time.monotonic() > deadline:
            return status
        time.sleep(0.2)


def quotas(send: Send, ns: str) -> list:
    send("POST", f"/api/v1/namespaces/{ns}/resourcequotas", QUOTA)
    small = {"requests": {"cpu": "100m"}, "limits": {"memory": "100Mi"}}
    big = {"requests": {"cpu": "1"}, "limits": {"memory": "100Mi", "nvidia.com/gpu": "2"}}
    seen = [_quota_status(send, ns, lambda s: "used" in s)]
    seen.append(refusal(send, ns, pod("big", containers=[container(resources=big)])))
    seen.append(refusal(send, ns, pod("bare")))
    seen.append(refusal(send, ns, pod("small", containers=[container(resources=small)])))
    seen.append(_quota_status(send, ns, lambda s: (s.get("used") or {}).get("pods") == "1"))
    seen.append(refusal(send, ns, pod("second", containers=[container(resources=small)])))
    send("DELETE", f"/api/v1/namespaces/{ns}/pods/small", {"gracePeriodSeconds": 0})
    seen.append(_quota_status(send, ns, lambda s: (s.get("used") or {}).get("count/pods") == "0")["used"])
    return seen


_HARD = {"count/pods": "5", "limits.memory": "1Gi", "pods": "1", "requests.cpu": "500m", "requests.nvidia.com/gpu": "1"}
_NONE = {"count/pods": "0", "limits.memory": "0", "pods": "0", "requests.cpu": "0", "requests.nvidia.com/gpu": "0"}
QUOTAS = [
    {"hard": _HARD, "used": _NONE},
    (
        403,
        'pods "big" is forbidden: exceeded quota: team-quota, requested: requests.cpu=1,requests.nvidia.com/gpu=2, '
        "used: requests.cpu=0,requests.nvidia.com/gpu=0, limited: requests.cpu=500m,requests.nvidia.com/gpu=1",
    ),
    (
        403,
        'pods "bare" is forbidden: failed quota: team-quota: must specify limits.memory for: node; requests.cpu for: node',
    ),
    (201, ""),
    {
        "hard": _HARD,
        "used": {
            "count/pods": "1",
            "limits.memory": "100Mi",
            "pods": "1",
            "requests.cpu": "100m",
            "requests.nvidia.com/gpu": "0",
        },
    },
    (403, 'pods "second" is forbidden: exceeded quota: team-quota, requested: pods=1, used: pods=1, limited: pods=1'),
    _NONE,
]


def policies(send: Send, ns: str) -> list:
    rule = {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
    policy = {
        "metadata": {"name": f"{ns}-policy"},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [rule]},
            "validations": [
                {
                    "expression": "object.spec.containers.all(c, has(c.securityContext) && "
                    "has(c.securityContext.runAsNonRoot) && c.securityContext.runAsNonRoot)",
                    "message": "every container must set runAsNonRoot",
                },
                {
                    "expression": "object.metadata.name.size() < 8",
                    "reason": "Forbidden",
                    "messageExpression": "'name ' + object.metadata.name + ' is too long'",
                },
            ],
        },
    }
    binding = {
        "metadata": {"name": f"{ns}-binding"},
        "spec": {
            "policyName": f"{ns}-policy",
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}},
        },
    }
    send("POST", f"{ADMISSION}/validatingadmissionpolicies", policy)
    send("POST", f"{ADMISSION}/validatingadmissionpolicybindings", binding)
    try:
        seen = []
        deadline = time.monotonic() + 30  # the real server starts enforcing a new policy within seconds
        for attempt in range(1000):
            seen = [refusal(send, ns, pod(f"p{attempt}"))]
            if seen[0][0] >= 400 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        seen[0] = (seen[0][0], seen[0][1].replace(f'"p{attempt}"', '"P"'))
        non_root = [container(securityContext={"runAsNonRoot": True})]
        seen.append(refusal(send, ns, pod("rather-long", containers=non_root)))
        seen.append(refusal(send, ns, pod("short", containers=non_root)))
        return [(code, message.replace(ns, "{ns}")) for code, message in seen]
    finally:
        send("DELETE", f"{ADMISSION}/validatingadmissionpolicybindings/{ns}-binding", None)
        send("DELETE", f"{ADMISSION}/validatingadmissionpolicies/{ns}-policy", None)


_DENIED = "ValidatingAdmissionPolicy '{ns}-policy' with binding '{ns}-binding' denied request: "
POLICIES = [
    (422, f'pods "P" is forbidden: {_DENIED}every container must set runAsNonRoot'),
    (403, f'pods "rather-long" is forbidden: {_DENIED}name rather-long is too long'),
    (201, ""),
]

SCENARIOS = [
    pytest.param(service_account_and_priority, SERVICE_ACCOUNT_AND_PRIORITY, id="service-account-and-priority"),
    pytest.param(pod_security, POD_SECURITY, id="pod-security"),
    pytest.param(limit_ranges, LIMIT_RANGES, id="limit-ranges"),
    pytest.param(quotas, QUOTAS, id="resource-quota"),
    pytest.param(policies, POLICIES, id="validating-admission-policy"),
]


@pytest.mark.parametrize("scenario, expected", SCENARIOS)
def test_the_local_cluster_admits_pods_as_the_real_api_server_does(api, ns, scenario, expected):
    assert scenario(local_sender(api), ns) == expected


@pytest.mark.real
@pytest.mark.parametrize("scenario, expected", SCENARIOS)
def test_the_real_api_server_answers_the_same(real_control_plane, real_namespace, scenario, expected):
    assert scenario(real_sender(real_control_plane), real_namespace) == expected


def test_a_refused_pod_leaves_nothing_behind_and_a_dry_run_is_admitted_the_same(api, core, ns):
    send = local_sender(api)
    send(
        "POST", f"/api/v1/namespaces/{ns}/resourcequotas", {"metadata": {"name": "q"}, "spec": {"hard": {"pods": "0"}}}
    )
    code, answer = send("POST", f"/api/v1/namespaces/{ns}/pods?dryRun=All", pod("dry"))
    assert (code, answer["reason"]) == (403, "Forbidden")
    assert answer["details"] == {"name": "dry", "kind": "pods"}
    assert refusal(send, ns, pod("real"))[0] == 403
    assert core.list_namespaced_pod(ns).items == []
    assert core.read_namespaced_resource_quota("q", ns).status.used == {"pods": "0"}


def test_a_warning_policy_admits_with_the_real_warning_and_its_variables_and_conditions_apply(api, ns):
    send = local_sender(api)
    rule = {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
    policy = {
        "metadata": {"name": f"{ns}-warn"},
        "spec": {
            "matchConstraints": {"resourceRules": [rule]},
            "matchConditions": [
                {"name": "labelled", "expression": "has(object.metadata.labels) && 'team' in object.metadata.labels"}
            ],
            "variables": [{"name": "images", "expression": "object.spec.containers.map(c, c.image)"}],
            "validations": [{"expression": "variables.images.all(i, i.contains(':'))"}],
        },
    }
    binding = {"metadata": {"name": f"{ns}-warn"}, "spec": {"policyName": f"{ns}-warn", "validationActions": ["Warn"]}}
    assert send("POST", f"{ADMISSION}/validatingadmissionpolicies", policy)[0] == 201
    assert send("POST", f"{ADMISSION}/validatingadmissionpolicybindings", binding)[0] == 201
    try:
        labelled = dict(pod("untagged"), metadata={"name": "untagged", "labels": {"team": "a"}})
        response = api.call_api(
            f"/api/v1/namespaces/{ns}/pods",
            "POST",
            body=labelled,
            auth_settings=["BearerToken"],
            _preload_content=False,
        )
        assert response[1] == 201
        assert response[2]["Warning"] == (
            f"299 - \"Validation failed for ValidatingAdmissionPolicy '{ns}-warn' with binding '{ns}-warn': failed "
            "expression: variables.images.all(i, i.contains(':'))\""
        )
        unlabelled = api.call_api(
            f"/api/v1/namespaces/{ns}/pods",
            "POST",
            body=pod("other"),
            auth_settings=["BearerToken"],
            _preload_content=False,
        )
        assert "Warning" not in unlabelled[2]  # its match condition does not hold: not evaluated
    finally:
        send("DELETE", f"{ADMISSION}/validatingadmissionpolicybindings/{ns}-warn", None)
        send("DELETE", f"{ADMISSION}/validatingadmissionpolicies/{ns}-warn", None)


def test_a_policy_the_local_cluster_cannot_evaluate_is_refused_at_its_creation(api, ns):
    policy = {
        "metadata": {"name": f"{ns}-params"},
        "spec": {
            "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
            "validations": [{"expression": "object.metadata.name == params.data.name"}],
        },
    }
    code, answer = local_sender(api)("POST", f"{ADMISSION}/validatingadmissionpolicies", policy)
    assert (code, answer["reason"]) == (422, "Invalid")
    assert "spec.paramKind: Forbidden: the local cluster does not evaluate policies with params" in answer["message"]


def test_a_restricted_security_job_runs_where_pod_security_enforces_restricted(backend):
    """The product's `restricted_security=True` pods pass the restricted level on both back ends: the emulation
    refuses no more than the real admission does."""
    labels = {"pod-security.kubernetes.io/enforce": "restricted"}
    backend.core().patch_namespace(backend.namespace, {"metadata": {"labels": labels}})
    executor = backend.executor(restricted_security=True)
    with run.Experiment("restricted", executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(inline="echo admitted"), name="restricted")
        exp.run(sequential=True)
        job = exp.jobs[0]
    assert exp.status(return_dict=True)[job.id]["status"] == AppState.SUCCEEDED
    events = backend.core().list_namespaced_event(backend.namespace).items
    assert [e.message for e in events if e.reason == "FailedCreate"] == []
