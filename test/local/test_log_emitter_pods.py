"""Emulated log-emitter containers (local/nemo_kubeflow_local/kubelet/log_emitters.py): a container with
NEMO_KUBEFLOW_LOCAL_LOG_EMITTER="LINES RATE" runs no process, its lines are written by the kubelet's
one emitter thread, and the API serves the pod as any other (status, events, logs, deletion)."""

from __future__ import annotations

from kubernetes import client
from localcluster_helpers import create_runtime, create_trainjob, pods_of, runtime, trainjob, unique, wait_finished

from nemo_kubeflow_local.kubelet.log_emitters import EMITTER_ENV


def emitter_pod(name: str, spec: str, command: tuple = ("false",), node: str = "7") -> dict:
    # `false` would fail the pod: a pod that succeeds shows that the command never ran.
    return {
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "node",
                    "image": "python:3.11",
                    "command": list(command),
                    "env": [{"name": EMITTER_ENV, "value": spec}, {"name": "PET_NODE_RANK", "value": node}],
                }
            ],
        },
    }


def main_state(core, ns: str, name: str) -> dict:
    pod = core.read_namespaced_pod(name, ns)
    statuses = pod.status.container_statuses or []
    return {
        "phase": pod.status.phase,
        "state": statuses[0].state if statuses else None,
        "id": statuses[0].container_id if statuses else None,
    }


def test_an_emitter_container_prints_its_lines_without_a_process_and_completes(cluster, core, ns):
    core.create_namespaced_pod(ns, emitter_pod("emit", "12 40"))
    cluster.wait_for(lambda: main_state(core, ns, "emit")["phase"] == "Succeeded", timeout=30)
    state = main_state(core, ns, "emit")
    assert state["state"].terminated.exit_code == 0 and state["state"].terminated.reason == "Completed"
    assert state["id"].startswith("local://emitter-")  # no process id: nothing was exec'd
    lines = core.read_namespaced_pod_log("emit", ns).splitlines()
    assert [line.split()[:4] for line in lines] == [["LOG", "7", "0", str(n)] for n in range(12)]
    times = [float(line.split()[4]) for line in lines]
    assert times == sorted(times)
    reasons = [e.reason for e in core.list_namespaced_event(ns).items if e.involved_object.name == "emit"]
    assert "Started" in reasons and "Scheduled" in reasons


def test_following_an_emitter_gets_every_line_once_and_ends_with_the_run(cluster, core, ns):
    core.create_namespaced_pod(ns, emitter_pod("follow", "30 20"))
    cluster.wait_for(lambda: main_state(core, ns, "follow")["phase"] != "Pending", timeout=30)
    stream = core.read_namespaced_pod_log("follow", ns, follow=True, _preload_content=False)
    text = b"".join(stream.stream(4096)).decode()
    assert [line.split()[3] for line in text.splitlines()] == [str(n) for n in range(30)]
    # tailLines and timestamps are served from the same log as for a process.
    tail = core.read_namespaced_pod_log("follow", ns, tail_lines=3, timestamps=True).splitlines()
    assert [line.split()[4] for line in tail] == ["27", "28", "29"]


def test_deleting_a_running_emitter_pod_ends_it_at_once(cluster, core, ns):
    core.create_namespaced_pod(ns, emitter_pod("long", "100000 5"))
    cluster.wait_for(lambda: main_state(core, ns, "long")["phase"] == "Running", timeout=30)
    assert main_state(core, ns, "long")["state"].running is not None
    core.delete_namespaced_pod("long", ns, grace_period_seconds=30)
    # No program to wait for: gone well before its grace period would end.
    cluster.wait_for(lambda: not core.list_namespaced_pod(ns).items, timeout=10)


def test_an_unreadable_emitter_value_fails_the_container_start_naming_the_variable(cluster, core, ns):
    core.create_namespaced_pod(ns, emitter_pod("bad", "lots quickly"))
    cluster.wait_for(lambda: main_state(core, ns, "bad")["phase"] == "Failed", timeout=30)
    terminated = main_state(core, ns, "bad")["state"].terminated
    assert terminated.reason == "StartError" and terminated.exit_code == 128
    assert f'{EMITTER_ENV}="lots quickly": expected "LINES RATE"' in terminated.message


def test_a_trainjob_of_emitter_nodes_runs_each_node_with_its_rank(cluster, core, custom, ns):
    """Trainer's PET_NODE_RANK reaches the emitter: each node's lines carry its own index."""
    name = unique("emit-rt")
    create_runtime(custom, runtime(name))
    body = trainjob("emitters", name, ["false"], num_nodes=16)
    body["spec"]["trainer"]["env"] = [{"name": EMITTER_ENV, "value": "3 50"}]
    create_trainjob(custom, ns, body)
    finished = wait_finished(cluster, custom, ns, "emitters", timeout=60)
    assert any(c["type"] == "Complete" and c["status"] == "True" for c in finished["status"]["conditions"])
    pods = pods_of(core, ns, "emitters")
    assert len(pods) == 16
    for pod in pods:
        index = pod.metadata.labels["batch.kubernetes.io/job-completion-index"]
        lines = core.read_namespaced_pod_log(pod.metadata.name, ns).splitlines()
        assert [line.split()[1] for line in lines] == [index] * 3, pod.metadata.name


def test_the_emitter_thread_is_one_for_many_pods(cluster, core, ns):
    """Many emitting pods at once: one emitter thread of the kubelet, no process per pod."""
    import threading

    for i in range(20):
        core.create_namespaced_pod(ns, emitter_pod(f"many-{i}", "1000 2", node=str(i)))
    cluster.wait_for(
        lambda: sum(p.status.phase == "Running" for p in core.list_namespaced_pod(ns).items) == 20, timeout=60
    )
    assert [t.name for t in threading.enumerate()].count("log-emitters") == 1
    assert all(main_state(core, ns, f"many-{i}")["id"].startswith("local://emitter-") for i in range(20))
    core.delete_collection_namespaced_pod(ns, body=client.V1DeleteOptions(grace_period_seconds=0))
    cluster.wait_for(lambda: not core.list_namespaced_pod(ns).items, timeout=30)
