"""A client reads its kubeconfig again when the cluster stops taking what it read: a refused credential (401),
a refused connection, a failed TLS handshake. Over HTTP, on the local cluster and (marked `real`) the
upstream kube-apiserver.

- (a) The local cluster restarted on its workdir (a new port, token and CA, the kubeconfig rewritten) under an
  attached `exp.run()`: the wait reads the kubeconfig again and goes on to the job's real end state, which a
  new process reads too. Before, it retried the old port for as long as it waited.
- A rotated CA: a kubeconfig that carries another CA than the server's fails the TLS handshake; once the
  file carries the server's CA, the next request reads it again and goes on.
- (b) A kubeconfig whose exec plugin hands out tokens that are revoked (local: `LocalCluster.issue_api_token`;
  real: a bound service-account token, TokenRequest bound to a Secret, revoked by deleting the Secret, so
  kube-apiserver answers 401): the next looks run the plugin again, once for threads failing together, and
  say so once without the token."""

from __future__ import annotations

import base64
import logging
import os
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nemo_run as run
import pytest
import yaml
from backends import app_id_of, wait_for
from test_e2e import plain
from test_outages_and_gone_jobs import ATTACHED, running_trainjob
from torchx.specs import AppState

from nemo_kubeflow.cluster.client import KubernetesCluster
from nemo_kubeflow.errors import ClusterError
from nemo_kubeflow.nemo_run.scheduler import create_scheduler
from nemo_kubeflow_local import LocalCluster
from nemo_kubeflow_local.apiserver.tls import make_credentials

#: The exec plugin: hands out the token in the file argv[1] (as a cloud CLI hands out its cached token), and
#: appends a line to argv[2] each time it runs.
PLUGIN = """
import json, sys
token_file, runs_file = sys.argv[1:3]
with open(runs_file, "a") as runs:
    runs.write("run\\n")
token = open(token_file).read().strip()
print(json.dumps({"apiVersion": "client.authentication.k8s.io/v1beta1", "kind": "ExecCredential",
                  "status": {"token": token}}))
"""

#: Threads that look at the job at once after the revocation: they read the kubeconfig again once.
LOOKERS = 4


class LocalTokens:
    """Tokens of the local API server (`issue_api_token`), revoked at once."""

    def __init__(self, cluster: LocalCluster):
        self.cluster = cluster

    def issue(self) -> str:
        return self.cluster.issue_api_token(3600)

    def revoke(self, token: str) -> None:
        self.cluster.revoke_api_token(token)

    def close(self) -> None:
        pass


class BoundServiceAccountTokens:
    """Bound service-account tokens of kube-apiserver: a ServiceAccount bound to cluster-admin (for this test,
    removed after it), each token bound to a Secret of its own (TokenRequest `boundObjectRef`); deleting the
    Secret revokes the token (kube-apiserver then answers 401 to it)."""

    ACCOUNT = "reread"

    def __init__(self, cp, namespace: str):
        self.cp, self.namespace, self.issued = cp, namespace, 0
        self.binding = f"{namespace}-{self.ACCOUNT}"
        cp.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": self.ACCOUNT}})
        cp.request(
            "POST",
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            {
                "metadata": {"name": self.binding},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                "subjects": [{"kind": "ServiceAccount", "name": self.ACCOUNT, "namespace": namespace}],
            },
        )
        self.secrets: dict[str, str] = {}

    def issue(self) -> str:
        self.issued += 1
        name = f"{self.ACCOUNT}-binding-{self.issued}"
        secret = self.cp.request("POST", f"/api/v1/namespaces/{self.namespace}/secrets", {"metadata": {"name": name}})
        answer = self.cp.request(
            "POST",
            f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{self.ACCOUNT}/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {
                    "expirationSeconds": 3600,
                    "boundObjectRef": {
                        "apiVersion": "v1",
                        "kind": "Secret",
                        "name": name,
                        "uid": secret["metadata"]["uid"],
                    },
                },
            },
        )
        token = answer["status"]["token"]
        self.secrets[token] = name
        return token

    def revoke(self, token: str) -> None:
        self.cp.request("DELETE", f"/api/v1/namespaces/{self.namespace}/secrets/{self.secrets[token]}")

    def close(self) -> None:
        self.cp.request("DELETE", f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{self.binding}")


@pytest.fixture()
def tokens(backend, request):
    if backend.name == "local":
        made = LocalTokens(request.getfixturevalue("local_cluster"))
    else:
        made = BoundServiceAccountTokens(request.getfixturevalue("real_control_plane"), backend.namespace)
    yield made
    made.close()


def exec_kubeconfig(backend_kubeconfig: str, where: Path) -> tuple[Path, Path, Path, dict]:
    """A kubeconfig for the back end's cluster whose user is the exec plugin; its token file, the plugin's
    runs file, and the cluster entry (server, CA)."""
    config = yaml.safe_load(Path(backend_kubeconfig).read_text())
    [cluster] = config["clusters"]
    plugin, token_file, runs = where / "plugin.py", where / "token", where / "plugin-runs"
    plugin.write_text(PLUGIN)
    runs.write_text("")
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": sys.executable,
            "args": [str(plugin), str(token_file), str(runs)],
            "interactiveMode": "Never",
        }
    }
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": "plugin-user", "user": user}],
        "contexts": [{"name": "plugin", "context": {"cluster": cluster["name"], "user": "plugin-user"}}],
        "current-context": "plugin",
    }
    path = where / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig))
    return path, token_file, runs, cluster["cluster"]


def refused(cluster_entry: dict, token: str) -> bool:
    """Whether the API server answers a request with ``token`` 401 Unauthorized."""
    context = ssl.create_default_context(cadata=base64.b64decode(cluster_entry["certificate-authority-data"]).decode())
    request = urllib.request.Request(f"{cluster_entry['server']}/api", headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, context=context, timeout=10):
            return False
    except urllib.error.HTTPError as error:
        return error.code == 401


def runs_of(runs: Path) -> int:
    return len(runs.read_text().splitlines())


class Said(logging.Handler):
    """The client's log lines (NeMo-Run's Experiment replaces the root logger's handlers, caplog's too)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_a_revoked_exec_plugin_token_runs_the_plugin_again_once_and_the_looks_go_on(backend, tokens, tmp_path):
    kubeconfig, token_file, runs, entry = exec_kubeconfig(backend.kubeconfig, tmp_path)
    first = tokens.issue()
    token_file.write_text(first)
    with run.Experiment("reread-exec", executor=backend.executor(nodes=1, kubeconfig=str(kubeconfig))) as exp:
        exp.add(run.Script(inline="sleep 300"), name="train")
        exp.run(detach=True)
    app_id = app_id_of(exp.jobs[0])
    scheduler = create_scheduler("t")
    try:
        wait_for(lambda: scheduler.describe(app_id).state == AppState.RUNNING, "the job to run", timeout=120)
        before = runs_of(runs)
        second = tokens.issue()
        token_file.write_text(second)
        tokens.revoke(first)
        wait_for(lambda: refused(entry, first), "the API server to refuse the revoked token", timeout=60)
        said, client_log = Said(), logging.getLogger("nemo_kubeflow.cluster.client")
        client_log.addHandler(said)
        start = threading.Barrier(LOOKERS)

        def look(_: int) -> AppState:
            start.wait()
            return scheduler.look_after(app_id, repair=False)[0].state  # a look, not a describe answered again

        try:
            with ThreadPoolExecutor(LOOKERS) as pool:
                states = list(pool.map(look, range(LOOKERS), timeout=120))
        finally:
            client_log.removeHandler(said)
        read_again = [m for m in said.messages if "kubeconfig read again" in m]
        assert states == [AppState.RUNNING] * LOOKERS, (states, read_again)
        assert runs_of(runs) == before + 1, (runs_of(runs), before, read_again)
        assert read_again == [f"kubeconfig read again: {kubeconfig} after HTTP 401 Unauthorized: a new token"]
        assert not any(first in m or second in m for m in said.messages)
    finally:
        scheduler.cancel(app_id)


def test_an_attached_wait_reads_the_kubeconfig_again_after_the_local_cluster_restarted(tmp_path, nemorun_home):
    workdir = tmp_path / "lc"
    cluster = LocalCluster(workdir, persist=True).start()
    try:
        marker = tmp_path / "never"  # the job runs until the cluster stops under it
        env = {**os.environ, "NEMORUN_HOME": str(nemorun_home), "COLUMNS": "300"}
        proc = subprocess.Popen(
            [sys.executable, "-c", ATTACHED, str(cluster.kubeconfig_path), str(marker), "restart", "1"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=tmp_path,
        )
        try:
            name = running_trainjob(cluster, "restart", proc)
            time.sleep(3)  # the wait looks (every 2 s), its watches and the log follower are open
            old_url, old_token = cluster.url, cluster._token
            cluster.stop()
            time.sleep(5)  # the wait finds nothing at the old port for a while
            assert proc.poll() is None, proc.stdout.read()
            cluster = LocalCluster(workdir, persist=True).start()
            out, _ = proc.communicate(timeout=150)
        finally:
            proc.kill()
        text = " ".join(plain(out).split())
        assert "FINAL STATE FAILED" in text, text[-3000:]
        read_again = [line for line in plain(out).splitlines() if "kubeconfig read again" in line]
        # Once when the burst of refused connections began (the old file, nothing changed, or already the new
        # one), once more when the file was rewritten: no read per failed try.
        assert 1 <= len(read_again) <= 2, read_again
        assert all("after a refused connection" in line for line in read_again), read_again
        assert f"server {old_url} -> {cluster.url}, a new token, a new CA" in read_again[-1], read_again
        assert len(read_again) == 1 or "nothing changed" in read_again[0], read_again
        assert old_token not in out and cluster._token not in out
        # A new process reads the same end.
        described = create_scheduler("t").describe(f"{cluster.namespace}:{name}")
        assert described.state == AppState.FAILED, described
        trainjob = next(j for j in cluster.objects("trainjobs", "default") if j["metadata"]["name"] == name)
        [failed] = [c for c in trainjob["status"]["conditions"] if c["type"] == "Failed"]
        assert failed["reason"] == "LocalClusterRestarted", failed
        assert "LocalClusterRestarted" in text or "the local cluster was stopped while this TrainJob ran" in text, text[
            -3000:
        ]
    finally:
        cluster.stop()


def with_ca(kubeconfig: Path, ca_pem: bytes, to: Path) -> None:
    """``kubeconfig`` with its cluster's CA replaced by ``ca_pem``, written to ``to`` (renamed into place, as a
    tool that rotates it does)."""
    config = yaml.safe_load(kubeconfig.read_text())
    config["clusters"][0]["cluster"]["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
    partial = to.with_suffix(".partial")
    partial.write_text(yaml.safe_dump(config))
    os.replace(partial, to)


def test_a_rotated_ca_is_read_again_after_the_tls_failure(local, tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    with_ca(local.kubeconfig_path, make_credentials().ca_pem, kubeconfig)  # another CA than the server's
    cluster = KubernetesCluster(str(kubeconfig), max_attempts=2, backoff=0.01)
    said, client_log = Said(), logging.getLogger("nemo_kubeflow.cluster.client")
    client_log.addHandler(said)
    level = client_log.level
    client_log.setLevel(logging.INFO)  # "nothing changed" is said at INFO
    try:
        with pytest.raises(ClusterError, match="CERTIFICATE_VERIFY_FAILED"):
            cluster.list("Namespace", None)
        unchanged = [m for m in said.messages if "kubeconfig read again" in m]
        with_ca(local.kubeconfig_path, local.ca_pem, kubeconfig)  # the CA rotated in the file
        names = [ns["metadata"]["name"] for ns in cluster.list("Namespace", None)]
    finally:
        client_log.removeHandler(said)
        client_log.setLevel(level)
    assert "default" in names
    # One read in the failing burst (its tries did not read again), one more once the file changed.
    tls = f"kubeconfig read again: {kubeconfig} after a TLS failure ([SSL: CERTIFICATE_VERIFY_FAILED] certificate"
    assert len(unchanged) == 1 and unchanged[0].startswith(tls), unchanged
    assert unchanged[0].endswith(": nothing changed"), unchanged
    read_again = [m for m in said.messages if "kubeconfig read again" in m]
    assert len(read_again) == 2 and read_again[1].startswith(tls) and read_again[1].endswith(": a new CA"), read_again


pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
