"""The same e2e scenarios on both back ends: `local` (the embedded LocalCluster) and `real` (the upstream
control plane, test/controlplane/, with our node agent running the pods). The `real` params are marked
`real`, so the default run covers `local` only; `python -m pytest -q -m real test/test_backends.py` runs
the upstream one (docs/real-control-plane.md). The `backend` fixture is in conftest.py, the `Backend` it
gives in backends.py; test_backends_resilience.py runs the resilience scenarios the same way. What the real
run showed that the emulation does not is listed in docs/local-cluster.md ("What the real control plane showed")."""

import json
import re

import nemo_run as run
import workloads
from backends import app_id_of, logs, wait_for
from kubeflow.trainer import HuggingFaceDatasetInitializer, HuggingFaceModelInitializer, Initializer
from kubernetes import client
from kubernetes.config import new_client_from_config
from kueue_api import serves_kueue_visibility
from torchx.specs import AppState

from nemo_kubeflow import ConfigMapPackager, PVCMount
from nemo_kubeflow.nemo_run.scheduler import create_scheduler
from nemo_kubeflow.observe.status import NOT_TRIED_YET
from nemo_kubeflow.parts import initializers as inits
from nemo_kubeflow_local.kubelet import initializer_image as local_initializer

# ---------------------------------------------------------------- (1) script and inline tasks


def test_script_and_inline_tasks_succeed_with_logs_of_every_node(backend):
    script = run.Script(inline='echo "node $PET_NODE_RANK of $PET_NNODES says $GREETING"', env={"GREETING": "hi"})
    with run.Experiment("be-script", executor=backend.executor(), log_level="WARN") as exp:
        exp.add(script, name="hello")
        exp.add(run.Partial(workloads.greet, name="fiddle"), name="greet")
        exp.run(sequential=True)
        hello, greet = exp.jobs
    status = exp.status(return_dict=True)
    assert status[hello.id]["status"] == AppState.SUCCEEDED, logs(hello, "hello")
    assert status[greet.id]["status"] == AppState.SUCCEEDED, logs(greet, "greet")
    hello_lines = logs(hello, "hello")
    assert "[node-0] node 0 of 2 says hi\n" in hello_lines and "[node-1] node 1 of 2 says hi\n" in hello_lines, (
        hello_lines
    )
    greet_lines = logs(greet, "greet")
    assert (
        "[node-0] hello fiddle from node 0\n" in greet_lines and "[node-1] hello fiddle from node 1\n" in greet_lines
    ), greet_lines


# ---------------------------------------------------------------- (2) a failing rank

FAILING_RANK = """\
import os, sys, time
rank = int(os.environ["RANK"])
print(f"rank {rank} starting", flush=True)
if rank == 1:
    sys.exit(3)
time.sleep(20)
"""


def test_a_failing_rank_fails_the_job_with_its_rank_node_and_exit_code(backend, tmp_path):
    worker = tmp_path / "train.py"
    worker.write_text(FAILING_RANK)
    executor = backend.executor(
        launcher="torchrun", packager=ConfigMapPackager(relative_path=str(tmp_path), include_pattern="train.py")
    )
    with run.Experiment("be-fail", executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(path=str(worker), entrypoint="python"), name="boom")
        exp.run(sequential=True)
        job = exp.jobs[0]
    assert exp.status(return_dict=True)[job.id]["status"] == AppState.FAILED
    desc = create_scheduler("t").describe(app_id_of(job))
    assert desc.state == AppState.FAILED
    assert desc.msg.startswith("rank 1 on node 1: exited with code 3;"), desc.msg


# ---------------------------------------------------------------- (2b) the other nodes stopping after a failure

#: Node 1 fails; node 0 takes a few seconds to stop once its pod is deleted (a checkpoint on SIGTERM).
SLOW_TO_STOP = (
    'if [ "$PET_NODE_RANK" = 1 ]; then sleep 2; exit 3; fi; '
    "trap 'sleep 6; exit 0' TERM; while true; do sleep 0.2; done"
)


def test_a_failure_reads_failing_while_the_other_nodes_stop_and_failed_once_they_did(backend):
    # The Job controller adds FailureTarget at once and deletes node 0's pod, but its Failed condition (and so
    # JobSet's and Trainer's verdict) waits until that pod has ended (Kubernetes 1.31 on); meanwhile the
    # TrainJob counts no node active or ready, as before its pods start.
    with run.Experiment("be-stopping", executor=backend.executor(retries=0), log_level="WARN") as exp:
        exp.add(run.Script(inline=SLOW_TO_STOP), name="t")
        exp.run(detach=True)
        job = exp.jobs[0]
    name, scheduler = app_id_of(job).split(":", 1)[1], create_scheduler("t")
    failing = wait_for(
        lambda: (d := scheduler.describe(app_id_of(job))).msg.startswith("failing: ") and d,
        "status to say the job is failing",
        timeout=120,
    )
    assert failing.state == AppState.RUNNING, failing.msg
    assert re.fullmatch(
        rf"failing: node 1 \(pod {name}-node-0-1-\w{{5}}\) exited with code 3; the Job controller "
        r"stops its other nodes \(1 of 2 still stopping\), then JobSet restarts the gang or fails the "
        r"job",
        failing.msg,
    ), failing.msg
    (node_job,) = backend.objects("jobs", name)
    conditions = {c["type"]: c["status"] for c in node_job["status"].get("conditions", [])}
    assert conditions.get("FailureTarget") == "True" and "Failed" not in conditions, node_job["status"]
    assert node_job["status"].get("terminating") == 1, node_job["status"]
    failed = wait_for(
        lambda: (d := scheduler.describe(app_id_of(job))).state == AppState.FAILED and d,
        "the job to fail once node 0 stopped",
        timeout=60,
    )
    assert "node 1 (pod" in failed.msg and "exited with code 3" in failed.msg, failed.msg
    (node_job,) = backend.objects("jobs", name)
    assert {c["type"] for c in node_job["status"]["conditions"] if c["status"] == "True"} >= {"FailureTarget", "Failed"}


# ---------------------------------------------------------------- (3) detach, reconnect, cancel


def test_detach_reconnect_status_cancel_and_garbage_collection(backend):
    with run.Experiment("be-cancel", executor=backend.executor(), log_level="WARN") as exp:
        exp.add(run.Script(inline="echo cancel-marker; sleep 300"), name="long")
        exp.run(detach=True)
        exp_id = exp._id
    reconnected = run.Experiment.from_id(exp_id)
    job = reconnected.jobs[0]
    name = app_id_of(job).split(":", 1)[1]
    scheduler = create_scheduler("t")
    wait_for(lambda: scheduler.describe(app_id_of(job)).state == AppState.RUNNING, "the TrainJob to run", timeout=90)
    assert reconnected.status(return_dict=True)[job.id]["status"] == AppState.RUNNING
    wait_for(lambda: "[node-1] cancel-marker\n" in logs(job, "long"), "the marker in node 1's log", timeout=90)
    owned = ("jobsets", "jobs", "pods", "configmaps")
    assert all(backend.objects(resource, name) for resource in owned), {r: len(backend.objects(r, name)) for r in owned}
    reconnected.cancel(job.id)
    for resource in ("trainjobs", *owned):
        wait_for(
            lambda: not backend.objects(resource, name), f"the garbage collector to delete the {resource}", timeout=90
        )
    desc = scheduler.describe(app_id_of(job))
    assert desc.state == AppState.CANCELLED and "no longer exists" in desc.msg, (desc.state, desc.msg)


# ---------------------------------------------------------------- (4) Secret env and a claim


def test_secret_env_and_a_created_claim_reach_every_node(backend, monkeypatch):
    monkeypatch.setenv("BACKENDS_TOKEN", "s3cret-value")
    backend.provide_volume("be-ckpt", "1Gi")
    executor = backend.executor(
        secret_env_vars={"TOKEN": "env:BACKENDS_TOKEN"},
        pvc_mounts=[PVCMount(claim_name="be-ckpt", mount_path="/ckpt", create=True, size="1Gi")],
    )
    # The token's length, never the token: a Secret never reaches a log.
    script = run.Script(
        inline='echo "token length ${#TOKEN}"; echo "$PET_NODE_RANK" > /ckpt/node-$PET_NODE_RANK; '
        'cat /ckpt/node-$PET_NODE_RANK | sed "s/^/wrote /"'
    )
    with run.Experiment("be-volumes", executor=executor, log_level="WARN") as exp:
        exp.add(script, name="vol")
        exp.run(sequential=True)
        job = exp.jobs[0]
    lines = logs(job, "vol")
    assert exp.status(return_dict=True)[job.id]["status"] == AppState.SUCCEEDED, lines
    for node in (0, 1):
        assert f"[node-{node}] token length 12\n" in lines and f"[node-{node}] wrote {node}\n" in lines, lines
    assert not any("s3cret" in line for line in lines)
    (claim,) = [c for c in backend.objects("persistentvolumeclaims") if c["metadata"]["name"] == "be-ckpt"]
    assert claim.get("status", {}).get("phase") == "Bound", claim.get("status")


# ---------------------------------------------------------------- (5) preflight


def test_preflight_runs_first_with_the_pet_values_of_envinjection(backend):
    with run.Experiment("be-preflight", executor=backend.executor(preflight=True), log_level="WARN") as exp:
        exp.add(run.Script(inline="echo training on $PET_NODE_RANK"), name="t")
        exp.run(sequential=True)
        job = exp.jobs[0]
    assert exp.status(return_dict=True)[job.id]["status"] == AppState.SUCCEEDED, logs(job, "t")
    preflight = backend.step_logs(app_id_of(job).split(":", 1)[1], "node", "preflight")
    assert sorted(preflight) == [0, 1], preflight
    for rank, log in preflight.items():
        assert f"preflight: node {rank} of 2, 1 process(es) per node, master " in log, log
        assert log.endswith("preflight: all checks passed\n"), log


# ---------------------------------------------------------------- (6) initializers


def test_initializers_fill_the_shared_claim_before_training(backend, tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text('{"text": "hello"}\n')
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{"layers": 2}\n')
    backend.provide_volume("be-init-cache", "1Gi")
    executor = backend.executor(
        initializer=Initializer(
            dataset=HuggingFaceDatasetInitializer(storage_uri=f"file://{tmp_path / 'data'}"),
            model=HuggingFaceModelInitializer(storage_uri=f"file://{tmp_path / 'model'}"),
        ),
        initializer_settings=inits.InitializerSettings(
            claim_name="be-init-cache",
            create_claim=True,
            claim_size="1Gi",
            dataset_command=local_initializer.command("dataset"),
            model_command=local_initializer.command("model"),
        ),
    )
    with run.Experiment("be-init", executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(inline="cat /workspace/dataset/train.jsonl /workspace/model/config.json"), name="t")
        exp.run(sequential=True)
        job = exp.jobs[0]
    lines = "".join(logs(job, "t"))
    assert exp.status(return_dict=True)[job.id]["status"] == AppState.SUCCEEDED, lines
    assert '{"text": "hello"}' in lines and '{"layers": 2}' in lines, lines
    name = app_id_of(job).split(":", 1)[1]
    for step in ("dataset-initializer", "model-initializer"):
        step_log = backend.step_logs(name, step, step)
        assert list(step_log) == [0] and "copied 1 file(s)" in step_log[0], step_log


# ---------------------------------------------------------------- (7) gang restart


def test_a_rank_failing_once_restarts_the_gang_which_then_succeeds(backend, tmp_path):
    marker = tmp_path / "failed-once"
    script = (
        f'if [ "$PET_NODE_RANK" = 1 ] && [ ! -e {marker} ]; then touch {marker}; echo failing; exit 3; fi; '
        'echo "attempt ok on $PET_NODE_RANK"'
    )
    with run.Experiment("be-restart", executor=backend.executor(retries=1), log_level="WARN") as exp:
        exp.add(run.Script(inline=script), name="t")
        exp.run(sequential=True)
        job = exp.jobs[0]
    lines = logs(job, "t")
    assert exp.status(return_dict=True)[job.id]["status"] == AppState.SUCCEEDED, lines
    assert marker.exists()  # rank 1 failed once, and the job still succeeded: the gang ran again
    (jobset,) = backend.objects("jobsets", app_id_of(job).split(":", 1)[1])
    # JobSet counts the restart in its status, and says how the restarted gang ended
    status = jobset.get("status", {})
    assert (status.get("restarts"), status.get("restartsCountTowardsMax"), status.get("terminalState")) == (
        1,
        1,
        "Completed",
    ), status
    (restarting,) = [c for c in status["conditions"] if c["type"] == "RestartingJobSet"]
    assert (restarting["status"], restarting["reason"]) == ("False", "JobSetCompleted"), restarting
    assert "[node-0] attempt ok on 0\n" in lines and "[node-1] attempt ok on 1\n" in lines, lines


# ---------------------------------------------------------------- (8) a Kueue LocalQueue that admits later


def test_a_held_kueue_queue_keeps_the_job_suspended_until_it_admits_it(backend):
    custom = backend.custom_objects()
    queue = {
        "apiVersion": f"kueue.x-k8s.io/{backend.kueue_version()}",
        "kind": "LocalQueue",
        "metadata": {"name": "be-held"},
        "spec": {"clusterQueue": backend.provide_cluster_queue(), "stopPolicy": "Hold"},
    }
    custom.create_namespaced_custom_object(
        "kueue.x-k8s.io", backend.kueue_version(), backend.namespace, "localqueues", queue
    )
    with run.Experiment("be-queue", executor=backend.executor(queue_name="be-held"), log_level="WARN") as exp:
        exp.add(run.Script(inline='echo "admitted on $PET_NODE_RANK"'), name="q")
        exp.run(detach=True)
        job = exp.jobs[0]
    name = app_id_of(job).split(":", 1)[1]
    scheduler = create_scheduler("t")
    # Kueue names the reason on its own reconcile, after the Workload exists: until then status says that the
    # job waits for the queue, and that Kueue has not tried it yet once its Workload exists.
    desc = wait_for(
        lambda: (
            (d := scheduler.describe(app_id_of(job))).msg.startswith("waiting for queue be-held to admit it: ")
            and NOT_TRIED_YET not in d.msg
            and d
        ),
        "Kueue to say why the job waits",
        timeout=90,
    )
    assert desc.state == AppState.PENDING, (desc.state, desc.msg)
    assert desc.msg == "waiting for queue be-held to admit it: Inadmissible: LocalQueue be-held is inactive", desc.msg
    (trainjob,) = backend.objects("trainjobs", name)
    assert trainjob["spec"].get("suspend") is True
    assert backend.objects("pods", name) == []
    custom.patch_namespaced_custom_object(
        "kueue.x-k8s.io",
        backend.kueue_version(),
        backend.namespace,
        "localqueues",
        "be-held",
        {"spec": {"stopPolicy": "None"}},
    )
    wait_for(
        lambda: scheduler.describe(app_id_of(job)).state in (AppState.SUCCEEDED, AppState.FAILED),
        "Kueue to admit the job and the job to finish",
        timeout=90,
    )
    lines = logs(job, "q")
    assert scheduler.describe(app_id_of(job)).state == AppState.SUCCEEDED, lines
    assert "[node-0] admitted on 0\n" in lines and "[node-1] admitted on 1\n" in lines, lines


# ---------------------------------------------------------------- (9) TCPXO-style sidecar ordering

SIDECAR = {
    # like GKE's tcpxo-daemon: a native sidecar (an init container with restartPolicy Always) that must be up
    # before training starts and is stopped (SIGTERM) once training has ended
    "name": "rxdm",
    "image": "python:3.11",
    "restartPolicy": "Always",
    "command": [
        "bash",
        "-c",
        "trap 'date +%s.%N > \"$MARKERS/$HOSTNAME.stopped\"; echo rxdm stopping; exit 0' TERM; "
        'date +%s.%N > "$MARKERS/$HOSTNAME.up"; echo rxdm up; while true; do sleep 0.1; done',
    ],
}


def test_a_native_sidecar_starts_before_training_and_stops_after_it(backend, tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    sidecar = dict(SIDECAR, env=[{"name": "MARKERS", "value": str(markers)}])
    # the default runtime template, with one more sidecar (what the gke-tcpxo profile adds is the same kind)
    template = tmp_path / "sidecar_runtime.yaml.j2"
    template.write_text(
        f'{{% set sidecars = sidecars + [{json.dumps(sidecar)}] %}}{{% include "training_runtime.yaml.j2" %}}'
    )
    script = (
        f'test -e {markers}/$HOSTNAME.up && echo "sidecar up before training on $PET_NODE_RANK"; '
        f"sleep 1; date +%s.%N > {markers}/$HOSTNAME.trained"
    )
    with run.Experiment(
        "be-sidecar", executor=backend.executor(runtime_template=str(template)), log_level="WARN"
    ) as exp:
        exp.add(run.Script(inline=script), name="t")
        exp.run(sequential=True)
        job = exp.jobs[0]
    lines = logs(job, "t")
    assert exp.status(return_dict=True)[job.id]["status"] == AppState.SUCCEEDED, lines
    assert (
        "[node-0] sidecar up before training on 0\n" in lines and "[node-1] sidecar up before training on 1\n" in lines
    ), lines
    name = app_id_of(job).split(":", 1)[1]
    pods = backend.objects("pods", name)
    assert len(pods) == 2, [p["metadata"]["name"] for p in pods]
    for pod in pods:
        host = pod["spec"]["hostname"]  # $HOSTNAME in its containers (JobSet's DNS hostnames)
        trained = float((markers / f"{host}.trained").read_text())
        stopped = float(
            wait_for(
                lambda: (markers / f"{host}.stopped").is_file() and (markers / f"{host}.stopped").read_text().strip(),
                "the sidecar's stop",
                timeout=90,
            )
        )
        assert float((markers / f"{host}.up").read_text()) < trained < stopped
        assert pod["status"]["phase"] == "Succeeded", pod["status"]
        (rxdm,) = [s for s in pod["status"]["initContainerStatuses"] if s["name"] == "rxdm"]
        assert "terminated" in rxdm["state"], rxdm
        (node,) = [s for s in pod["status"]["containerStatuses"] if s["name"] == "node"]
        assert node["state"]["terminated"]["exitCode"] == 0, node


# ---------------------------------------------------------------- (10) a claim the pods wait for


def test_pods_waiting_for_their_claim_are_described_with_the_claims_name(backend):
    with run.Experiment(
        "be-claim",
        log_level="WARN",
        executor=backend.executor(pvc_mounts=[PVCMount(claim_name="be-later", mount_path="/data")]),
    ) as exp:
        exp.add(run.Script(inline="echo claim mounted on $PET_NODE_RANK"), name="t")
        exp.run(detach=True)
        job = exp.jobs[0]
    scheduler = create_scheduler("t")
    desc = wait_for(
        lambda: (d := scheduler.describe(app_id_of(job))).msg.startswith("node ") and d,
        "the scheduler to say why the pods wait",
        timeout=90,
    )
    assert desc.state == AppState.PENDING
    assert "cannot be scheduled: 0/" in desc.msg and 'persistentvolumeclaim "be-later" not found' in desc.msg, desc.msg
    core = client.CoreV1Api(new_client_from_config(config_file=backend.kubeconfig))
    core.create_namespaced_persistent_volume_claim(
        backend.namespace,
        {
            "metadata": {"name": "be-later"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        },
    )
    if backend.name == "real":
        # The claim exists but nothing binds it (no PersistentVolume, no provisioner): the scheduler's
        # words do not name it, the description does. (The local cluster binds every claim at once.)
        desc = wait_for(
            lambda: (d := scheduler.describe(app_id_of(job))).msg.count("unbound") and d,
            "the scheduler to find the claim unbound",
            timeout=90,
        )
        assert desc.state == AppState.PENDING
        assert (
            "pod has unbound immediate PersistentVolumeClaims" in desc.msg
            and "(the pod's claims: be-later;" in desc.msg
        ), desc.msg
        backend.provide_volume("be-later", "1Gi")
    wait_for(
        lambda: scheduler.describe(app_id_of(job)).state in (AppState.SUCCEEDED, AppState.FAILED),
        "the job to run once its claim is bound",
        timeout=90,
    )
    lines = logs(job, "t")
    assert scheduler.describe(app_id_of(job)).state == AppState.SUCCEEDED, lines
    assert "[node-0] claim mounted on 0\n" in lines and "[node-1] claim mounted on 1\n" in lines, lines


# ---------------------------------------------------------------- (11) a ClusterQueue's quota


def test_a_job_over_its_cluster_queues_quota_waits_with_kueues_reason_until_quota_frees(backend, tmp_path):
    custom = backend.custom_objects()
    cluster_queue = backend.provide_cluster_queue(cpu="1", memory="4Gi")
    custom.create_namespaced_custom_object(
        "kueue.x-k8s.io",
        backend.kueue_version(),
        backend.namespace,
        "localqueues",
        {
            "apiVersion": f"kueue.x-k8s.io/{backend.kueue_version()}",
            "kind": "LocalQueue",
            "metadata": {"name": "be-quota"},
            "spec": {"clusterQueue": cluster_queue},
        },
    )
    marker = tmp_path / "done"  # the pods run on this machine: a file tells the first job to finish
    executor = backend.executor(nodes=1, queue_name="be-quota", cpu_request="1", memory_request="1Gi")
    scheduler = create_scheduler("t")
    jobs = []
    for name, script in (("be-first", f"until [ -e {marker} ]; do sleep 0.2; done"), ("be-second", "echo second")):
        with run.Experiment(name, executor=executor, log_level="WARN") as exp:
            exp.add(run.Script(inline=script), name="q")
            exp.run(detach=True)
        jobs.append(exp.jobs[0])
        if name == "be-first":
            wait_for(lambda: scheduler.describe(app_id_of(jobs[0])).state == AppState.RUNNING, "the first job to run")
    try:
        desc = wait_for(
            lambda: (
                (d := scheduler.describe(app_id_of(jobs[1]))).msg.startswith("waiting for queue")
                and "quota" in d.msg
                and d
            ),
            "Kueue to say why the second job waits",
        )
    finally:
        marker.write_text("")
    assert desc.state == AppState.PENDING, (desc.state, desc.msg)
    # The place from Kueue's visibility API, where the back end serves it (its discovery says; the real stage serves
    # it where kube-apiserver's aggregator can reach it).
    served = serves_kueue_visibility(new_client_from_config(config_file=backend.kubeconfig))
    place = " (1st of 1 in LocalQueue be-quota)" if served else ""
    assert desc.msg == (
        f"waiting for queue be-quota to admit it{place}: Pending: couldn't assign flavors to pod set node: "
        "insufficient unused quota for cpu in flavor be-flavor, 1 more needed"
    ), desc.msg
    wait_for(
        lambda: scheduler.describe(app_id_of(jobs[1])).state in (AppState.SUCCEEDED, AppState.FAILED),
        "the second job to be admitted once the first ended, and to finish",
    )
    assert scheduler.describe(app_id_of(jobs[1])).state == AppState.SUCCEEDED
