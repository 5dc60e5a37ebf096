"""The local cluster's emulation of Trainer v2.3.0's TrainJobStatus status server, over HTTPS: what it
accepts (the Kubeflow SDK's request, as nemo_kubeflow.progress sends it), what it refuses and how (its
metav1.Status answers), its throttling, and the env, token and CA it gives the trainer pods."""

import json
import ssl
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager

import pytest
from torchx.specs import Role

from nemo_kubeflow import KubeflowExecutor, progress
from nemo_kubeflow.build.plan import build_submission
from nemo_kubeflow.cluster.client import KubernetesCluster
from nemo_kubeflow.cluster.submit import submit
from nemo_kubeflow.config.packager import BundleFile
from nemo_kubeflow_local import LocalCluster
from nemo_kubeflow_local.controllers import trainjob_status as ts

NS = "status-server"


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    with gated_cluster(tmp_path_factory.mktemp("gated"), NS) as cluster:
        yield cluster


@contextmanager
def gated_cluster(workdir, namespace):
    """A local cluster with the TrainJobStatus gate on, and ``namespace`` in it."""
    with LocalCluster(workdir=workdir, feature_gates=(ts.FEATURE_GATE,)) as cluster:
        cluster.create_namespace(namespace)
        yield cluster


@pytest.fixture(scope="module")
def job(gated):
    """A TrainJob whose one node sleeps (its pod shows what the plugin gave it)."""
    return sleeping_trainjob(gated, NS, 120)


def sleeping_trainjob(cluster, namespace, seconds):
    """Submit a TrainJob whose one node sleeps ``seconds``; returns its name."""
    executor = KubeflowExecutor(container_image="img", nodes=1, shm_size=None, namespace=namespace)
    role = Role(name="train", image="", entrypoint="bash", args=["-c", f"sleep {seconds}"])
    sub = build_submission(
        executor, role, [BundleFile("code/a.py", b"print(1)\n")], task_name="train", experiment_id=namespace
    )
    submit(KubernetesCluster(kubeconfig=str(cluster.kubeconfig_path)), sub)
    return sub.name


def post(gated, path, body, token=None, raw=None):
    context = ssl.create_default_context(cadata=gated.status_server.credentials.ca_pem.decode())
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(
        gated.status_server.url + path,
        data=raw if raw is not None else json.dumps(body).encode(),
        method="POST",
        headers=headers,
    )
    try:
        with urllib.request.urlopen(request, context=context, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def token_for(gated, name, namespace=NS):
    return gated.tokens.issue(namespace, "default", ts.token_audience(namespace, name), 600)


def trainer_status(gated, name):
    [trainjob] = [j for j in gated.objects("trainjobs", NS) if j["metadata"]["name"] == name]
    return (trainjob.get("status") or {}).get("trainerStatus")


def test_the_sdks_request_is_applied_and_echoed(gated, job):
    body = {"trainerStatus": progress.Report(5, 50, {"loss": 0.5}, time.time(), 1.0).trainer_status()}
    code, answer = post(gated, ts.status_path(NS, job), body, token_for(gated, job))
    assert code == 200 and answer == body
    assert trainer_status(gated, job) == body["trainerStatus"]
    # What it sent replaces what it sent before (server-side apply by one field manager).
    smaller = {"trainerStatus": {"lastUpdatedTime": "2026-11-27T09:00:00+00:00", "progressPercentage": 20}}
    assert post(gated, ts.status_path(NS, job), smaller, token_for(gated, job))[0] == 200
    assert trainer_status(gated, job) == smaller["trainerStatus"]
    # No trainerStatus: nothing applied, the request echoed.
    assert post(gated, ts.status_path(NS, job), {}, token_for(gated, job)) == (200, {})
    assert trainer_status(gated, job) == smaller["trainerStatus"]


@pytest.mark.parametrize("case", ["no token", "garbage", "other job's audience", "other namespace"])
def test_a_token_not_for_this_trainjob_is_forbidden(gated, job, case):
    token = {
        "no token": None,
        "garbage": "a.b.c",
        "other job's audience": token_for(gated, "other"),
        "other namespace": gated.tokens.issue("elsewhere", "default", ts.token_audience(NS, job), 600),
    }[case]
    code, answer = post(gated, ts.status_path(NS, job), {"trainerStatus": {"lastUpdatedTime": "x"}}, token)
    assert (code, answer["reason"], answer["message"]) == (403, "Forbidden", "Forbidden")


def test_refusals_are_metav1_statuses(gated, job):
    path, token = ts.status_path(NS, job), token_for(gated, job)
    assert post(gated, path, None, token, raw=b"{not json")[1]["message"] == "Invalid payload"
    code, answer = post(gated, path, {"trainerStatus": {"progressPercentage": 50}}, token)
    assert code == 422 and "lastUpdatedTime is required when trainerStatus is present" in answer["message"]
    code, answer = post(gated, path, {"trainerStatus": {"lastUpdatedTime": "x", "progressPercentage": 101}}, token)
    assert code == 422 and "progressPercentage" in answer["message"]
    code, answer = post(gated, path, None, token, raw=b" " * (ts.MAX_BODY + 1))
    assert (code, answer["reason"]) == (413, "RequestEntityTooLarge")
    gone = "no-such-job"
    code, answer = post(
        gated, ts.status_path(NS, gone), {"trainerStatus": {"lastUpdatedTime": "x"}}, token_for(gated, gone)
    )
    assert (code, answer["message"]) == (404, "Train job not found")
    assert post(gated, "/healthz", {}, token)[1]["message"] == "Not found"


def test_updates_beyond_the_burst_wait_for_the_qps():
    """Trainer's status-server client: QPS 5, burst 10; a request beyond waits for its turn (a clock stands
    still here, so the waits add up), none is refused."""
    now, slept = [0.0], []
    limiter = ts.RateLimiter(clock=lambda: now[0], sleep=slept.append)
    for _ in range(15):
        limiter.wait()
    assert limiter.waited == 5 and slept == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])


def test_concurrent_updates_all_succeed(gated, job):
    body = {"trainerStatus": {"lastUpdatedTime": "2026-11-27T09:00:00+00:00"}}
    codes = []
    threads = [
        threading.Thread(
            target=lambda: codes.append(post(gated, ts.status_path(NS, job), body, token_for(gated, job))[0])
        )
        for _ in range(15)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert codes == [200] * 15


def test_the_trainer_pods_get_the_url_the_ca_and_a_token_for_their_trainjob(gated, job):
    [pod] = gated.wait_for(
        lambda: [
            p
            for p in gated.objects("pods", NS)
            if p["metadata"]["name"].startswith(job) and p.get("status", {}).get("phase") == "Running"
        ],
        timeout=60,
    )
    [node] = [c for c in pod["spec"]["containers"] if c["name"] == "node"]
    env = {e["name"]: e.get("value") for e in node["env"]}
    assert env[ts.URL_ENV] == gated.status_server.url + ts.status_path(NS, job)
    assert env[ts.TOKEN_ENV] == f"{ts.MOUNT_PATH}/token" and env[ts.CA_CERT_ENV] == f"{ts.MOUNT_PATH}/ca.crt"
    [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == ts.VOLUME_NAME]
    token_source = volume["projected"]["sources"][0]["serviceAccountToken"]
    assert token_source == {"audience": ts.token_audience(NS, job), "expirationSeconds": 3600, "path": "token"}
    [config] = [c for c in gated.objects("configmaps", NS) if c["metadata"]["name"] == f"{job}-tls-config"]
    assert config["data"]["ca.crt"] == gated.status_server.credentials.ca_pem.decode()
    assert config["metadata"]["ownerReferences"][0]["kind"] == "TrainJob"
    # The kubelet wrote the token and the CA where the env says (remapped into the pod's directory).
    volume_dir = gated.workdir / "pods" / NS / pod["metadata"]["name"] / "volumes" / ts.VOLUME_NAME
    token = (volume_dir / "token").read_text()
    assert gated.tokens.verify(token, ts.token_audience(NS, job))["kubernetes.io"]["namespace"] == NS
    assert (volume_dir / "ca.crt").read_bytes() == gated.status_server.credentials.ca_pem
    # nemo_kubeflow.progress, given that env (paths as the kubelet remapped them), writes through the server.
    reporter = progress.Reporter(
        10,
        interval=0,
        env={
            "PET_NNODES": "1",
            ts.URL_ENV: env[ts.URL_ENV],
            ts.TOKEN_ENV: str(volume_dir / "token"),
            ts.CA_CERT_ENV: str(volume_dir / "ca.crt"),
        },
    )
    assert reporter.transport == "status-server"
    reporter.report(10, loss=0.125)
    reporter.flush(timeout=30)
    assert reporter.server is not None and reporter.server.sent == 1
    metrics = {m["name"]: m["value"] for m in trainer_status(gated, job)["metrics"]}
    assert metrics == {"step": "10", "total_steps": "10", "loss": "0.125"}
