"""TrainJobs run as local processes: pods, logs, status, failures, restarts, suspension, deletion."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from kubernetes import client, watch
from localcluster_helpers import (
    GROUP,
    VERSION,
    condition,
    container_pid,
    create_runtime,
    create_trainjob,
    get_trainjob,
    group_alive,
    pods_of,
    runtime,
    trainjob,
    unique,
    wait_finished,
)

HELLO = ["bash", "-c", "echo rank=$PET_NODE_RANK of $PET_NNODES; cat /cfg/hello.txt"]
CFG_VOLUME = {"name": "cfg", "configMap": {"name": "hello"}}
CFG_MOUNT = {"name": "cfg", "mountPath": "/cfg"}


@pytest.fixture(scope="module")
def hello_runtime(custom) -> str:
    name = unique("hello")
    create_runtime(custom, runtime(name, volumes=(CFG_VOLUME,), mounts=(CFG_MOUNT,)))
    return name


@pytest.fixture(scope="module")
def plain_runtime(custom) -> str:
    name = unique("plain")
    create_runtime(custom, runtime(name))
    return name


def _hello_configmap(core, ns):
    core.create_namespaced_config_map(ns, {"metadata": {"name": "hello"}, "data": {"hello.txt": "hello from cfg\n"}})


def test_trainjob_runs_pods_to_completion(cluster, core, custom, ns, hello_runtime):
    _hello_configmap(core, ns)
    create_trainjob(custom, ns, trainjob("hello", hello_runtime, HELLO))
    job = wait_finished(cluster, custom, ns, "hello")
    complete = condition(job, "Complete")
    assert (complete["status"], complete["reason"], complete["message"]) == (
        "True",
        "AllJobsCompleted",
        "jobset completed successfully",
    )
    assert job["status"]["jobsStatus"] == [
        {"name": "node", "ready": 0, "succeeded": 1, "failed": 0, "active": 0, "suspended": 0}
    ]

    pods = pods_of(core, ns, "hello")
    assert [p.status.phase for p in pods] == ["Succeeded", "Succeeded"]
    for rank, pod in enumerate(pods):
        assert re.fullmatch(rf"hello-node-0-{rank}-[a-z0-9]{{5}}", pod.metadata.name)
        labels = pod.metadata.labels
        assert labels["jobset.sigs.k8s.io/jobset-name"] == "hello"
        assert labels["jobset.sigs.k8s.io/replicatedjob-name"] == "node"
        assert labels["jobset.sigs.k8s.io/restart-attempt"] == "0"
        assert labels["batch.kubernetes.io/job-completion-index"] == str(rank)
        assert labels["batch.kubernetes.io/job-name"] == "hello-node-0"
        assert pod.metadata.annotations["batch.kubernetes.io/job-completion-index"] == str(rank)
        [owner] = pod.metadata.owner_references
        assert (owner.kind, owner.name, owner.controller) == ("Job", "hello-node-0", True)
        assert pod.metadata.finalizers is None  # the Job controller released the finished pod
        env = {e.name: e for e in pod.spec.containers[0].env}
        assert env["PET_NNODES"].value == "2" and env["PET_NPROC_PER_NODE"].value == "1"
        assert env["PET_NODE_RANK"].value_from.field_ref.field_path == (
            "metadata.annotations['batch.kubernetes.io/job-completion-index']"
        )
        assert env["PET_MASTER_ADDR"].value == "127.0.0.1" and int(env["PET_MASTER_PORT"].value) > 0
        terminated = pod.status.container_statuses[0].state.terminated
        assert (terminated.exit_code, terminated.reason) == (0, "Completed")
        assert core.read_namespaced_pod_log(pod.metadata.name, ns) == f"rank={rank} of 2\nhello from cfg\n"
        assert core.read_namespaced_pod_log(pod.metadata.name, ns, tail_lines=1) == "hello from cfg\n"

    followed = list(
        watch.Watch().stream(
            core.read_namespaced_pod_log, name=pods[1].metadata.name, namespace=ns, container="node", follow=True
        )
    )
    assert followed == ["rank=1 of 2", "hello from cfg"]
    raw = core.read_namespaced_pod_log(pods[0].metadata.name, ns, follow=True, _preload_content=False)
    assert raw.data == b"rank=0 of 2\nhello from cfg\n"

    # The owner chain: TrainJob -> JobSet -> Job -> pods (and the JobSet's headless Service).
    jobset = custom.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", ns, "jobsets", "hello")
    assert [(o["kind"], o["uid"]) for o in jobset["metadata"]["ownerReferences"]] == [
        ("TrainJob", job["metadata"]["uid"])
    ]
    [k8s_job] = client.BatchV1Api(core.api_client).list_namespaced_job(ns).items
    assert k8s_job.metadata.name == "hello-node-0" == owner.name and k8s_job.metadata.uid == owner.uid
    assert k8s_job.metadata.owner_references[0].uid == jobset["metadata"]["uid"]
    assert k8s_job.spec.selector.match_labels == {"batch.kubernetes.io/controller-uid": owner.uid}
    service = core.read_namespaced_service("hello", ns)
    assert service.spec.cluster_ip == "None" and service.metadata.owner_references[0].kind == "JobSet"

    snapshot = core.read_namespaced_config_map("hello-runtime-snapshot", ns)
    assert snapshot.metadata.owner_references[0].uid == job["metadata"]["uid"]
    assert f"name: {hello_runtime}" in snapshot.data["runtime"]
    reasons = {(e.involved_object.kind, e.reason) for e in core.list_namespaced_event(ns).items}
    assert {
        ("Pod", "Started"),
        ("Pod", "Scheduled"),
        ("Job", "SuccessfulCreate"),
        ("JobSet", "AllJobsCompleted"),
    } <= reasons


def test_follow_streams_while_running(cluster, core, custom, ns, plain_runtime):
    create_trainjob(
        custom, ns, trainjob("slow", plain_runtime, ["bash", "-c", "echo one; sleep 0.5; echo two"], num_nodes=1)
    )
    pod = cluster.wait_for(lambda: [p for p in pods_of(core, ns, "slow") if p.status.phase == "Running"])[0]
    lines = list(watch.Watch().stream(core.read_namespaced_pod_log, name=pod.metadata.name, namespace=ns, follow=True))
    assert lines == ["one", "two"]


def test_failing_command_fails_the_trainjob(cluster, core, custom, ns, plain_runtime):
    create_trainjob(custom, ns, trainjob("boom", plain_runtime, ["bash", "-c", "echo dying >&2; exit 3"], num_nodes=1))
    job = wait_finished(cluster, custom, ns, "boom")
    failed = condition(job, "Failed")
    assert (failed["status"], failed["reason"], failed["message"]) == (
        "True",
        "FailedJobs",
        "jobset failed due to one or more job failures (first failed job: boom-node-0)",
    )
    assert condition(job, "Complete") is None
    (pod,) = pods_of(core, ns, "boom")
    terminated = pod.status.container_statuses[0].state.terminated
    assert (pod.status.phase, terminated.exit_code, terminated.reason) == ("Failed", 3, "Error")
    assert core.read_namespaced_pod_log(pod.metadata.name, ns) == "dying\n"


def test_missing_executable_is_a_start_error(cluster, core, custom, ns, plain_runtime):
    create_trainjob(custom, ns, trainjob("nocmd", plain_runtime, ["no-such-binary-xyz"], num_nodes=1))
    wait_finished(cluster, custom, ns, "nocmd")
    terminated = pods_of(core, ns, "nocmd")[0].status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason) == (128, "StartError")
    assert 'exec: "no-such-binary-xyz": executable file not found in $PATH' in terminated.message


def test_on_failure_pods_restart_in_place_until_the_backoff_limit(cluster, core, custom, ns):
    name = unique("onfailure")
    create_runtime(custom, runtime(name, restart_policy="OnFailure", backoff_limit=2))
    create_trainjob(custom, ns, trainjob("flaky", name, ["false"], num_nodes=1))
    job = wait_finished(cluster, custom, ns, "flaky")
    assert condition(job, "Failed")["reason"] == "FailedJobs"
    events = {e.reason for e in core.list_namespaced_event(ns).items}
    assert {"BackOff", "BackoffLimitExceeded"} <= events


def test_gang_restart_after_a_failure(cluster, core, custom, ns):
    name = unique("restart")
    create_runtime(
        custom,
        runtime(
            name,
            max_restarts=1,
            volumes=({"name": "data", "persistentVolumeClaim": {"claimName": "shared"}},),
            mounts=({"name": "data", "mountPath": "/data"},),
        ),
    )
    core.create_namespaced_persistent_volume_claim(
        ns,
        {
            "metadata": {"name": "shared"},
            "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
        },
    )
    # Whichever rank runs first fails attempt 0; every rank of attempt 1 finds the marker.
    command = ["bash", "-c", "if [ -f /data/marker ]; then echo second attempt; else touch /data/marker; exit 1; fi"]
    create_trainjob(custom, ns, trainjob("gang", name, command))
    job = wait_finished(cluster, custom, ns, "gang")
    assert condition(job, "Complete")["status"] == "True" and condition(job, "Failed") is None
    pods = pods_of(core, ns, "gang")
    assert [p.metadata.labels["jobset.sigs.k8s.io/restart-attempt"] for p in pods] == ["1", "1"]
    assert {core.read_namespaced_pod_log(p.metadata.name, ns) for p in pods} == {"second attempt\n"}
    assert "RestartJobSetFailurePolicyAction" in {e.reason for e in core.list_namespaced_event(ns).items}
    assert [p.name for p in (cluster.workdir / "pvcs" / ns / "shared").iterdir()] == ["marker"]


def test_restarts_exhausted(cluster, custom, ns):
    name = unique("exhaust")
    create_runtime(custom, runtime(name, max_restarts=1))
    create_trainjob(custom, ns, trainjob("dead", name, ["false"], num_nodes=1))
    failed = condition(wait_finished(cluster, custom, ns, "dead"), "Failed")
    assert (failed["reason"], failed["message"]) == (
        "ReachedMaxRestarts",
        "jobset failed due to reaching max number of restarts (first failed job: dead-node-0)",
    )


def test_suspend_and_resume(cluster, core, custom, ns, plain_runtime):
    create_trainjob(custom, ns, trainjob("paused", plain_runtime, ["bash", "-c", "echo ran"], suspend=True))
    job = cluster.wait_for(
        lambda: (lambda o: o if condition(o, "Suspended") else None)(get_trainjob(custom, ns, "paused"))
    )
    suspended = condition(job, "Suspended")
    assert (suspended["status"], suspended["reason"], suspended["message"]) == (
        "True",
        "Suspended",
        "TrainJob is suspended",
    )
    assert job["status"]["jobsStatus"][0]["suspended"] == 1 and pods_of(core, ns, "paused") == []

    custom.patch_namespaced_custom_object(GROUP, VERSION, ns, "trainjobs", "paused", {"spec": {"suspend": False}})
    job = wait_finished(cluster, custom, ns, "paused")
    resumed = condition(job, "Suspended")
    assert (resumed["status"], resumed["reason"], resumed["message"]) == ("False", "Resumed", "TrainJob is resumed")
    assert condition(job, "Complete")["status"] == "True"


def test_suspending_a_running_job_deletes_its_pods(cluster, core, custom, ns, plain_runtime):
    create_trainjob(custom, ns, trainjob("sleeper", plain_runtime, ["sleep", "60"]))
    pods = cluster.wait_for(
        lambda: (lambda running: running if len(running) == 2 else None)(
            [p for p in pods_of(core, ns, "sleeper") if p.status.phase == "Running"]
        )
    )
    pids = [container_pid(p) for p in pods_of(core, ns, "sleeper")]
    custom.patch_namespaced_custom_object(GROUP, VERSION, ns, "trainjobs", "sleeper", {"spec": {"suspend": True}})
    cluster.wait_for(lambda: not pods_of(core, ns, "sleeper") and not any(group_alive(pid) for pid in pids))
    assert len(pods) >= 1


def test_deleting_a_running_trainjob_kills_its_processes(cluster, core, custom, ns, plain_runtime):
    # The background sleep shares the container's process group: it must die too.
    create_trainjob(custom, ns, trainjob("doomed", plain_runtime, ["bash", "-c", "sleep 60 & sleep 60"]))
    cluster.wait_for(lambda: len([p for p in pods_of(core, ns, "doomed") if p.status.phase == "Running"]) == 2)
    pids = [container_pid(p) for p in pods_of(core, ns, "doomed")]
    assert all(group_alive(pid) for pid in pids)
    uid = get_trainjob(custom, ns, "doomed")["metadata"]["uid"]
    core.create_namespaced_config_map(
        ns,
        {
            "metadata": {
                "name": "doomed-code",
                "ownerReferences": [
                    {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainJob", "name": "doomed", "uid": uid}
                ],
            }
        },
    )
    custom.delete_namespaced_custom_object(GROUP, VERSION, ns, "trainjobs", "doomed")
    cluster.wait_for(lambda: not any(group_alive(pid) for pid in pids), timeout=10)
    cluster.wait_for(lambda: not pods_of(core, ns, "doomed"))
    assert cluster.objects("configmaps", ns) == []  # the snapshot and our ConfigMap went with it
    assert "Killing" in {e.reason for e in core.list_namespaced_event(ns).items}


def test_trainjobs_deleted_at_once_leave_nothing_behind(cluster, core, custom, ns, plain_runtime):
    """A TrainJob deleted while the Trainer emulation works on it (snapshot, pods) leaves no
    dependent and no process: what is created after its owner went is garbage-collected too."""
    names = [f"brief-{i}" for i in range(40)]
    for i, name in enumerate(names):
        create_trainjob(custom, ns, trainjob(name, plain_runtime, ["sleep", "30"]))
        time.sleep(i % 10 * 0.002)  # meet the emulation at different points of its work
        custom.delete_namespaced_custom_object(GROUP, VERSION, ns, "trainjobs", name)

    def leftovers() -> list[str]:
        pods = [f"pod {p.metadata.name}" for p in core.list_namespaced_pod(ns).items]
        configmaps = [f"configmap {c.metadata.name}" for c in core.list_namespaced_config_map(ns).items]
        return pods + configmaps + [f"process {pid}" for pid in _processes_of_pods_in(cluster, ns)]

    deadline = time.monotonic() + 5
    while leftovers() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert leftovers() == []
    assert custom.list_namespaced_custom_object(GROUP, VERSION, ns, "trainjobs")["items"] == []


def _processes_of_pods_in(cluster, namespace: str) -> list[int]:
    """Living processes started for a pod of `namespace` (their HOME is the pod's directory)."""
    home = f"HOME={cluster.workdir / 'pods' / namespace}/".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                environ = (entry / "environ").read_bytes()
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state != "Z" and any(var.startswith(home) for var in environ.split(b"\0")):
                found.append(int(entry.name))
    return found


def test_active_deadline(cluster, core, custom, ns, plain_runtime):
    create_trainjob(custom, ns, trainjob("late", plain_runtime, ["sleep", "60"], activeDeadlineSeconds=1))
    failed = condition(wait_finished(cluster, custom, ns, "late"), "Failed")
    assert (failed["reason"], failed["message"]) == ("DeadlineExceeded", "TrainJob exceeded its active deadline")
    cluster.wait_for(lambda: not pods_of(core, ns, "late"))


def test_pod_waits_for_its_configmap(cluster, core, custom, ns, hello_runtime):
    create_trainjob(custom, ns, trainjob("waits", hello_runtime, HELLO, num_nodes=1))
    cluster.wait_for(lambda: "FailedMount" in {e.reason for e in core.list_namespaced_event(ns).items})
    assert [p.status.phase for p in pods_of(core, ns, "waits")] == ["Pending"]
    message = next(e.message for e in core.list_namespaced_event(ns).items if e.reason == "FailedMount")
    assert message == 'MountVolume.SetUp failed for volume "cfg" : configmap "hello" not found'
    _hello_configmap(core, ns)
    assert condition(wait_finished(cluster, custom, ns, "waits"), "Complete")["status"] == "True"


def test_environment_init_containers_and_sidecars(cluster, core, custom, ns):
    name = unique("env")
    node = {
        "env": [
            {"name": "GREETING", "value": "hi $(CFG_WHO)"},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
        "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "CFG_"}],
        "workingDir": "/workspace",
    }
    pod_extra = {
        "initContainers": [
            {
                "name": "prepare",
                "image": "busybox",
                "command": ["bash", "-c", "echo prepared > /workspace/ready"],
                "volumeMounts": [{"name": "work", "mountPath": "/workspace"}],
            },
            {"name": "sidecar", "image": "busybox", "restartPolicy": "Always", "command": ["sleep", "60"]},
        ]
    }
    create_runtime(
        custom,
        runtime(
            name,
            node=node,
            pod_extra=pod_extra,
            volumes=({"name": "work", "emptyDir": {}},),
            mounts=({"name": "work", "mountPath": "/workspace"},),
            ml_policy={"torch": {"envInjection": {"targets": [{"jobName": "node", "containerNames": ["prepare"]}]}}},
        ),
    )
    core.create_namespaced_secret(ns, {"metadata": {"name": "creds"}, "stringData": {"token": "s3cret"}})
    core.create_namespaced_config_map(ns, {"metadata": {"name": "settings"}, "data": {"WHO": "world", "MODE": "x"}})
    script = "cat ready; echo $GREETING $TOKEN $CFG_MODE $POD $PET_NODE_RANK $JOB_COMPLETION_INDEX; pwd"
    create_trainjob(custom, ns, trainjob("envjob", name, ["bash", "-c", script], num_nodes=1))
    assert condition(wait_finished(cluster, custom, ns, "envjob"), "Complete")["status"] == "True"
    (pod,) = pods_of(core, ns, "envjob")
    lines = core.read_namespaced_pod_log(pod.metadata.name, ns, container="node").splitlines()
    assert lines[:2] == ["prepared", f"hi world s3cret x {pod.metadata.name} 0 0"]
    assert lines[2] == str(cluster.pod_dir(pod.metadata.name, ns) / "volumes" / "work")
    init_env = {e.name for e in pod.spec.init_containers[0].env}
    assert {"PET_NNODES", "PET_MASTER_ADDR", "PET_MASTER_PORT"} <= init_env
    sidecar = next(s for s in pod.status.init_container_statuses if s.name == "sidecar")
    assert sidecar.state.terminated is not None  # stopped once the main container ended


def test_runtime_edits_do_not_affect_a_started_job(cluster, core, custom, ns):
    name = unique("snap")
    create_runtime(custom, runtime(name, node={"env": [{"name": "VERSION", "value": "one"}]}))
    create_trainjob(custom, ns, trainjob("snap", name, ["bash", "-c", "echo $VERSION"], num_nodes=1, suspend=True))
    cluster.wait_for(
        lambda: [c for c in cluster.objects("configmaps", ns) if c["metadata"]["name"] == "snap-runtime-snapshot"]
    )
    # (Deleting it instead would make the webhook deny the resume, as Trainer does.)
    custom.patch_cluster_custom_object(
        GROUP,
        VERSION,
        "clustertrainingruntimes",
        name,
        {
            "spec": {
                "template": {
                    "spec": {
                        "replicatedJobs": runtime(name, node={"env": [{"name": "VERSION", "value": "two"}]})["spec"][
                            "template"
                        ]["spec"]["replicatedJobs"]
                    }
                }
            }
        },
    )
    custom.patch_namespaced_custom_object(GROUP, VERSION, ns, "trainjobs", "snap", {"spec": {"suspend": False}})
    wait_finished(cluster, custom, ns, "snap")
    assert core.read_namespaced_pod_log(pods_of(core, ns, "snap")[0].metadata.name, ns) == "one\n"


def test_previous_logs_after_an_in_place_restart(cluster, core, custom, ns):
    name = unique("retry")
    create_runtime(custom, runtime(name, restart_policy="OnFailure", backoff_limit=3))
    command = ["bash", "-c", "if [ -f $HOME/once ]; then echo second; else touch $HOME/once; echo first; exit 1; fi"]
    create_trainjob(custom, ns, trainjob("retry", name, command, num_nodes=1))
    assert condition(wait_finished(cluster, custom, ns, "retry"), "Complete")["status"] == "True"
    (pod,) = pods_of(core, ns, "retry")
    status = pod.status.container_statuses[0]
    assert status.restart_count == 1 and status.last_state.terminated.exit_code == 1
    assert core.read_namespaced_pod_log(pod.metadata.name, ns) == "second\n"
    assert core.read_namespaced_pod_log(pod.metadata.name, ns, previous=True) == "first\n"


def test_initializer_runs_before_the_trainer(cluster, core, custom, ns):
    name = unique("init")
    body = runtime(
        name,
        volumes=({"name": "data", "persistentVolumeClaim": {"claimName": "data"}},),
        mounts=({"name": "data", "mountPath": "/data"},),
    )
    jobs = body["spec"]["template"]["spec"]["replicatedJobs"]
    jobs[0]["dependsOn"] = [{"name": "dataset-initializer", "status": "Complete"}]
    jobs.insert(
        0,
        {
            "name": "dataset-initializer",
            "template": {
                "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "dataset-initializer"}},
                "spec": {
                    "template": {
                        "spec": {
                            "restartPolicy": "Never",
                            "containers": [
                                {
                                    "name": "dataset-initializer",
                                    "image": "busybox",
                                    "command": ["bash", "-c", "sleep 0.3; echo $STORAGE_URI > /data/uri"],
                                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                                }
                            ],
                            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
                        }
                    }
                },
            },
        },
    )
    create_runtime(custom, body)
    core.create_namespaced_persistent_volume_claim(
        ns,
        {
            "metadata": {"name": "data"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        },
    )
    create_trainjob(
        custom,
        ns,
        trainjob(
            "initjob", name, ["cat", "/data/uri"], num_nodes=1, initializer={"dataset": {"storageUri": "hf://org/data"}}
        ),
    )
    assert condition(wait_finished(cluster, custom, ns, "initjob"), "Complete")["status"] == "True"
    pods = pods_of(core, ns, "initjob")
    assert [p.metadata.labels["jobset.sigs.k8s.io/replicatedjob-name"] for p in pods] == ["dataset-initializer", "node"]
    assert core.read_namespaced_pod_log(pods[1].metadata.name, ns) == "hf://org/data\n"


def test_runtime_patches_add_volumes_to_the_node(cluster, core, custom, ns, plain_runtime):
    _hello_configmap(core, ns)
    patch = {
        "manager": "nemo-kubeflow.nvidia.com/tests",
        "trainingRuntimeSpec": {
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": "node",
                            "template": {
                                "spec": {
                                    "template": {
                                        "metadata": {"labels": {"patched": "yes"}},
                                        "spec": {
                                            "volumes": [CFG_VOLUME],
                                            "containers": [{"name": "node", "volumeMounts": [CFG_MOUNT]}],
                                        },
                                    }
                                }
                            },
                        }
                    ]
                }
            }
        },
    }
    create_trainjob(
        custom, ns, trainjob("patched", plain_runtime, ["cat", "/cfg/hello.txt"], num_nodes=1, runtimePatches=[patch])
    )
    assert condition(wait_finished(cluster, custom, ns, "patched"), "Complete")["status"] == "True"
    (pod,) = pods_of(core, ns, "patched")
    assert pod.metadata.labels["patched"] == "yes"
    assert core.read_namespaced_pod_log(pod.metadata.name, ns) == "hello from cfg\n"


def test_an_invalid_pod_template_only_leaves_an_event(cluster, core, custom, ns):
    name = unique("broken")
    create_runtime(custom, runtime(name, mounts=({"name": "missing", "mountPath": "/x"},)))
    create_trainjob(custom, ns, trainjob("broken", name, ["true"], num_nodes=1))
    event = cluster.wait_for(lambda: [e for e in core.list_namespaced_event(ns).items if e.reason == "FailedCreate"])[0]
    assert event.involved_object.kind == "Job" and event.involved_object.name == "broken-node-0"
    assert 'spec.template.spec.containers[0].volumeMounts[0].name: Not found: "missing"' in event.message
    assert pods_of(core, ns, "broken") == [] and condition(get_trainjob(custom, ns, "broken"), "Failed") is None
