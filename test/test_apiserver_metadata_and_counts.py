"""The local API server's metadata-only answers (``PartialObjectMetadataList``, as kube-apiserver serves
them: checked on the real control plane too) and its own request and byte counts per verb and resource."""

import json
import uuid

import pytest

from nemo_kubeflow.cluster.client import METADATA_LIST_ACCEPT, KubernetesCluster

OBJECT_ACCEPT = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"


def _raw(api_client, path, accept, query=()):
    """(HTTP status, parsed body) of a GET sent with this Accept header, errors included."""
    from kubernetes.client.exceptions import ApiException

    try:
        resp = api_client.call_api(
            path,
            "GET",
            query_params=list(query),
            header_params={"Accept": accept},
            auth_settings=["BearerToken"],
            _preload_content=False,
            _return_http_data_only=True,
        )
        return resp.status, json.loads(resp.data)
    except ApiException as error:
        return error.status, json.loads(error.body)


def _configmaps(cluster, namespace):
    for i in range(3):
        cluster.create(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": f"meta-{i}",
                    "namespace": namespace,
                    "labels": {"meta-test": "yes" if i < 2 else "no"},
                },
                "data": {"big": "x" * 2000},
            }
        )


def _check_metadata_answers(cluster, api_client, namespace):
    _configmaps(cluster, namespace)
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    status, body = _raw(api_client, path, METADATA_LIST_ACCEPT, [("labelSelector", "meta-test=yes")])
    assert status == 200
    assert (body["kind"], body["apiVersion"]) == ("PartialObjectMetadataList", "meta.k8s.io/v1")
    assert body["metadata"]["resourceVersion"]
    assert sorted(i["metadata"]["name"] for i in body["items"]) == ["meta-0", "meta-1"]
    for item in body["items"]:
        assert (item["kind"], item["apiVersion"]) == ("PartialObjectMetadata", "meta.k8s.io/v1")
        assert set(item) == {"kind", "apiVersion", "metadata"}  # no data, no spec, no status
        assert item["metadata"]["labels"] == {"meta-test": "yes"} and item["metadata"]["uid"]
    status, one = _raw(api_client, f"{path}/meta-2", OBJECT_ACCEPT)
    assert status == 200 and one["kind"] == "PartialObjectMetadata" and one["metadata"]["name"] == "meta-2"
    assert "data" not in one
    # The list's media type for one object, the object's for a list: refused, not answered in full.
    assert _raw(api_client, f"{path}/meta-2", METADATA_LIST_ACCEPT)[0] == 406
    assert _raw(api_client, path, OBJECT_ACCEPT)[0] == 406
    # What the client sends, and what it makes of the answer.
    found = cluster.list_metadata("ConfigMap", namespace, label_selector="meta-test=yes")
    assert sorted(i["metadata"]["name"] for i in found) == ["meta-0", "meta-1"]
    assert all("data" not in i for i in found)


def test_metadata_only_lists_and_gets(local):
    namespace = f"meta-{uuid.uuid4().hex[:6]}"
    local.create_namespace(namespace)
    _check_metadata_answers(KubernetesCluster(str(local.kubeconfig_path)), local.api_client(), namespace)


@pytest.mark.real
def test_metadata_only_lists_and_gets_on_the_real_control_plane(real_control_plane, real_namespace):
    from kubernetes import config

    api_client = config.new_client_from_config(config_file=str(real_control_plane.kubeconfig_path))
    _check_metadata_answers(KubernetesCluster(str(real_control_plane.kubeconfig_path)), api_client, real_namespace)


def test_the_server_counts_requests_and_response_bytes_per_verb_and_resource(local):
    namespace = f"count-{uuid.uuid4().hex[:6]}"
    local.create_namespace(namespace)
    cluster = KubernetesCluster(str(local.kubeconfig_path))
    _configmaps(cluster, namespace)
    api_client = local.api_client()
    local.clear_api_counters()
    sizes = []
    for accept, query in (
        ("application/json", ()),
        ("application/json", [("labelSelector", "meta-test=yes")]),
        (METADATA_LIST_ACCEPT, ()),
    ):
        resp = api_client.call_api(
            f"/api/v1/namespaces/{namespace}/configmaps",
            "GET",
            query_params=list(query),
            header_params={"Accept": accept},
            auth_settings=["BearerToken"],
            _preload_content=False,
            _return_http_data_only=True,
        )
        sizes.append(len(resp.data))
    resp = api_client.call_api(
        f"/api/v1/namespaces/{namespace}/configmaps/meta-0",
        "GET",
        header_params={"Accept": "application/json"},
        auth_settings=["BearerToken"],
        _preload_content=False,
        _return_http_data_only=True,
    )
    assert cluster.get("ConfigMap", "no-such", namespace) is None  # a 404 is a request too
    counts = {(c.verb, c.resource): (c.requests, c.bytes) for c in local.api_counters()}
    assert counts[("list", "configmaps")] == (3, sum(sizes))
    assert counts[("get", "configmaps")][0] == 2
    assert counts[("get", "configmaps")][1] > len(resp.data)  # the object, and the 404's Status
    assert sizes[2] < sizes[0] / 3  # metadata only: a fraction of the full list
    local.clear_api_counters()
    assert local.api_counters() == []
