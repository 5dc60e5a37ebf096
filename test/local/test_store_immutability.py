"""Stored objects are never changed in place: the store hands them themselves to its listeners, to watch
history and to readers that copy them outside its lock (`Store.list`), so a change in place is a torn read
elsewhere ("dictionary changed size during iteration" in a `LocalCluster.objects()` under load). Found with
the store's frozen switch (`NEMO_KUBEFLOW_LOCAL_FROZEN_STORE=1`, apiserver/frozen.py): the kubelet set
`spec.nodeName` on the pod a listener handed it."""

from __future__ import annotations

import copy

import pytest
from localcluster_helpers import create_runtime, create_trainjob, runtime, trainjob, unique, wait_finished

from nemo_kubeflow_local.apiserver import frozen
from nemo_kubeflow_local.apiserver import resources as R
from nemo_kubeflow_local.apiserver.store import Store


def test_no_stored_object_changes_after_its_commit_while_a_job_runs(cluster, core, custom, ns):
    store = cluster._started().store
    committed: list[tuple[str, str, dict, dict]] = []  # (event, resource, the stored object, a copy at commit)

    def record(event: str, rt, obj: dict) -> None:
        if obj["metadata"].get("namespace") == ns:
            committed.append((event, rt.plural, obj, copy.deepcopy(obj)))

    store.add_listener(record)
    try:
        name = unique("runtime")
        create_runtime(custom, runtime(name))
        create_trainjob(custom, ns, trainjob("steady", name, ["bash", "-c", "echo done"], num_nodes=2))
        job = wait_finished(cluster, custom, ns, "steady", timeout=30)
    finally:
        store.remove_listener(record)
    assert job["status"]["conditions"][-1]["type"] == "Complete"
    assert {plural for _, plural, _, _ in committed} >= {"trainjobs", "jobsets", "jobs", "pods"}
    changed = [
        (event, plural, obj["metadata"]["name"], obj["metadata"]["resourceVersion"])
        for event, plural, obj, at_commit in committed
        if obj != at_commit
    ]
    assert changed == []


def test_the_frozen_switch_refuses_a_change_in_place_and_copies_stay_writable(monkeypatch):
    monkeypatch.setenv(frozen.ENV, "1")
    store = Store()
    store.create(R.NAMESPACES, {"metadata": {"name": "ns"}})
    store.create(R.CONFIGMAPS, {"metadata": {"name": "cm", "namespace": "ns"}, "data": {"a": "1"}})
    stored = store.snapshot(R.CONFIGMAPS, "ns", "cm")
    with pytest.raises(frozen.ModifiedStoredObject, match=r"\['b'\] = \.\.\."):
        stored["data"]["b"] = "2"
    with pytest.raises(frozen.ModifiedStoredObject, match=r"setdefault\('labels'\)"):
        stored["metadata"].setdefault("labels", {})
    [listed], _ = store.list(R.CONFIGMAPS, "ns")
    listed["data"]["b"] = "2"  # a copy: the caller's own
    assert type(listed["data"]) is dict and store.get(R.CONFIGMAPS, "ns", "cm")["data"] == {"a": "1"}
    assert store.mutate(R.CONFIGMAPS, "ns", "cm", lambda cm: {**cm, "data": {"a": "3"}})["data"] == {"a": "3"}
