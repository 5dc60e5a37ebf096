"""Kueue by what the server serves: the client asks once per process which Kueue versions the API server
serves and reads LocalQueues, Workloads and ClusterQueues in v1beta2 where it is served, v1beta1 only
where v1beta2 is not (Kueue before v0.15). Each test runs a local cluster serving the versions a Kueue
release serves: both (v0.15 to v0.19), only v1beta2 (v0.20), only v1beta1 (before v0.15)."""

import socket
import time

import pytest
from kubernetes import client
from kueue_api import kueue_version
from nemo_run.run.torchx_backend.components import torchrun

from nemo_kubeflow import KubeflowExecutor
from nemo_kubeflow.build.plan import build_submission
from nemo_kubeflow.cluster.client import KubernetesCluster
from nemo_kubeflow.cluster.submit import check_queue, submit
from nemo_kubeflow.config.packager import BundleFile
from nemo_kubeflow.constants import KUEUE_GROUP
from nemo_kubeflow.errors import NotFoundError
from nemo_kubeflow.nemo_run.scheduler import create_scheduler
from nemo_kubeflow_local import LocalCluster


def _queue(api_client, name: str, version: str, stop_policy: str = "None") -> None:
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        KUEUE_GROUP,
        version,
        "default",
        "localqueues",
        {
            "apiVersion": f"{KUEUE_GROUP}/{version}",
            "kind": "LocalQueue",
            "metadata": {"name": name},
            "spec": {"clusterQueue": "cluster-queue", "stopPolicy": stop_policy},
        },
    )


def _kueue_requests(local) -> list:
    return [r.path for r in local.requests if r.path.startswith(f"/apis/{KUEUE_GROUP}")]


@pytest.mark.parametrize(
    "served, expected",
    [
        (("v1beta2", "v1beta1"), "v1beta2"),
        (("v1beta2",), "v1beta2"),
        (("v1beta1",), "v1beta1"),
    ],
)
def test_queue_lookups_use_the_preferred_version_the_server_serves(tmp_path, served, expected):
    with LocalCluster(workdir=tmp_path / "cluster", kueue_versions=served) as local:
        assert kueue_version(local.api_client()) == expected
        _queue(local.api_client(), "team", expected)
        cluster = KubernetesCluster(str(local.kubeconfig_path))
        local.clear_requests()
        check_queue(cluster, "default", "team")  # found: no error
        with pytest.raises(NotFoundError, match="queues in this namespace: team"):
            check_queue(cluster, "default", "missing")
        # Asked once for this server (discovery), then every look-up in the served version.
        paths = _kueue_requests(local)
        assert paths[0] == f"/apis/{KUEUE_GROUP}" and paths.count(f"/apis/{KUEUE_GROUP}") == 1
        assert all(p.startswith(f"/apis/{KUEUE_GROUP}/{expected}/") for p in paths[1:]), paths
        assert len(paths) == 4  # discovery, get team, get missing, list


def test_a_new_server_at_an_address_asked_before_is_asked_again(tmp_path):
    """Served versions are remembered per server, not per address: a cluster rebuilt at one address (here a local
    cluster on the port another served on, as test clusters come and go) may serve other versions."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with LocalCluster(workdir=tmp_path / "old", kueue_versions=("v1beta2", "v1beta1"), port=port) as old:
        assert KubernetesCluster(str(old.kubeconfig_path)).served_versions(KUEUE_GROUP) == ("v1beta2", "v1beta1")
        old_server = KubernetesCluster(str(old.kubeconfig_path)).api_client.configuration.host
    with LocalCluster(workdir=tmp_path / "new", kueue_versions=("v1beta2",), port=port) as new:
        cluster = KubernetesCluster(str(new.kubeconfig_path))
        assert cluster.api_client.configuration.host == old_server
        assert cluster.served_versions(KUEUE_GROUP) == ("v1beta2",)
        new.clear_requests()
        assert KubernetesCluster(str(new.kubeconfig_path)).served_versions(KUEUE_GROUP) == ("v1beta2",)
        assert _kueue_requests(new) == []  # the same server again: remembered


def test_a_kueue_that_serves_only_v1beta2_still_says_why_a_job_waits(tmp_path, monkeypatch):
    """As Kueue v0.20 ships: the queue check passes and describe gives Kueue's reason from the Workload."""
    with LocalCluster(workdir=tmp_path / "cluster", kueue_versions=("v1beta2",)) as local:
        monkeypatch.setenv("KUBECONFIG", str(local.kubeconfig_path))  # describe without a record of the job
        api = client.ApiClient(local.api_client().configuration)
        with pytest.raises(client.ApiException) as gone:  # v1beta1 is not served at all
            client.CustomObjectsApi(api).list_namespaced_custom_object(KUEUE_GROUP, "v1beta1", "default", "localqueues")
        assert gone.value.status == 404
        local.clear_requests()
        _queue(local.api_client(), "waiting", "v1beta2", stop_policy="Hold")
        executor = KubeflowExecutor(
            container_image="python:3.11",
            nodes=1,
            shm_size=None,
            queue_name="waiting",
            kubeconfig=str(local.kubeconfig_path),
            experiment_id="v1beta2only_1",
        )
        role = executor.macro_values().apply(torchrun.torchrun("train.py", script="train.py", j="1x1").roles[0])
        sub = build_submission(executor, role, [BundleFile("code/train.py", b"print('hi')\n", 0o644)], task_name="t")
        submit(KubernetesCluster(str(local.kubeconfig_path)), sub)
        app_id = f"default:{sub.name}"
        scheduler = create_scheduler("t")
        desc = scheduler.describe(app_id)
        for _ in range(50):
            if desc is not None and "inactive" in desc.msg:
                break
            time.sleep(0.2)
            desc = scheduler.describe(app_id)
        assert desc is not None and desc.msg == (
            "waiting for queue waiting to admit it: Inadmissible: LocalQueue waiting is inactive"
        ), desc and desc.msg
        assert not [r for r in local.requests if r.path.startswith(f"/apis/{KUEUE_GROUP}/v1beta1")]


def test_the_local_cluster_converts_v1beta1_objects_to_and_from_v1beta2(tmp_path):
    """Serving both, one stored object reads in either version with that version's fields."""
    with LocalCluster(workdir=tmp_path / "cluster") as local:
        custom = client.CustomObjectsApi(local.api_client())
        custom.create_cluster_custom_object(
            KUEUE_GROUP,
            "v1beta1",
            "clusterqueues",
            {
                "apiVersion": f"{KUEUE_GROUP}/v1beta1",
                "kind": "ClusterQueue",
                "metadata": {"name": "cq"},
                "spec": {"cohort": "team", "namespaceSelector": {}, "resourceGroups": []},
            },
        )
        new = custom.get_cluster_custom_object(KUEUE_GROUP, "v1beta2", "clusterqueues", "cq")
        old = custom.get_cluster_custom_object(KUEUE_GROUP, "v1beta1", "clusterqueues", "cq")
        assert new["apiVersion"] == f"{KUEUE_GROUP}/v1beta2" and new["spec"]["cohortName"] == "team"
        assert "cohort" not in new["spec"]
        assert old["apiVersion"] == f"{KUEUE_GROUP}/v1beta1" and old["spec"]["cohort"] == "team"
        listed = custom.list_cluster_custom_object(KUEUE_GROUP, "v1beta1", "clusterqueues")
        assert listed["apiVersion"] == f"{KUEUE_GROUP}/v1beta1" and listed["items"][0]["spec"]["cohort"] == "team"


@pytest.mark.real
def test_the_real_kueue_is_read_in_the_version_it_serves(real_control_plane, real_namespace):
    """With $NEMO_KUBEFLOW_REAL_KUEUE_V1BETA1=unserved, Kueue's CRDs serve only v1beta2 (as v0.20 ships)."""
    cluster = KubernetesCluster(str(real_control_plane.kubeconfig_path))
    served = cluster.served_versions(KUEUE_GROUP)
    expected = ("v1beta2",) if not real_control_plane.kueue_v1beta1_served else ("v1beta2", "v1beta1")
    assert served == expected
    api = client.ApiClient(cluster.api_client.configuration)
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        KUEUE_GROUP,
        "v1beta2",
        real_namespace,
        "localqueues",
        {
            "apiVersion": f"{KUEUE_GROUP}/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": "team"},
            "spec": {"clusterQueue": "cluster-queue"},
        },
    )
    check_queue(cluster, real_namespace, "team")
    with pytest.raises(NotFoundError, match="queues in this namespace: team"):
        check_queue(cluster, real_namespace, "missing")
