"""The local API server's chunked lists (``limit`` and ``continue``), as kube-apiserver serves them: at most
``limit`` items in key order, ``metadata.continue`` when more match, ``remainingItemCount`` only without a
selector; in full and metadata-only lists. Checked on the real control plane too."""

import base64
import json
import socket
import time
import uuid

import pytest
from test_apiserver_metadata_and_counts import _configmaps, _raw

from nemo_kubeflow.cluster.client import METADATA_LIST_ACCEPT, KubernetesCluster


def _names(body):
    return [item["metadata"]["name"] for item in body["items"]]


def _check_chunks(cluster, api_client, namespace):
    _configmaps(cluster, namespace)  # meta-0, meta-1 (labelled meta-test=yes), meta-2 (no)
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    configmaps = [name for name in _names(_raw(api_client, path, "application/json")[1]) if name.startswith("meta-")]
    assert configmaps == ["meta-0", "meta-1", "meta-2"]  # key order
    everything = len(_raw(api_client, path, "application/json")[1]["items"])  # kube-root-ca.crt on the real one

    status, first = _raw(api_client, path, "application/json", [("limit", "2")])
    assert status == 200 and len(first["items"]) == 2
    assert first["metadata"]["continue"] and first["metadata"]["remainingItemCount"] == everything - 2
    status, rest = _raw(
        api_client, path, "application/json", [("limit", "2"), ("continue", first["metadata"]["continue"])]
    )
    assert status == 200 and bool(rest["metadata"].get("continue")) == (everything > 4)
    if everything <= 4:
        assert _names(first) + _names(rest) == _names(_raw(api_client, path, "application/json")[1])

    # With a selector: no count of what is left (kube-apiserver does not count what a selector filters).
    status, labelled = _raw(api_client, path, "application/json", [("labelSelector", "meta-test=yes"), ("limit", "1")])
    assert status == 200 and _names(labelled) == ["meta-0"]
    assert labelled["metadata"]["continue"] and "remainingItemCount" not in labelled["metadata"]
    status, last = _raw(
        api_client,
        path,
        "application/json",
        [("labelSelector", "meta-test=yes"), ("limit", "1"), ("continue", labelled["metadata"]["continue"])],
    )
    assert status == 200 and _names(last) == ["meta-1"]

    # A limit the list does not reach: everything, no continue.
    status, whole = _raw(api_client, path, "application/json", [("labelSelector", "meta-test=yes"), ("limit", "5")])
    assert status == 200 and _names(whole) == ["meta-0", "meta-1"] and not whole["metadata"].get("continue")

    # Metadata only: the same chunk, the same list metadata.
    status, partial = _raw(api_client, path, METADATA_LIST_ACCEPT, [("limit", "2")])
    assert status == 200 and partial["kind"] == "PartialObjectMetadataList" and len(partial["items"]) == 2
    assert partial["metadata"]["continue"] and partial["metadata"]["remainingItemCount"] == everything - 2

    # What the client sends: the first chunk only.
    assert [c["metadata"]["name"] for c in cluster.list("ConfigMap", namespace, "meta-test=yes", limit=1)] == ["meta-0"]

    # A token that does not decode: 400.
    status, error = _raw(api_client, path, "application/json", [("limit", "1"), ("continue", "not-a-token")])
    assert status == 400 and error["kind"] == "Status", error


def test_chunked_lists(local):
    namespace = f"chunk-{uuid.uuid4().hex[:6]}"
    local.create_namespace(namespace)
    _check_chunks(KubernetesCluster(str(local.kubeconfig_path)), local.api_client(), namespace)


def test_a_token_of_a_revision_no_longer_served_is_expired(local):
    """The local store keeps no history: a token of an earlier resourceVersion is answered 410 Expired, as
    kube-apiserver answers one whose revision etcd compacted."""
    namespace = f"chunk-{uuid.uuid4().hex[:6]}"
    local.create_namespace(namespace)
    cluster, api_client = KubernetesCluster(str(local.kubeconfig_path)), local.api_client()
    _configmaps(cluster, namespace)
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    first = _raw(api_client, path, "application/json", [("limit", "1")])[1]
    token = first["metadata"]["continue"]
    assert json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))["v"] == "meta.k8s.io/v1"
    cluster.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "later", "namespace": namespace}})
    status, error = _raw(api_client, path, "application/json", [("limit", "1"), ("continue", token)])
    assert status == 410 and error["reason"] == "Expired", error
    status, error = _raw(api_client, path, "application/json", [("limit", "x")])
    assert status == 400, error


@pytest.mark.real
def test_chunked_lists_on_the_real_control_plane(real_control_plane, real_namespace):
    from kubernetes import config

    api_client = config.new_client_from_config(config_file=str(real_control_plane.kubeconfig_path))
    _check_chunks(KubernetesCluster(str(real_control_plane.kubeconfig_path)), api_client, real_namespace)


def test_a_client_that_goes_away_mid_answer_is_no_server_error(local, caplog):
    """A log follower closing its connection while a large list is sent (the server's write then fails with a
    TLS EOF, a broken pipe or a reset): the local server logs no internal error for it and serves on."""
    namespace = f"gone-{uuid.uuid4().hex[:6]}"
    local.create_namespace(namespace)
    cluster = KubernetesCluster(kubeconfig=str(local.kubeconfig_path))
    for i in range(60):
        cluster.create(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": f"big-{i}", "namespace": namespace},
                "data": {"big": "x" * 200_000},
            }
        )
    caplog.set_level("ERROR")
    for _ in range(3):
        resp = cluster.api_client.call_api(
            f"/api/v1/namespaces/{namespace}/configmaps",
            "GET",
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
            _preload_content=False,
            _return_http_data_only=True,
        )
        resp.read(1024)
        resp._connection.sock.shutdown(socket.SHUT_RDWR)  # gone, mid-answer
        resp.close()
    assert len(cluster.list("ConfigMap", namespace)) == 60
    time.sleep(0.5)
    assert not [r for r in caplog.records if "Internal error" in r.getMessage() or r.exc_info], [
        r.getMessage() for r in caplog.records
    ]
