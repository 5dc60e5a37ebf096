"""Ctrl-C in a script that runs an experiment: a real process, a real SIGINT, the local cluster."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import nemo_run as run
from builders import sigint_as_in_a_terminal
from polling import wait_for
from torchx.specs import parse_app_handle

from nemo_kubeflow.nemo_run.scheduler import create_scheduler

SCRIPT = textwrap.dedent("""\
    import sys
    import nemo_run as run
    from nemo_kubeflow import KubeflowExecutor

    executor = KubeflowExecutor(container_image="python:3.11", nodes=1, shm_size=None, kubeconfig=sys.argv[1])
    with run.Experiment(sys.argv[2], executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(inline="echo started; sleep 300"), name="long")
        print("EXPERIMENT", exp._id, flush=True)
        exp.run(sequential=True)
    print("the script went on", flush=True)
""")


class Script:
    """The experiment script, run as a user runs it, its output in a file."""

    def __init__(self, local, tmp_path, title):
        (tmp_path / "exp.py").write_text(SCRIPT)
        self.out_path = tmp_path / "out.txt"
        self.out = open(self.out_path, "w")
        self.title = title
        self.proc = subprocess.Popen(
            [sys.executable, str(tmp_path / "exp.py"), str(local.kubeconfig_path), title],
            stdout=self.out,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            env={**os.environ, "COLUMNS": "300"},
            preexec_fn=sigint_as_in_a_terminal,
        )

    def output(self) -> str:
        return self.out_path.read_text()

    def wait_for(self, predicate, what: str, timeout=90.0):
        """``polling.wait_for`` while the script runs: it fails at once, with the output, if the script ended."""

        def still_running():
            assert self.proc.poll() is None, f"the script ended early:\n{self.output()[-3000:]}"

        return wait_for(
            predicate,
            what,
            timeout=timeout,
            interval=0.1,
            still_worth_it=still_running,
            detail=lambda: f"output:\n{self.output()[-3000:]}",
        )

    def exp_id(self) -> str:
        return self.wait_for(
            lambda: next(
                (line.split()[1] for line in self.output().splitlines() if line.startswith("EXPERIMENT ")), None
            ),
            "the experiment's id",
        )

    def exit_code(self, timeout=30.0) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(
                f"the script did not end {timeout:.0f}s after Ctrl-C:\n{self.output()[-3000:]}"
            ) from None
        finally:
            self.out.close()


def trainjob_of(local, title):
    prefix = title.replace("_", "-")
    return next((j for j in local.objects("trainjobs", "default") if j["metadata"]["name"].startswith(prefix)), None)


def running_pod(local, trainjob):
    return any(
        p["metadata"].get("labels", {}).get("jobset.sigs.k8s.io/jobset-name") == trainjob
        and (p.get("status") or {}).get("phase") == "Running"
        for p in local.objects("pods", "default")
    )


def recorded_app_id(exp_id):
    """What NeMo-Run's records (read back as `Experiment.from_id` does) say the task's job is."""
    exp = run.Experiment.from_id(exp_id)
    handle = exp.jobs[0].handle
    return parse_app_handle(handle)[2] if handle else None


def cancel(app_id):
    create_scheduler("t").cancel(app_id)


def test_first_ctrl_c_stops_waiting_and_says_how_to_follow_up(local, tmp_path):
    script = Script(local, tmp_path, "ctrlc")
    exp_id = script.exp_id()
    job = script.wait_for(lambda: trainjob_of(local, "ctrlc"), "the TrainJob")
    name = job["metadata"]["name"]
    script.wait_for(lambda: running_pod(local, name), "a running pod")
    time.sleep(3)  # NeMo-Run polls every 2 s: let it wait
    os.kill(script.proc.pid, signal.SIGINT)
    code = script.exit_code()
    out = script.output()
    assert code != 0 and "the script went on" not in out
    assert f"Ctrl-C: stopped waiting for TrainJob default/{name}; it keeps running on the cluster." in out, out
    assert f"nemo experiment logs {exp_id} 0" in out and f"nemo experiment cancel {exp_id} 0" in out
    assert f'run.Experiment.from_id("{exp_id}")' in out and f"nemo-kubeflow status {exp_id}" in out
    # The job runs on, and NeMo-Run's records have it.
    job = trainjob_of(local, "ctrlc")
    assert job is not None and "deletionTimestamp" not in job["metadata"]
    assert running_pod(local, name)
    assert recorded_app_id(exp_id) == f"default:{name}"
    cancel(f"default:{name}")


def test_second_ctrl_c_exits_at_once(local, tmp_path):
    script = Script(local, tmp_path, "twice")
    job = script.wait_for(lambda: trainjob_of(local, "twice"), "the TrainJob")
    script.wait_for(lambda: running_pod(local, job["metadata"]["name"]), "a running pod")
    time.sleep(3)
    os.kill(script.proc.pid, signal.SIGINT)
    time.sleep(0.2)
    os.kill(script.proc.pid, signal.SIGINT)
    assert script.exit_code(timeout=10) == 130
    assert "Second Ctrl-C: exiting now. The jobs keep running on the cluster." in script.output()
    cancel(f"default:{job['metadata']['name']}")
