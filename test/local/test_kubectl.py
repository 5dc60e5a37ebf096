"""The local cluster through the real kubectl, with the kubeconfig the cluster writes: HTTPS with
its CA and bearer token, discovery, server-side printing, OpenAPI for `apply`, logs."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import yaml

from nemo_kubeflow.cli import main as console
from nemo_kubeflow_local.apiserver.printers import human_duration

KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(
    KUBECTL is None,
    reason="kubectl is not on PATH (apt install kubectl, or see https://kubernetes.io/docs/tasks/tools/)",
)


@pytest.fixture(scope="module")
def kubectl(cluster, tmp_path_factory):
    """Run kubectl against the cluster as a user would after `export KUBECONFIG=...`; a private
    discovery cache, so no other cluster's cached discovery is read."""
    cache = tmp_path_factory.mktemp("kubectl-cache")
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig_path)}

    def run(*args: str, stdin: str = "", check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            [KUBECTL, f"--cache-dir={cache}", *args], input=stdin, capture_output=True, text=True, timeout=60, env=env
        )
        if check:
            assert proc.returncode == 0, f"kubectl {' '.join(args)}: {proc.stderr}"
        return proc

    return run


def rows(output: str) -> list[list[str]]:
    """`kubectl get` output: the header row, then one row per object, split on whitespace."""
    return [line.split() for line in output.strip().splitlines()]


@needs_kubectl
def test_get_namespaces(kubectl, ns):
    header, *table = rows(kubectl("get", "namespaces").stdout)
    assert header == ["NAME", "STATUS", "AGE"]
    assert [ns, "Active"] in [row[:2] for row in table]
    assert "default" in kubectl("get", "ns", "-o", "name").stdout  # short names from discovery


@needs_kubectl
def test_render_output_applies_and_runs(kubectl, cluster, ns, monkeypatch, capsys):
    monkeypatch.setenv("NEMO_KUBEFLOW_LOCAL_KUBECONFIG", str(cluster.kubeconfig_path))
    assert (
        console.main(
            [
                "render",
                "--factory",
                "kubeflow_local",
                "--set",
                f"namespace={ns}",
                "--name",
                "hello",
                "--",
                "echo hello from kubectl",
            ]
        )
        == 0
    )
    manifests = capsys.readouterr().out
    runtime, trainjob, configmap = yaml.safe_load_all(manifests)
    assert [runtime["kind"], trainjob["kind"], configmap["kind"]] == ["ClusterTrainingRuntime", "TrainJob", "ConfigMap"]
    job = trainjob["metadata"]["name"]

    # Client-side dry run: kubectl reads discovery and OpenAPI, GETs each object, writes nothing.
    out = kubectl("apply", "--dry-run=client", "-f", "-", stdin=manifests).stdout
    assert out.count("created (dry run)") == 3, out
    assert not cluster.objects("trainjobs", ns)

    # Server-side dry run: the server validates (fieldValidation=Strict) and admits, and stores nothing.
    # The TrainJob's runtime must exist first, as with the real Trainer webhook.
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump(runtime))
    out = kubectl("apply", "--dry-run=server", "-f", "-", stdin=manifests).stdout
    assert f"trainjob.trainer.kubeflow.org/{job} created (server dry run)" in out, out
    assert f"configmap/{configmap['metadata']['name']} created (server dry run)" in out, out
    assert not cluster.objects("trainjobs", ns) and not cluster.objects("configmaps", ns)

    # Server-side validation reaches kubectl's users: an unknown field is refused by name.
    bad = dict(trainjob, spec={**trainjob["spec"], "nodez": 2})
    refused = kubectl("apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(bad), check=False)
    assert refused.returncode != 0 and "nodez" in refused.stderr, refused.stderr

    out = kubectl("apply", "-f", "-", stdin=manifests).stdout
    assert f"trainjob.trainer.kubeflow.org/{job} created" in out, out
    header, *table = rows(kubectl("get", "trainjobs", "-n", ns).stdout)
    assert header == ["NAME", "STATE", "AGE"] and table[0][:2] == [job, "Suspended"]
    # A rendered TrainJob is created suspended (a submission resumes it once its ConfigMaps exist).
    kubectl("patch", "trainjob", job, "-n", ns, "--type=merge", "-p", '{"spec": {"suspend": false}}')
    cluster.wait_for(
        lambda: (
            kubectl("get", "trainjob", job, "-n", ns, "-o", "jsonpath={.status.conditions[-1].type}").stdout
            == "Complete"
        ),
        timeout=60,
    )
    assert rows(kubectl("get", "trainjobs", "-n", ns).stdout)[1][:2] == [job, "Complete"]

    # Re-applying the same manifests patches nothing that changed.
    out = kubectl("apply", "-f", "-", stdin=manifests).stdout
    assert f"configmap/{configmap['metadata']['name']} unchanged" in out, out

    # The finished job's pod: listed with its state, described with its events, its log read.
    header, *pods = rows(kubectl("get", "pods", "-n", ns).stdout)
    assert header == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    [[pod, ready, status, restarts, _]] = pods
    assert pod.startswith(f"{job}-node-0-0-") and (ready, status, restarts) == ("0/1", "Completed", "0")
    assert kubectl("get", "pods", "-n", ns, "-o", "wide").stdout.split("\n")[0].split()[-2:] == ["IP", "NODE"]
    described = kubectl("describe", "pod", pod, "-n", ns).stdout
    assert f"Name:             {pod}" in described
    assert "Status:           Succeeded" in described
    assert f"Controlled By:  Job/{job}-node-0" in described  # TrainJob -> JobSet -> Job -> pod
    assert "Started container node" in described  # the pod's events
    assert kubectl("logs", pod, "-n", ns).stdout == "hello from kubectl\n"
    assert kubectl("logs", f"pod/{pod}", "-n", ns, "-c", "node", "--tail=1").stdout == "hello from kubectl\n"
    header, *events = rows(kubectl("get", "events", "-n", ns).stdout)
    assert header == ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    assert ["Normal", "Started", f"pod/{pod}", "Started", "container", "node"] in [row[1:] for row in events]

    # The re-apply set spec.suspend back to the manifests' true (a three-way merge with the live object).
    assert yaml.safe_load(kubectl("get", "trainjob", job, "-n", ns, "-o", "yaml").stdout)["spec"]["suspend"] is True
    assert kubectl("delete", "trainjob", job, "-n", ns).stdout == f'trainjob.trainer.kubeflow.org "{job}" deleted\n'
    cluster.wait_for(lambda: not cluster.objects("pods", ns), timeout=30)


@needs_kubectl
def test_a_kubeconfig_without_the_ca_is_refused(kubectl, cluster, tmp_path):
    """The server's certificate is checked: kubectl trusts it only through the kubeconfig's CA."""
    config = yaml.safe_load(cluster.kubeconfig_path.read_text())
    del config["clusters"][0]["cluster"]["certificate-authority-data"]
    other = tmp_path / "kubeconfig"
    other.write_text(yaml.safe_dump(config))
    proc = kubectl("--kubeconfig", str(other), "get", "namespaces", check=False)
    assert proc.returncode != 0 and "certificate signed by unknown authority" in proc.stderr, proc.stderr


@needs_kubectl
def test_auth_can_i_is_answered_from_the_denial_rules(kubectl, cluster, ns):
    """kubectl sends its SelfSubjectAccessReview in protobuf: the server reads it and answers (in JSON)."""
    cluster.deny("create", "pods", ns)
    cluster.deny("get", "pods/log", ns)
    answers = {
        ("list", "pods", "-n", ns): (0, "yes"),
        ("create", "pods", "-n", ns): (1, "no"),
        ("create", "pods", "-n", "default"): (0, "yes"),
        ("get", "pods", "--subresource=log", "-n", ns): (1, "no"),
        ("get", "/healthz"): (0, "yes"),
    }
    for args, answer in answers.items():
        proc = kubectl("auth", "can-i", *args, check=False)
        assert (proc.returncode, proc.stdout.strip()) == answer, (args, proc.stderr)


def test_ages_read_as_kubectl_prints_them():
    cases = {
        0: "0s",
        59: "59s",
        119: "119s",
        125: "2m5s",
        180: "3m",
        600: "10m",
        3 * 3600: "3h",
        3 * 3600 + 60: "3h1m",
        9 * 3600: "9h",
        3 * 86400 + 3600: "3d1h",
        30 * 86400: "30d",
        3 * 365 * 86400: "3y",
        9 * 365 * 86400: "9y",
    }
    assert {seconds: human_duration(seconds) for seconds in cases} == cases
