"""Shipped files keep their modes in the pod: a 0600 key stays private, a script stays executable (ConfigMap
volume items carry each file's `mode`; the sharded package's tar keeps it too)."""

import json
import os

import nemo_run as run
import pytest
from torchx.specs import AppState, parse_app_handle

from nemo_kubeflow import ConfigMapPackager, KubeflowExecutor
from nemo_kubeflow.nemo_run.scheduler import create_scheduler

REPORT = """import json, os, stat
print("MODES " + json.dumps({n: oct(stat.S_IMODE(os.stat(n).st_mode)) for n in ("key.pem", "run.sh", "report.py")}),
      flush=True)
"""


@pytest.mark.parametrize("mode", ["plain", "sharded"])
def test_shipped_files_keep_their_modes(local, tmp_path, mode):
    code = tmp_path / "code"
    code.mkdir()
    (code / "report.py").write_text(REPORT)
    (code / "key.pem").write_text("not a real key\n")
    (code / "run.sh").write_text("#!/bin/sh\necho ran\n")
    os.chmod(code / "report.py", 0o644)
    os.chmod(code / "key.pem", 0o600)
    os.chmod(code / "run.sh", 0o750)
    executor = KubeflowExecutor(
        container_image="python:3.11",
        kubeconfig=str(local.kubeconfig_path),
        shm_size=None,
        packager=ConfigMapPackager(relative_path=str(code), include_pattern="*", mode=mode),
    )
    with run.Experiment(f"modes-{mode}", executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(path="/nemo_run/code/report.py", entrypoint="python"), name="modes")
        exp.run(sequential=True)
    job = exp.jobs[0]
    assert exp.status(return_dict=True)[job.id]["status"] == AppState.SUCCEEDED
    lines = list(create_scheduler("t").log_iter(parse_app_handle(job.handle)[2], "modes", 0))
    [got] = [json.loads(line.split("MODES ", 1)[1]) for line in lines if "MODES " in line]
    assert got == {"key.pem": "0o600", "run.sh": "0o750", "report.py": "0o644"}, lines
