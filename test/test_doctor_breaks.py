"""`nemo-kubeflow doctor` when things are broken: a Secret it may not create, a configuration error, a
kubeconfig that does not exist, a server at a dead port, one that accepts connections and never answers,
one that stops answering midway. Each ends in a verdict line, within its bound (docs/cli.md), and every
warn and FAIL line carries its fix."""

import base64
import json
import socket
import subprocess
import sys
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from nemo_kubeflow.cli.doctor import ANSWER_WITHIN_S, DOCTOR_WITHIN_S
from nemo_kubeflow_local.apiserver.tls import make_credentials

CPU = ["--factory", "kubeflow_cpu", "--set", "shm_size=None"]
#: Well above doctor's bound: a doctor still running then hangs.
ENDS_WITHIN_S = DOCTOR_WITHIN_S + 30
VERDICTS = ("a job can run; ", "check(s) failed: a job cannot run as configured; ")


def run_doctor(kubeconfig, *argv):
    """Doctor in its own process (bounded: a hang fails the test); its exit code and stdout lines."""
    done = subprocess.run(
        [sys.executable, "-m", "nemo_kubeflow.cli.main", "doctor", *CPU, "--kubeconfig", str(kubeconfig), *argv],
        capture_output=True,
        text=True,
        timeout=ENDS_WITHIN_S,
    )
    return done.returncode, done.stdout.splitlines()


def findings(lines):
    return [entry for entry in lines if entry.startswith(("warn  ", "FAIL  "))]


def assert_well_formed(lines):
    """Every line ok/warn/FAIL but the last, the verdict; every warn and FAIL with its fix."""
    text = "\n".join(lines)
    assert lines and any(v in lines[-1] for v in VERDICTS), text
    assert all(entry.startswith(("ok    ", "warn  ", "FAIL  ")) for entry in lines[:-1]), text
    assert all("; fix: " in entry for entry in findings(lines)), text


def kubeconfig_at(tmp_path, server):
    path = tmp_path / "kubeconfig"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    return path


@contextmanager
def silent_server():
    """A server on 127.0.0.1 that accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    accepted, stop = [], threading.Event()

    def accept():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        for conn in accepted:
            conn.close()
        listener.close()


@contextmanager
def server_that_stops_answering():
    """A server that answers Trainer's discovery (doctor's first request), then nothing else."""
    release = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path.startswith("/apis/trainer.kubeflow.org"):
                body = json.dumps(
                    {"versions": [{"groupVersion": "trainer.kubeflow.org/v1alpha1", "version": "v1alpha1"}]}
                )
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())
            else:
                release.wait(ENDS_WITHIN_S)

        do_POST = do_GET

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        release.set()
        server.shutdown()
        server.server_close()


def dead_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_secret_env_vars_without_create_secrets_fails_with_its_fix(local):
    local.deny("create", "secrets", "default")
    try:
        code, lines = run_doctor(local.kubeconfig_path, "--set", 'secret_env_vars={"HF_TOKEN": "env:HOME"}')
    finally:
        local.allow_all()
    assert code == 1, "\n".join(lines)
    assert (
        "FAIL  may not create secrets in default: no secret_env_vars (their values are sent as a Secret); "
        "fix: ask an admin for RBAC: create secrets in default, or drop secret_env_vars"
    ) in "\n".join(lines)
    assert "check(s) failed" in lines[-1]
    assert_well_formed(lines)


def test_a_configuration_error_is_one_fail_before_any_cluster_check(local):
    code, lines = run_doctor(local.kubeconfig_path, "--set", "gpus_per_node=-1")
    assert code == 1
    assert len(lines) == 2, "\n".join(lines)
    assert lines[0].startswith(
        "FAIL  configuration: gpus_per_node=-1: must be an integer >= 0; fix: give gpus_per_node"
    )
    assert lines[1] == "1 check(s) failed: a job cannot run as configured; 0 warning(s)"


def test_a_value_the_executor_cannot_be_built_from_is_one_fail(local):
    code, lines = run_doctor(local.kubeconfig_path, "--set", "gpus_per_node=abc")
    assert code == 1
    assert len(lines) == 2 and lines[0].startswith("FAIL  configuration: --set gpus_per_node=abc"), "\n".join(lines)
    assert_well_formed(lines)


def test_a_job_that_cannot_be_rendered_is_a_fail_with_its_fix(local, tmp_path):
    code, lines = run_doctor(local.kubeconfig_path, "--set", f"runtime_template={tmp_path / 'no-such.yaml.j2'}")
    assert code == 1
    assert line_starting(lines, "FAIL  cannot render the job: ")
    assert_well_formed(lines)


def test_a_kubeconfig_that_does_not_exist_is_one_fail(tmp_path):
    code, lines = run_doctor(tmp_path / "no-such-kubeconfig")
    assert code == 1
    assert len(lines) == 2, "\n".join(lines)
    assert lines[0].startswith("FAIL  cannot read the kubeconfig: kubeconfig ")
    assert "does not exist; fix: check the kubeconfig path" in lines[0]
    assert_well_formed(lines)


def test_a_server_at_a_dead_port_is_one_fail(tmp_path):
    port = dead_port()
    code, lines = run_doctor(kubeconfig_at(tmp_path, f"http://127.0.0.1:{port}"))
    assert code == 1
    assert len(lines) == 2, "\n".join(lines)
    assert lines[0].startswith(
        f"FAIL  cannot reach the cluster: the API server at http://127.0.0.1:{port} did not answer"
    )
    assert "; fix: check the kubeconfig path" in lines[0] and "the server address" in lines[0]
    assert "install Trainer" not in "\n".join(lines)
    assert_well_formed(lines)


def test_a_kubeconfig_with_another_ca_is_one_fail_naming_the_ca(local, tmp_path):
    """A CA that does not sign the server's certificate is said as such, not as refused credentials."""
    config = yaml.safe_load(local.kubeconfig_path.read_text())
    other_ca = make_credentials().ca_pem
    config["clusters"][0]["cluster"]["certificate-authority-data"] = base64.b64encode(other_ca).decode()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    code, lines = run_doctor(kubeconfig)
    assert code == 1
    assert len(lines) == 2, "\n".join(lines)
    assert lines[0].startswith("FAIL  cannot trust the API server's certificate: "), lines[0]
    assert "CERTIFICATE_VERIFY_FAILED" in lines[0] and "certificate-authority" in lines[0]
    assert "expired token" not in lines[0]
    assert_well_formed(lines)


def test_a_server_that_never_answers_is_one_fail_within_the_bound(tmp_path):
    with silent_server() as server:
        code, lines = run_doctor(kubeconfig_at(tmp_path, server))
    assert code == 1
    assert len(lines) == 2, "\n".join(lines)
    assert lines[0].startswith(
        f"FAIL  cannot reach the cluster: the API server at {server} did not answer within {ANSWER_WITHIN_S} s; fix: "
    )
    assert_well_formed(lines)


def test_a_server_that_stops_answering_midway_ends_in_a_verdict(tmp_path):
    with server_that_stops_answering() as server:
        code, lines = run_doctor(kubeconfig_at(tmp_path, server))
    assert code == 1
    assert line_starting(lines, f"FAIL  the cluster stopped answering: the API server at {server} did not answer")
    assert_well_formed(lines)


def line_starting(lines, start):
    found = [entry for entry in lines if entry.startswith(start)]
    assert found, "\n".join(lines)
    return found[0]


@pytest.mark.parametrize(
    "situation",
    ["healthy", "namespace missing", "rights denied", "unreachable", "bad config", "queue missing"],
)
def test_every_warn_and_fail_line_carries_its_fix(situation, local, tmp_path):
    kubeconfig, argv = local.kubeconfig_path, []
    if situation == "namespace missing":
        argv = ["--namespace", "no-such-namespace"]
    elif situation == "unreachable":
        kubeconfig = kubeconfig_at(tmp_path, f"http://127.0.0.1:{dead_port()}")
    elif situation == "bad config":
        argv = ["--set", "nodes=0"]
    elif situation == "queue missing":
        argv = ["--set", "queue_name=no-such-queue", "--set", "runtime_name=no-such-runtime"]
    elif situation == "rights denied":
        for verb, resource in (("create", "trainjobs"), ("get", "namespaces"), ("list", "pods")):
            local.deny(verb, resource, "default" if resource != "namespaces" else None)
    try:
        code, lines = run_doctor(kubeconfig, *argv)
    finally:
        local.allow_all()
    assert code == (0 if situation == "healthy" else 1), "\n".join(lines)
    assert_well_formed(lines)
    if situation != "healthy":
        assert findings(lines), "\n".join(lines)
