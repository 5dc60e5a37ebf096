"""A canary secret reaches the pod and nowhere else: not in logs, dry-run files or output,
ConfigMaps, other objects, exception texts, NeMo-Run's saved metadata, or pod logs."""

import hashlib
import logging
from pathlib import Path

import nemo_run as run
import pytest
from torchx.specs import AppState, parse_app_handle

from nemo_kubeflow import KubeflowExecutor, SubmissionError
from nemo_kubeflow.nemo_run.scheduler import create_scheduler

CANARY = "canary-7d1e0a9b5c"


def files_containing(root: Path, needle: str) -> list[str]:
    hits = []
    for path in root.rglob("*"):
        if path.is_file() and needle.encode() in path.read_bytes():
            hits.append(str(path))
    return hits


def test_canary_only_in_the_secret(local, nemorun_home, monkeypatch, capsys, caplog):
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("CANARY_SRC", CANARY)
    executor = KubeflowExecutor(
        container_image="python:3.11",
        nodes=2,
        kubeconfig=str(local.kubeconfig_path),
        shm_size=None,
        secret_env_vars={"API_TOKEN": "env:CANARY_SRC"},
        env_vars={"PLAIN": "visible"},
    )
    # The pod proves it received the value by printing its hash, never the value.
    script = run.Script(
        inline='echo "token sha256 $(printf %s "$API_TOKEN" | sha256sum | cut -c1-16)"; env | grep -c . >/dev/null'
    )
    with run.Experiment("secrets", executor=executor, log_level="DEBUG") as exp:
        exp.add(script, name="uses-secret")
        exp.run(sequential=True)
    job = exp.jobs[0]
    assert exp.status(return_dict=True)[job.id]["status"] == AppState.SUCCEEDED

    app_id = parse_app_handle(job.handle)[2]
    lines = [line for node in (0, 1) for line in create_scheduler("t").log_iter(app_id, "uses-secret", node)]
    digest = hashlib.sha256(CANARY.encode()).hexdigest()[:16]
    assert sum(f"token sha256 {digest}" in line for line in lines) == 2, lines

    # Objects: only the Secret carries it (base64-encoded there).
    for resource in ("configmaps", "trainjobs", "clustertrainingruntimes", "pods", "events"):
        dumped = repr(local.objects(resource, None))
        assert CANARY not in dumped, resource
    secrets = local.objects("secrets", "default")
    assert len(secrets) == 1 and CANARY not in repr(secrets[0].get("data"))  # stored base64, as Kubernetes does

    # Everything NeMo-Run and we wrote on this machine, and everything printed or logged.
    assert files_containing(nemorun_home, CANARY) == []
    # The pods got it as an environment variable only: no file of theirs holds it (logs included).
    assert files_containing(local.workdir / "pods", CANARY) == []
    out = capsys.readouterr()
    assert CANARY not in out.out and CANARY not in out.err
    assert CANARY not in caplog.text
    assert all(CANARY not in line for line in lines)


def test_canary_not_in_exception_text(local, monkeypatch):
    monkeypatch.setenv("CANARY_SRC", CANARY)
    local.inject_fault(verb="create", resource="secrets", status=422, message="rejected secret")
    executor = KubeflowExecutor(
        container_image="python:3.11",
        kubeconfig=str(local.kubeconfig_path),
        secret_env_vars={"API_TOKEN": "env:CANARY_SRC"},
    )
    with pytest.raises(SubmissionError) as err:
        run.run(run.Script(inline="true"), executor=executor, name="secret-fault", detach=True)
    text = "".join(str(e) for e in (err.value, err.value.__cause__) if e)
    assert "rejected secret" in text and CANARY not in text
    assert [s for s in local.objects("secrets", "default") if "secret-fault" in s["metadata"]["name"]] == []
