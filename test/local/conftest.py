"""Fixtures for the local cluster tests: one cluster per session, a fresh namespace per test."""

from __future__ import annotations

import uuid

import pytest
from kubernetes import client

from nemo_kubeflow_local import LocalCluster


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    with LocalCluster(tmp_path_factory.mktemp("cluster")) as local:
        yield local


@pytest.fixture
def ns(cluster) -> str:
    name = "t-" + uuid.uuid4().hex[:8]
    cluster.create_namespace(name)
    yield name
    cluster.allow_all()
    # The cluster lives for the session: pods a test left would restart (busybox without a command) until its end.
    client.CoreV1Api(cluster.api_client()).delete_collection_namespaced_pod(name, grace_period_seconds=0)


@pytest.fixture(scope="session")
def api(cluster):
    return cluster.api_client()


@pytest.fixture(scope="session")
def core(api) -> client.CoreV1Api:
    return client.CoreV1Api(api)


@pytest.fixture(scope="session")
def custom(api) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)
