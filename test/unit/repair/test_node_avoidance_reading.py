"""Node avoidance, pure reads: which events and pods blame a node and in what order, which nodes can still take
the job's pods, what the TrainJob's annotation holds and what status says about it (the moves themselves run
on the local cluster in test/test_resilience.py)."""

from nemo_kubeflow.observe.node_faults import (
    ANNOTATION,
    OFF,
    Avoidance,
    NodeFault,
    capped,
    gang_attempt,
    node_faults,
    schedulable_nodes,
    status_line,
)
from nemo_kubeflow.repair.node_avoidance import runtime_patches


def _event(pod, reason, message=None, kind="Pod", **fields):
    event = {"involvedObject": {"kind": kind, "name": pod}, "reason": reason, **fields}
    return {**event, "message": message} if message is not None else event


def test_events_blame_the_node_the_pod_was_scheduled_on_else_the_events_source_oldest_first():
    events = [
        _event("j-node-0-1-b", "NodeNotReady", eventTime="2026-01-01T00:00:09Z", source={"host": "n2"}),
        _event("j-node-0-0-a", "Scheduled", "Successfully assigned ns/j-node-0-0-a to n1"),
        _event(
            "j-node-0-0-a",
            "TaintManagerEviction",
            "Marking for deletion",
            lastTimestamp="2026-01-01T00:00:05Z",
            source={"host": "elsewhere"},
        ),
        _event("j-node-0-2-c", "Evicted", source={}),  # no node to blame
        _event("j-node-0-3-d", "Evicted", kind="Node", source={"host": "n4"}),  # not a pod's event
        _event("other-node-0-0-e", "Evicted", source={"host": "n5"}),  # another job's pod
    ]
    assert node_faults([], events, "j") == [
        NodeFault("n1", "j-node-0-0-a", "TaintManagerEviction (Marking for deletion)"),
        NodeFault("n2", "j-node-0-1-b", "NodeNotReady ()"),
    ]


def test_a_pod_still_there_blames_its_node_once_and_before_the_events():
    pod = {
        "metadata": {"name": "j-node-0-0-a"},
        "spec": {"nodeName": "n1"},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "False"},
                {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet"},
            ]
        },
    }
    not_disrupted = {
        "metadata": {"name": "j-node-0-1-b"},
        "spec": {"nodeName": "n2"},
        "status": {"conditions": [{"type": "DisruptionTarget", "status": "False", "reason": "DeletionByTaintManager"}]},
    }
    unscheduled = {
        "metadata": {"name": "j-node-0-2-c"},
        "spec": {},
        "status": {"conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"}]},
    }
    events = [_event("j-node-0-0-a", "Evicted", "later", source={"host": "n1"})]
    assert node_faults([pod, not_disrupted, unscheduled], events, "j") == [
        NodeFault("n1", "j-node-0-0-a", "DisruptionTarget (TerminationByKubelet)")
    ]


def test_only_ready_uncordoned_nodes_with_the_selectors_labels_take_pods():
    def node(name, ready="True", unschedulable=False, labels=None):
        return {
            "metadata": {"name": name, "labels": labels or {"pool": "gpu"}},
            "spec": {"unschedulable": unschedulable} if unschedulable else {},
            "status": {"conditions": [{"type": "Ready", "status": ready}]},
        }

    nodes = [
        node("n1"),
        node("n2", ready="False"),
        node("n3", unschedulable=True),
        node("n4", labels={"pool": "cpu"}),
        {"metadata": {"name": "n5"}},
    ]
    assert schedulable_nodes(nodes, {"pool": "gpu"}) == ["n1"]
    assert schedulable_nodes(nodes, {}) == ["n1", "n4"]


def test_nodes_left_out_are_named_with_their_count():
    faults = [NodeFault("n1", "p1", "w"), NodeFault("n2", "p2", "w"), NodeFault("n3", "p3", "w")]
    taken, why = capped([NodeFault("n0", "p0", "w")], faults, ["n0", "n1", "n2", "n3"], pods=2)
    assert taken == faults[:1]
    assert why == "not avoiding nodes n2, n3: only 1 schedulable node would be left for 2 pods"
    # A fault on a node that is not schedulable anyway costs nothing to avoid.
    taken, why = capped([], faults, ["n1"], pods=1)
    assert taken == faults[1:] and why == "not avoiding node n1: only 0 schedulable nodes would be left for 1 pods"
    assert capped([], faults, [], pods=1) == (faults, "")


def test_the_annotation_round_trips_and_anything_else_starts_from_nothing():
    avoidance = Avoidance((NodeFault("n1", "p1", "Evicted (m)"),), (NodeFault("n2", "p2", "w"),), 2, "capped")
    trainjob = {"metadata": {"annotations": {ANNOTATION: avoidance.to_json()}}}
    assert Avoidance.of(trainjob) == avoidance
    for text in (OFF, "", "not json", "[1]", '{"avoided": [{"node": "n1"}]}'):
        assert Avoidance.of({"metadata": {"annotations": {ANNOTATION: text}}}) == Avoidance(), text
    assert Avoidance.of(None) == Avoidance() and Avoidance.of({"metadata": {}}) == Avoidance()


def test_status_names_the_avoided_nodes_the_restarts_before_and_why_some_are_not():
    fault = NodeFault("n1", "p1", "Evicted (m)")
    assert status_line(Avoidance()) == ""
    assert (
        status_line(Avoidance((fault,), restarts_before=1))
        == "avoiding node n1 after its pod p1 failed with Evicted (m); 1 gang restart before the move"
    )
    assert (
        status_line(Avoidance((fault,), restarts_before=2, capped="not avoiding node n2: x"))
        == "avoiding node n1 after its pod p1 failed with Evicted (m); 2 gang restarts before the move; "
        "not avoiding node n2: x"
    )


def test_the_gang_attempt_is_the_newest_numeric_label():
    def pod(labels):
        return {"metadata": {"labels": labels} if labels is not None else {}}

    label = "jobset.sigs.k8s.io/restart-attempt"
    assert gang_attempt([]) == 0
    assert gang_attempt([pod(None), pod({label: "x"}), pod({label: "3"}), pod({label: "1"})]) == 3


def test_the_runtime_patch_replaces_only_its_own_entry():
    from nemo_kubeflow.repair.node_avoidance import PATCH_MANAGER

    other = {"manager": "example.com/m"}
    trainjob = {"spec": {"runtimePatches": [{"manager": PATCH_MANAGER, "old": True}, other]}}
    patches = runtime_patches(trainjob, {"nodeAffinity": {}})
    assert patches[0] == other and patches[1]["manager"] == PATCH_MANAGER and "old" not in patches[1]
    assert [p["manager"] for p in runtime_patches({}, {})] == [PATCH_MANAGER]
