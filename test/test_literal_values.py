"""What the user wrote reaches the process unchanged: Kubernetes' `$(VAR)` expansion and `$$` in a container's
args and env values, and NeMo-Run's macro substitution, leave the task's arguments and env values as written."""

import json
from pathlib import Path

import nemo_run as run
from torchx.specs import AppState, parse_app_handle

from nemo_kubeflow import ConfigMapPackager, KubeflowExecutor
from nemo_kubeflow.nemo_run.scheduler import create_scheduler

CANARY = "canary-literal-5e2b7c"

#: Prints what the process got (argv, the env values of the test) as one JSON line, and whether a file
#: named `pwned` exists in its working directory.
RECORDER = """import json, os, sys
names = ("A", "DOLLARS", "REF", "PLAIN")
print("GOT " + json.dumps({"argv": sys.argv[1:], "env": {n: os.environ.get(n) for n in names},
                           "pwned": os.path.exists("pwned")}), flush=True)
"""

ARGS = ["$(A)", "$(TOK)", "$(PLAIN)", "a$$b", "$$(A)", "$HOME", "$(", "end$", "${node_rank_var}"]
#: NeMo-Run's executor macros (`${node_rank_var}`...) are still replaced by the name of the variable.
ARRIVED = [*ARGS[:-1], "PET_NODE_RANK"]
ENV = {"A": "'$(touch pwned)'", "DOLLARS": "x$$y$$$z", "REF": "$(PLAIN)-$(A)", "PLAIN": "plain"}


def test_args_and_env_values_arrive_literally(local, tmp_path, monkeypatch):
    monkeypatch.setenv("LITERAL_TOK_SRC", CANARY)
    (tmp_path / "record.py").write_text(RECORDER)
    executor = KubeflowExecutor(
        container_image="python:3.11",
        kubeconfig=str(local.kubeconfig_path),
        shm_size=None,
        env_vars=dict(ENV),
        secret_env_vars={"TOK": "env:LITERAL_TOK_SRC"},
        packager=ConfigMapPackager(relative_path=str(tmp_path), include_pattern="record.py"),
    )
    with run.Experiment("literal", executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(path=str(tmp_path / "record.py"), args=list(ARGS), entrypoint="python"), name="record")
        exp.run(sequential=True)
    job = exp.jobs[0]
    assert exp.status(return_dict=True)[job.id]["status"] == AppState.SUCCEEDED
    app_id = parse_app_handle(job.handle)[2]
    lines = list(create_scheduler("t").log_iter(app_id, "record", 0))
    got = [json.loads(line.split("GOT ", 1)[1]) for line in lines if "GOT " in line]
    assert len(got) == 1, lines
    assert got[0]["argv"] == ARRIVED
    assert got[0]["env"] == ENV
    assert got[0]["pwned"] is False
    assert list(Path(local.workdir).rglob("pwned")) == []
    assert all(CANARY not in line for line in lines)
