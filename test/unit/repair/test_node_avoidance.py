"""Node avoidance, pure: the NotIn term and the runtime's own node affinity, which failures count as node
faults and how many nodes may be avoided, the marker of avoid_failed_nodes=False, and a move the Trainer
webhook would refuse (test/test_resilience.py moves jobs off lost nodes on the local cluster)."""

import re

import pytest

from nemo_kubeflow import KubeflowExecutor


def test_the_avoidance_term_keeps_the_runtimes_own_node_affinity_and_replaces_its_own():
    from nemo_kubeflow.repair.node_avoidance import avoidance_affinity

    gpu = {"key": "gpu", "operator": "In", "values": ["h100"]}
    pod_spec = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                gpu,
                                {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["a"]},
                            ]
                        },
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["x"]}]},
                    ]
                }
            }
        }
    }
    terms = avoidance_affinity(pod_spec, ["b", "a"], previous=["a"])["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    ours = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["a", "b"]}
    # A patch replaces the term list whole: each of the runtime's terms (ORed) gets the NotIn (ANDed).
    assert terms == [
        {"matchExpressions": [gpu, ours]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["x"]}], "matchExpressions": [ours]},
    ]
    assert avoidance_affinity({}, ["a"], previous=[])["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ] == [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["a"]}]}]


def test_only_node_faults_count_and_never_so_many_that_the_job_no_longer_fits():
    from nemo_kubeflow.observe.node_faults import NodeFault, capped, node_faults

    def pod(name, node, reason):
        return {
            "metadata": {"name": name},
            "spec": {"nodeName": node},
            "status": {
                "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": reason, "message": "m"}]
            },
        }

    pods = [
        pod("j-node-0-0-a", "n1", "DeletionByTaintManager"),
        pod("j-node-0-1-b", "n2", "PreemptionByScheduler"),
        pod("j-node-0-2-c", "n3", "EvictionByEvictionAPI"),
    ]
    events = [
        {
            "involvedObject": {"kind": "Pod", "name": "j-node-0-1-z"},
            "reason": "Scheduled",
            "message": "Successfully assigned default/j-node-0-1-z to n4",
        },
        {
            "involvedObject": {"kind": "Pod", "name": "j-node-0-1-z"},
            "reason": "Evicted",
            "message": "The node was low on resource: memory.",
        },
        {"involvedObject": {"kind": "Pod", "name": "other-node-0-0-q"}, "reason": "NodeNotReady"},
    ]
    faults = node_faults(pods, events, "j")
    assert faults == [
        NodeFault("n1", "j-node-0-0-a", "DisruptionTarget (DeletionByTaintManager: m)"),
        NodeFault("n4", "j-node-0-1-z", "Evicted (The node was low on resource: memory.)"),
    ]
    taken, why = capped([], faults, ["n1", "n2", "n3", "n4"], pods=2)
    assert taken == faults and why == ""
    taken, why = capped([], faults, ["n1", "n2", "n4"], pods=2)
    assert taken == faults[:1] and why == "not avoiding node n4: only 1 schedulable node would be left for 2 pods"


def test_avoid_failed_nodes_false_marks_the_trainjob_and_a_non_bool_is_refused():
    from nemo_kubeflow.build.manifests import node_avoidance_annotations as submit_annotations
    from nemo_kubeflow.errors import ConfigError
    from nemo_kubeflow.observe.node_faults import ANNOTATION, OFF

    assert submit_annotations(KubeflowExecutor(container_image="img", avoid_failed_nodes=False)) == {ANNOTATION: OFF}
    assert submit_annotations(KubeflowExecutor(container_image="img")) == {}
    with pytest.raises(ConfigError, match=re.escape("avoid_failed_nodes='no': must be True or False")):
        KubeflowExecutor(container_image="img", avoid_failed_nodes="no").validate()


def test_a_move_the_trainer_webhook_would_refuse_is_not_sent():
    from nemo_kubeflow.repair.node_avoidance import avoidance_affinity, patch_problems, runtime_patches

    trainjob = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "j", "namespace": "default"},
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "runtimePatches": [{"manager": f"example.com/m{i}"} for i in range(16)],
        },
    }
    patches = runtime_patches(trainjob, avoidance_affinity({}, ["n1"], previous=[]))
    assert any("17 patches, over the CRD limit of 16" in p for p in patch_problems(trainjob, patches)), patch_problems(
        trainjob, patches
    )
    trainjob["spec"]["runtimePatches"] = trainjob["spec"]["runtimePatches"][:1]
    assert patch_problems(trainjob, runtime_patches(trainjob, avoidance_affinity({}, ["n1"], previous=[]))) == []


def test_the_term_built_again_from_a_pod_spec_that_has_it_is_not_doubled_and_keeps_off_says_so():
    from nemo_kubeflow.repair.node_avoidance import avoidance_affinity, keeps_off

    gpu = {"key": "gpu", "operator": "In", "values": ["h100"]}
    once = avoidance_affinity(
        {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [gpu]}]
                    }
                }
            }
        },
        ["a"],
        previous=[],
    )
    again = avoidance_affinity({"affinity": once}, ["a"], previous=[])  # a step repeated on the rebuilt JobSet
    assert again == once
    assert keeps_off({"affinity": once}, ["a"]) and not keeps_off({"affinity": once}, ["a", "b"])
    assert not keeps_off({}, ["a"])  # a JobSet built from the TrainJob before the runtime patch
    half = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    once["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0],
                    {"matchExpressions": [gpu]},
                ]
            }
        }
    }
    assert not keeps_off({"affinity": half}, ["a"])  # every term (ORed) must keep off the node


def test_the_annotation_says_replacing_only_while_the_move_waits_for_the_rebuilt_jobset():
    import json

    from nemo_kubeflow.observe.node_faults import ANNOTATION, Avoidance, NodeFault

    moving = Avoidance((), (NodeFault("n1", "p1", "Evicted (m)"),), restarts_before=1)
    replacing = moving.replaced(restarts=2)
    assert replacing.replacing and replacing.restarts_before == 3
    assert json.loads(replacing.to_json())["replacing"] is True
    assert Avoidance.of({"metadata": {"annotations": {ANNOTATION: replacing.to_json()}}}) == replacing
    done = replacing.moved()
    assert done.avoided == moving.moving and not done.moving and not done.replacing and done.restarts_before == 3
    assert "replacing" not in json.loads(done.to_json())  # as annotations written before the key existed
