"""Finished jobs cleaned without Trainer v2.3.0's loop (trainer#3779): a JobSet TTL deletes a failed job's
JobSet, Trainer v2.3.0 clears the TrainJob's Failed condition and builds the JobSet again, and the job runs
again, forever. `ttl_seconds_after_finished` is therefore a TrainJob annotation that `nemo-kubeflow gc
--expired` acts on, never a JobSet TTL; a runtime of one's own with a JobSet TTL is refused on a Trainer
that reruns failed jobs (or whose version cannot be read). The local cluster's Trainer loops as v2.3.0 does.
"""

import time

import nemo_run as run
import pytest
from backends import app_id_of, trainjob_of, wait_for
from kubernetes import client
from torchx.specs import AppState

from nemo_kubeflow import KubeflowExecutor
from nemo_kubeflow.build.plan import build_submission
from nemo_kubeflow.cli.main import main as cli_main
from nemo_kubeflow.cluster.client import KubernetesCluster
from nemo_kubeflow.cluster.submit import submit
from nemo_kubeflow.config.packager import BundleFile
from nemo_kubeflow.constants import (
    JOBSET_UID_LABEL,
    TRAINER_PUBLIC_CONFIGMAP,
    TRAINER_SYSTEM_NAMESPACE,
    TRAINER_VERSION_KEY,
    TTL_ANNOTATION,
)
from nemo_kubeflow.errors import ConfigError
from nemo_kubeflow.nemo_run.scheduler import create_scheduler
from nemo_kubeflow_local import LocalCluster

#: Longer than Trainer v2.3.0 takes to build a deleted JobSet again (about 11 s on the real controllers).
REBUILD_WINDOW_S = 25


def test_a_failing_job_with_a_ttl_stays_failed_runs_once_and_gc_expired_cleans_it(backend):
    executor = backend.executor(nodes=1, ttl_seconds_after_finished=0)
    with run.Experiment("be-ttl", executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(inline="echo ttl-run; exit 1"), name="fails")
        exp.run(sequential=True)
        job = exp.jobs[0]
    assert exp.status(return_dict=True)[job.id]["status"] == AppState.FAILED
    name = trainjob_of(job)
    [trainjob] = backend.objects("trainjobs", name)
    assert trainjob["metadata"]["annotations"][TTL_ANNOTATION] == "0"
    [jobset] = backend.objects("jobsets", name)
    assert "ttlSecondsAfterFinished" not in jobset["spec"]  # never a JobSet TTL

    time.sleep(REBUILD_WINDOW_S)  # what Trainer v2.3.0 would do with a deleted JobSet has had its time
    assert [j["metadata"]["uid"] for j in backend.objects("jobsets", name)] == [jobset["metadata"]["uid"]]
    pods = backend.objects("pods", name)
    assert len(pods) == 1 and pods[0]["metadata"]["labels"][JOBSET_UID_LABEL] == jobset["metadata"]["uid"]
    [trainjob] = backend.objects("trainjobs", name)
    assert any(c["type"] == "Failed" and c["status"] == "True" for c in trainjob["status"]["conditions"])

    assert cli_main(["gc", "--expired", "-n", backend.namespace, "--kubeconfig", backend.kubeconfig]) == 0
    wait_for(
        lambda: not backend.objects("trainjobs", name) and not backend.objects("pods", name),
        "gc --expired to delete the job and its pods",
    )
    assert backend.objects("jobsets", name) == [] or wait_for(
        lambda: not backend.objects("jobsets", name), "the JobSet to go with its TrainJob"
    )
    # A later status says how the job ended, not only that it is gone (gc kept it in the job's record).
    assert exp.status(return_dict=True)[job.id]["status"] == AppState.FAILED
    final = create_scheduler("t").describe(app_id_of(job))
    assert final.state == AppState.FAILED and "deleted by nemo-kubeflow gc" in final.msg, (final.state, final.msg)


def test_gc_expired_keeps_jobs_within_their_ttl_and_jobs_without_one(backend, capsys):
    executor = backend.executor(nodes=1)
    with run.Experiment("be-ttl-keep", executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(inline="echo kept"), name="none", executor=backend.executor(nodes=1))
        exp.add(
            run.Script(inline="echo kept"),
            name="day",
            executor=backend.executor(nodes=1, ttl_seconds_after_finished=86400),
        )
        exp.run(sequential=True)
    names = [trainjob_of(j) for j in exp.jobs]
    assert cli_main(["gc", "--expired", "-n", backend.namespace, "--kubeconfig", backend.kubeconfig]) == 0
    err = capsys.readouterr().err
    assert "deleted 0 finished" in err and "1 within their ttl_seconds_after_finished" in err
    assert "1 without ttl_seconds_after_finished" in err
    assert all(backend.objects("trainjobs", n) for n in names)


# --- a runtime of one's own with a JobSet TTL; the local Trainer's v2.3.0 loop -----------------------------


def _trainer_version(local, version):
    core = client.CoreV1Api(local.api_client())
    if version is None:
        core.delete_namespaced_config_map(TRAINER_PUBLIC_CONFIGMAP, TRAINER_SYSTEM_NAMESPACE)
    else:
        core.patch_namespaced_config_map(
            TRAINER_PUBLIC_CONFIGMAP, TRAINER_SYSTEM_NAMESPACE, {"data": {TRAINER_VERSION_KEY: version}}
        )


def _submission(local, **fields):
    executor = KubeflowExecutor(
        container_image="python:3.11",
        nodes=1,
        shm_size=None,
        runtime_kind="TrainingRuntime",
        kubeconfig=str(local.kubeconfig_path),
        experiment_id="ttlloop_1",
        **fields,
    )
    from nemo_run.run.torchx_backend.components import torchrun

    role = executor.macro_values().apply(torchrun.torchrun("train.py", script="train.py", j="1x1").roles[0])
    return build_submission(
        executor, role, [BundleFile("code/train.py", b"raise SystemExit(1)\n", 0o644)], task_name="t"
    )


def _runtime_with_a_jobset_ttl(local, ttl: int) -> KubernetesCluster:
    """The TrainingRuntime `ttl-runtime`: the rendered one with a JobSet TTL, as a user's own runtime may have."""
    cluster = KubernetesCluster(str(local.kubeconfig_path))
    runtime = _submission(local).runtime
    runtime["metadata"] = {"name": "ttl-runtime", "namespace": "default", "labels": {}}
    runtime["spec"]["template"]["spec"]["ttlSecondsAfterFinished"] = ttl
    cluster.create(runtime)
    return cluster


@pytest.fixture()
def own_cluster(tmp_path):
    with LocalCluster(workdir=tmp_path / "cluster") as local:
        yield local


def test_a_runtime_with_a_jobset_ttl_is_refused_on_trainer_2_3_and_when_the_version_is_unknown(own_cluster):
    local = own_cluster
    cluster = _runtime_with_a_jobset_ttl(local, 60)
    for version, says in (
        ("v2.3.0", "this cluster's Trainer is v2.3.0"),
        (
            None,
            "this cluster's Trainer version is unknown: ConfigMap kubeflow-system/"
            "kubeflow-trainer-public does not exist",
        ),
    ):
        if version is None:
            _trainer_version(local, None)
        local.clear_requests()
        with pytest.raises(ConfigError) as refused:
            submit(cluster, _submission(local, runtime_name="ttl-runtime"))
        assert says in str(refused.value) and "trainer#3779" in str(refused.value)
        assert "nemo-kubeflow gc --expired" in str(refused.value)
        assert [r for r in local.requests if r.verb not in ("get", "list")] == []


def test_the_local_trainer_builds_a_failed_jobs_jobset_again_once_its_ttl_deletes_it(own_cluster):
    """As Trainer v2.3.0 does (its removeFailedCondition): seen here with a runtime of one's own that sets a
    JobSet TTL, on a cluster whose ConfigMap claims v2.4.0 so that the product lets it through."""
    local = own_cluster
    cluster = _runtime_with_a_jobset_ttl(local, 0)
    _trainer_version(local, "v2.4.0")
    sub = _submission(local, runtime_name="ttl-runtime")
    submit(cluster, sub)
    seen: set[str] = set()

    def jobsets_seen():
        seen.update(j["metadata"]["uid"] for j in local.objects("jobsets", "default"))
        return len(seen) >= 3

    wait_for(jobsets_seen, "the failed job's JobSet to be built again after its TTL, twice", timeout=120)
    cluster.delete("TrainJob", sub.name, "default")
