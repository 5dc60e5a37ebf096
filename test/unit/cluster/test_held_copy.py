"""What a list or watch holds is handed to a look as a copy: the look may change it, the held object stays."""

import json

from nemo_kubeflow.cluster.watched import held_copy

POD = json.loads(
    '{"metadata": {"name": "t-node-0-0", "labels": {"a": "1"}, "ownerReferences": [{"uid": "u", "controller": true}]},'
    ' "spec": {"containers": [{"name": "node", "args": ["-c", "x"], "resources": {"limits": {"cpu": 1.5}}}]},'
    ' "status": {"phase": "Running", "podIP": null, "containerStatuses": [{"restartCount": 0, "ready": false}]}}'
)


def test_a_copy_equals_what_is_held_and_changing_it_leaves_the_held_object_as_it_was():
    held = json.loads(json.dumps(POD))
    copied = held_copy([held])
    assert copied == [POD]
    copied[0]["metadata"]["labels"]["a"] = "2"
    copied[0]["spec"]["containers"][0]["args"].append("y")
    copied[0]["status"]["containerStatuses"][0]["restartCount"] = 1
    assert held == POD
    assert held_copy(None) is None


def test_what_is_not_json_data_is_still_copied_deeply():
    class Mark:
        def __init__(self) -> None:
            self.seen = ["a"]

    held = {"mark": Mark()}
    copied = held_copy(held)
    copied["mark"].seen.append("b")
    assert held["mark"].seen == ["a"]
