"""Several processes submitting at once, and a process killed in the middle of a submission."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from nemo_kubeflow_local import LocalCluster

REPO = Path(__file__).resolve().parent.parent

SUBMIT = textwrap.dedent("""
    import sys
    import nemo_run as run
    from nemo_kubeflow import KubeflowExecutor

    if __name__ == "__main__":
        executor = KubeflowExecutor(container_image="python:3.11", nodes=2, kubeconfig=sys.argv[1],
                                    secret_env_vars={"TOKEN": "env:HOME"}, shm_size=None)
        run.run(run.Script(inline="echo done"), executor=executor, name="same-title", detach=True)
        print("SUBMITTED", flush=True)
""")


@pytest.fixture()
def local(tmp_path):
    with LocalCluster(workdir=tmp_path / "cluster") as c:
        yield c


def start(script: Path, local, nemorun_home) -> subprocess.Popen:
    env = {**os.environ, "NEMORUN_HOME": str(nemorun_home)}
    return subprocess.Popen(
        [sys.executable, str(script), str(local.kubeconfig_path)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_parallel_submissions_do_not_clash(local, tmp_path, nemorun_home):
    script = tmp_path / "submit.py"
    script.write_text(SUBMIT)
    procs = [start(script, local, nemorun_home) for _ in range(3)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0 and "SUBMITTED" in out, err[-2000:]
    jobs = local.objects("trainjobs", "default")
    secrets = local.objects("secrets", "default")
    assert len(jobs) == 3 and len({j["metadata"]["name"] for j in jobs}) == 3
    # One shared runtime: the later creates were answered 409 and reused it.
    assert len(local.objects("clustertrainingruntimes")) == 1
    # One Secret per job, each owned by its own TrainJob.
    owners = {s["metadata"]["ownerReferences"][0]["uid"] for s in secrets}
    assert len(secrets) == 3 and owners == {j["metadata"]["uid"] for j in jobs}


def test_killed_mid_submission_leaves_an_inert_job_that_nothing_trips_over(local, tmp_path, nemorun_home):
    script = tmp_path / "submit.py"
    script.write_text(SUBMIT)
    # Hold the ConfigMap create, so the process is killed after the TrainJob exists.
    local.inject_fault(verb="create", resource="configmaps", delay=5.0)
    proc = start(script, local, nemorun_home)
    local.wait_for(lambda: local.objects("trainjobs", "default"), timeout=60)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)

    [orphan] = local.objects("trainjobs", "default")
    assert orphan["spec"]["suspend"] is True  # created suspended: nothing runs
    time.sleep(0.5)
    assert local.objects("pods", "default") == []

    # The next run is unaffected: it gets its own names and reuses the runtime.
    rerun = start(script, local, nemorun_home)
    out, err = rerun.communicate(timeout=120)
    assert rerun.returncode == 0 and "SUBMITTED" in out, err[-2000:]
    names = {j["metadata"]["name"] for j in local.objects("trainjobs", "default")}
    assert len(names) == 2 and orphan["metadata"]["name"] in names

    # And the leftover is one delete away from nothing: its owned objects go with it.
    from nemo_kubeflow.cluster.client import KubernetesCluster

    KubernetesCluster(kubeconfig=str(local.kubeconfig_path)).delete("TrainJob", orphan["metadata"]["name"], "default")
    local.wait_for(
        lambda: (
            not [
                o
                for kind in ("configmaps", "secrets")
                for o in local.objects(kind, "default")
                if o["metadata"]["name"].startswith(orphan["metadata"]["name"])
            ]
        ),
        timeout=15,
    )
