"""A local cluster restarted on the same workdir keeps its API objects (issue 24, item 20).

`python -m nemo_kubeflow_local serve --workdir D` is started, given objects over HTTP, stopped with
SIGTERM and started again on D: what clients made is there again with its uid, a TrainJob that had
finished reads as it did, one that was running reads Failed (its processes are gone) and one that had
not started yet runs when resumed.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from kubernetes import client, config
from localcluster_helpers import (
    condition,
    create_runtime,
    create_trainjob,
    get_trainjob,
    pods_of,
    runtime,
    trainjob,
    unique,
    wait_finished,
)
from polling import wait_for

from nemo_kubeflow_local.apiserver.persistence import INTERRUPTED_REASON, STORE_FILE

REPO = Path(__file__).resolve().parents[2]


class Served:
    """One `serve` process: its banner and clients from the kubeconfig it wrote."""

    def __init__(self, workdir: Path, *extra: str):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nemo_kubeflow_local", "serve", "--workdir", str(workdir), *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        lines = []
        while not lines or not lines[-1].startswith("export KUBECONFIG="):
            line = self.proc.stdout.readline()
            if not line:
                raise AssertionError(f"serve exited ({self.proc.wait()}): {''.join(lines)}")
            lines.append(line)
        self.banner = "".join(lines)
        api = config.new_client_from_config(str(workdir / "kubeconfig"))
        self.core, self.custom = client.CoreV1Api(api), client.CustomObjectsApi(api)

    def wait_for(self, predicate, timeout: float = 30.0):
        return wait_for(predicate, "the local cluster", timeout=timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()


@pytest.fixture
def serve(tmp_path):
    started: list[Served] = []

    def start(*extra: str) -> Served:
        served = Served(tmp_path / "cluster", *extra)
        started.append(served)
        return served

    yield start
    for served in started:
        served.stop()


def test_a_restart_on_the_same_workdir_keeps_the_objects_and_says_what_was_running(serve):
    first = serve()
    assert "API objects kept in" in first.banner and "Restored" not in first.banner
    ns, rt = unique("keep"), unique("rt")
    first.core.create_namespace({"metadata": {"name": ns}})
    create_runtime(first.custom, runtime(rt))
    claim = first.core.create_namespaced_persistent_volume_claim(
        ns,
        {
            "metadata": {"name": "data"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        },
    )
    secret = first.core.create_namespaced_secret(ns, {"metadata": {"name": "tok"}, "stringData": {"TOK": "s3"}})
    config_map = first.core.create_namespaced_config_map(ns, {"metadata": {"name": "code"}, "data": {"a.py": "x"}})

    create_trainjob(first.custom, ns, trainjob("done", rt, ["true"], num_nodes=1))
    done = wait_finished(first, first.custom, ns, "done")
    assert condition(done, "Complete")["status"] == "True"
    create_trainjob(first.custom, ns, trainjob("running", rt, ["sleep", "600"], num_nodes=1))
    first.wait_for(lambda: [p for p in pods_of(first.core, ns, "running") if p.status.phase == "Running"])
    create_trainjob(first.custom, ns, trainjob("later", rt, ["true"], num_nodes=1, suspend=True))
    first.wait_for(lambda: (condition(get_trainjob(first.custom, ns, "later"), "Suspended") or {}).get("status"))
    running_uid = get_trainjob(first.custom, ns, "running")["metadata"]["uid"]
    first.stop()
    assert first.proc.returncode == 0

    second = serve()
    assert "Restored the API objects kept in" in second.banner
    assert (
        f"1 TrainJob(s) were running when it stopped and are now Failed ({INTERRUPTED_REASON}): {ns}/running"
        in second.banner
    )
    # What clients made is there again, the same objects (uids), and the Secret's value unchanged.
    assert second.core.read_namespaced_persistent_volume_claim("data", ns).metadata.uid == claim.metadata.uid
    kept_secret = second.core.read_namespaced_secret("tok", ns)
    assert (kept_secret.metadata.uid, base64.b64decode(kept_secret.data["TOK"])) == (secret.metadata.uid, b"s3")
    assert second.core.read_namespaced_config_map("code", ns).data == config_map.data
    assert second.custom.get_cluster_custom_object("trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes", rt)
    # The finished TrainJob reads as before; the running one is Failed, saying why; none of its pods is left.
    assert get_trainjob(second.custom, ns, "done")["status"]["conditions"] == done["status"]["conditions"]
    interrupted = get_trainjob(second.custom, ns, "running")
    assert interrupted["metadata"]["uid"] == running_uid
    failed = condition(interrupted, "Failed")
    assert (failed["status"], failed["reason"]) == ("True", INTERRUPTED_REASON)
    assert "restarted on the same workdir" in failed["message"] and "submit it again" in failed["message"]
    assert pods_of(second.core, ns, "running") == []
    # The one that had not started runs once resumed.
    second.custom.patch_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", ns, "trainjobs", "later", {"spec": {"suspend": False}}
    )
    assert condition(wait_finished(second, second.custom, ns, "later"), "Complete")["status"] == "True"
    second.stop()

    # Kept again at the second stop: a third start has the resumed job's end too.
    third = serve()
    assert condition(get_trainjob(third.custom, ns, "later"), "Complete")["status"] == "True"
    third.stop()


def test_forget_starts_empty_and_says_so(serve, tmp_path):
    first = serve()
    first.core.create_namespace({"metadata": {"name": "kept-ns"}})
    first.stop()
    assert (tmp_path / "cluster" / STORE_FILE).stat().st_mode & 0o077 == 0  # it holds Secrets: owner only

    forgetful = serve("--forget")
    assert "API objects are not kept: a restart starts empty" in forgetful.banner
    with pytest.raises(client.ApiException) as missing:
        forgetful.core.read_namespace("kept-ns")
    assert missing.value.status == 404


def test_an_unreadable_store_file_stops_the_start_naming_the_file_and_the_way_out(tmp_path):
    workdir = tmp_path / "cluster"
    workdir.mkdir()
    (workdir / STORE_FILE).write_text('{"formatVersion": 1, "objects": {')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [sys.executable, "-m", "nemo_kubeflow_local", "serve", "--workdir", str(workdir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"error: cannot read the API objects kept in {workdir / STORE_FILE}")
    assert "start with --forget" in done.stderr
