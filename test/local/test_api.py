"""The API server through the real `kubernetes` client: auth, CRUD, selectors, errors, validation."""

from __future__ import annotations

import base64
import json
import sys
import threading
import urllib.error
import urllib.request

import pytest
from kubernetes import client, watch
from kubernetes.client import ApiException
from localcluster_helpers import GROUP, VERSION, create_runtime, create_trainjob, runtime, trainjob, unique


def _raw(cluster, method: str, path: str, body: bytes = b"", token: str = "") -> tuple[int, dict]:
    request = urllib.request.Request(
        cluster.url + path,
        data=body or None,
        method=method,
        headers={"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=5, context=cluster.ssl_context()) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _status(error: ApiException) -> dict:
    return json.loads(error.body)


def test_requests_without_the_token_are_unauthorized(cluster):
    for token in ("", "wrong"):
        code, body = _raw(cluster, "GET", "/api/v1/namespaces", token=token)
        assert code == 401
        assert body == {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "Unauthorized",
            "reason": "Unauthorized",
            "code": 401,
        }


def test_kubeconfig(cluster):
    import yaml

    assert cluster.kubeconfig_path.stat().st_mode & 0o777 == 0o600
    config = yaml.safe_load(cluster.kubeconfig_path.read_text())
    assert config["current-context"] == cluster.context == "nemo-kubeflow-local"
    assert config["contexts"][0]["context"]["namespace"] == "default"
    assert config["clusters"][0]["cluster"]["server"] == cluster.url
    # HTTPS: kubectl sends a bearer token over TLS only. The CA is in the kubeconfig, as a real cluster's.
    assert cluster.url.startswith("https://127.0.0.1:")
    assert base64.b64decode(config["clusters"][0]["cluster"]["certificate-authority-data"]) == cluster.ca_pem


def test_plain_http_is_answered_with_what_to_fix(cluster):
    """An http:// URL gets a plain-text 400 saying the server speaks HTTPS (as Go's servers answer it),
    not a dropped connection."""
    plain = cluster.url.replace("https://", "http://")
    with pytest.raises(urllib.error.HTTPError) as error:
        urllib.request.urlopen(plain + "/api", timeout=5)
    assert error.value.code == 400
    assert error.value.read() == b"Client sent an HTTP request to an HTTPS server.\n"


def test_crud_and_label_selectors(core, ns):
    for name, labels in (("a", {"app": "a", "tier": "x"}), ("b", {"app": "b"}), ("c", {"other": "1"})):
        created = core.create_namespaced_config_map(
            ns, {"metadata": {"name": name, "labels": labels}, "data": {"k": name}}
        )
        assert created.metadata.uid and created.metadata.creation_timestamp and created.metadata.resource_version

    def names(selector=None, fields=None):
        return sorted(
            cm.metadata.name
            for cm in core.list_namespaced_config_map(ns, label_selector=selector, field_selector=fields).items
        )

    assert names() == ["a", "b", "c"]
    assert names("app=a") == names("app==a") == ["a"]
    assert names("app!=a") == ["b", "c"]
    assert names("app in (a, b)") == ["a", "b"]
    assert names("app notin (a)") == ["b", "c"]
    assert names("tier") == ["a"]
    assert names("!tier") == ["b", "c"]
    assert names("app=a,tier=x") == ["a"]
    assert names(fields="metadata.name=b") == ["b"]
    assert "a" in [cm.metadata.name for cm in core.list_config_map_for_all_namespaces(label_selector="app=a").items]

    patched = core.patch_namespaced_config_map("a", ns, {"metadata": {"labels": {"new": "yes"}}, "data": {"k2": "v"}})
    assert patched.metadata.labels == {"app": "a", "tier": "x", "new": "yes"}
    assert patched.data == {"k": "a", "k2": "v"}
    assert int(patched.metadata.resource_version) > 0

    stale = core.read_namespaced_config_map("b", ns)
    core.replace_namespaced_config_map("b", ns, {**stale.to_dict(), "data": {"k": "new"}})
    with pytest.raises(ApiException) as error:
        core.replace_namespaced_config_map("b", ns, stale)
    assert error.value.status == 409
    assert _status(error.value)["message"] == (
        'Operation cannot be fulfilled on configmaps "b": the object has been '
        "modified; please apply your changes to the latest version and try again"
    )

    core.delete_namespaced_config_map("c", ns)
    with pytest.raises(ApiException) as error:
        core.read_namespaced_config_map("c", ns)
    assert error.value.status == 404


def test_json_patch_and_merge_patch(core, custom, ns):
    core.create_namespaced_config_map(ns, {"metadata": {"name": "p"}, "data": {"a": "1", "b": "2"}})
    api = core.api_client
    api.call_api(
        f"/api/v1/namespaces/{ns}/configmaps/p",
        "PATCH",
        body=[{"op": "remove", "path": "/data/a"}, {"op": "add", "path": "/data/c", "value": "3"}],
        header_params={"Content-Type": "application/json-patch+json"},
        auth_settings=["BearerToken"],
    )
    assert core.read_namespaced_config_map("p", ns).data == {"b": "2", "c": "3"}
    name = unique("rt")
    create_runtime(custom, runtime(name))
    custom.patch_cluster_custom_object(
        GROUP, VERSION, "clustertrainingruntimes", name, {"metadata": {"labels": {"extra": "x"}}}
    )
    got = custom.get_cluster_custom_object(GROUP, VERSION, "clustertrainingruntimes", name)
    assert got["metadata"]["labels"]["extra"] == "x" and got["metadata"]["generation"] == 1
    assert "namespace" not in got["metadata"]


def test_patches_retry_internal_conflicts(custom, ns):
    """A patch without a resourceVersion never answers 409: the server re-reads and re-applies it
    when another writer (here: a status writer) got in between, as GuaranteedUpdate does."""
    name = unique("rt")
    create_runtime(custom, runtime(name))
    # Managed elsewhere (MultiKueue): the Trainer emulation leaves it alone, only our writers touch it.
    create_trainjob(custom, ns, trainjob("busy", name, ["true"], suspend=True, managedBy="kueue.x-k8s.io/multikueue"))
    rounds, errors = 150, []

    def write_status():
        for i in range(rounds):
            try:
                custom.patch_namespaced_custom_object_status(
                    GROUP,
                    VERSION,
                    ns,
                    "trainjobs",
                    "busy",
                    {
                        "status": {
                            "jobsStatus": [
                                {"name": "node", "active": i, "ready": 0, "succeeded": 0, "failed": 0, "suspended": 0}
                            ]
                        }
                    },
                )
            except ApiException as error:
                errors.append(error)

    writer = threading.Thread(target=write_status)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often: requests interleave inside the server's read-modify-write
    writer.start()
    try:
        for i in range(rounds):
            try:
                custom.patch_namespaced_custom_object(
                    GROUP, VERSION, ns, "trainjobs", "busy", {"spec": {"suspend": i % 2 == 0}}
                )
            except ApiException as error:
                errors.append(error)
    finally:
        writer.join()
        sys.setswitchinterval(interval)
    assert [(e.status, _status(e)["message"]) for e in errors] == []
    job = custom.get_namespaced_custom_object(GROUP, VERSION, ns, "trainjobs", "busy")
    assert job["spec"]["suspend"] is False and job["status"]["jobsStatus"][0]["active"] == rounds - 1


def test_patch_with_a_stale_resource_version_conflicts(core, ns):
    """A resourceVersion in the patch is an optimistic-lock precondition: a stale one answers 409."""
    created = core.create_namespaced_config_map(ns, {"metadata": {"name": "locked"}, "data": {"a": "1"}})
    stale = created.metadata.resource_version
    core.patch_namespaced_config_map("locked", ns, {"data": {"a": "2"}})
    for patch in (
        {"metadata": {"resourceVersion": stale}, "data": {"a": "3"}},
        [
            {"op": "replace", "path": "/metadata/resourceVersion", "value": stale},
            {"op": "replace", "path": "/data/a", "value": "3"},
        ],
    ):
        with pytest.raises(ApiException) as error:
            core.patch_namespaced_config_map("locked", ns, patch)
        status = _status(error.value)
        assert (error.value.status, status["reason"], status["message"]) == (
            409,
            "Conflict",
            'Operation cannot be fulfilled on configmaps "locked": the object has been modified; '
            "please apply your changes to the latest version and try again",
        )
    assert core.read_namespaced_config_map("locked", ns).data == {"a": "2"}
    current = core.read_namespaced_config_map("locked", ns).metadata.resource_version
    patched = core.patch_namespaced_config_map(
        "locked", ns, {"metadata": {"resourceVersion": current}, "data": {"a": "4"}}
    )
    assert patched.data == {"a": "4"} and patched.metadata.resource_version != current


def test_error_messages(cluster, core, custom, ns):
    with pytest.raises(ApiException) as error:
        core.read_namespaced_config_map("nope", ns)
    assert _status(error.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'configmaps "nope" not found',
        "reason": "NotFound",
        "details": {"name": "nope", "kind": "configmaps"},
        "code": 404,
    }
    with pytest.raises(ApiException) as error:
        custom.get_namespaced_custom_object(GROUP, VERSION, ns, "trainjobs", "nope")
    assert _status(error.value)["message"] == 'trainjobs.trainer.kubeflow.org "nope" not found'
    assert _status(error.value)["details"] == {"name": "nope", "group": GROUP, "kind": "trainjobs"}

    core.create_namespaced_config_map(ns, {"metadata": {"name": "dup"}})
    with pytest.raises(ApiException) as error:
        core.create_namespaced_config_map(ns, {"metadata": {"name": "dup"}})
    status = _status(error.value)
    assert (error.value.status, status["reason"], status["message"]) == (
        409,
        "AlreadyExists",
        'configmaps "dup" already exists',
    )

    with pytest.raises(ApiException) as error:
        core.create_namespaced_config_map(ns, {"metadata": {"name": "bad"}, "data": {"bad key": "v"}})
    status = _status(error.value)
    assert error.value.status == 422 and status["reason"] == "Invalid"
    assert status["message"].startswith(
        'ConfigMap "bad" is invalid: data[bad key]: Invalid value: "bad key": a '
        "valid config key must consist of alphanumeric characters"
    )
    assert status["details"]["causes"][0]["reason"] == "FieldValueInvalid"
    assert status["details"]["causes"][0]["field"] == "data[bad key]"

    with pytest.raises(ApiException) as error:
        core.create_namespaced_config_map(ns, {"metadata": {"name": "big"}, "data": {"a": "x" * (1024 * 1024 + 1)}})
    assert (
        _status(error.value)["message"] == 'ConfigMap "big" is invalid: []: Too long: must have at most 1048576 bytes'
    )

    with pytest.raises(ApiException) as error:
        core.create_namespaced_config_map(ns, {"metadata": {"name": "Bad_Name"}})
    assert error.value.status == 422
    assert 'metadata.name: Invalid value: "Bad_Name": a lowercase RFC 1123 subdomain' in _status(error.value)["message"]

    with pytest.raises(ApiException) as error:
        core.create_namespaced_config_map("ghost", {"metadata": {"name": "x"}})
    assert (error.value.status, _status(error.value)["message"]) == (404, 'namespaces "ghost" not found')

    code, body = _raw(cluster, "POST", f"/api/v1/namespaces/{ns}/configmaps", b"{not json", token=cluster._token)
    assert code == 400 and body["reason"] == "BadRequest"


def test_field_validation(core, custom, ns):
    name = unique("rt")
    create_runtime(custom, runtime(name))
    typo = trainjob("typo", name, ["true"], suspend=True)
    typo["spec"]["trainr"] = {"numNodes": 1}
    with pytest.raises(ApiException) as error:
        create_trainjob(custom, ns, typo, field_validation="Strict")
    assert error.value.status == 400
    assert _status(error.value)["message"] == (
        'TrainJob in version "v1alpha1" cannot be handled as a TrainJob: '
        'strict decoding error: unknown field "spec.trainr"'
    )

    _, code, headers = custom.create_namespaced_custom_object_with_http_info(
        GROUP, VERSION, ns, "trainjobs", typo, field_validation="Warn"
    )
    assert code == 201 and headers["Warning"] == '299 - "unknown field \\"spec.trainr\\""'
    stored = custom.get_namespaced_custom_object(GROUP, VERSION, ns, "trainjobs", "typo")
    assert "trainr" not in stored["spec"] and stored["spec"]["trainer"]["numNodes"] == 2

    typo["metadata"]["name"] = "typo2"
    _, _, headers = custom.create_namespaced_custom_object_with_http_info(
        GROUP, VERSION, ns, "trainjobs", typo, field_validation="Ignore"
    )
    assert "Warning" not in headers

    with pytest.raises(ApiException) as error:
        core.create_namespaced_config_map(
            ns, {"metadata": {"name": "cm"}, "dataa": {"a": "b"}}, field_validation="Strict"
        )
    assert 'strict decoding error: unknown field "dataa"' in _status(error.value)["message"]
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i", "volumeMount": []}]}}
    with pytest.raises(ApiException) as error:
        core.create_namespaced_pod(ns, pod, field_validation="Strict", dry_run="All")
    assert 'unknown field "spec.containers[0].volumeMount"' in _status(error.value)["message"]


@pytest.mark.parametrize(
    "name, accepted", [("MY VAR.1", True), ("1st", True), ("A=B", False), ("TAB\tX", False), ("NAME\n", False)]
)
def test_pod_env_var_names_follow_the_relaxed_rule(core, ns, name, accepted):
    """Printable ASCII other than '=' (IsRelaxedEnvVarName, the default since Kubernetes 1.32)."""
    pod = {
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "i", "env": [{"name": name, "value": "v"}]}]},
    }
    if accepted:
        assert core.create_namespaced_pod(ns, pod, dry_run="All").metadata.name == "p"
        return
    with pytest.raises(ApiException) as error:
        core.create_namespaced_pod(ns, pod, dry_run="All")
    assert error.value.status == 422
    assert (
        "spec.containers[0].env[0].name: Invalid value: " in _status(error.value)["message"]
        and "must consist only of printable ASCII characters other than '='" in _status(error.value)["message"]
    )


def test_dry_run_stores_nothing(cluster, core, custom, ns):
    created = core.create_namespaced_config_map(ns, {"metadata": {"name": "dry"}, "data": {"a": "b"}}, dry_run="All")
    assert created.metadata.name == "dry" and created.metadata.uid
    name = unique("rt")
    create_runtime(custom, runtime(name))
    result = create_trainjob(custom, ns, trainjob("dry", name, ["true"]), dry_run="All")
    assert result["spec"]["runtimeRef"]["kind"] == "ClusterTrainingRuntime"  # defaulted like the CRD does
    assert cluster.objects("configmaps", ns) == [] and cluster.objects("trainjobs", ns) == []


def test_owner_reference_garbage_collection(cluster, core, ns):
    parent = core.create_namespaced_config_map(ns, {"metadata": {"name": "parent"}})

    def owned(name, owner):
        return core.create_namespaced_config_map(
            ns,
            {
                "metadata": {
                    "name": name,
                    "ownerReferences": [
                        {
                            "apiVersion": "v1",
                            "kind": "ConfigMap",
                            "name": owner.metadata.name,
                            "uid": owner.metadata.uid,
                        }
                    ],
                }
            },
        )

    child = owned("child", parent)
    owned("grandchild", child)
    core.create_namespaced_config_map(ns, {"metadata": {"name": "bystander"}})
    core.delete_namespaced_config_map("parent", ns)
    assert [cm["metadata"]["name"] for cm in cluster.objects("configmaps", ns)] == ["bystander"]

    parent = core.create_namespaced_config_map(ns, {"metadata": {"name": "parent"}})
    owned("kept", parent)
    core.delete_namespaced_config_map("parent", ns, propagation_policy="Orphan")
    kept = core.read_namespaced_config_map("kept", ns)
    assert kept.metadata.owner_references is None


def test_dependents_of_a_gone_owner_are_collected(cluster, core, ns):
    """Created (or given an owner) after the owner went, a dependent is garbage-collected too:
    the GC checks every dependent's owners, not only the dependents there are at a deletion."""
    owner = core.create_namespaced_config_map(ns, {"metadata": {"name": "owner"}})
    gone = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    core.delete_namespaced_config_map("owner", ns)
    late = core.create_namespaced_config_map(ns, {"metadata": {"name": "late", "ownerReferences": [gone]}})
    assert late.metadata.uid  # created, as on a real cluster, and collected right after
    core.create_namespaced_config_map(ns, {"metadata": {"name": "owner"}})  # the same name, another uid
    core.create_namespaced_config_map(ns, {"metadata": {"name": "later", "ownerReferences": [gone]}})
    core.create_namespaced_config_map(ns, {"metadata": {"name": "adopted"}})
    core.patch_namespaced_config_map("adopted", ns, {"metadata": {"ownerReferences": [gone]}})
    # An owner of a kind not served here cannot be looked up: the GC leaves its dependents alone.
    core.create_namespaced_config_map(
        ns,
        {
            "metadata": {
                "name": "foreign",
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "d", "uid": "6b1e5bb6"}],
            }
        },
    )
    assert [cm["metadata"]["name"] for cm in cluster.objects("configmaps", ns)] == ["foreign", "owner"]


def test_secrets_merge_string_data(core, ns):
    secret = core.create_namespaced_secret(
        ns, {"metadata": {"name": "s"}, "stringData": {"token": "abc"}, "data": {"raw": "eHl6"}}
    )
    assert secret.data == {"raw": "eHl6", "token": "YWJj"} and secret.type == "Opaque"
    assert secret.string_data is None


def test_watch_sees_changes(core, ns):
    core.create_namespaced_config_map(ns, {"metadata": {"name": "before"}})
    threading.Timer(0.2, lambda: core.create_namespaced_config_map(ns, {"metadata": {"name": "after"}})).start()
    seen = []
    stream = watch.Watch()
    for event in stream.stream(core.list_namespaced_config_map, ns, timeout_seconds=5):
        seen.append((event["type"], event["object"].metadata.name))
        if len(seen) == 2:
            stream.stop()
    assert seen == [("ADDED", "before"), ("ADDED", "after")]


def test_discovery_and_events_v1(cluster, api, core, ns):
    assert client.VersionApi(api).get_code().major == "1"
    groups = [g.name for g in client.ApisApi(api).get_api_versions().groups]
    assert GROUP in groups and "events.k8s.io" in groups
    core.create_namespaced_event(
        ns,
        {
            "metadata": {"name": "e1"},
            "involvedObject": {"kind": "Pod", "name": "p"},
            "reason": "Test",
            "message": "hello",
            "type": "Normal",
            "firstTimestamp": "2025-01-01T00:00:00Z",
        },
    )
    # Like on a real cluster, core events have no eventTime, which the typed client cannot parse.
    response = client.EventsV1Api(api).list_namespaced_event(ns, _preload_content=False)
    events = json.loads(response.data)["items"]
    assert [(e["reason"], e["note"], e["regarding"]["name"], e["eventTime"]) for e in events] == [
        ("Test", "hello", "p", None)
    ]


def test_log_reads_from_a_second_and_of_the_last_lines_match_the_whole_log(cluster, core, ns):
    # The server seeks to the first record a `sinceTime`/`tailLines` read wants (an index, not a scan):
    # what it returns must be what filtering the whole log gives, to the second as the kubelet does.
    from nemo_kubeflow.cluster.client import KubernetesCluster

    core.create_namespaced_pod(
        ns,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "seconds"},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "main",
                        "image": "busybox",
                        "command": [
                            "bash",
                            "-c",
                            'for i in $(seq 1 25); do echo "line $i"; echo "line $i again"; sleep 0.1; done',
                        ],
                    }
                ],
            },
        },
    )
    cluster.wait_for(lambda: core.read_namespaced_pod("seconds", ns).status.phase == "Succeeded", 30)
    ours = KubernetesCluster(kubeconfig=str(cluster.kubeconfig_path))
    whole = list(ours.pod_log("seconds", ns, timestamps=True))
    assert [line.split(" ", 1)[1] for line in whole] == [f"line {i}{s}" for i in range(1, 26) for s in ("", " again")]
    seconds = sorted({line[:19] for line in whole})
    assert len(seconds) >= 2, seconds
    since = seconds[1]
    expected = [line for line in whole if line[:19] >= since]
    assert list(ours.pod_log("seconds", ns, timestamps=True, since_time=since + "Z")) == expected
    assert list(ours.pod_log("seconds", ns, timestamps=True, since_time=since + ".5Z")) == expected
    assert list(ours.pod_log("seconds", ns, timestamps=True, since_time=since + "Z", tail_lines=3)) == expected[-3:]
    assert list(ours.pod_log("seconds", ns, tail_lines=4)) == ["line 24", "line 24 again", "line 25", "line 25 again"]
    assert list(ours.pod_log("seconds", ns, timestamps=True, since_time="2999-01-01T00:00:00Z")) == []


def test_follow_streams_end_with_the_container_or_when_cut_and_close_from_another_thread(cluster, core, ns):
    # What log following relies on: a follow stream ends when its container does (a background process
    # of the container does not keep it open: the rest is killed with the main one), a stream cut by the
    # server ends the way it was cut, and LogStream.close from another thread ends a blocked read.
    from urllib3.exceptions import ProtocolError

    from nemo_kubeflow.cluster.client import KubernetesCluster

    ours = KubernetesCluster(kubeconfig=str(cluster.kubeconfig_path))

    def pod(name, script):
        core.create_namespaced_pod(
            ns,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "busybox", "command": ["bash", "-c", script]}],
                },
            },
        )
        cluster.wait_for(lambda: core.read_namespaced_pod(name, ns).status.phase != "Pending", 30)

    def texts(chunks):
        return [line.split(" ", 1)[1] for chunk in chunks for line in chunk]

    pod("bg", "(while true; do echo bg; sleep 0.1; done) & echo main; sleep 0.5")
    chunks = list(ours.pod_log_stream("bg", ns))  # returns: the container ended, its background loop too
    assert texts(chunks)[0] == "main" and set(texts(chunks)[1:]) <= {"bg"}, chunks

    pod("ticker", 'for i in $(seq 1 300); do echo "tick $i"; sleep 0.05; done')
    for abrupt in (True, False):
        stream = ours.pod_log_stream("ticker", ns, container="main")
        received = iter(stream)
        assert texts([next(received)])[0] == "tick 1"
        assert cluster.log_streams() == [f"{ns}/ticker"]
        assert cluster.cut_log_streams("other-pod") == 0
        assert cluster.cut_log_streams("ticker", abrupt=abrupt) == 1
        if abrupt:
            with pytest.raises(ProtocolError, match="Connection broken"):
                list(received)
        else:
            list(received)  # ends without an error, as if the container had
        cluster.wait_for(lambda: cluster.log_streams() == [], 5)
        assert not stream.interrupted

    stream = ours.pod_log_stream("ticker", ns, since_time="2000-01-01T00:00:00Z")
    received = iter(stream)
    next(received)
    threading.Timer(0.2, stream.close).start()
    with pytest.raises(ProtocolError):
        list(received)  # woken at once, although the container goes on printing
    assert stream.interrupted
    cluster.wait_for(lambda: cluster.log_streams() == [], 5)  # the server saw the connection go
