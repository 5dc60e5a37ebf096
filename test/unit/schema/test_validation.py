"""Offline manifest validation: valid manifests pass, and each broken one is reported with
the exact path of the problem and a message that says what to do."""

from __future__ import annotations

import copy
from collections import OrderedDict
from pathlib import Path
from typing import Any

import locations
import pytest
import yaml

from nemo_kubeflow.errors import ConfigError, ManifestValidationError
from nemo_kubeflow.schema import validation
from nemo_kubeflow.schema.validation import check_manifests, validate_manifest

DATA = locations.DATA / "validation"

TRAINJOB: dict[str, Any] = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1",
    "kind": "TrainJob",
    "metadata": {"name": "pretrain-a1b2c3", "namespace": "team-a"},
    "spec": {
        "runtimeRef": {"name": "torch-distributed"},
        "trainer": {
            "command": ["bash", "-c", "torchrun /nemo_run/scripts/train.py"],
            "numNodes": 2,
            "numProcPerNode": 8,
            "env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
            "resourcesPerNode": {
                "requests": {"cpu": "16", "nvidia.com/gpu": "8"},
                "limits": {"cpu": "32", "memory": "512Gi", "nvidia.com/gpu": 8.0},
            },
        },
    },
}

#: kubeflow/trainer v2.3.0 manifests/base/runtimes/torch_distributed.yaml.
TORCH_DISTRIBUTED: dict[str, Any] = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1",
    "kind": "ClusterTrainingRuntime",
    "metadata": {"name": "torch-distributed", "labels": {"trainer.kubeflow.org/framework": "torch"}},
    "spec": {
        "mlPolicy": {"numNodes": 1, "torch": {}},
        "template": {
            "spec": {
                "replicatedJobs": [
                    {
                        "name": "node",
                        "template": {
                            "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                            "spec": {
                                "template": {
                                    "spec": {
                                        "containers": [
                                            {
                                                "name": "node",
                                                "image": "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime",
                                            }
                                        ]
                                    }
                                }
                            },
                        },
                    }
                ]
            }
        },
    },
}

GKE_RUNTIME: dict[str, Any] = yaml.safe_load((DATA / "gke_tcpxo_runtime.yaml").read_text())

CONFIGMAP: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "metadata": {"name": "pretrain-a1b2c3-files-0", "namespace": "team-a"},
    "data": {"train.sh": "#!/bin/bash\nexec python train.py\n", "config.yaml": "lr: 0.1\n"},
    "binaryData": {"model.bin": "AAECAwQ="},
}

SECRET: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Secret",
    "metadata": {"name": "hf-token", "namespace": "team-a"},
    "type": "Opaque",
    "data": {"token": "aGZfc2VjcmV0"},
    "stringData": {"user": "me"},
}

PVC: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "PersistentVolumeClaim",
    "metadata": {"name": "training-data", "namespace": "team-a"},
    "spec": {
        "accessModes": ["ReadWriteMany"],
        "storageClassName": "standard-rwx",
        "resources": {"requests": {"storage": "10Ti"}},
    },
}

FIXTURES = {
    "trainjob": TRAINJOB,
    "torch-distributed": TORCH_DISTRIBUTED,
    "gke": GKE_RUNTIME,
    "configmap": CONFIGMAP,
    "secret": SECRET,
    "pvc": PVC,
}


@pytest.mark.parametrize("name", FIXTURES)
def test_valid_manifest_has_no_problems(name: str) -> None:
    assert validate_manifest(FIXTURES[name]) == []


def test_namespaced_training_runtime_is_valid() -> None:
    runtime = copy.deepcopy(TORCH_DISTRIBUTED)
    runtime["kind"] = "TrainingRuntime"
    runtime["metadata"]["namespace"] = "team-a"
    assert validate_manifest(runtime) == []


# --- broken manifests ------------------------------------------------------------------------

TRAINER = ("spec", "trainer")
RJOB = ("spec", "template", "spec", "replicatedJobs", 0)
POD = (*RJOB, "template", "spec", "template", "spec")
NODE = (*POD, "containers", 0)
RJOB_P = "spec.template.spec.replicatedJobs[0]"
POD_P = f"{RJOB_P}.template.spec.template.spec"
NODE_P = f"{POD_P}.containers[0]"


def _at(obj: Any, path: tuple) -> Any:
    for key in path:
        obj = obj[key]
    return obj


def _apply(obj: dict, op: tuple) -> None:
    """Apply one edit: ("set", path, value), ("del", path), ("rename", path, new_key),
    ("append", path, value)."""
    action, path, *arg = op
    parent = _at(obj, path[:-1])
    if action == "set":
        parent[path[-1]] = arg[0]
    elif action == "del":
        del parent[path[-1]]
    elif action == "rename":
        parent[arg[0]] = parent.pop(path[-1])
    elif action == "append":
        parent[path[-1]].append(arg[0])


def case(base: str, ops: list[tuple], path: str, phrase: str, name: str) -> Any:
    return pytest.param(base, ops, path, phrase, id=name)


BROKEN = [
    # Unknown fields, at several depths, with a suggestion.
    case(
        "trainjob",
        [("rename", ("spec", "trainer"), "trainr")],
        "spec.trainr",
        "did you mean trainer?",
        "typo-trainr",
    ),
    case(
        "trainjob",
        [("rename", (*TRAINER, "numProcPerNode"), "numProcPerNod")],
        "spec.trainer.numProcPerNod",
        "did you mean numProcPerNode?",
        "typo-numProcPerNod",
    ),
    case(
        "gke",
        [("rename", (*NODE, "volumeMounts"), "volumeMount")],
        f"{NODE_P}.volumeMount",
        "did you mean volumeMounts?",
        "typo-volumeMount",
    ),
    case(
        "gke",
        [("rename", (*NODE, "resources", "limits"), "limts")],
        f"{NODE_P}.resources.limts",
        "did you mean limits?",
        "typo-limts",
    ),
    case(
        "torch-distributed",
        [("set", ("spec", "mlPolicy", "torch", "numProcPerNode"), "auto")],
        "spec.mlPolicy.torch.numProcPerNode",
        "removed in Trainer v2.2",
        "removed-torch-numProcPerNode",
    ),
    case(
        "trainjob",
        [("set", ("spec", "podTemplateOverrides"), [])],
        "spec.podTemplateOverrides",
        "use spec.runtimePatches",
        "removed-podTemplateOverrides",
    ),
    case("configmap", [("rename", ("data",), "dta")], "dta", "did you mean data?", "typo-configmap-data"),
    case(
        "gke",
        [("set", (*POD, "hostnameOverride"), "x")],
        f"{POD_P}.hostnameOverride",
        "unknown field in Kubernetes 1.31",
        "field-newer-than-pinned-kubernetes",
    ),
    case(
        "gke",
        [("append", (*NODE, "env"), {"nam": "X", "value": "1"})],
        f"{NODE_P}.env[5].name",
        "required field is missing",
        "env-missing-name",
    ),
    # Wrong types.
    case(
        "trainjob",
        [("set", (*TRAINER, "numProcPerNode"), "auto")],
        "spec.trainer.numProcPerNode",
        "expected an integer, got string",
        "numProcPerNode-auto",
    ),
    case(
        "trainjob",
        [("set", (*TRAINER, "numNodes"), "2")],
        "spec.trainer.numNodes",
        "write 2 without quotes",
        "numNodes-string",
    ),
    case(
        "trainjob",
        [("set", (*TRAINER, "command"), "bash -c")],
        "spec.trainer.command",
        "expected a list",
        "command-string",
    ),
    case(
        "gke",
        [("set", (*RJOB, "replicas"), "1")],
        f"{RJOB_P}.replicas",
        "expected an integer",
        "replicas-string",
    ),
    case(
        "gke",
        [("set", (*NODE, "imagePullPolicy"), "Sometimes")],
        f"{NODE_P}.imagePullPolicy",
        "must be one of enum values",
        "imagePullPolicy-enum",
    ),
    case(
        "trainjob",
        [("set", ("metadata", "labels"), {"team": 5})],
        "metadata.labels.team",
        'quote it: "5"',
        "label-value-number",
    ),
    # Quantities and resources.
    case(
        "gke",
        [("set", (*NODE, "resources", "requests", "cpu"), "eight")],
        f"{NODE_P}.resources.requests.cpu",
        "is not a Kubernetes quantity",
        "quantity-eight",
    ),
    case(
        "trainjob",
        [("set", (*TRAINER, "resourcesPerNode", "limits", "nvidia.com/gpu"), "0.5")],
        'spec.trainer.resourcesPerNode.limits["nvidia.com/gpu"]',
        "not a whole number",
        "gpu-fraction",
    ),
    case(
        "trainjob",
        [("set", (*TRAINER, "resourcesPerNode", "requests", "cpu"), "64")],
        "spec.trainer.resourcesPerNode.requests.cpu",
        "request 64 exceeds the limit 32",
        "requests-over-limits",
    ),
    case(
        "gke",
        [("set", (*NODE, "resources", "limits", "nvidia.com/gpu"), "16")],
        f'{NODE_P}.resources.requests["nvidia.com/gpu"]',
        "request must equal the limit",
        "gpu-request-not-limit",
    ),
    case(
        "gke",
        [("set", (*NODE, "resources", "limits", "gpu"), 8)],
        f"{NODE_P}.resources.limits.gpu",
        "use nvidia.com/gpu",
        "unqualified-gpu",
    ),
    case(
        "gke",
        [("set", (*POD, "volumes", 4, "emptyDir", "sizeLimit"), "lots")],
        f"{POD_P}.volumes[4].emptyDir.sizeLimit",
        "not a Kubernetes quantity",
        "shm-size",
    ),
    # Environment.
    case(
        "trainjob",
        [("append", (*TRAINER, "env"), {"name": "PET_NODE_RANK", "value": "0"})],
        "spec.trainer.env[1].name",
        "PET_NODE_RANK is set by Kubeflow Trainer",
        "pet-env",
    ),
    case(
        "gke",
        [("append", (*NODE, "env"), {"name": "NCCL_TUNER_PLUGIN", "value": "x"})],
        f"{NODE_P}.env[5].name",
        "is already set at",
        "duplicate-env",
    ),
    case(
        "trainjob",
        [("append", (*TRAINER, "env"), {"name": "1BAD=NAME", "value": "x"})],
        "spec.trainer.env[1].name",
        "not a valid environment variable name",
        "bad-env-name",
    ),
    case(
        "trainjob",
        [
            (
                "append",
                (*TRAINER, "env"),
                {"name": "X", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            )
        ],
        "spec.trainer.env[1]",
        "sets both value and valueFrom",
        "env-value-and-valueFrom",
    ),
    # Runtime structure.
    case(
        "gke",
        [("set", (*NODE, "name"), "trainer")],
        f"{POD_P}.containers",
        "no container named node",
        "missing-node-container",
    ),
    case(
        "gke",
        [("set", (*RJOB, "replicas"), 2)],
        f"{RJOB_P}.replicas",
        "must have one replica",
        "ancestor-replicas-2",
    ),
    case(
        "gke",
        [("append", ("spec", "mlPolicy", "torch", "envInjection", "targets", 0, "containerNames"), "node")],
        "spec.mlPolicy.torch.envInjection.targets[0].containerNames[1]",
        "the CRD forbids it here",
        "envInjection-node",
    ),
    case(
        "gke",
        [
            (
                "set",
                ("spec", "mlPolicy", "torch", "envInjection", "targets", 0, "containerNames", 0),
                "prefligt",
            )
        ],
        "spec.mlPolicy.torch.envInjection.targets[0].containerNames[0]",
        "did you mean preflight?",
        "envInjection-missing-container",
    ),
    case(
        "torch-distributed",
        [("set", ("spec", "mlPolicy", "mpi"), {"numProcPerNode": 1})],
        "spec.mlPolicy",
        "only one policy",
        "two-policies",
    ),
    case(
        "torch-distributed",
        [
            ("set", ("spec", "mlPolicy", "torch"), None),
            ("set", ("spec", "mlPolicy", "jax"), {"numProcPerNode": 8}),
        ],
        "spec.mlPolicy.jax.numProcPerNode",
        "jax takes no settings",
        "jax-settings-pruned",
    ),
    case(
        "torch-distributed",
        [("set", (*NODE, "resources"), {"limits": {"memory": "64Gi"}})],
        f"{NODE_P}.resources.limits",
        "Unknown device type",
        "memory-only-limits",
    ),
    case(
        "torch-distributed",
        [("del", ("metadata", "labels"))],
        'metadata.labels["trainer.kubeflow.org/framework"]',
        "the Kubeflow SDK refuses runtimes without it",
        "missing-framework-label",
    ),
    case(
        "torch-distributed",
        [
            (
                "set",
                (*RJOB, "template", "spec", "template", "metadata"),
                {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
            ),
            ("del", (*RJOB, "template", "metadata")),
        ],
        "spec.template.spec.replicatedJobs",
        "on the Job template",
        "ancestor-label-on-pod-template",
    ),
    case(
        "gke",
        [("append", (*NODE, "volumeMounts"), {"name": "scratch", "mountPath": "/scratch"})],
        f"{NODE_P}.volumeMounts[5].name",
        "no volume named scratch",
        "undeclared-volume",
    ),
    case(
        "gke",
        [("set", (*POD, "initContainers", 1, "name"), "node")],
        f"{NODE_P}.name",
        "is already used at",
        "duplicate-container-name",
    ),
    case(
        "gke",
        [("set", (*NODE, "restartPolicy"), "Always")],
        f"{NODE_P}.restartPolicy",
        "only init containers take a restartPolicy",
        "sidecar-policy-on-container",
    ),
    case(
        "gke",
        [("set", (*POD, "restartPolicy"), "Always")],
        f"{POD_P}.restartPolicy",
        "use Never or OnFailure",
        "job-pod-restart-always",
    ),
    case(
        "gke",
        [("set", ("spec", "template", "spec", "successPolicy", "operator"), "Some")],
        "spec.template.spec.successPolicy.operator",
        "use one of All, Any",
        "jobset-enum",
    ),
    case(
        "gke",
        [("set", ("spec", "template", "spec", "successPolicy", "targetReplicatedJobs"), ["nod"])],
        "spec.template.spec.successPolicy.targetReplicatedJobs[0]",
        "did you mean node?",
        "jobset-unknown-replicated-job",
    ),
    case(
        "torch-distributed",
        [("set", ("spec", "template", "spec", "replicatedJobs"), [])],
        "spec.template.spec.replicatedJobs",
        "at least one replicated job",
        "no-replicated-jobs",
    ),
    # Names, namespaces, labels.
    case(
        "torch-distributed",
        [("set", ("metadata", "namespace"), "default")],
        "metadata.namespace",
        "cluster-scoped",
        "cluster-runtime-namespace",
    ),
    case(
        "trainjob",
        [("set", ("metadata", "name"), "Bad_Name")],
        "metadata.name",
        'use e.g. "bad-name"',
        "name-uppercase",
    ),
    case("trainjob", [("set", ("metadata", "name"), "my.job")], "metadata.name", "no dots", "name-dots"),
    case(
        "trainjob",
        [("set", ("metadata", "name"), "1job")],
        "metadata.name",
        "starting with a letter",
        "name-leading-digit",
    ),
    case(
        "trainjob",
        [("set", ("metadata", "name"), "a" * 49)],
        "metadata.name",
        "pods of replicated job 'node' would be named up to 64 characters",
        "name-over-pod-name-budget",
    ),
    case(
        "configmap",
        [("set", ("metadata", "name"), "abc\n")],
        "metadata.name",
        "not a DNS-1123 subdomain",
        "name-trailing-newline",
    ),
    case(
        "trainjob",
        [("set", ("metadata", "name"), "abc\n")],
        "metadata.name",
        "not an RFC 1035 label",
        "trainjob-name-trailing-newline",
    ),
    case(
        "trainjob",
        [("set", ("metadata", "namespace"), "team-a\n")],
        "metadata.namespace",
        "not a DNS-1123 label",
        "namespace-trailing-newline",
    ),
    case(
        "trainjob",
        [("set", ("spec", "trainer", "env", 0, "name"), "NCCL_DEBUG\n")],
        "spec.trainer.env[0].name",
        "not a valid environment variable name",
        "env-name-trailing-newline",
    ),
    case("configmap", [("set", ("data", "key\n"), "x")], 'data["key\\n"]', "invalid key", "data-key-trailing-newline"),
    case(
        "trainjob",
        [("set", ("metadata", "labels"), {"team\n": "a"})],
        'metadata.labels["team\\n"]',
        "invalid label key",
        "label-key-trailing-newline",
    ),
    case(
        "trainjob",
        [("set", ("metadata", "labels"), {"team": "a\n"})],
        "metadata.labels.team",
        "invalid label value",
        "label-value-trailing-newline",
    ),
    case(
        "trainjob",
        [("set", ("metadata", "name"), "a" * 64)],
        "metadata.name",
        "CRD limit of 63",
        "name-over-63",
    ),
    case(
        "torch-distributed",
        [("set", ("metadata", "name"), "Torch_Distributed")],
        "metadata.name",
        "not a DNS-1123 subdomain",
        "runtime-name",
    ),
    case(
        "trainjob",
        [("set", ("metadata", "labels"), {"bad key!": "x"})],
        'metadata.labels["bad key!"]',
        "invalid label key",
        "label-key",
    ),
    # TrainJob fields.
    case(
        "trainjob",
        [("set", ("spec", "runtimeRef", "kind"), "Runtime")],
        "spec.runtimeRef.kind",
        "not a runtime kind",
        "runtimeRef-kind",
    ),
    case(
        "trainjob",
        [("set", ("spec", "managedBy"), "me")],
        "spec.managedBy",
        "not allowed by the CRD",
        "managedBy",
    ),
    case(
        "trainjob",
        [("set", ("spec", "activeDeadlineSeconds"), 0)],
        "spec.activeDeadlineSeconds",
        "less than 1",
        "deadline-zero",
    ),
    case(
        "trainjob",
        [("set", (*TRAINER, "numNodes"), 0)],
        "spec.trainer.numNodes",
        "less than 1",
        "numNodes-zero",
    ),
    case(
        "trainjob",
        [("set", ("spec", "runtimePatches"), [{"manager": "example.com/a"}, {"manager": "example.com/a"}])],
        "spec.runtimePatches[1].manager",
        "already used",
        "duplicate-patch-manager",
    ),
    # ConfigMap, Secret, PVC, kind.
    case(
        "configmap",
        [("set", ("data", "scripts/train.sh"), "x")],
        'data["scripts/train.sh"]',
        "no '/'",
        "configmap-key-slash",
    ),
    case(
        "configmap",
        [("set", ("data", "big"), "x" * (1024 * 1024))],
        "data",
        "over the API server's limit of 1048576",
        "configmap-too-big",
    ),
    case(
        "configmap",
        [("set", ("binaryData", "model.bin"), "not base64!")],
        'binaryData["model.bin"]',
        "not valid base64",
        "configmap-bad-base64",
    ),
    case(
        "configmap",
        [("set", ("binaryData", "train.sh"), "AA==")],
        'binaryData["train.sh"]',
        "also in data",
        "configmap-key-twice",
    ),
    case("secret", [("set", ("data", "token"), "abc")], "data.token", "not valid base64", "secret-bad-base64"),
    case("secret", [("set", ("type",), "opaque")], "type", "did you mean Opaque?", "secret-type"),
    case(
        "pvc",
        [("set", ("spec", "accessModes"), ["ReadWriteAll"])],
        "spec.accessModes[0]",
        "not an access mode",
        "pvc-access-mode",
    ),
    case(
        "pvc",
        [("del", ("spec", "resources"))],
        "spec.resources.requests.storage",
        "without a storage request",
        "pvc-no-storage",
    ),
    case("pvc", [("set", ("kind",), "Deployment")], "kind", "unknown kind", "unknown-kind"),
    case("configmap", [("set", ("apiVersion",), "v2")], "apiVersion", "use v1", "wrong-apiVersion"),
    # The CRDs' own rules (schemas.json), where no rule of validation.py words it better.
    case(
        "gke",
        [("set", (*RJOB, "template", "metadata", "generateName"), "x-")],
        f"{RJOB_P}.template.metadata.generateName",
        "unknown field; remove it (known fields: annotations, finalizers, labels, name, namespace)",
        "crd-embedded-metadata-is-restricted",
    ),
    case(
        "gke",
        [("set", ("spec", "mlPolicy", "torch", "envInjection", "targets", 0, "containerNames"), [])],
        "spec.mlPolicy.torch.envInjection.targets[0].containerNames",
        "the CRD requires at least 1",
        "crd-min-items",
    ),
    case(
        "trainjob",
        [("set", ("spec", "activeDeadlineSeconds"), 0)],
        "spec.activeDeadlineSeconds",
        "set a positive number of seconds",
        "crd-minimum-worded-by-the-mirror",
    ),
    case(
        "trainjob",
        [
            (
                "set",
                ("spec", "runtimePatches"),
                [
                    {
                        "manager": "example.com/x",
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
                                                                {"name": "sidecar", "imagePullPolicy": "Sometimes"}
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
        ],
        "spec.runtimePatches[0].trainingRuntimeSpec.template.spec.replicatedJobs[0].template.spec.template.spec"
        ".containers[0].imagePullPolicy",
        "unknown field; remove it (known fields: env, name, securityContext, volumeMounts)",
        "runtime-patch-containers-take-few-fields",
    ),
    case(
        "trainjob",
        [("set", ("metadata", "labels"), {"team": None})],
        "metadata.labels.team",
        "expected a string, got null",
        "label-value-null",
    ),
]


@pytest.mark.parametrize("base, ops, path, phrase", BROKEN)
def test_broken_manifest_names_path_and_fix(base: str, ops: list[tuple], path: str, phrase: str) -> None:
    obj = copy.deepcopy(FIXTURES[base])
    for op in ops:
        _apply(obj, op)
    problems = validate_manifest(obj)
    at_path = [p for p in problems if p.startswith(f"{path}: ")]
    assert at_path, f"nothing reported at {path}: {problems}"
    assert any(phrase in p for p in at_path), at_path


def test_one_typo_is_reported_once_across_layers() -> None:
    # The models and the strict Kubernetes schema both see the typo; only one message remains.
    obj = copy.deepcopy(GKE_RUNTIME)
    _apply(obj, ("rename", (*NODE, "volumeMounts"), "volumeMount"))
    assert [p for p in validate_manifest(obj) if p.startswith(f"{NODE_P}.volumeMount:")] == [
        f"{NODE_P}.volumeMount: unknown field; did you mean volumeMounts?"
    ]


def test_problems_are_sorted_by_path() -> None:
    obj = copy.deepcopy(TRAINJOB)
    obj["metadata"]["name"] = "Bad"
    obj["spec"]["trainer"]["env"] = [{"name": f"V{i}", "value": "1"} for i in range(11)] + [{"name": "V1"}]
    obj["spec"]["trainer"]["env"][2]["name"] = "2bad"
    problems = validate_manifest(obj)
    assert [p.split(":")[0] for p in problems] == [
        "metadata.name",
        "spec.trainer.env[2].name",
        "spec.trainer.env[11].name",
    ]


def test_non_string_keys_are_reported() -> None:
    obj = copy.deepcopy(CONFIGMAP)
    obj["data"][1] = "x"
    assert validate_manifest(obj) == [
        "data: key 1 is not a string; quote it (YAML reads 1, true or null keys as non-strings)"
    ]


# --- check_manifests ---------------------------------------------------------------------------


def test_check_manifests_accepts_valid_objects() -> None:
    check_manifests([CONFIGMAP, SECRET, PVC, TORCH_DISTRIBUTED, TRAINJOB])


def test_check_manifests_raises_for_first_invalid_object_with_all_its_problems() -> None:
    job = copy.deepcopy(TRAINJOB)
    job["spec"]["trainer"]["numProcPerNode"] = "auto"
    job["spec"]["trainr"] = {}
    pvc = copy.deepcopy(PVC)
    del pvc["spec"]["accessModes"]
    with pytest.raises(ManifestValidationError) as err:
        check_manifests([CONFIGMAP, job, pvc])
    assert (err.value.kind, err.value.name) == ("TrainJob", "pretrain-a1b2c3")
    assert err.value.problems == validate_manifest(job)
    assert len(err.value.problems) == 2
    assert "spec.trainr: unknown field" in str(err.value)


# --- memoization and speed ----------------------------------------------------------------------


@pytest.fixture
def fresh_cache(monkeypatch: pytest.MonkeyPatch) -> OrderedDict:
    cache: OrderedDict = OrderedDict()
    monkeypatch.setattr(validation, "_CACHE", cache)
    return cache


def test_identical_objects_are_validated_once(fresh_cache: OrderedDict, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = validation._validate
    monkeypatch.setattr(validation, "_validate", lambda obj: calls.append(obj) or real(obj))
    broken = copy.deepcopy(GKE_RUNTIME)
    broken["spec"]["mlPolicy"]["numNodes"] = 0
    first = validate_manifest(broken)
    first.append("caller mutates its copy")
    # Key order does not matter: the cache key is the canonical JSON.
    reordered = dict(reversed(list(copy.deepcopy(broken).items())))
    assert validate_manifest(reordered) == first[:-1]
    assert len(calls) == 1
    assert len(fresh_cache) == 1


def test_cache_is_bounded(fresh_cache: OrderedDict, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(validation, "_CACHE_SIZE", 2)
    for name in ("a", "b", "c"):
        validate_manifest({**CONFIGMAP, "metadata": {"name": name}})
    assert len(fresh_cache) == 2


# --- JobSet's pod-name rule: the TrainJob name leaves room for every pod name ------------------

#: An experiment id as NeMo-Run makes it: the title, "_", time.time_ns() (19 digits).
NEMO_RUN_ID = "llama3-8b-pretrain-h100_1732406400123456789"


def _planned(nodes: int, with_initializers: bool, experiment_id: str = NEMO_RUN_ID, task: str = "pretrain"):
    from kubeflow.trainer import HuggingFaceDatasetInitializer, HuggingFaceModelInitializer, Initializer
    from torchx.specs import Role

    from nemo_kubeflow import KubeflowExecutor
    from nemo_kubeflow.build.plan import build_submission
    from nemo_kubeflow.parts.initializers import InitializerSettings

    init = (
        Initializer(
            dataset=HuggingFaceDatasetInitializer(storage_uri="hf://org/data"),
            model=HuggingFaceModelInitializer(storage_uri="hf://org/model"),
        )
        if with_initializers
        else None
    )
    executor = KubeflowExecutor(
        container_image="img",
        nodes=nodes,
        shm_size=None,
        initializer=init,
        initializer_settings=InitializerSettings(claim_name="cache") if init else None,
    )
    executor.validate()
    role = Role(name=task, image="", entrypoint="bash", args=["-c", "true"])
    return build_submission(executor, role, [], task_name=task, experiment_id=experiment_id)


def _pod_names(sub) -> dict[str, int]:
    """The longest pod name of each replicated job, as JobSet's webhook computes it."""
    from nemo_kubeflow.parts import naming

    jobs = naming.runtime_job_shapes(sub.runtime, sub.trainjob["spec"]["trainer"]["numNodes"])
    return {job.name: len(naming.longest_pod_name(sub.name, job)) for job in jobs}


@pytest.mark.parametrize("nodes, budget", [(1, 48), (9, 48), (10, 48), (128, 46)])
def test_names_without_initializers_use_the_node_budget(nodes: int, budget: int) -> None:
    sub = _planned(nodes, with_initializers=False)
    assert len(sub.name) == budget and sub.name.startswith("llama3-8b-pretrain-h100-")
    assert max(_pod_names(sub).values()) == 63
    check_manifests(sub.manifests())


@pytest.mark.parametrize("nodes", [1, 9, 10, 128])
def test_names_with_initializers_leave_room_for_the_dataset_initializer(nodes: int) -> None:
    sub = _planned(nodes, with_initializers=True)
    pods = _pod_names(sub)
    assert set(pods) == {"dataset-initializer", "model-initializer", "node"}
    assert len(sub.name) == 33 and pods["dataset-initializer"] == 63 and max(pods.values()) == 63
    check_manifests(sub.manifests())


def test_short_names_are_not_shortened() -> None:
    sub = _planned(2, with_initializers=True, experiment_id="e_1", task="t")
    assert sub.name.startswith("e-1-t-") and len(sub.name) < 33


def _renamed(sub, name: str) -> dict:
    trainjob = copy.deepcopy(sub.trainjob)
    trainjob["metadata"]["name"] = name
    return trainjob


@pytest.mark.parametrize(
    "nodes, with_initializers, budget, longest_job",
    [
        (1, False, 48, "node"),
        (10, False, 48, "node"),
        (11, False, 47, "node"),
        (128, False, 46, "node"),
        (1, True, 33, "dataset-initializer"),
        (128, True, 33, "dataset-initializer"),
    ],
)
def test_a_name_at_the_limit_validates_and_one_past_it_is_refused(nodes, with_initializers, budget, longest_job):
    sub = _planned(nodes, with_initializers)
    at_limit = _renamed(sub, "j" * budget)
    assert validation.validate_manifests([sub.runtime, at_limit]) == [[], []]
    past = _renamed(sub, "j" * (budget + 1))
    [runtime_problems, problems] = validation.validate_manifests([sub.runtime, past])
    assert runtime_problems == []
    [message] = [p for p in problems if f"replicated job {longest_job!r}" in p]
    # The TrainJob, the replicated job, the pod-name length and the fix.
    assert message.startswith(f'metadata.name: TrainJob "{"j" * (budget + 1)}": pods of replicated job')
    assert "would be named up to 64 characters" in message and "over the 63 JobSet allows" in message
    assert message.endswith(
        f"shorten the TrainJob name to at most {budget} characters, or rename replicated job {longest_job!r}"
    )
    with pytest.raises(ManifestValidationError, match="64 characters"):
        check_manifests([sub.runtime, past])


def test_without_its_runtime_a_trainjob_is_checked_for_its_node_job() -> None:
    # 128 nodes: node pods "<name>-node-0-127-xxxxx"; the budget is 46.
    trainjob = copy.deepcopy(TRAINJOB)
    trainjob["spec"]["trainer"]["numNodes"] = 128
    trainjob["metadata"]["name"] = "a" * 46
    assert validate_manifest(trainjob) == []
    trainjob["metadata"]["name"] = "a" * 47
    [problem] = validate_manifest(trainjob)
    assert "replicated job 'node' would be named up to 64 characters" in problem
    assert "at most 46 characters" in problem


def test_the_validate_command_checks_a_trainjob_against_its_runtime_file(tmp_path: Path, capsys) -> None:
    from nemo_kubeflow.cli.main import main

    sub = _planned(1, with_initializers=True)
    runtime_file, trainjob_file = tmp_path / "runtime.yaml", tmp_path / "trainjob.yaml"
    runtime_file.write_text(yaml.safe_dump(sub.runtime))
    trainjob_file.write_text(yaml.safe_dump(_renamed(sub, "j" * 40)))
    # Alone, the TrainJob's `node` pods fit; with its runtime, the dataset initializer's do not.
    assert main(["validate", str(trainjob_file)]) == 0
    assert main(["validate", str(runtime_file), str(trainjob_file)]) == 1
    out = capsys.readouterr().out
    assert f"{trainjob_file}: TrainJob/{'j' * 40}: metadata.name:" in out
    assert "replicated job 'dataset-initializer' would be named up to 70 characters" in out
    assert "at most 33 characters" in out


def test_a_runtime_whose_job_names_leave_no_room_for_any_name_is_refused(tmp_path: Path) -> None:
    from torchx.specs import Role

    from nemo_kubeflow import KubeflowExecutor
    from nemo_kubeflow.build.plan import build_submission
    from nemo_kubeflow.parts.templates import templates_dir

    long_job = "node-of-a-runtime-whose-replicated-job-names-are-far-too-long"
    text = (templates_dir() / "training_runtime.yaml.j2").read_text()
    template = tmp_path / "runtime.yaml.j2"
    template.write_text(text.replace("        - name: node\n", f"        - name: {long_job}\n", 1))
    executor = KubeflowExecutor(container_image="img", nodes=1, shm_size=None, runtime_template=str(template))
    role = Role(name="t", image="", entrypoint="bash", args=["-c", "true"])
    with pytest.raises(
        ConfigError, match=f"replicated job '{long_job}' of the runtime leaves -9 characters for the TrainJob name"
    ) as err:
        build_submission(executor, role, [], task_name="t", experiment_id="e")
    assert "give the runtime's replicated jobs shorter names" in str(err.value)
