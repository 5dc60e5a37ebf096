"""How a job waiting in a Kueue queue is described: the Workload it owns and Kueue's reason
(test/test_scheduling.py runs Kueue on the local cluster)."""

import pytest

from nemo_kubeflow.observe.status import owned_workload, queue_place, queue_wait_message, without_place


def _workload(*conditions):
    return {
        "metadata": {"ownerReferences": [{"kind": "TrainJob", "uid": "u1"}]},
        "status": {"conditions": [dict(zip(("type", "status", "reason", "message"), c)) for c in conditions]},
    }


@pytest.mark.parametrize(
    "conditions, message",
    [
        ((), "waiting for queue q to admit it: Kueue has not tried it yet"),
        (
            (
                (
                    "QuotaReserved",
                    "False",
                    "Pending",
                    "couldn't assign flavors to pod set node: insufficient unused quota "
                    "for nvidia.com/gpu in flavor h100, 8 more needed",
                ),
            ),
            "waiting for queue q to admit it: Pending: couldn't assign flavors to pod set node: insufficient unused quota "
            "for nvidia.com/gpu in flavor h100, 8 more needed",
        ),
        (
            (
                ("QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue cq"),
                ("Admitted", "False", "NoChecks", "The workload has not all checks ready"),
            ),
            "waiting for queue q to admit it: quota reserved, waiting for admission checks "
            "(NoChecks: The workload has not all checks ready)",
        ),
        (
            (
                ("Evicted", "True", "Preempted", "Preempted to accommodate a workload (UID: x) due to prioritization"),
                ("QuotaReserved", "False", "Pending", "Preempted"),
            ),
            "preempted, waiting for queue q to admit it again (Preempted: Preempted to accommodate a workload (UID: x) "
            "due to prioritization)",
        ),
        (
            (("Evicted", "True", "PodsReadyTimeout", "Exceeded the PodsReady timeout"),),
            "waiting for queue q to admit it again (evicted: PodsReadyTimeout: Exceeded the PodsReady timeout)",
        ),
    ],
)
def test_queue_wait_message_carries_kueues_reason(conditions, message):
    trainjob = {"metadata": {"uid": "u1"}}
    workload = owned_workload([_workload(*conditions), {"metadata": {"ownerReferences": [{"uid": "other"}]}}], trainjob)
    assert queue_wait_message("q", workload) == message
    assert owned_workload([], trainjob) is None


def test_a_workload_not_tried_says_so_unless_its_place_is_known_and_no_workload_says_nothing_more():
    untried = {"metadata": {"name": "w"}, "status": {}}
    assert queue_wait_message("q", untried, " (2nd of 2 in LocalQueue q)") == (
        "waiting for queue q to admit it (2nd of 2 in LocalQueue q)"
    )
    assert queue_wait_message("q", None) == "waiting for queue q to admit it"  # not created yet, or unreadable


@pytest.mark.parametrize("place, total", [(0, 2), (11, 990), (999, 1000)])
def test_what_a_queued_task_waits_for_does_not_change_as_its_place_moves(place, total):
    """The console says a waiting task's line again when what it waits for changes, not when the queue moved."""
    pending = [{"metadata": {"name": f"w{i}"}, "positionInLocalQueue": i} for i in range(total)]
    workload = _workload(("QuotaReserved", "False", "Pending", "insufficient unused quota (cpu)"))
    workload["metadata"]["name"] = f"w{place}"
    placed = queue_wait_message("my-q", workload, queue_place("my-q", pending, workload))
    assert "in LocalQueue my-q)" in placed
    assert (
        without_place(placed)
        == queue_wait_message("my-q", workload)
        == ("waiting for queue my-q to admit it: Pending: insufficient unused quota (cpu)")
    )
    assert without_place("running: 1 gang restart so far (attempt 0: node 1)") == (
        "running: 1 gang restart so far (attempt 0: node 1)"
    )
