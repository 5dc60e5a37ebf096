"""The compiled schemas (nemo_kubeflow/schema/schemas.json): in sync with their pinned sources, and what a fresh
process's first dry run loads instead of the SDK's models."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nemo_kubeflow import constants
from nemo_kubeflow.schema import compiled as schemas
from tools import compile_schemas as schemagen

REPO = Path(__file__).resolve().parent.parent


def test_shipped_schemas_are_what_the_generator_makes_of_the_pinned_sources():
    try:
        crds = schemagen.trainer_crd_dir()
    except schemagen.CrdsUnavailable as error:  # the CRDs are not in this repository: they come from Go's proxy
        pytest.skip(f"the pinned Trainer CRDs cannot be fetched here: {error}")
    assert schemagen.OUTPUT.read_text() == schemagen.generate(crds), "run: python -m tools.compile_schemas"


def test_schemas_name_their_sources():
    data = schemas.data()
    assert data["trainer_version"] == "2.3.0"
    assert data["kubernetes_version"] == constants.KUBERNETES_VERSION
    assert set(data["roots"]) == {
        "TrainJob",
        "ClusterTrainingRuntime",
        "TrainingRuntime",
        "core/Job",
        "core/ConfigMap",
        "core/Secret",
        "core/PersistentVolumeClaim",
    }
    assert sorted(data["crd_sha256"]) == sorted(name for name, _ in schemagen.TRAINER_KINDS.values())


def test_compiled_nodes_keep_the_crd_rules_and_the_models_enums():
    container = schemas.node_at(
        "ClusterTrainingRuntime",
        ("spec", "template", "spec", "replicatedJobs", "*", "template", "spec", "template", "spec", "containers", "*"),
    )
    node = schemas.nodes()[container]
    assert node["required"] == ["name"]
    # The CRD's embedded core types have no enums; the models (Trainer's OpenAPI) do.
    assert schemas.nodes()[node["properties"]["imagePullPolicy"]]["enum"] == ["Always", "IfNotPresent", "Never"]
    assert schemas.nodes()[schemas.node_at("TrainJob", ("spec", "activeDeadlineSeconds"))]["minimum"] == 1
    assert schemas.nodes()[schemas.node_at("TrainJob", ("spec", "trainer", "command"))]["maxItems"] == 128
    # Every object's metadata is the API server's ObjectMeta (the CRD says only `type: object`).
    meta = schemas.nodes()[schemas.node_at("TrainJob", ("metadata",))]
    assert {"name", "namespace", "labels", "annotations", "generateName"} <= set(meta["properties"])
    # Quantities and int-or-string fields keep their kinds.
    limits = schemas.node_at("TrainJob", ("spec", "trainer", "resourcesPerNode", "limits", "cpu"))
    assert schemas.nodes()[limits]["type"] == "quantity"


def test_schema_order_is_the_models_order_and_keeps_maps_as_given():
    trainjob = {
        "spec": {
            "trainer": {"numNodes": 2, "image": "i", "env": [{"value": "1", "name": "A"}]},
            "runtimeRef": {"name": "r"},
        },
        "metadata": {"name": "n", "labels": {"z": "1", "a": "2"}},
        "kind": "TrainJob",
        "apiVersion": "v",
        "extra": 1,
    }
    ordered = schemas.in_schema_order(trainjob, schemas.root("TrainJob"))
    assert list(ordered) == ["apiVersion", "kind", "metadata", "spec", "extra"]
    assert list(ordered["spec"]) == ["runtimeRef", "trainer"]
    assert list(ordered["spec"]["trainer"]) == ["env", "image", "numNodes"]
    assert list(ordered["spec"]["trainer"]["env"][0]) == ["name", "value"]
    assert list(ordered["metadata"]["labels"]) == ["z", "a"]


_FIRST_DRY_RUN = textwrap.dedent("""
    import json, sys
    from nemo_kubeflow import KubeflowExecutor
    from nemo_kubeflow.build.plan import build_submission
    from nemo_kubeflow.schema.validation import check_manifests
    from torchx.specs import Role

    executor = KubeflowExecutor(container_image="img", nodes=2, nprocs_per_node=8, namespace="team",
                                experiment_id="exp-1")
    {initializer}
    role = Role(name="train", image="", entrypoint="python", args=["train.py"])
    sub = build_submission(executor, role, [], task_name="train")
    check_manifests(sub.manifests())
    # (kubernetes_validate is not listed: nemo_run imports it.)
    print(json.dumps(sorted({{m.split(".")[0] for m in sys.modules}} & {{"kubeflow_trainer_api", "kubeflow"}})))
""")


def _heavy_modules(initializer: str = "") -> list[str]:
    code = _FIRST_DRY_RUN.format(initializer=initializer)
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_first_dry_run_builds_and_validates_without_the_sdk_models():
    # kubeflow_trainer_api (~400 pydantic models) cost a fresh process's first dry run 0.5 s and more.
    assert _heavy_modules() == []


def test_initializers_still_go_through_the_sdk():
    setup = (
        "from kubeflow.trainer import Initializer, HuggingFaceDatasetInitializer\n"
        "from nemo_kubeflow.parts.initializers import InitializerSettings\n"
        "executor.initializer = Initializer(dataset=HuggingFaceDatasetInitializer(storage_uri='hf://org/data'))\n"
        "executor.initializer_settings = InitializerSettings(claim_name='cache')"
    )
    assert "kubeflow_trainer_api" in _heavy_modules(setup)
