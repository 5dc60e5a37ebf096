"""Progress through Trainer's status server across a service-account token rotation (the local cluster's
emulation: a new signing key, the pods' projected token files rewritten, the old tokens refused with 403).
Trainer v2.3.0's status server verifies the bearer token as an OIDC ID token (signature, expiry, the
TrainJob's audience) and checks its namespace claim; nemo_kubeflow.progress reads the token file at each
write, and tries once more when a 401/403 answers a token that was rotated meanwhile."""

import io
import time

import nemo_run as run
import progress_workload
import pytest
from backends import app_id_of, trainjob_of, wait_for
from backends import logs as node_logs
from test_progress import PACKAGER
from test_trainjob_status_server import gated_cluster, post, sleeping_trainjob
from torchx.specs import AppState

from nemo_kubeflow import ConfigMapPackager, KubeflowExecutor, progress
from nemo_kubeflow.nemo_run.scheduler import create_scheduler
from nemo_kubeflow_local.controllers import trainjob_status as ts

NS = "rotation"


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    with gated_cluster(tmp_path_factory.mktemp("gated"), NS) as cluster:
        yield cluster


def trainer_status(gated, name):
    [trainjob] = [j for j in gated.objects("trainjobs", NS) if j["metadata"]["name"] == name]
    return (trainjob.get("status") or {}).get("trainerStatus") or {}


def step_of(status):
    return int({m["name"]: m["value"] for m in status.get("metrics") or []}.get("step", 0))


def token_file(gated, trainjob):
    """Node 0's projected token, where the kubelet wrote it."""
    [pod] = [p for p in gated.objects("pods", NS) if p["metadata"]["name"].startswith(f"{trainjob}-node-0-0")]
    return gated.workdir / "pods" / NS / pod["metadata"]["name"] / "volumes" / ts.VOLUME_NAME / ts.TOKEN_FILE


def test_progress_goes_on_through_the_status_server_across_token_rotations(gated, nemorun_home):
    executor = KubeflowExecutor(
        container_image="python:3.11",
        nodes=1,
        nprocs_per_node=1,
        namespace=NS,
        kubeconfig=str(gated.kubeconfig_path),
        shm_size=None,
        packager=ConfigMapPackager(**PACKAGER),
    )
    with run.Experiment("prog-rot", executor=executor, log_level="WARN") as exp:
        exp.add(run.Partial(progress_workload.train, steps=300, seconds_per_step=0.1, interval=0.5), name="prog-rot")
        exp.run(detach=True)
    job = exp.jobs[0]
    name = trainjob_of(job)
    for at_step in (60, 150):
        wait_for(
            lambda: step_of(trainer_status(gated, name)) >= at_step, f"step {at_step} in trainerStatus", timeout=180
        )
        path = token_file(gated, name)
        old = path.read_text()
        assert gated.rotate_service_account_tokens() >= 1
        new = path.read_text()
        assert new != old
        # The emulation refuses the old token from now on, and takes the new one.
        request = {"trainerStatus": {"lastUpdatedTime": "2026-11-27T09:00:00+00:00"}}
        assert post(gated, ts.status_path(NS, name), request, old)[0] == 403
        rotated_at = step_of(trainer_status(gated, name))
        wait_for(
            lambda: step_of(trainer_status(gated, name)) > rotated_at + 10,
            "new steps in trainerStatus after the rotation",
            timeout=120,
        )
    wait_for(
        lambda: create_scheduler("t").describe(app_id_of(job)).state == AppState.SUCCEEDED, "the job's end", timeout=180
    )
    assert step_of(trainer_status(gated, name)) == 300
    logs = "\n".join(node_logs(job, "prog-rot", nodes=(0,)))
    # Every write went to the status server: none fell back to the log line.
    assert "via status-server" in logs and progress.LINE_MARKER not in logs, logs[-2000:]
    [done] = [line for line in logs.splitlines() if "progress done:" in line]
    writes, sent = done.split("progress done: ")[1].split(" writes, ")
    assert sent == f"{writes} to the status server", done


@pytest.fixture(scope="module")
def sleeper(gated):
    """A TrainJob whose one node sleeps: the in-process reporters below write its status."""
    return sleeping_trainjob(gated, NS, 300)


def in_process_reporter(gated, trainjob, token_path, stream):
    """The reporter as rank 0 of ``trainjob`` would make it, with the token at ``token_path``."""
    ca = token_path.parent / "ca.crt"
    ca.write_bytes(gated.status_server.credentials.ca_pem)
    return progress.Reporter(
        10,
        interval=0,
        stream=stream,
        env={
            "PET_NNODES": "1",
            ts.URL_ENV: gated.status_server.url + ts.status_path(NS, trainjob),
            ts.TOKEN_ENV: str(token_path),
            ts.CA_CERT_ENV: str(ca),
        },
    )


def issue(gated, trainjob):
    return gated.tokens.issue(NS, "default", ts.token_audience(NS, trainjob))


class CountingCheck:
    """The status server's token check, noting each token it is given."""

    def __init__(self, verify):
        self.verify, self.checked = verify, []

    def __call__(self, token, audience):
        self.checked.append(token)
        return self.verify(token, audience)


class CheckRotatingFirst:
    """The status server's token check, where a rotation lands between the reporter's read of the token and
    the server's check of it (the kubelet rewrites the file, then the old key is retired)."""

    def __init__(self, gated, trainjob, token_path):
        self.gated, self.trainjob, self.token_path = gated, trainjob, token_path
        self.verify, self.checked = gated.tokens.verify, []

    def __call__(self, token, audience):
        if not self.checked:
            with self.gated.tokens.rotation():
                self.token_path.write_text(issue(self.gated, self.trainjob))
        self.checked.append(token)
        return self.verify(token, audience)


def test_a_token_rotated_between_its_read_and_its_check_is_sent_again(gated, sleeper, tmp_path, monkeypatch):
    path = tmp_path / "token"
    path.write_text(issue(gated, sleeper))
    check = CheckRotatingFirst(gated, sleeper, path)
    monkeypatch.setattr(gated.tokens, "verify", check)
    stream = io.StringIO()
    reporter = in_process_reporter(gated, sleeper, path, stream)
    assert reporter.report(7, loss=0.5)
    reporter.flush()
    # Two tries: the old token (refused once the rotation ended), then the new one, which wrote the step.
    assert len(check.checked) == 2 and check.checked[1] == path.read_text() != check.checked[0]
    assert reporter.server.sent == 1 and step_of(trainer_status(gated, sleeper)) == 7
    assert stream.getvalue() == "" and reporter.transport == "status-server"


def test_a_refused_token_that_did_not_change_is_not_sent_again(gated, sleeper, tmp_path, monkeypatch):
    """A token refused for another reason (here: its key was retired and the file was not rewritten) is not
    retried: the reporter says so once, writes the report on its log line, and backs off."""
    path = tmp_path / "token"
    path.write_text(issue(gated, sleeper))
    with gated.tokens.rotation():
        pass  # the token's key is retired, the file unchanged
    check = CountingCheck(gated.tokens.verify)
    monkeypatch.setattr(gated.tokens, "verify", check)
    stream = io.StringIO()
    reporter = in_process_reporter(gated, sleeper, path, stream)
    assert reporter.report(3, loss=0.5)
    reporter.flush()
    deadline = time.monotonic() + 30
    while progress.LINE_MARKER not in stream.getvalue() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(check.checked) == 1 and reporter.server.sent == 0
    assert stream.getvalue().startswith(progress.LINE_MARKER) and '"step":3' in stream.getvalue()
    assert reporter.transport == "log"  # backing off
