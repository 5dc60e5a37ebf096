"""The emulated JobSet and Job controllers' objects and the JobSet webhook's pod-name rule."""

from __future__ import annotations

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from localcluster_helpers import (
    condition,
    create_runtime,
    create_trainjob,
    get_trainjob,
    pods_of,
    runtime,
    trainjob,
    unique,
    wait_finished,
)

from nemo_kubeflow_local.controllers.jobset import jobset_pod_name_errors

JOBSET = ("jobset.x-k8s.io", "v1alpha2")
DENIED = "JobSet name is too long, pod names generated for this JobSet will exceed 63 characters"


@pytest.fixture(scope="module")
def echo_runtime(custom) -> str:
    name = unique("echo")
    create_runtime(custom, runtime(name))
    return name


@pytest.fixture(scope="module")
def initializer_runtime(custom) -> str:
    """`node` after a dataset and a model initializer (the longest replicated-job names we use)."""
    name = unique("init")
    body = runtime(name)
    jobs = body["spec"]["template"]["spec"]["replicatedJobs"]
    for step in ("model-initializer", "dataset-initializer"):
        jobs.insert(
            0,
            {
                "name": step,
                "template": {
                    "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": step}},
                    "spec": {
                        "template": {
                            "spec": {
                                "restartPolicy": "Never",
                                "containers": [{"name": step, "image": "python:3.11", "command": ["true"]}],
                            }
                        }
                    },
                },
            },
        )
    jobs[-1]["dependsOn"] = [
        {"name": "dataset-initializer", "status": "Complete"},
        {"name": "model-initializer", "status": "Complete"},
    ]
    create_runtime(custom, body)
    return name


def _name(length: int) -> str:
    prefix = unique("n")
    return prefix + "x" * (length - len(prefix))


def _jobset(custom, ns: str, name: str):
    try:
        return custom.get_namespaced_custom_object(*JOBSET, ns, "jobsets", name)
    except ApiException as error:
        if error.status == 404:
            return None
        raise


def _denials(core, ns: str, name: str) -> list[str]:
    return [
        e.message
        for e in core.list_namespaced_event(ns).items
        if e.involved_object.name == name and e.reason == "TrainJobResourcesCreationFailed"
    ]


@pytest.mark.parametrize("nodes, longest", [(1, 48), (9, 48), (10, 48), (11, 47), (128, 46)])
def test_pod_names_at_the_limit_are_accepted_one_past_refused(cluster, core, custom, ns, echo_runtime, nodes, longest):
    """`<trainjob>-node-0-<last index>-<5 random>` fits in 63 characters or JobSet refuses it; the
    TrainJob is accepted and never starts. (Suspended: the JobSet is built, no pods run.)"""
    fits, too_long = _name(longest), _name(longest + 1)
    for name in (fits, too_long):
        create_trainjob(custom, ns, trainjob(name, echo_runtime, ["true"], num_nodes=nodes, suspend=True))
    cluster.wait_for(lambda: _jobset(custom, ns, fits) and _denials(core, ns, too_long))
    assert _jobset(custom, ns, too_long) is None and not _denials(core, ns, fits)
    last_job = f"{too_long}-node-0"
    assert _denials(core, ns, too_long)[0] == (
        'TrainJob resources reconciliation failed: admission webhook "vjobset.kb.io" denied the request: '
        f'JobSet.jobset.x-k8s.io "{too_long}" is invalid: spec.replicatedJobs[0].name: Invalid value: '
        f'"{last_job}": {DENIED}'
    )
    assert len(f"{fits}-node-0-{nodes - 1}-abcde") == 63


def test_a_name_at_the_limit_runs_and_one_past_it_never_starts(cluster, core, custom, ns, echo_runtime):
    fits, too_long = _name(48), _name(49)
    command = ["sh", "-c", 'echo "index=$JOB_COMPLETION_INDEX"']
    create_trainjob(custom, ns, trainjob(too_long, echo_runtime, command))
    create_trainjob(custom, ns, trainjob(fits, echo_runtime, command))
    done = wait_finished(cluster, custom, ns, fits)
    assert condition(done, "Complete")["status"] == "True"
    pods = pods_of(core, ns, fits)
    assert [max(len(p.metadata.name) for p in pods)] == [63]
    # JOB_COMPLETION_INDEX reads the label (PET_NODE_RANK the annotation), and resolves.
    assert sorted(core.read_namespaced_pod_log(p.metadata.name, ns) for p in pods) == ["index=0\n", "index=1\n"]
    stuck = get_trainjob(custom, ns, too_long)
    assert not condition(stuck, "Complete") and not condition(stuck, "Failed")
    assert pods_of(core, ns, too_long) == [] and _denials(core, ns, too_long)


def test_initializers_count_in_the_pod_name_rule(cluster, core, custom, ns, initializer_runtime):
    """`dataset-initializer` is the longest replicated job: 33 characters fit, 34 do not; from 36
    both initializers are refused, in one message (the recording's 37 gave 67 and 65)."""
    fits, one_past, both = _name(33), _name(34), _name(36)
    for name in (fits, one_past, both):
        create_trainjob(custom, ns, trainjob(name, initializer_runtime, ["true"], num_nodes=1, suspend=True))
    cluster.wait_for(lambda: _jobset(custom, ns, fits) and _denials(core, ns, one_past) and _denials(core, ns, both))
    assert (
        f'spec.replicatedJobs[0].name: Invalid value: "{one_past}-dataset-initializer-0": {DENIED}'
        in _denials(core, ns, one_past)[0]
    )
    assert (
        f'is invalid: [spec.replicatedJobs[0].name: Invalid value: "{both}-dataset-initializer-0": {DENIED}, '
        f'spec.replicatedJobs[1].name: Invalid value: "{both}-model-initializer-0": {DENIED}]'
        in _denials(core, ns, both)[0]
    )


def test_the_rule_only_counts_indexed_jobs_with_completions():
    spec = {"replicatedJobs": [{"name": "node", "replicas": 1, "template": {"spec": {"completions": 2}}}]}
    # Job names are checked for every job ("x"*55 + "-node-0" fits), pod names only for Indexed ones.
    assert jobset_pod_name_errors("x" * 55, spec) == []
    spec["replicatedJobs"][0]["template"]["spec"]["completionMode"] = "Indexed"
    assert [str(e) for e in jobset_pod_name_errors("x" * 49, spec)] == [
        f'spec.replicatedJobs[0].name: Invalid value: "{"x" * 49}-node-0": {DENIED}'
    ]


def test_owner_chain_and_garbage_collection(cluster, core, custom, ns, echo_runtime):
    """TrainJob -> JobSet -> Job -> pods, and the Service; deleting the TrainJob removes them all."""
    name = unique("chain")
    created = create_trainjob(custom, ns, trainjob(name, echo_runtime, ["sleep", "60"], num_nodes=2))
    batch = client.BatchV1Api(core.api_client)
    cluster.wait_for(lambda: len(pods_of(core, ns, name)) == 2)
    jobset = _jobset(custom, ns, name)
    assert jobset["metadata"]["ownerReferences"][0]["uid"] == created["metadata"]["uid"]
    assert "maxRestarts" not in jobset["spec"].get("failurePolicy", {})
    [job] = batch.list_namespaced_job(ns, label_selector=f"jobset.sigs.k8s.io/jobset-name={name}").items
    assert job.metadata.owner_references[0].uid == jobset["metadata"]["uid"]
    for pod in pods_of(core, ns, name):
        assert pod.metadata.owner_references[0].uid == job.metadata.uid
        assert (
            pod.metadata.generate_name
            == f"{job.metadata.name}-{pod.metadata.labels['batch.kubernetes.io/job-completion-index']}-"
        )
        assert pod.metadata.finalizers == ["batch.kubernetes.io/job-tracking"]
        assert pod.metadata.labels["jobset.sigs.k8s.io/priority"] == "0"
    assert core.read_namespaced_service(name, ns).metadata.owner_references[0].uid == jobset["metadata"]["uid"]

    custom.delete_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", ns, "trainjobs", name)
    cluster.wait_for(lambda: not pods_of(core, ns, name), timeout=20)
    assert _jobset(custom, ns, name) is None
    assert batch.list_namespaced_job(ns).items == []
    assert [s.metadata.name for s in core.list_namespaced_service(ns).items] == []


def test_jobsets_jobs_and_services_are_read_only(core, custom, ns):
    with pytest.raises(ApiException) as raised:
        custom.create_namespaced_custom_object(
            *JOBSET,
            ns,
            "jobsets",
            {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "mine"}, "spec": {}},
        )
    assert raised.value.status == 405
    with pytest.raises(ApiException) as raised:
        client.BatchV1Api(core.api_client).create_namespaced_job(ns, {"metadata": {"name": "mine"}})
    assert raised.value.status == 405 and "read-only" in raised.value.body


def test_api_server_pod_defaults(core, ns):
    """What the API server and its admission plugins fill into a created pod (seen in the recording)."""
    pod = core.api_client.sanitize_for_serialization(
        core.create_namespaced_pod(
            ns,
            {
                "metadata": {"name": "defaults"},
                "spec": {
                    "tolerations": [{"key": "node.kubernetes.io/unreachable", "operator": "Exists"}],
                    "containers": [
                        {
                            "name": "c",
                            "image": "busybox:1",
                            "command": ["true"],
                            "env": [{"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}],
                        }
                    ],
                    "volumes": [
                        {"name": "h", "hostPath": {"path": "/tmp"}},
                        {
                            "name": "d",
                            "downwardAPI": {"items": [{"path": "n", "fieldRef": {"fieldPath": "metadata.name"}}]},
                        },
                    ],
                },
            },
        )
    )
    spec = pod["spec"]
    assert (spec["priority"], spec["preemptionPolicy"]) == (0, "PreemptLowerPriority")
    assert spec["serviceAccount"] == spec["serviceAccountName"] == "default"
    # The pod tolerates unreachable already (any effect): only not-ready is added.
    assert spec["tolerations"] == [
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists"},
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
    ]
    assert spec["containers"][0]["env"][0]["valueFrom"]["fieldRef"]["apiVersion"] == "v1"
    assert spec["volumes"][0]["hostPath"] == {"path": "/tmp", "type": ""}
    assert spec["volumes"][1]["downwardAPI"]["defaultMode"] == 420
    assert spec["volumes"][1]["downwardAPI"]["items"][0]["fieldRef"]["apiVersion"] == "v1"
    core.delete_namespaced_pod("defaults", ns, grace_period_seconds=0)


def _node_patch(pod_spec: dict) -> dict:
    return {
        "manager": "example.com/tests",
        "trainingRuntimeSpec": {
            "template": {
                "spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {"template": {"spec": pod_spec}}}}]}
            }
        },
    }


def _node_pod_spec(jobset: dict) -> dict:
    return jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


def test_a_suspended_jobset_takes_a_new_node_selector_but_not_a_new_affinity(cluster, core, custom, ns, echo_runtime):
    """Trainer re-applies the JobSet of a suspended TrainJob; JobSet's webhook lets only the pod template's
    labels, annotations, nodeSelector, tolerations and scheduling gates change. A refused apply is refused
    whole: resumed, the JobSet stays suspended."""
    name = unique("immutable")
    create_trainjob(custom, ns, trainjob(name, echo_runtime, ["true"], num_nodes=1, suspend=True))
    cluster.wait_for(lambda: _jobset(custom, ns, name))
    selector = {"nodeSelector": {"pool": "a"}}
    custom.patch_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", ns, "trainjobs", name, {"spec": {"runtimePatches": [_node_patch(selector)]}}
    )
    cluster.wait_for(lambda: _node_pod_spec(_jobset(custom, ns, name)).get("nodeSelector") == {"pool": "a"})

    affinity = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["n1"]}]}
                    ]
                }
            }
        }
    }
    custom.patch_namespaced_custom_object(
        "trainer.kubeflow.org",
        "v1alpha1",
        ns,
        "trainjobs",
        name,
        {"spec": {"runtimePatches": [_node_patch({**selector, **affinity})]}},
    )

    def refused():
        return [
            e
            for e in core.list_namespaced_event(ns).items
            if e.reason == "TrainJobResourcesCreationFailed" and e.involved_object.name == name
        ]

    event = cluster.wait_for(refused)[0]  # the whole denial is longer than an event keeps
    assert event.message.startswith(
        f'TrainJob resources reconciliation failed: admission webhook "vjobset.kb.io" '
        f'denied the request: JobSet.jobset.x-k8s.io "{name}" is invalid: '
        "spec.replicatedJobs: Invalid value: "
    ), event.message
    custom.patch_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", ns, "trainjobs", name, {"spec": {"suspend": False}}
    )
    # Trainer's status says resumed (it follows the TrainJob's spec), after the resume's apply was refused.
    cluster.wait_for(lambda: (condition(get_trainjob(custom, ns, name), "Suspended") or {}).get("status") == "False")
    jobset = _jobset(custom, ns, name)
    assert jobset["spec"]["suspend"] is True and "affinity" not in _node_pod_spec(jobset)
    assert pods_of(core, ns, name) == []
