"""Tasks that ship the same code share one ConfigMap of it (docs/packaging.md, "Shared code"), on both back
ends: one owner per TrainJob, deleted by the garbage collector with the last of them (the real one's on `real`,
the local cluster's emulation on `local`), kept by a rollback and by `gc --experiment` while another job uses it."""

import nemo_run as run
import pytest
from backends import wait_for
from torchx.specs import Role

from nemo_kubeflow import ConfigMapPackager
from nemo_kubeflow.build.packaging import SHARE_MIN_BYTES
from nemo_kubeflow.build.plan import build_submission
from nemo_kubeflow.cli import main as console
from nemo_kubeflow.cluster.client import KubernetesCluster
from nemo_kubeflow.cluster.submit import submit
from nemo_kubeflow.config.packager import BundleFile
from nemo_kubeflow.constants import SHARED_CODE_LABEL, TRAINJOB_KIND
from nemo_kubeflow.errors import AlreadyExistsError, SubmissionError


def task(backend, name: str, experiment: str, code: bytes, command: str = "sleep 600", **fields):
    """One task's Submission: ``code`` (made large enough to be shared) as its code, and a config file of its
    own, as NeMo-Run ships."""
    code += b"#" * SHARE_MIN_BYTES + b"\n"
    executor = backend.executor(nodes=1, **fields)
    role = Role(name=name, image="", entrypoint="bash", args=["-c", command])
    files = [BundleFile("code/train.py", code), BundleFile(f"{name}/configs/{name}_config.yaml", name.encode())]
    return build_submission(executor, role, files, task_name=name, experiment_id=experiment)


def shared_configmaps(backend) -> list[dict]:
    return [
        c for c in backend.objects("configmaps") if (c["metadata"].get("labels") or {}).get(SHARED_CODE_LABEL) == "true"
    ]


def owners(backend, name: str) -> set[str]:
    found = [c for c in backend.objects("configmaps") if c["metadata"]["name"] == name]
    return {ref["name"] for c in found for ref in c["metadata"].get("ownerReferences") or []}


def gone(backend, name: str) -> bool:
    return not any(c["metadata"]["name"] == name for c in backend.objects("configmaps"))


def test_tasks_of_the_same_code_share_its_configmap_until_the_last_job_is_deleted(backend):
    cluster = KubernetesCluster(kubeconfig=backend.kubeconfig)
    code = b"print('shared')\n"
    first, second = task(backend, "one", "shared-a", code), task(backend, "two", "shared-a", code)
    other = task(backend, "three", "shared-a", b"print('other')\n")
    for sub in (first, second, other):
        submit(cluster, sub, resume=False)  # suspended: the ConfigMaps matter here, not the pods

    [shared] = first.configmaps[:1]
    name = shared["metadata"]["name"]
    assert second.configmaps[0]["metadata"]["name"] == name != other.configmaps[0]["metadata"]["name"]
    assert len(shared_configmaps(backend)) == 2  # one per code, not one per task
    assert owners(backend, name) == {first.name, second.name}
    # The tasks' own files stay their own, each owned by its TrainJob alone.
    assert owners(backend, first.configmaps[1]["metadata"]["name"]) == {first.name}

    cluster.delete(TRAINJOB_KIND, first.name, backend.namespace)
    wait_for(lambda: gone(backend, first.configmaps[1]["metadata"]["name"]), "the first task's own ConfigMap to go")
    # The garbage collector drops the deleted owner, and keeps what another job still mounts.
    wait_for(lambda: owners(backend, name) == {second.name}, "the deleted job to leave the shared ConfigMap's owners")
    cluster.delete(TRAINJOB_KIND, second.name, backend.namespace)
    wait_for(lambda: gone(backend, name), "the shared ConfigMap to go with its last TrainJob")
    assert owners(backend, other.configmaps[0]["metadata"]["name"]) == {other.name}


def test_a_rollback_keeps_the_shared_configmap_that_another_job_uses(backend, monkeypatch):
    cluster = KubernetesCluster(kubeconfig=backend.kubeconfig)
    code = b"print('rollback')\n"
    kept = task(backend, "kept", "shared-b", code)
    submit(cluster, kept, resume=False)
    monkeypatch.setenv("SHARED_TOKEN", "canary-7c1e")
    failing = task(backend, "failing", "shared-b", code, secret_env_vars={"TOKEN": "env:SHARED_TOKEN"})
    # Someone else's Secret under the task's Secret's name: the submission fails after it joined the shared
    # ConfigMap, and rolls back.
    backend.core().create_namespaced_secret(
        backend.namespace, {"metadata": {"name": failing.secret["metadata"]["name"]}, "stringData": {"x": "y"}}
    )
    with pytest.raises(SubmissionError) as err:
        submit(cluster, failing, resume=False)
    assert isinstance(err.value.__cause__, AlreadyExistsError)
    name = kept.configmaps[0]["metadata"]["name"]
    wait_for(lambda: owners(backend, name) == {kept.name}, "the rolled-back job to leave the shared ConfigMap")
    assert not any(j["metadata"]["name"] == failing.name for j in backend.objects("trainjobs"))


def test_gc_of_an_experiment_keeps_the_code_another_experiments_job_uses(backend, capsys):
    cluster = KubernetesCluster(kubeconfig=backend.kubeconfig)
    code = b"print('gc')\n"
    done = task(backend, "done", "shared-gc-old", code, command="true")
    running = task(backend, "running", "shared-gc-new", code)
    submit(cluster, done)
    submit(cluster, running, resume=False)

    def finished() -> bool:
        job = cluster.get(TRAINJOB_KIND, done.name, backend.namespace) or {}
        conditions = (job.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Complete" and c["status"] == "True" for c in conditions)

    wait_for(finished, "the finished task's TrainJob to complete", timeout=180)
    name = done.configmaps[0]["metadata"]["name"]
    argv = ["gc", "--namespace", backend.namespace, "--experiment", "shared-gc-old", "--min-age", "0"]
    assert console.main([*argv, "--kubeconfig", backend.kubeconfig]) == 0, capsys.readouterr().err
    wait_for(lambda: owners(backend, name) == {running.name}, "gc's job to leave the shared ConfigMap")
    cluster.delete(TRAINJOB_KIND, running.name, backend.namespace)
    wait_for(lambda: gone(backend, name), "the shared ConfigMap to go with its last TrainJob")


def test_a_sweep_of_the_same_code_sends_it_once_and_keeps_no_copy_per_task(backend, tmp_path):
    (tmp_path / "train.py").write_text("print('sweep')\n" + "#" * SHARE_MIN_BYTES + "\n")
    packager = ConfigMapPackager(relative_path=str(tmp_path), include_pattern="train.py")
    with run.Experiment(
        "be-sweep-code", executor=backend.executor(nodes=1, packager=packager), log_level="WARN"
    ) as exp:
        for i in range(3):
            exp.add(run.Script(inline="true"), name=f"t{i}")
        exp.run(detach=True)
        jobs = exp.jobs
    [shared] = shared_configmaps(backend)
    assert len(owners(backend, shared["metadata"]["name"])) == 3
    assert [len(v) for v in shared["data"].values()] == [len("print('sweep')\n") + SHARE_MIN_BYTES + 1]
    # NeMo-Run keeps each task's dry run for the experiment's life: the files sent are not kept in it.
    for job in jobs:
        sent = job._dryrun_info.request.submission
        assert [cm["metadata"]["name"] for cm in sent.configmaps][0] == shared["metadata"]["name"]
        assert not any("data" in cm or "binaryData" in cm for cm in sent.configmaps)
