"""An API server that does not answer, and a TrainJob deleted behind NeMo-Run's back: what the attached wait,
`nemo experiment status` and `nemo experiment logs` say (real processes, over HTTP, on the local cluster)."""

import os
import subprocess
import sys
import time

import nemo_run as run
import pytest
from kubernetes import client
from polling import wait_for
from test_e2e import plain
from torchx.specs import AppState, parse_app_handle

from nemo_kubeflow import KubeflowExecutor
from nemo_kubeflow.nemo_run.scheduler import create_scheduler

#: How long the tests keep the API server unreachable: the code path of a 5-minute outage (a look fails,
#: UNKNOWN, backoff doubling to 30 s), shortened.
OUTAGE_S = float(os.environ.get("NEMO_KUBEFLOW_TEST_OUTAGE_S", "15"))

#: An attached run: argv = kubeconfig, marker file, experiment title, tail_logs ("1" or "0").
ATTACHED = """
import sys
import nemo_run as run
from nemo_kubeflow import KubeflowExecutor

kubeconfig, marker, title, tail = sys.argv[1:5]
executor = KubeflowExecutor(container_image="python:3.11", nodes=1, shm_size=None, kubeconfig=kubeconfig)
script = f'echo "line from train"; for i in $(seq 1 900); do [ -e {marker} ] && exit 0; sleep 0.2; done; exit 5'
with run.Experiment(title, executor=executor, log_level="WARN") as exp:
    exp.add(run.Script(inline=script), name="train", tail_logs=tail == "1")
    exp.run(sequential=True)
print("FINAL STATE", exp.jobs[0].state.name, flush=True)
"""


def start_attached(local, tmp_path, nemorun_home, title, tail=False):
    marker = tmp_path / f"{title}-done"
    env = {**os.environ, "NEMORUN_HOME": str(nemorun_home), "COLUMNS": "300"}
    proc = subprocess.Popen(
        [sys.executable, "-c", ATTACHED, str(local.kubeconfig_path), str(marker), title, "1" if tail else "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
    )  # not the checkout: `python -c` imports from its cwd
    return proc, marker


def running_trainjob(local, title, proc):
    """The name of the attached run's TrainJob once its pod runs."""

    def still_running():
        assert proc.poll() is None, proc.stdout.read()

    def find():
        for job in local.objects("trainjobs", "default"):
            name = job["metadata"]["name"]
            if name.startswith(title) and any(
                p["metadata"]["name"].startswith(name) and p.get("status", {}).get("phase") == "Running"
                for p in local.objects("pods", "default")
            ):
                return name
        return None

    return wait_for(find, "the attached run's pod to run", timeout=120, still_worth_it=still_running)


def test_an_attached_wait_waits_through_an_api_server_outage(local, tmp_path, nemorun_home):
    proc, marker = start_attached(local, tmp_path, nemorun_home, "outage")
    try:
        running_trainjob(local, "outage", proc)
        time.sleep(3)  # the wait polls (every 2 s)
        outage = local.inject_fault(drop_connection=True, times=10**9)
        try:
            time.sleep(OUTAGE_S)
            assert proc.poll() is None, proc.stdout.read()  # still waiting: "could not look" is no end
        finally:
            outage.remove()
        marker.write_text("")
        out, _ = proc.communicate(timeout=180)
    finally:
        proc.kill()
    text = " ".join(plain(out).split())
    assert "FINAL STATE SUCCEEDED" in text, text[-3000:]
    assert text.count("the API server cannot be reached since") == 1, text[-3000:]
    assert "the job's state is unknown, not changed: looking again with backoff" in text
    assert "the API server answers again (unreachable from" in text
    assert "Exception while waiting" not in text and "Retrying (Retry(" not in text, text[-3000:]


def detached(local, title, script="sleep 300"):
    executor = KubeflowExecutor(
        container_image="python:3.11", nodes=1, shm_size=None, kubeconfig=str(local.kubeconfig_path)
    )
    with run.Experiment(title, executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(inline=script), name="train")
        exp.run(detach=True)
    return exp, parse_app_handle(exp.jobs[0].handle)[2]


def nemo(console_script, nemorun_home, *args):
    env = {**os.environ, "NEMORUN_HOME": str(nemorun_home), "COLUMNS": "300"}
    out = subprocess.run(
        [console_script("nemo"), "experiment", *args], env=env, capture_output=True, text=True, timeout=180
    )
    return " ".join(plain(out.stdout + out.stderr).split())


def test_status_with_the_api_server_down_says_so_once_and_shows_unknown(local, nemorun_home, console_script):
    exp, app_id = detached(local, "down")
    wait_for(lambda: create_scheduler("t").describe(app_id).state == AppState.RUNNING, "the job to run", timeout=60)
    outage = local.inject_fault(drop_connection=True, times=10**9)
    try:
        text = nemo(console_script, nemorun_home, "status", exp._id)
        kf = subprocess.run(
            [console_script("nemo-kubeflow"), "status", exp._id],
            capture_output=True,
            text=True,
            timeout=180,
            env={**os.environ, "NEMORUN_HOME": str(nemorun_home), "COLUMNS": "300"},
        )
    finally:
        outage.remove()
    assert text.count("the API server cannot be reached since") == 1, text[-3000:]
    assert "Retrying" not in text, text[-3000:]
    assert "Status: UNKNOWN" in text and "SUBMITTED" not in text, text[-3000:]
    assert "state: UNKNOWN" in kf.stdout and "the API server cannot be reached since" in kf.stdout, kf.stdout
    assert "Retrying" not in kf.stdout + kf.stderr, kf.stderr[-3000:]
    create_scheduler("t").cancel(app_id)


def delete_trainjob(local, name):
    """What `kubectl delete trainjob NAME` does, and wait until its pods are gone."""
    client.CustomObjectsApi(local.api_client()).delete_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", "default", "trainjobs", name
    )
    wait_for(
        lambda: not [p for p in local.objects("pods", "default") if p["metadata"]["name"].startswith(name)],
        "the pods to go",
        timeout=60,
    )


def test_logs_of_a_deleted_trainjob_say_that_no_log_was_kept(local, nemorun_home, console_script):
    exp, app_id = detached(local, "gone", script="echo hello from the node; sleep 300")
    name = app_id.split(":", 1)[1]
    wait_for(lambda: create_scheduler("t").describe(app_id).state == AppState.RUNNING, "the job to run", timeout=60)
    delete_trainjob(local, name)
    text = nemo(console_script, nemorun_home, "logs", exp._id, "0")
    assert (
        f"no log: TrainJob default/{name} no longer exists, so its pods and their logs are gone, and no log "
        "was kept" in text
    ), text[-3000:]
    assert f"logs are kept in {exp.jobs[0].executor.job_dir}/logs/node-0.log when they are followed" in text


def test_a_trainjob_deleted_under_an_attached_run_is_said_deleted_and_its_kept_log_named_after_the_task(
    local, tmp_path, nemorun_home, console_script
):
    proc, _ = start_attached(local, tmp_path, nemorun_home, "deleted", tail=True)
    try:
        name = running_trainjob(local, "deleted", proc)
        wait_for(lambda: _kept(nemorun_home), "the followed log to be kept", timeout=60)
        delete_trainjob(local, name)
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    text = " ".join(plain(out).split())
    assert "FINAL STATE CANCELLED" in text, text[-3000:]
    assert f"TrainJob default/{name} no longer exists: it was deleted outside this NeMo-Run process" in text, text[
        -3000:
    ]
    exp_id = next(d for d in os.listdir(nemorun_home / "experiments" / "deleted"))
    logs = nemo(console_script, nemorun_home, "logs", exp_id, "0")
    assert "train/0 line from train" in logs and "node/0" not in logs, logs[-3000:]


def _kept(nemorun_home):
    """Whether the attached run's follower has kept node 0's first line next to the job."""
    for root, _, files in os.walk(nemorun_home / "experiments"):
        if "node-0.log" in files and "line from train" in open(os.path.join(root, "node-0.log")).read():
            return True
    return False


pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
