"""Starting and stopping: nothing is left running; the `serve` command."""

from __future__ import annotations

import os
import signal
import threading
import time

from kubernetes import client, config
from localcluster_helpers import (
    children_of,
    container_pid,
    create_runtime,
    create_trainjob,
    group_alive,
    pods_of,
    runtime,
    trainjob,
)

from nemo_kubeflow_local import LocalCluster
from nemo_kubeflow_local.__main__ import main


def test_stop_kills_every_process_and_removes_the_temporary_workdir():
    before = set(children_of())
    cluster = LocalCluster().start()
    workdir = cluster.workdir
    api = cluster.api_client()
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    create_runtime(custom, runtime("sleepy"))
    create_trainjob(custom, "default", trainjob("sleepy", "sleepy", ["bash", "-c", "sleep 60 & sleep 60"]))
    cluster.wait_for(lambda: len([p for p in pods_of(core, "default", "sleepy") if p.status.phase == "Running"]) == 2)
    groups = [container_pid(p) for p in pods_of(core, "default", "sleepy")]
    assert all(group_alive(pgid) for pgid in groups)

    cluster.stop()
    assert not any(group_alive(pgid) for pgid in groups)
    assert set(children_of()) <= before
    assert not workdir.exists()


def test_a_given_workdir_is_kept(tmp_path):
    with LocalCluster(tmp_path) as cluster:
        assert cluster.kubeconfig_path == tmp_path / "kubeconfig"
    assert (tmp_path / "kubeconfig").exists()


def test_serve_command(tmp_path, capsys):
    """`python -m nemo_kubeflow_local serve` runs `main`; run it here (a subprocess would spend seconds
    importing nemo_kubeflow's NeMo-Run registration) and stop it with SIGTERM, as a terminal would."""
    kubeconfig = tmp_path / "kubeconfig"
    namespaces: list[str] = []

    def use_then_stop():
        deadline = time.monotonic() + 20
        while not kubeconfig.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        try:
            configuration = client.Configuration()
            config.load_kube_config(str(kubeconfig), client_configuration=configuration)
            api = client.CoreV1Api(client.ApiClient(configuration))
            namespaces.extend(n.metadata.name for n in api.list_namespace().items)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)

    handler = signal.getsignal(signal.SIGTERM)
    threading.Thread(target=use_then_stop, daemon=True).start()
    assert main(["serve", "--workdir", str(tmp_path)]) == 0
    assert "default" in namespaces
    assert f"export KUBECONFIG={kubeconfig}" in capsys.readouterr().out
    assert signal.getsignal(signal.SIGTERM) == handler  # the previous handler is back
