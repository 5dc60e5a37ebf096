"""Helpers for the local cluster tests: small runtimes, TrainJobs, waiting, process checks."""

from __future__ import annotations

import copy
import os
import uuid
from pathlib import Path
from typing import Optional

GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def runtime(name: str, *, kind: str = "ClusterTrainingRuntime", namespace: Optional[str] = None,
            restart_policy: str = "Never", backoff_limit: Optional[int] = 0, max_restarts: Optional[int] = None,
            volumes: tuple = (), mounts: tuple = (), node: Optional[dict] = None, num_nodes: int = 1,
            ml_policy: Optional[dict] = None, pod_extra: Optional[dict] = None) -> dict:
    """A small torch runtime whose `node` container the TrainJob fills in (image, command)."""
    job_spec: dict = {"template": {"spec": {
        "restartPolicy": restart_policy,
        "containers": [{"name": "node", "image": "python:3.11", "volumeMounts": list(mounts), **(node or {})}],
        "volumes": list(volumes), **(pod_extra or {})}}}
    if backoff_limit is not None:
        job_spec["backoffLimit"] = backoff_limit
    jobset: dict = {"replicatedJobs": [{"name": "node", "template": {
        "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}}, "spec": job_spec}}]}
    if max_restarts is not None:
        jobset["failurePolicy"] = {"maxRestarts": max_restarts}
    obj = {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind,
           "metadata": {"name": name, "labels": {"trainer.kubeflow.org/framework": "torch"}},
           "spec": {"mlPolicy": ml_policy or {"numNodes": num_nodes, "torch": {}}, "template": {"spec": jobset}}}
    if namespace:
        obj["metadata"]["namespace"] = namespace
    return obj


def trainjob(name: str, runtime_name: str, command: Optional[list] = None, *, num_nodes: int = 2,
             runtime_kind: Optional[str] = None, **spec) -> dict:
    ref = {"name": runtime_name}
    if runtime_kind:
        ref["kind"] = runtime_kind
    trainer = {"numNodes": num_nodes}
    if command is not None:
        trainer["command"] = command
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainJob", "metadata": {"name": name},
            "spec": {"runtimeRef": ref, "trainer": trainer, **spec}}


def create_runtime(custom, body: dict) -> dict:
    body = copy.deepcopy(body)
    if body["kind"] == "TrainingRuntime":
        return custom.create_namespaced_custom_object(GROUP, VERSION, body["metadata"]["namespace"],
                                                      "trainingruntimes", body)
    return custom.create_cluster_custom_object(GROUP, VERSION, "clustertrainingruntimes", body)


def create_trainjob(custom, namespace: str, body: dict, **kwargs) -> dict:
    return custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", body, **kwargs)


def get_trainjob(custom, namespace: str, name: str) -> dict:
    return custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", name)


def condition(obj: dict, type_: str) -> Optional[dict]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == type_), None)


def wait_finished(cluster, custom, namespace: str, name: str, timeout: float = 20.0) -> dict:
    """Wait for Complete or Failed; return the TrainJob."""
    def finished():
        obj = get_trainjob(custom, namespace, name)
        return obj if any((condition(obj, t) or {}).get("status") == "True" for t in ("Complete", "Failed")) else None
    return cluster.wait_for(finished, timeout)


def pods_of(core, namespace: str, trainjob_name: str) -> list:
    return sorted(core.list_namespaced_pod(namespace, label_selector=f"jobset.sigs.k8s.io/jobset-name={trainjob_name}")
                  .items, key=lambda p: p.metadata.name)


def container_pid(pod) -> int:
    """The emulated container ID is `local://<pid>` (the process group leader)."""
    return int(pod.status.container_statuses[0].container_id.rsplit("/", 1)[-1])


def group_alive(pgid: int) -> bool:
    """Whether any process is left in process group `pgid` (zombies count as gone)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def children_of(pid: int = os.getpid()) -> list[int]:
    """Living (non-zombie) direct children of `pid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry.name))
    return found
