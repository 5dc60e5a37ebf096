"""Finished jobs: JobSet's TTL, `nemo-kubeflow gc` of finished TrainJobs, and what a cancel of a
finished job says (on the local cluster, over HTTP)."""

import os
import shlex
import subprocess
from datetime import datetime, timedelta, timezone

import nemo_run as run
import pytest
from kubernetes.client import CustomObjectsApi
from polling import wait_for

from nemo_kubeflow import KubeflowExecutor
from nemo_kubeflow.cli import main as console
from nemo_kubeflow.cli.render import render_submission
from nemo_kubeflow.cluster.client import KubernetesCluster
from nemo_kubeflow.cluster.submit import submit
from nemo_kubeflow.constants import JOBSET_NAME_LABEL, TRAINJOB_KIND, TTL_ANNOTATION
from nemo_kubeflow.errors import ClusterError, ConfigError
from nemo_kubeflow.parts.naming import label_value


@pytest.fixture()
def client(cluster):
    return KubernetesCluster(kubeconfig=str(cluster.kubeconfig_path))


def executor(cluster, namespace: str, **fields) -> KubeflowExecutor:
    return KubeflowExecutor(
        container_image="python:3.11",
        nodes=1,
        namespace=namespace,
        shm_size=None,
        kubeconfig=str(cluster.kubeconfig_path),
        **fields,
    )


def submit_job(cluster, client, namespace: str, experiment_id: str, script: str = "echo done", **fields):
    """Submit one task the way the scheduler does; returns the Submission."""
    sub = render_submission(executor(cluster, namespace, **fields), [script], name="task", experiment_id=experiment_id)
    submit(client, sub)
    return sub


def finished_condition(client, namespace: str, name: str, timeout: float = 60.0) -> dict:
    def finished():
        job = client.get(TRAINJOB_KIND, name, namespace) or {}
        return next(
            (
                c
                for c in (job.get("status") or {}).get("conditions") or []
                if c["type"] in ("Complete", "Failed") and c["status"] == "True"
            ),
            None,
        )

    return wait_for(finished, f"TrainJob {namespace}/{name} to finish", timeout=timeout, interval=0.1)


def pods_of(cluster, namespace: str, name: str) -> list[dict]:
    return [
        p for p in cluster.objects("pods", namespace) if p["metadata"].get("labels", {}).get(JOBSET_NAME_LABEL) == name
    ]


def names(cluster, resource: str, namespace: str) -> set[str]:
    return {o["metadata"]["name"] for o in cluster.objects(resource, namespace)}


def gc(capsys, cluster, *argv: str) -> tuple[str, str]:
    capsys.readouterr()
    assert console.main(["gc", *argv, "--kubeconfig", str(cluster.kubeconfig_path)]) == 0
    return capsys.readouterr()


# --- ttl_seconds_after_finished ---------------------------------------------------------------


def test_ttl_is_a_trainjob_annotation_never_a_jobset_ttl(cluster, client):
    """Trainer v2.3.0 reruns a failed job whose JobSet a TTL deleted (trainer#3779): the TTL is ours,
    acted on by `gc --expired` (test_ttl_trainer_loop.py), with any runtime."""
    cluster.create_namespace("ttl")
    expiring = submit_job(cluster, client, "ttl", "ttl_1", ttl_seconds_after_finished=4)
    assert "ttlSecondsAfterFinished" not in expiring.runtime["spec"]["template"]["spec"]
    assert expiring.trainjob["metadata"]["annotations"][TTL_ANNOTATION] == "4"
    executor(cluster, "default", ttl_seconds_after_finished=60, runtime_name="shared").validate()


def test_ttl_out_of_range_is_refused_before_anything_is_sent(cluster):
    with pytest.raises(ConfigError) as error:
        executor(cluster, "default", ttl_seconds_after_finished=-1).validate()
    assert "ttl_seconds_after_finished=-1: must be a whole number of seconds from 0 to 2147483647" in str(error.value)


# --- gc of finished TrainJobs -----------------------------------------------------------------


def foreign_trainjob(client, namespace: str, like: dict, name: str) -> None:
    """A finished TrainJob somebody made by hand on our runtime: no nemo-kubeflow labels."""
    client.create(
        {
            "apiVersion": like["apiVersion"],
            "kind": TRAINJOB_KIND,
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"runtimeRef": like["spec"]["runtimeRef"], "trainer": {"command": ["bash", "-c", "echo by hand"]}},
        }
    )
    finished_condition(client, namespace, name)


def test_gc_by_experiment_deletes_its_finished_jobs_and_what_they_own_only(cluster, client, capsys, monkeypatch):
    cluster.create_namespace("gc-exp")
    monkeypatch.setenv("GC_TEST_TOKEN", "s3cret")
    a = submit_job(
        cluster, client, "gc-exp", "exp-a_1795319744650370646", secret_env_vars={"TOKEN": "env:GC_TEST_TOKEN"}
    )
    b = submit_job(cluster, client, "gc-exp", "exp-b_1795319744650370647")
    for sub in (a, b):
        finished_condition(client, "gc-exp", sub.name)
    foreign_trainjob(client, "gc-exp", a.trainjob, "by-hand")
    assert a.secret is not None and a.secret["metadata"]["name"] in names(cluster, "secrets", "gc-exp")

    # By title, dry run: listed (kind, namespace, name, state, age), nothing deleted.
    out, err = gc(capsys, cluster, "-n", "gc-exp", "--experiment", "exp-a", "--dry-run")
    lines = out.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"would delete TrainJob/{a.name} (namespace gc-exp): SUCCEEDED, finished "
    ), out
    assert lines[0].endswith(" ago")
    assert "TrainJobs: would delete 1 finished" in err
    assert {a.name, b.name, "by-hand"} <= names(cluster, "trainjobs", "gc-exp")

    # By id: that experiment's TrainJob goes, and the garbage collector takes its ConfigMaps and Secret.
    out, _ = gc(capsys, cluster, "-n", "gc-exp", "--experiment", "exp-a_1795319744650370646")
    assert out.startswith(f"deleted TrainJob/{a.name} (namespace gc-exp): SUCCEEDED") and out.count("\n") == 1
    cluster.wait_for(
        lambda: (
            not [
                n
                for kind in ("configmaps", "secrets", "trainjobs")
                for n in names(cluster, kind, "gc-exp")
                if n.startswith(a.name)
            ]
        ),
        timeout=30,
    )
    assert not pods_of(cluster, "gc-exp", a.name)
    assert {b.name, "by-hand"} <= names(cluster, "trainjobs", "gc-exp")

    # Every finished one of ours; the hand-made TrainJob (no labels) is not touched, finished or not.
    out, _ = gc(capsys, cluster, "-n", "gc-exp", "--finished")
    assert out.startswith(f"deleted TrainJob/{b.name} (namespace gc-exp): SUCCEEDED") and out.count("\n") == 1
    assert names(cluster, "trainjobs", "gc-exp") == {"by-hand"}
    out, err = gc(capsys, cluster, "-n", "gc-exp", "--finished")
    assert out == "" and "TrainJobs: deleted 0 finished" in err


def test_gc_older_than_counts_from_when_the_job_finished(cluster, client, capsys):
    cluster.create_namespace("gc-age")
    old = submit_job(cluster, client, "gc-age", "old_1795319744650370646")
    new = submit_job(cluster, client, "gc-age", "new_1795319744650370646")
    for sub in (old, new):
        finished_condition(client, "gc-age", sub.name)
    # Finished eight days ago: the status subresource, as Trainer writes it.
    job = client.get(TRAINJOB_KIND, old.name, "gc-age")
    eight_days_ago = (datetime.now(timezone.utc) - timedelta(days=8)).strftime("%Y-%m-%dT%H:%M:%SZ")
    conditions = [
        {**c, "lastTransitionTime": eight_days_ago} if c["type"] == "Complete" else c
        for c in job["status"]["conditions"]
    ]
    CustomObjectsApi(client.api_client).patch_namespaced_custom_object_status(
        "trainer.kubeflow.org", "v1alpha1", "gc-age", "trainjobs", old.name, {"status": {"conditions": conditions}}
    )

    out, err = gc(capsys, cluster, "-n", "gc-age", "--older-than", "7d", "--dry-run")
    assert out == f"would delete TrainJob/{old.name} (namespace gc-age): SUCCEEDED, finished 8d ago\n"
    assert "kept 0 not finished, 1 that finished less than 7d ago" in err
    out, _ = gc(capsys, cluster, "-n", "gc-age", "--older-than", "7d")
    assert out == f"deleted TrainJob/{old.name} (namespace gc-age): SUCCEEDED, finished 8d ago\n"
    assert names(cluster, "trainjobs", "gc-age") == {new.name}


def test_gc_without_a_selection_keeps_finished_jobs_and_says_how_to_delete_them(cluster, client, capsys):
    cluster.create_namespace("gc-hint")
    sub = submit_job(cluster, client, "gc-hint", "hint_1795319744650370646")
    finished_condition(client, "gc-hint", sub.name)
    out, err = gc(capsys, cluster, "-n", "gc-hint", "--min-age", "0")
    assert (
        out == ""
        and "1 finished TrainJob(s) kept" in err
        and "--finished, --experiment, --older-than or --expired" in err
    )
    assert sub.name in names(cluster, "trainjobs", "gc-hint")


def test_gc_frees_the_runtime_of_the_jobs_it_deletes(cluster, client, capsys):
    cluster.create_namespace("gc-rt")
    sub = submit_job(cluster, client, "gc-rt", "rt_1795319744650370646", runtime_kind="TrainingRuntime")
    finished_condition(client, "gc-rt", sub.name)
    runtime = sub.runtime["metadata"]["name"]
    out, err = gc(capsys, cluster, "-n", "gc-rt", "--finished", "--min-age", "0", "--dry-run")
    jobs_line, runtime_line = out.splitlines()
    assert jobs_line.startswith(f"would delete TrainJob/{sub.name} (namespace gc-rt): SUCCEEDED, finished ")
    assert runtime_line == f"would delete TrainingRuntime/{runtime} (namespace gc-rt)"
    assert "kept 0 in use" in err
    assert runtime in names(cluster, "trainingruntimes", "gc-rt")


def test_gc_deletes_only_the_trainjob_it_listed_not_one_recreated_under_its_name(cluster, client, capsys):
    cluster.create_namespace("gc-uid")
    sub = submit_job(cluster, client, "gc-uid", "uid_1795319744650370646")
    finished_condition(client, "gc-uid", sub.name)
    listed_uid = client.get(TRAINJOB_KIND, sub.name, "gc-uid")["metadata"]["uid"]
    assert client.delete(TRAINJOB_KIND, sub.name, "gc-uid")
    cluster.wait_for(lambda: sub.name not in names(cluster, "trainjobs", "gc-uid"), timeout=30)
    foreign_trainjob(client, "gc-uid", sub.trainjob, sub.name)  # a new job under the same name
    with pytest.raises(ClusterError) as conflict:
        client.delete(TRAINJOB_KIND, sub.name, "gc-uid", uid=listed_uid)
    assert conflict.value.status == 409 and "Precondition failed" in str(conflict.value)
    assert sub.name in names(cluster, "trainjobs", "gc-uid")

    # gc meets the same answer when a job is replaced between its list and its delete: it keeps it.
    ours = submit_job(cluster, client, "gc-uid", "uid_1795319744650370647")
    finished_condition(client, "gc-uid", ours.name)
    fault = cluster.inject_fault(
        verb="delete",
        resource="trainjobs",
        status=409,
        reason="Conflict",
        message="Precondition failed: UID in precondition: x, UID in object meta: y",
    )
    out, err = gc(capsys, cluster, "-n", "gc-uid", "--finished")
    assert fault.fired and out == ""
    assert f"kept TrainJob/{ours.name} (namespace gc-uid): replaced by a new TrainJob since it was listed" in err
    assert ours.name in names(cluster, "trainjobs", "gc-uid")


# --- running jobs, and cancel -----------------------------------------------------------------


def run_experiment(cluster, namespace: str, title: str, script: str, **run_options):
    """One task through NeMo-Run in a new namespace; (experiment, TrainJob name)."""
    cluster.create_namespace(namespace)
    with run.Experiment(title, executor=executor(cluster, namespace), log_level="WARN") as exp:
        exp.add(run.Script(inline=script), name="task")
        exp.run(**run_options)
    return exp, exp.jobs[0].handle.rsplit(":", 1)[1]


def test_a_running_job_survives_gc_and_its_cancel_says_nothing_more(cluster, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # NeMo-Run's console: one line per message
    exp, name = run_experiment(cluster, "gc-run", "gc-running", "echo started; sleep 300", detach=True)
    cluster.wait_for(
        lambda: any(p.get("status", {}).get("phase") == "Running" for p in pods_of(cluster, "gc-run", name)), timeout=60
    )
    out, err = gc(capsys, cluster, "-n", "gc-run", "--finished", "--experiment", "gc-running", "--older-than", "0s")
    assert out == "" and "kept 1 not finished" in err
    assert name in names(cluster, "trainjobs", "gc-run")

    capsys.readouterr()
    exp.cancel(exp.jobs[0].id)
    assert "already finished" not in capsys.readouterr().out
    cluster.wait_for(lambda: name not in names(cluster, "trainjobs", "gc-run"), timeout=30)


def test_cancel_of_a_finished_job_says_it_finished_and_how_to_remove_it(
    cluster, capsys, monkeypatch, nemorun_home, console_script
):
    monkeypatch.setenv("COLUMNS", "1000")
    exp, name = run_experiment(cluster, "cancel", "done-cancel", "echo done", sequential=True)
    assert name in names(cluster, "trainjobs", "cancel")

    capsys.readouterr()
    exp.cancel(exp.jobs[0].id)
    out = capsys.readouterr().out
    assert f"TrainJob cancel/{name} already finished (SUCCEEDED), so cancel deleted nothing" in out, out
    suggested = out.split("Remove them with `", 1)[1].split("`", 1)[0]
    experiment = label_value(exp._id)
    assert suggested == (
        f"nemo-kubeflow gc --namespace cancel --experiment {experiment} --kubeconfig {cluster.kubeconfig_path}"
    )
    assert f"kubectl delete trainjob {name} -n cancel" in out and "ttl_seconds_after_finished" in out
    assert name in names(cluster, "trainjobs", "cancel")  # cancel itself deleted nothing

    # The same from `nemo experiment cancel`, in a new process.
    nemo = console_script("nemo")
    env = {**os.environ, "NEMORUN_HOME": str(nemorun_home), "COLUMNS": "1000"}
    cli = subprocess.run(
        [nemo, "experiment", "cancel", exp._id, "0"], env=env, capture_output=True, text=True, timeout=120
    )
    assert cli.returncode == 0, cli.stderr[-2000:]
    assert f"TrainJob cancel/{name} already finished (SUCCEEDED)" in cli.stdout + cli.stderr

    # The command it suggests removes the job (its experiment has no other).
    capsys.readouterr()
    assert console.main(shlex.split(suggested)[1:]) == 0
    assert capsys.readouterr().out.startswith(f"deleted TrainJob/{name} (namespace cancel): SUCCEEDED")
    assert name not in names(cluster, "trainjobs", "cancel")
