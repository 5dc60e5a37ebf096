"""Ctrl-C during a submission stops the program: a real process, a real SIGINT, the local cluster holding
the submission at one step (a request it delays) while the Ctrl-C comes.

Before the resume (the TrainJob is created suspended and resumed last) what was created is deleted and
nothing ran; after it the job runs, NeMo-Run's records have it, and the output says how to cancel it.
Either way the program stops there (KeyboardInterrupt: killed by SIGINT, which a shell shows as 130)."""

import os
import signal
import subprocess
import sys
import textwrap

import nemo_run as run
from builders import sigint_as_in_a_terminal
from polling import wait_for
from torchx.specs import parse_app_handle

from nemo_kubeflow.nemo_run.scheduler import create_scheduler

# `detach=True`: NeMo-Run does not wait for the job, so nothing but the Ctrl-C handling can stop the program.
SCRIPT = textwrap.dedent("""\
    import sys
    import nemo_run as run
    from nemo_kubeflow import KubeflowExecutor

    executor = KubeflowExecutor(container_image="python:3.11", nodes=1, shm_size=None, kubeconfig=sys.argv[1])
    with run.Experiment(sys.argv[2], executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(inline="echo started; sleep 300"), name="long")
        print("EXPERIMENT", exp._id, flush=True)
        exp.run(detach=True)
        print("the script went on", flush=True)
    print("the script ended normally", flush=True)
""")
HOLD = 4.0  # seconds the local cluster holds the request the Ctrl-C comes during


def start(local, tmp_path, title):
    (tmp_path / "exp.py").write_text(SCRIPT)
    out = open(tmp_path / "out.txt", "w")
    proc = subprocess.Popen(
        [sys.executable, str(tmp_path / "exp.py"), str(local.kubeconfig_path), title],
        stdout=out,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
        env={**os.environ, "COLUMNS": "300"},
        preexec_fn=sigint_as_in_a_terminal,
    )
    return proc, out


def ended(proc, out, tmp_path) -> tuple[int, str]:
    try:
        code = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
    out.close()
    return code, (tmp_path / "out.txt").read_text()


def ctrl_c_when_held(proc, held, tmp_path) -> None:
    """SIGINT once the request ``held`` (a local-cluster fault that delays it) has reached the server."""
    wait_for(
        lambda: held.fired >= 1,
        "the held request",
        timeout=90,
        interval=0.05,
        still_worth_it=lambda: (
            proc.poll() is None or (_ for _ in ()).throw(AssertionError((tmp_path / "out.txt").read_text()[-3000:]))
        ),
    )
    os.kill(proc.pid, signal.SIGINT)


def ours(local, resource, prefix):
    return [o for o in local.objects(resource, "default") if o["metadata"]["name"].startswith(prefix)]


def recorded_app_id(exp_id):
    handle = run.Experiment.from_id(exp_id).jobs[0].handle
    return parse_app_handle(handle)[2] if handle else None


def test_ctrl_c_before_the_resume_deletes_what_was_created_and_stops(local, tmp_path):
    # The task's ConfigMaps are created after the suspended TrainJob, before the resume.
    held = local.inject_fault(verb="create", resource="configmaps", delay=HOLD)
    proc, out = start(local, tmp_path, "stopsubmit")
    try:
        ctrl_c_when_held(proc, held, tmp_path)
    finally:
        code, text = ended(proc, out, tmp_path)
    assert code == -signal.SIGINT, text  # ended by the Ctrl-C (a shell shows 130)
    assert "the script went on" not in text and "the script ended normally" not in text
    [name] = {
        line.split("TrainJob default/")[1].split()[0]
        for line in text.splitlines()
        if "Ctrl-C: the submission of TrainJob default/" in line
    }
    assert (
        f"Ctrl-C: the submission of TrainJob default/{name} was stopped before the job started; what it had "
        "created was deleted, nothing ran on the cluster."
    ) in text, text
    assert not any(r.verb == "patch" and r.resource == "trainjobs" and r.name == name for r in local.requests)
    # Nothing is left: the TrainJob, and the ConfigMap the held request created after it (garbage-collected).
    local.wait_for(
        lambda: (
            not ours(local, "trainjobs", name) and not ours(local, "configmaps", name) and not ours(local, "pods", name)
        ),
        timeout=20,
    )


def test_ctrl_c_after_the_resume_records_the_job_says_how_to_cancel_it_and_stops(local, tmp_path):
    held = local.inject_fault(verb="patch", resource="trainjobs", delay=HOLD)  # the resume
    proc, out = start(local, tmp_path, "latesubmit")
    try:
        ctrl_c_when_held(proc, held, tmp_path)
    finally:
        code, text = ended(proc, out, tmp_path)
    assert code == -signal.SIGINT, text
    assert "the script went on" not in text and "the script ended normally" not in text
    exp_id = next(line.split()[1] for line in text.splitlines() if line.startswith("EXPERIMENT "))
    [job] = ours(local, "trainjobs", "latesubmit")
    name = job["metadata"]["name"]
    assert job["spec"].get("suspend") is False  # it runs
    assert f"Ctrl-C came after TrainJob default/{name} had started: the job runs on the cluster." in text, text
    assert f"nemo experiment cancel {exp_id} 0" in text and f"nemo experiment logs {exp_id} 0" in text
    assert f"kubectl delete trainjobs.trainer.kubeflow.org {name} -n default" in text
    assert recorded_app_id(exp_id) == f"default:{name}"  # so that `nemo experiment cancel` finds it
    create_scheduler("t").cancel(f"default:{name}")
    local.wait_for(lambda: not ours(local, "trainjobs", name), timeout=20)
