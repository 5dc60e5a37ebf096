"""The Trainer's CRD rules (422) and validating webhooks (403), with the real messages."""

from __future__ import annotations

import json

import pytest
from kubernetes.client import ApiException
from localcluster_helpers import GROUP, VERSION, create_runtime, create_trainjob, runtime, trainjob, unique

DENIED = 'admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request: '


def _error(call) -> tuple[int, str]:
    with pytest.raises(ApiException) as error:
        call()
    return error.value.status, json.loads(error.value.body)["message"]


@pytest.fixture
def runtime_name(custom) -> str:
    name = unique("rt")
    create_runtime(custom, runtime(name))
    return name


def test_runtime_must_exist(custom, ns):
    code, message = _error(lambda: create_trainjob(custom, ns, trainjob("job", "ghost", ["true"])))
    assert code == 403
    assert message.startswith(DENIED + "spec.RuntimeRef: Invalid value: ")
    assert message.endswith(
        'clustertrainingruntimes.trainer.kubeflow.org "ghost" not found: specified '
        "clusterTrainingRuntime must be created before the TrainJob is created"
    )

    other = unique("ns")
    custom.api_client.call_api(
        "/api/v1/namespaces", "POST", body={"metadata": {"name": other}}, auth_settings=["BearerToken"]
    )
    create_runtime(custom, runtime("local-rt", kind="TrainingRuntime", namespace=other))
    code, message = _error(
        lambda: create_trainjob(custom, ns, trainjob("job", "local-rt", ["true"], runtime_kind="TrainingRuntime"))
    )
    assert code == 403 and message.endswith(
        'trainingruntimes.trainer.kubeflow.org "local-rt" not found: specified '
        "trainingRuntime must be created before the TrainJob is created"
    )
    created = create_trainjob(
        custom, other, trainjob("job", "local-rt", ["true"], runtime_kind="TrainingRuntime", suspend=True)
    )
    assert created["spec"]["runtimeRef"] == {"name": "local-rt", "kind": "TrainingRuntime", "apiGroup": GROUP}


def test_pet_variables_are_reserved(custom, ns, runtime_name):
    body = trainjob("job", runtime_name, ["true"])
    body["spec"]["trainer"]["env"] = [
        {"name": "PET_NNODES", "value": "3"},
        {"name": "OK", "value": "1"},
        {"name": "PET_MASTER_PORT", "value": "1"},
    ]
    code, message = _error(lambda: create_trainjob(custom, ns, body))
    assert code == 403 and message.startswith(DENIED + "spec.trainer.env: Invalid value: ")
    assert message.endswith("must not have reserved envs, invalid envs configured: [PET_MASTER_PORT PET_NNODES]")


@pytest.mark.parametrize("name", ["Bad_Name", "1starts-with-digit", "a" * 64])
def test_trainjob_name_is_an_rfc1035_label(custom, ns, runtime_name, name):
    code, message = _error(lambda: create_trainjob(custom, ns, trainjob(name, runtime_name, ["true"])))
    assert code == 422
    assert message.startswith(f'TrainJob.trainer.kubeflow.org "{name}" is invalid: ')
    rule = "must be no more than 63 characters" if len(name) > 63 else "must match RFC 1035 DNS label format"
    assert f'<nil>: Invalid value: "object": metadata.name {rule}' in message


def test_num_proc_per_node_must_be_positive(custom, ns, runtime_name):
    body = trainjob("job", runtime_name, ["true"])
    body["spec"]["trainer"]["numProcPerNode"] = 0
    assert _error(lambda: create_trainjob(custom, ns, body))[0] == 422
    body["spec"]["trainer"]["numProcPerNode"] = "auto"
    code, message = _error(lambda: create_trainjob(custom, ns, body))
    assert code == 422 and 'spec.trainer.numProcPerNode in body must be of type integer: "string"' in message


def test_runtime_webhook_rules(custom):
    two = runtime(unique("rt"))
    two["spec"]["template"]["spec"]["replicatedJobs"][0]["replicas"] = 2
    code, message = _error(lambda: create_runtime(custom, two))
    assert (code, message) == (
        403,
        'admission webhook "validator.clustertrainingruntime.trainer.kubeflow.org" '
        "denied the request: spec.template.spec.replicatedJobs[0].replicas: Invalid "
        "value: 2: always must be 1",
    )

    no_node = runtime(unique("rt"), node={"name": "trainer"})
    code, message = _error(lambda: create_runtime(custom, no_node))
    assert code == 403 and message.endswith("must contain the required container for the ancestor: trainer")

    two_policies = runtime(unique("rt"), ml_policy={"torch": {}, "mpi": {}})
    code, message = _error(lambda: create_runtime(custom, two_policies))
    assert code == 422 and message.endswith(
        'spec.mlPolicy: Invalid value: "object": Only one of the policy can be configured'
    )

    injected = runtime(
        unique("rt"),
        ml_policy={"torch": {"envInjection": {"targets": [{"jobName": "node", "containerNames": ["node"]}]}}},
    )
    code, message = _error(lambda: create_runtime(custom, injected))
    assert code == 422 and "containerNames must not include the main node container" in message


def test_env_injection_targets_must_exist(custom, ns):
    name = unique("rt")
    create_runtime(
        custom,
        runtime(
            name,
            ml_policy={"torch": {"envInjection": {"targets": [{"jobName": "node", "containerNames": ["preflight"]}]}}},
        ),
    )
    code, message = _error(lambda: create_trainjob(custom, ns, trainjob("job", name, ["true"])))
    assert code == 403
    assert message.endswith('envInjection target podSet "node" container "preflight" not found in runtime template')


def test_runtime_patches_must_name_existing_containers(custom, ns, runtime_name):
    body = trainjob(
        "job",
        runtime_name,
        ["true"],
        runtimePatches=[
            {
                "manager": "example.com/tests",
                "trainingRuntimeSpec": {
                    "template": {
                        "spec": {
                            "replicatedJobs": [
                                {
                                    "name": "node",
                                    "template": {
                                        "spec": {
                                            "template": {
                                                "spec": {
                                                    "containers": [
                                                        {"name": "trainer", "env": [{"name": "A", "value": "1"}]}
                                                    ]
                                                }
                                            }
                                        }
                                    },
                                }
                            ]
                        }
                    }
                },
            }
        ],
    )
    code, message = _error(lambda: create_trainjob(custom, ns, body))
    assert code == 403 and message.endswith("must not have container that doesn't exist in the runtime job node")


def test_trainjob_spec_is_immutable_except_suspend(custom, ns, runtime_name):
    create_trainjob(custom, ns, trainjob("job", runtime_name, ["true"], suspend=True))
    code, message = _error(
        lambda: custom.patch_namespaced_custom_object(
            GROUP, VERSION, ns, "trainjobs", "job", {"spec": {"trainer": {"numNodes": 5}}}
        )
    )
    assert (code, message) == (
        422,
        'TrainJob.trainer.kubeflow.org "job" is invalid: spec.trainer: Invalid value: "object": field is immutable',
    )
    patched = custom.patch_namespaced_custom_object(
        GROUP, VERSION, ns, "trainjobs", "job", {"spec": {"suspend": False}}
    )
    assert patched["spec"]["suspend"] is False and patched["metadata"]["generation"] == 2
