"""With ``runtime_name``, a runtime the user may not read (403 on its GET) is no reason to stop: Trainer's
webhook still refuses a missing runtime, job or container; what only we check is said to be unchecked."""

from __future__ import annotations

import copy
import logging

import pytest
from torchx.specs import Role

from nemo_kubeflow import KubeflowExecutor
from nemo_kubeflow.build.plan import build_submission
from nemo_kubeflow.cluster.client import KubernetesCluster
from nemo_kubeflow.cluster.submit import submit
from nemo_kubeflow.config.packager import BundleFile


@pytest.fixture()
def cluster(local):
    local.allow_all()
    return KubernetesCluster(kubeconfig=str(local.kubeconfig_path), backoff=0.01, max_backoff=0.05)


def plan(task, **kw):
    executor = KubeflowExecutor(container_image="img", nodes=1, shm_size=None, **kw)
    role = Role(name=task, image="", entrypoint="bash", args=["-c", "sleep 1"])
    return build_submission(
        executor, role, [BundleFile("a.py", b"print(1)\n")], task_name=task, experiment_id="unreadable-runtime"
    )


def test_a_runtime_the_user_may_not_read_is_submitted_to_saying_what_went_unchecked(local, cluster, caplog):
    runtime = copy.deepcopy(plan("base").runtime)
    runtime["metadata"] = {"name": "admins-runtime", "labels": runtime["metadata"].get("labels", {})}
    cluster.create(runtime)
    name = None
    try:
        local.deny("get", "clustertrainingruntimes")
        local.clear_requests()
        with caplog.at_level(logging.WARNING):
            result = submit(
                cluster,
                plan("unreadable", runtime_name="admins-runtime", tolerations=[{"key": "pool", "operator": "Exists"}]),
            )
        gets = [r.status_code for r in local.requests if (r.verb, r.resource) == ("get", "clustertrainingruntimes")]
        assert gets == [403]  # asked once, refused
        warning = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
        assert "cannot read ClusterTrainingRuntime 'admins-runtime'" in warning
        assert "were not checked" in warning and "tolerations" in warning and "ask an admin for 'get'" in warning
        name = result.trainjob["metadata"]["name"]
        assert name in [o["metadata"]["name"] for o in local.objects("trainjobs", "default")]
    finally:
        local.allow_all()
        if name:
            cluster.delete("TrainJob", name, "default")
        cluster.delete("ClusterTrainingRuntime", "admins-runtime")
