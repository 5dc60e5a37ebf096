"""Helpers for the local cluster tests: small runtimes, TrainJobs, waiting, process checks."""

from __future__ import annotations

import copy
import os
import textwrap
import time
import uuid
from pathlib import Path
from typing import Optional

GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def runtime(
    name: str,
    *,
    kind: str = "ClusterTrainingRuntime",
    namespace: Optional[str] = None,
    restart_policy: str = "Never",
    backoff_limit: Optional[int] = 0,
    max_restarts: Optional[int] = None,
    volumes: tuple = (),
    mounts: tuple = (),
    node: Optional[dict] = None,
    num_nodes: int = 1,
    ml_policy: Optional[dict] = None,
    pod_extra: Optional[dict] = None,
) -> dict:
    """A small torch runtime whose `node` container the TrainJob fills in (image, command)."""
    job_spec: dict = {
        "template": {
            "spec": {
                "restartPolicy": restart_policy,
                "containers": [{"name": "node", "image": "python:3.11", "volumeMounts": list(mounts), **(node or {})}],
                "volumes": list(volumes),
                **(pod_extra or {}),
            }
        }
    }
    if backoff_limit is not None:
        job_spec["backoffLimit"] = backoff_limit
    jobset: dict = {
        "replicatedJobs": [
            {
                "name": "node",
                "template": {
                    "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                    "spec": job_spec,
                },
            }
        ]
    }
    if max_restarts is not None:
        jobset["failurePolicy"] = {"maxRestarts": max_restarts}
    obj = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": kind,
        "metadata": {"name": name, "labels": {"trainer.kubeflow.org/framework": "torch"}},
        "spec": {"mlPolicy": ml_policy or {"numNodes": num_nodes, "torch": {}}, "template": {"spec": jobset}},
    }
    if namespace:
        obj["metadata"]["namespace"] = namespace
    return obj


def trainjob(
    name: str,
    runtime_name: str,
    command: Optional[list] = None,
    *,
    num_nodes: int = 2,
    runtime_kind: Optional[str] = None,
    **spec,
) -> dict:
    ref = {"name": runtime_name}
    if runtime_kind:
        ref["kind"] = runtime_kind
    trainer = {"numNodes": num_nodes}
    if command is not None:
        trainer["command"] = command
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {"runtimeRef": ref, "trainer": trainer, **spec},
    }


def create_runtime(custom, body: dict) -> dict:
    body = copy.deepcopy(body)
    if body["kind"] == "TrainingRuntime":
        return custom.create_namespaced_custom_object(
            GROUP, VERSION, body["metadata"]["namespace"], "trainingruntimes", body
        )
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
    return sorted(
        core.list_namespaced_pod(namespace, label_selector=f"jobset.sigs.k8s.io/jobset-name={trainjob_name}").items,
        key=lambda p: p.metadata.name,
    )


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


#: A container that traps SIGTERM (noting it), then starts a child in a session of its own, which
#: starts an orphan (its parent exits at once): three processes no process group holds together.
STUBBORN = textwrap.dedent("""
    import os, signal, sys, time
    out = sys.argv[1]
    signal.signal(signal.SIGTERM, lambda *_: open(os.path.join(out, f"term-{os.getpid()}"), "w").close())
    def record():
        open(os.path.join(out, f"pid-{os.getpid()}"), "w").close()
    if os.fork() == 0:
        os.setsid()
        if os.fork() != 0:
            os._exit(0)  # the grandchild below is orphaned
        if os.fork() == 0:
            os.setsid()
        record()
        while True:
            time.sleep(1)
    record()
    while True:
        time.sleep(1)
""")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def recorded_pids(out: Path, count: int, timeout: float = 30.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while len(list(out.glob("pid-*"))) < count:
        assert time.monotonic() < deadline, f"only {sorted(out.iterdir())} after {timeout}s"
        time.sleep(0.05)
    return sorted(int(p.name.split("-")[1]) for p in out.glob("pid-*"))


def wait_gone(pids: list[int], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while any(alive(pid) for pid in pids):
        assert time.monotonic() < deadline, f"still running: {[p for p in pids if alive(p)]}"
        time.sleep(0.05)


def stubborn_pod(name: str, out: Path, grace: int) -> dict:
    return {
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": grace,
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "python:3.11", "command": ["python", "-c", STUBBORN, str(out)]}],
        },
    }


#: A gloo all-reduce of rank + 1 over every process of a torchrun job. One write per line: with
#: PYTHONUNBUFFERED, print() writes the text and the newline separately, and ranks share pipes.
ALL_REDUCE_SCRIPT = """\
import sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
value = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(value)
sys.stdout.write(f"rank {dist.get_rank()} of {dist.get_world_size()}: sum={int(value.item())}\\n")
dist.destroy_process_group()
"""
