"""Dataset and model initializers, pure: the Kubeflow SDK's types on the executor, the runtime's
initializer jobs, ``spec.initializer`` through the SDK's converters (test/test_initializers.py runs them
on the local cluster).

Regenerate the golden file after an intended change with:
    NEMO_KUBEFLOW_UPDATE_GOLDEN=1 pytest test/unit/parts/test_initializers.py
"""

import os

import builders
import fiddle as fdl
import pytest
import yaml
from kubeflow.trainer import (
    DataCacheInitializer,
    HuggingFaceDatasetInitializer,
    HuggingFaceModelInitializer,
    Initializer,
    S3DatasetInitializer,
    S3ModelInitializer,
)
from kubeflow.trainer.backends.container.types import ContainerBackendConfig
from kubeflow.trainer.backends.kubernetes import utils as sdk_utils
from kubeflow.trainer.constants import constants as sdk_constants
from locations import GOLDEN
from nemo_run.core.serialization.yaml import YamlSerializer
from nemo_run.core.serialization.zlib_json import ZlibJSONSerializer

from nemo_kubeflow import ConfigError, KubeflowExecutor, PVCMount
from nemo_kubeflow.parts import initializers as inits
from nemo_kubeflow.parts.yamlio import dump_all
from nemo_kubeflow.schema.validation import check_manifests

HF = Initializer(
    dataset=HuggingFaceDatasetInitializer(storage_uri="hf://tatsu-lab/alpaca"),
    model=HuggingFaceModelInitializer(storage_uri="hf://meta-llama/Llama-3.2-1B-Instruct"),
)


SETTINGS = inits.InitializerSettings(
    claim_name="llm-cache", create_claim=True, claim_size="200Gi", storage_class="standard-rwx", model_secret="hf-token"
)


def executor(**kw) -> KubeflowExecutor:
    base = dict(
        container_image="nvcr.io/nvidia/nemo:25.02",
        nodes=2,
        nprocs_per_node=8,
        gpus_per_node=8,
        initializer=HF,
        initializer_settings=SETTINGS,
        experiment_id="finetune_1700000000",
    )
    return KubeflowExecutor(**{**base, **kw})


def submission(**kw):
    return builders.submission(executor(**kw), task="finetune")


jobs = builders.replicated_jobs


def pod(job: dict) -> dict:
    return job["template"]["spec"]["template"]["spec"]


# --- the SDK's types and defaults ------------------------------------------------------------------------


def test_defaults_are_the_sdks():
    defaults = ContainerBackendConfig()
    assert inits.SDK_DATASET_IMAGE == defaults.dataset_initializer_image
    assert inits.SDK_MODEL_IMAGE == defaults.model_initializer_image
    assert (inits.DATASET_PATH, inits.MODEL_PATH) == (sdk_constants.DATASET_PATH, sdk_constants.MODEL_PATH)
    assert (inits.DATASET_INITIALIZER, inits.MODEL_INITIALIZER) == (
        sdk_constants.DATASET_INITIALIZER,
        sdk_constants.MODEL_INITIALIZER,
    )


def test_executor_with_an_initializer_survives_nemo_run_serialization():
    ex = executor(
        initializer=Initializer(
            dataset=DataCacheInitializer(
                storage_uri="cache://schema/table", metadata_loc="s3://b/meta.json", num_data_nodes=2
            ),
            model=S3ModelInitializer(storage_uri="s3://bucket/model", endpoint="https://s3.example.com"),
        )
    )
    config = ex.to_config()
    assert fdl.build(config) == ex and ex.clone() == ex
    back = fdl.build(ZlibJSONSerializer().deserialize(ZlibJSONSerializer().serialize(config)))
    assert back == ex and isinstance(back.initializer.dataset, DataCacheInitializer)
    # NeMo-Run writes the YAML form for people (it cannot read any executor back: `job_dir: ''`).
    text = yaml.safe_load(YamlSerializer().serialize(config))
    assert text["initializer"]["model"]["_target_"] == "kubeflow.trainer.types.types.S3ModelInitializer"
    assert text["initializer_settings"]["claim_name"] == "llm-cache"


def test_golden_manifests():
    text = dump_all(submission().manifests())
    path = GOLDEN / "initializers.yaml"
    if os.environ.get("NEMO_KUBEFLOW_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), "manifests changed; see the module docstring to regenerate"


# --- the runtime and the TrainJob ------------------------------------------------------------------------


def test_runtime_runs_the_initializers_before_node_on_a_shared_claim():
    sub = submission()
    check_manifests(sub.manifests())
    js = jobs(sub)
    assert list(js) == ["dataset-initializer", "model-initializer", "node"]  # dependsOn names earlier jobs
    for step, path in (("dataset-initializer", "/workspace/dataset"), ("model-initializer", "/workspace/model")):
        job = js[step]
        assert job["template"]["metadata"]["labels"] == {"trainer.kubeflow.org/trainjob-ancestor-step": step}
        [container] = pod(job)["containers"]
        assert container["name"] == step and container["image"] == f"ghcr.io/kubeflow/trainer/{step}:latest"
        assert "command" not in container  # the image's entrypoint
        # Trainer's webhook wants a mount of the volume named "initializer" in the initializer container.
        assert container["volumeMounts"] == [
            {"name": "initializer", "mountPath": path, "subPath": path.rsplit("/")[-1]}
        ]
        assert pod(job)["volumes"] == [{"name": "initializer", "persistentVolumeClaim": {"claimName": "llm-cache"}}]
    node = js["node"]
    assert node["dependsOn"] == [
        {"name": "dataset-initializer", "status": "Complete"},
        {"name": "model-initializer", "status": "Complete"},
    ]
    [train] = pod(node)["containers"]
    assert {"name": "initializer", "mountPath": "/workspace/model", "subPath": "model"} in train["volumeMounts"]
    assert sub.pvcs[0]["metadata"]["name"] == "llm-cache" and sub.pvcs[0]["spec"]["storageClassName"] == "standard-rwx"


def test_spec_initializer_is_what_the_sdks_converters_give():
    spec = submission().trainjob["spec"]["initializer"]
    expected_dataset = sdk_utils.get_dataset_initializer(HF.dataset).to_dict()
    expected_model = sdk_utils.get_model_initializer(HF.model).to_dict()
    assert spec["dataset"] == {k: v for k, v in expected_dataset.items() if v != []}
    assert spec["model"] == {**expected_model, "secretRef": {"name": "hf-token"}}
    assert spec["model"]["env"] == [{"name": "IGNORE_PATTERNS", "value": "*.msgpack,*.h5,*.bin,*.pt,*.pth"}]


def test_tasks_with_other_sources_share_the_runtime():
    other = Initializer(
        dataset=S3DatasetInitializer(storage_uri="s3://bucket/data"),
        model=S3ModelInitializer(storage_uri="s3://bucket/model"),
    )
    a, b = submission(), submission(initializer=other)
    assert a.runtime["metadata"]["name"] == b.runtime["metadata"]["name"]
    assert b.trainjob["spec"]["initializer"]["dataset"]["storageUri"] == "s3://bucket/data"


def test_a_claim_listed_in_pvc_mounts_is_created_once():
    sub = submission(pvc_mounts=[PVCMount(claim_name="llm-cache", mount_path="/cache", create=True, size="1Ti")])
    assert [p["metadata"]["name"] for p in sub.pvcs] == ["llm-cache"]


def test_data_cache_runs_with_its_service_account_and_no_claim():
    cache = Initializer(
        dataset=DataCacheInitializer(
            storage_uri="cache://schema/table", metadata_loc="s3://b/meta.json", num_data_nodes=3
        )
    )
    sub = submission(initializer=cache, initializer_settings=None)  # None: the defaults, which have no claim
    check_manifests(sub.manifests())
    js = jobs(sub)
    assert list(js) == ["dataset-initializer", "node"]
    spec = pod(js["dataset-initializer"])
    assert spec["serviceAccountName"] == "kubeflow-trainer-cache-initializer"
    assert spec["volumes"] == [{"name": "initializer", "emptyDir": {}}]
    assert {"name": "CACHE_IMAGE", "value": "ghcr.io/kubeflow/trainer/data-cache:v2.3.0"} in spec["containers"][0][
        "env"
    ]
    [train] = pod(js["node"])["containers"]
    assert train["env"][0]["name"] == "TRAIN_JOB_NAME" and "initializer" not in str(train.get("volumeMounts"))
    env = {e["name"]: e["value"] for e in sub.trainjob["spec"]["initializer"]["dataset"]["env"]}
    assert env["CLUSTER_SIZE"] == "4" and env["METADATA_LOC"] == "s3://b/meta.json"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(
                initializer=Initializer(
                    model=HuggingFaceModelInitializer(storage_uri="hf://m", access_token="hf_secret")
                )
            ),
            "initializer.model.access_token: literal credentials are refused",
        ),
        (
            dict(initializer=Initializer(dataset=S3DatasetInitializer(storage_uri="s3://b/d", secret_access_key="k"))),
            "put SECRET_ACCESS_KEY in a Secret and set initializer_settings.dataset_secret",
        ),
        (dict(initializer_settings=inits.InitializerSettings()), "initializer_settings.claim_name is not set"),
        (dict(initializer_settings=None), "initializer_settings.claim_name is not set"),
        (
            dict(initializer_settings={"claim_name": "c"}),
            "initializer_settings: expected InitializerSettings(...), got dict",
        ),
        (
            dict(initializer=Initializer(dataset=HuggingFaceDatasetInitializer(storage_uri="tatsu-lab/alpaca"))),
            "write 'hf://tatsu-lab/alpaca'",
        ),
        (
            dict(initializer=Initializer(dataset=HuggingFaceDatasetInitializer(storage_uri="file:///data"))),
            "reads hf:// URIs for HuggingFaceDatasetInitializer; use that scheme, or give initializer_settings.dataset_command",
        ),
        (
            dict(initializer_settings=inits.InitializerSettings(claim_name="c", create_claim=True)),
            "create_claim=True needs claim_size",
        ),
        (
            dict(initializer=Initializer(dataset=HuggingFaceModelInitializer(storage_uri="hf://m"))),
            "initializer.dataset: HuggingFaceModelInitializer is not a dataset initializer",
        ),
        (dict(initializer=Initializer()), "initializer has neither dataset nor model"),
        (dict(initializer={"dataset": "hf://x"}), "initializer: expected kubeflow.trainer.Initializer"),
        (
            dict(initializer_settings=inits.InitializerSettings(claim_name="c", dataset_secret="Bad_Name")),
            "initializer_settings.dataset_secret='Bad_Name': not a valid Secret name",
        ),
        (
            dict(pvc_mounts=[PVCMount(claim_name="m", mount_path="/workspace/model")]),
            "pvc_mounts[m]: /workspace/model is where model-initializer puts its download; mount elsewhere",
        ),
    ],
)
def test_invalid_initializer_settings_are_named(kwargs, message):
    with pytest.raises(ConfigError) as err:
        executor(**kwargs).validate()
    assert message in str(err.value)
