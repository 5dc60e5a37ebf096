"""The emulator's own name rules (local/nemo_kubeflow_local/names.py), checked against what the real
components said, never against the product's code.

* Offline: what the real Trainer v2.3.0 + JobSet v0.12.0 refused when test/data/real-trainer was
  recorded (a 50-character TrainJob; initializers at 37 characters) and apimachinery's messages.
* `-m real`: the same requests sent to the real kube-apiserver and JobSet webhook (dry run, nothing
  is stored) and to the local cluster; the refusals must be the same, word for word.
"""

from __future__ import annotations

import json
import urllib.error
import uuid

import pytest
from kubernetes import client

from nemo_kubeflow_local import names
from nemo_kubeflow_local.apiserver import resources as R
from nemo_kubeflow_local.apiserver.apierrors import invalid
from nemo_kubeflow_local.constants import KUBERNETES_VERSION
from nemo_kubeflow_local.controllers.jobset import jobset_pod_name_errors
from nemo_kubeflow_local.quantity import parse_quantity


def _jobset_spec(*jobs: tuple[str, int, int]) -> dict:
    """A JobSet spec of Indexed replicated jobs (name, replicas, completions), as Trainer builds them."""
    return {
        "replicatedJobs": [
            {
                "name": name,
                "replicas": replicas,
                "template": {
                    "spec": {
                        "completionMode": "Indexed",
                        "completions": completions,
                        "parallelism": completions,
                        "template": {
                            "spec": {"restartPolicy": "OnFailure", "containers": [{"name": "node", "image": "busybox"}]}
                        },
                    }
                },
            }
            for name, replicas, completions in jobs
        ]
    }


# --- the real controllers' recorded refusals ---------------------------------------------------------------


def test_a_50_character_trainjob_is_refused_as_the_real_webhook_refused_it():
    """Recorded: a 50-character TrainJob of one node; the longest pod name was 65 characters."""
    name = "a" * 50
    [error] = names.jobset_name_errors(name, _jobset_spec(("node", 1, 1)))
    assert len(f"{name}-node-0-0-abcde") == 65
    assert (error.path, error.value, error.message) == (
        "spec.replicatedJobs[0].name",
        f"{name}-node-0",
        names.POD_NAME_TOO_LONG,
    )


def test_initializers_at_37_characters_are_both_refused_as_recorded():
    """Recorded: with dataset and model initializers, 37 characters gave pod names of 67 and 65."""
    name = "e" * 37
    spec = _jobset_spec(("dataset-initializer", 1, 1), ("model-initializer", 1, 1), ("node", 1, 1))
    errors = names.jobset_name_errors(name, spec)
    assert [(e.path, e.value) for e in errors] == [
        ("spec.replicatedJobs[0].name", f"{name}-dataset-initializer-0"),
        ("spec.replicatedJobs[1].name", f"{name}-model-initializer-0"),
    ]
    assert {e.message for e in errors} == {names.POD_NAME_TOO_LONG}
    assert [len(f"{e.value}-0-abcde") for e in errors] == [67, 65]


@pytest.mark.parametrize(
    "replicated_job, completions, fits",
    [
        ("node", 1, 48),
        ("node", 10, 48),
        ("node", 11, 47),
        ("node", 100, 47),
        ("node", 101, 46),
        ("dataset-initializer", 1, 33),
        ("model-initializer", 1, 35),
    ],
)
def test_the_longest_name_that_fits_is_at_the_boundary(replicated_job, completions, fits):
    spec = _jobset_spec((replicated_job, 1, completions))
    assert names.jobset_name_errors("j" * fits, spec) == []
    assert [e.message for e in names.jobset_name_errors("j" * (fits + 1), spec)] == [names.POD_NAME_TOO_LONG]
    assert names.longest_fitting_jobset_name(replicated_job, 1, completions) == fits


def test_job_names_are_checked_too_and_say_so():
    """placement.GenJobName with the last replica's index: 1000 replicas take three digits."""
    errors = names.jobset_name_errors("x" * 56, _jobset_spec(("node", 1000, 1)))
    assert [e.message for e in errors] == [names.JOB_NAME_TOO_LONG, names.POD_NAME_TOO_LONG]
    assert {e.value for e in errors} == {"x" * 56 + "-node-999"}


def test_the_controller_reports_the_rule_in_the_api_servers_words():
    [error] = jobset_pod_name_errors("a" * 50, _jobset_spec(("node", 1, 1)))
    assert str(error) == f'spec.replicatedJobs[0].name: Invalid value: "{"a" * 50}-node-0": {names.POD_NAME_TOO_LONG}'


# --- apimachinery's values (pkg/util/validation and its tests) ------------------------------------------------


@pytest.mark.parametrize(
    "value, errors",
    [
        ("a", []),
        ("123-abc", []),
        ("a" * 63, []),
        ("a" * 64, ["must be no more than 63 characters"]),
        ("a.b", ["must not contain dots"]),
        (
            "A",
            [
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start "
                "and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
                "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
            ],
        ),
    ],
)
def test_dns1123_labels(value, errors):
    assert names.dns1123_label_errors(value) == errors


def test_dns1035_labels_start_with_a_letter():
    assert names.dns1035_label_errors("abc-123") == []
    assert names.dns1035_label_errors("1abc") == [
        "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic "
        "character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation "
        "is '[a-z]([-a-z0-9]*[a-z0-9])?')"
    ]


@pytest.mark.parametrize(
    "value, valid",
    [("example.com", True), ("a" * 253, True), ("a" * 254, False), ("a..b", False), ("-a", False), ("a_b", False)],
)
def test_dns1123_subdomains(value, valid):
    assert (names.dns1123_subdomain_errors(value) == []) is valid


@pytest.mark.parametrize(
    "key, errors",
    [
        ("app.kubernetes.io/name", []),
        ("simple", []),
        ("a/b/c", 1),
        ("/name", 1),
        ("prefix/", 2),
        ("Upper.Case/x", 1),
        ("x" * 64, 1),
        ("_x", 1),
    ],
)
def test_label_keys(key, errors):
    assert len(names.qualified_name_errors(key)) == (errors or 0)


@pytest.mark.parametrize(
    "value, valid",
    [
        ("", True),
        ("MyValue", True),
        ("my_value", True),
        ("12345", True),
        ("a" * 63, True),
        ("a" * 64, False),
        ("-x", False),
        ("x.", False),
        ("a b", False),
    ],
)
def test_label_values(value, valid):
    assert (names.label_value_errors(value) == []) is valid


@pytest.mark.parametrize(
    "key, errors",
    [
        ("key.name", []),
        ("KEY_NAME", []),
        (".", ["must not be '.'"]),
        ("..", ["must not be '..'"]),
        ("..x", ["must not start with '..'"]),
        ("a/b", 1),
    ],
)
def test_config_keys(key, errors):
    found = names.config_key_errors(key)
    assert (len(found) == errors) if isinstance(errors, int) else found == errors


@pytest.mark.parametrize(
    "name, valid",
    [("A_B", True), ("1A", True), ("a b", True), ("A=B", False), ("", False), ("é", False), ("\t", False)],
)
def test_relaxed_env_var_names(name, valid):
    assert (names.relaxed_env_var_name_errors(name) == []) is valid


@pytest.mark.parametrize(
    "text, value",
    [
        ("500m", "0.5"),
        ("64Gi", str(64 * 2**30)),
        ("1e3", "1000"),
        ("1.5Ki", "1536"),
        (".5", "0.5"),
        ("1.", "1"),
        ("2E-2", "0.02"),
        ("-1", "-1"),
        ("3n", "0.000000003"),
        (8, "8"),
        ("1 ", None),
        ("1Kb", None),
        ("", None),
        ("1.5.5", None),
    ],
)
def test_quantities_parse_as_apimachinery_does(text, value):
    parsed = parse_quantity(text)
    assert (parsed is None) if value is None else parsed == type(parsed)(value)


# --- the same requests on the real control plane and on the local cluster ---------------------------------


def _real(cp, method: str, path: str, body: dict) -> tuple[int, str]:
    try:
        cp.request(method, path, body)
        return 201, ""
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())["message"]


def _local(api: client.ApiClient, path: str, body: dict) -> tuple[int, str]:
    try:
        api.call_api(
            path,
            "POST",
            body=body,
            query_params=[("dryRun", "All")],
            auth_settings=["BearerToken"],
            header_params={"Content-Type": "application/json"},
            _preload_content=False,
        )
        return 201, ""
    except client.ApiException as error:
        return int(error.status), json.loads(error.body)["message"]


JOBSET_SHAPES = [  # (name length, replicated jobs): at, one past and well past each boundary
    (48, [("node", 1, 1)]),
    (49, [("node", 1, 1)]),
    (50, [("node", 1, 1)]),
    (48, [("node", 1, 11)]),
    (33, [("dataset-initializer", 1, 1), ("model-initializer", 1, 1), ("node", 1, 1)]),
    (37, [("dataset-initializer", 1, 1), ("model-initializer", 1, 1), ("node", 1, 1)]),
    (56, [("node", 1000, 1)]),
]


@pytest.mark.real
def test_the_real_jobset_webhook_refuses_exactly_what_the_emulator_refuses(real_control_plane, real_namespace):
    cp, ns = real_control_plane, real_namespace
    for length, jobs in JOBSET_SHAPES:
        name = ("j" + uuid.uuid4().hex * 2)[:length]
        spec = _jobset_spec(*jobs)
        body = {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {"name": name, "namespace": ns},
            "spec": spec,
        }
        code, message = _real(cp, "POST", f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets?dryRun=All", body)
        errors = jobset_pod_name_errors(name, spec)
        if not errors:
            assert (code, message) == (201, ""), (length, jobs)
            continue
        # JobSet's webhook answers an Invalid status error: the API server passes on its 422.
        denial = invalid(R.JOBSETS, name, errors).message
        assert (code, message) == (422, f'admission webhook "vjobset.kb.io" denied the request: {denial}'), (
            length,
            jobs,
        )


#: Bodies the real API server refuses for one name rule each (Go walks labels in map order: one per request).
CORE_REQUESTS = [
    {"metadata": {"name": "Bad_Name"}},
    {"metadata": {"name": "a" * 254}},
    *(
        {"metadata": {"name": "ok", "labels": {key: "v"}}}
        for key in ("a/b/c", "/x", "p/", "Upper.Case/x", "p/" + "n" * 64, "_x")
    ),
    *({"metadata": {"name": "ok", "labels": {"k": value}}} for value in ("-bad", "a" * 64, "a b")),
    {"metadata": {"name": "ok", "annotations": {"not a key": "v"}}},
    *({"metadata": {"name": "ok"}, "data": {key: "v"}} for key in ("..x", "a/b", ".", "k" * 254)),
]


#: How another minor of the real control plane's matrix (test/controlplane/versions.py) words the same refusals
#: where it differs from the release the emulator speaks for (KUBERNETES_VERSION): the emulator's words -> that
#: minor's. v1.37.2 words them as v1.36.3 does; v1.32.9 (run 2026-11-27) as below. A minor not listed is
#: compared word for word.
OTHER_MINORS_WORDS = {
    "32": {
        "a valid label key must consist": "a qualified name must consist",
        "must be no more than 63 bytes": "must be no more than 63 characters",
    },
}


@pytest.mark.real
def test_the_real_api_server_words_name_refusals_as_the_emulator_does(
    real_control_plane, real_namespace, cluster, ns, api
):
    cp = real_control_plane
    version = cp.request("GET", "/version")
    assert version["gitVersion"].startswith("v1.")
    emulated_minor = KUBERNETES_VERSION.split(".")[1]
    rewording = OTHER_MINORS_WORDS.get(version["minor"], {}) if version["minor"] != emulated_minor else {}
    differences = []
    for body in CORE_REQUESTS:
        body = {"apiVersion": "v1", "kind": "ConfigMap", **body}
        real = _real(cp, "POST", f"/api/v1/namespaces/{real_namespace}/configmaps?dryRun=All", body)
        local = _local(api, f"/api/v1/namespaces/{ns}/configmaps", body)
        for emulated, other in rewording.items():
            local = (local[0], local[1].replace(emulated, other))
        assert real[0] == 422, body
        if local != real:
            differences.append(f"{body['metadata']}\n  real:  {real}\n  local: {local}")
    assert not differences, "\n".join(differences)


def test_the_server_reports_the_release_whose_schemas_it_checks(cluster, api):
    from nemo_kubeflow_local.apiserver.core_schemas import schema_version

    version = client.VersionApi(api).get_code()
    assert version.git_version == f"v{KUBERNETES_VERSION}"
    assert schema_version().split(".")[:2] == [version.major, version.minor]
