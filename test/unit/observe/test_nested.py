"""status.nested: a path into a Kubernetes object where any level may be missing or null."""

from nemo_kubeflow.observe.status import nested


def test_a_missing_or_null_level_gives_the_default():
    pod = {"status": {"containerStatuses": None, "phase": "Running"}, "metadata": None}
    assert nested(pod, "status", "phase") == "Running"
    assert nested(pod, "status", "containerStatuses", default=[]) == []
    assert nested(pod, "metadata", "labels", "x", default="") == ""
    assert nested(pod, "spec", "volumes") is None
    assert nested(None, "status", default={}) == {}


def test_an_empty_value_gives_the_default_as_or_did():
    job = {"status": {"ready": 0, "restarts": 2}}
    assert nested(job, "status", "ready", default=0) == 0
    assert nested(job, "status", "restarts", default=0) == 2
    assert nested({"status": {"reason": ""}}, "status", "reason", default="Evicted") == "Evicted"
