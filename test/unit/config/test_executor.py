"""KubeflowExecutor: validation messages, NeMo-Run integration points, no I/O on construction."""

import fiddle as fdl
import pytest
from locations import DOCS
from nemo_run.core.serialization.zlib_json import ZlibJSONSerializer
from nemo_run.run.experiment import Experiment
from nemo_run.run.torchx_backend.schedulers import api

from nemo_kubeflow import ConfigError, ConfigMapPackager, KubeflowExecutor, PVCMount


def ok(**kw):
    return KubeflowExecutor(**{"container_image": "img", **kw})


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(nodes=0), "nodes=0: must be an integer >= 1"),
        (dict(nprocs_per_node=-1), "nprocs_per_node=-1"),
        (dict(gpus_per_node=4, nprocs_per_node=8), "exceeds gpus_per_node=4"),
        (dict(namespace="Team_A"), "namespace='Team_A': must be a DNS-1123 label"),
        (dict(cpu_request="eight"), "cpu_request='eight': not a Kubernetes quantity"),
        (dict(cpu_request="1e99999999999"), "cpu_request='1e99999999999': not a Kubernetes quantity"),
        (dict(memory_request="8Gi", memory_limit="4Gi"), "memory_request='8Gi' is larger than memory_limit='4Gi'"),
        (
            dict(env_vars={"PET_NODE_RANK": "0"}),
            "environment variable PET_NODE_RANK is set by Kubeflow Trainer's torch plugin",
        ),
        (dict(env_vars={"1BAD": "x"}), "environment variable '1BAD'"),
        (dict(secret_env_vars={"TOKEN": "hunter2"}), "literal values are refused"),
        (dict(secret_key_refs={"K": "no-key"}), "expected 'secret-name/key'"),
        (dict(env_vars={"K": "1"}, secret_key_refs={"K": "s/k"}), "K is set twice"),
        (dict(pvc_mounts=[PVCMount(claim_name="d", mount_path="/nemo_run")]), "already used by workspace_mount_path"),
        (dict(pvc_mounts=[PVCMount(claim_name="d", mount_path="/d", create=True)]), "create=True needs size"),
        (dict(pvc_mounts=[PVCMount(claim_name="d", mount_path="rel")]), "must be an absolute path"),
        (dict(runtime_kind="MyRuntime"), "runtime_kind='MyRuntime'"),
        (dict(active_deadline_seconds=0), "active_deadline_seconds=0"),
        (dict(enable_tcpxo=True), "enable_tcpxo needs gpus_per_node > 0"),
        (dict(shm_size="lots"), "shm_size='lots'"),
        (dict(extra_resources={"nvidia.com/gpu": "8"}), "set GPUs with gpus_per_node"),
        (dict(labels={"team": "x" * 70}), "label values are at most 63"),
    ],
)
def test_invalid_configurations_are_named(kwargs, message):
    with pytest.raises(ConfigError, match=None) as err:
        ok(**kwargs).validate()
    assert message in str(err.value)


def test_missing_image_says_how_to_fix():
    with pytest.raises(ConfigError, match="container_image is not set"):
        KubeflowExecutor().validate()


def test_all_problems_reported_at_once():
    with pytest.raises(ConfigError) as err:
        KubeflowExecutor(nodes=0, namespace="BAD").validate()
    text = str(err.value)
    assert "nodes=0" in text and "namespace='BAD'" in text and "container_image" in text


def test_registered_with_nemo_run():
    assert api.EXECUTOR_MAPPING[KubeflowExecutor] == "kubeflow_trainer"
    assert api.REVERSE_EXECUTOR_MAPPING["kubeflow_trainer"] is KubeflowExecutor
    assert KubeflowExecutor in Experiment._PARALLEL_SUPPORTED_EXECUTORS
    assert KubeflowExecutor in Experiment._DETACH_SUPPORTED_EXECUTORS
    assert KubeflowExecutor not in Experiment._DEPENDENCY_SUPPORTED_EXECUTORS
    # nemo_run's log lookup special-cases any class with an attribute named `logs`.
    assert not hasattr(KubeflowExecutor, "logs")


def test_construction_does_no_io(monkeypatch):
    import kubernetes.config

    def boom(*a, **k):
        raise AssertionError("kubeconfig read during construction")

    monkeypatch.setattr(kubernetes.config, "load_kube_config", boom)
    monkeypatch.setattr(kubernetes.config, "new_client_from_config", boom)
    ex = ok(kubeconfig="/does/not/exist", pvc_mounts=[PVCMount(claim_name="d", mount_path="/d")])
    clone = ex.clone()
    assert clone.kubeconfig == "/does/not/exist" and clone.pvc_mounts[0].claim_name == "d"
    assert isinstance(clone.packager, ConfigMapPackager)


def test_survives_nemo_run_serialization():
    ex = ok(nodes=2, secret_env_vars={"T": "env:T"}, pvc_mounts=[PVCMount(claim_name="d", mount_path="/d")])
    data = ZlibJSONSerializer().serialize(ex.to_config())
    back = fdl.build(ZlibJSONSerializer().deserialize(data))
    assert back == ex


def every_field_set() -> KubeflowExecutor:
    """An executor with every field away from its default (nested settings included)."""
    from kubeflow.trainer import HuggingFaceModelInitializer, Initializer

    from nemo_kubeflow import SecretMount
    from nemo_kubeflow.parts.fabrics import TCPXOConfig
    from nemo_kubeflow.parts.initializers import InitializerSettings

    ex = ok(
        nodes=3,
        nprocs_per_node=4,
        gpus_per_node=4,
        secret_env_vars={"T": "env:T"},
        pvc_mounts=[PVCMount(claim_name="d", mount_path="/d")],
        secret_mounts=[SecretMount(secret_name="s", mount_path="/s")],
        tcpxo=TCPXOConfig(nic_count=4),
        initializer=Initializer(model=HuggingFaceModelInitializer(storage_uri="hf://m")),
        initializer_settings=InitializerSettings(claim_name="c"),
        packager=ConfigMapPackager(mode="sharded"),
        env_vars={"A": "1"},
        retries=2,
        labels={"team": "x"},
        queue_name="q",
    )
    ex.assign("exp_1", "/tmp/exp_1", "t", "t")
    return ex


@pytest.mark.parametrize("make", [ok, every_field_set], ids=["defaults", "every-field-set"])
def test_to_config_lists_only_what_differs_from_the_defaults_and_builds_back_equal(make):
    import dataclasses

    ex = make()
    cfg = ex.to_config()
    set_fields = set(cfg.__arguments__)
    if make is ok:
        assert set_fields == {"container_image", "packager"}  # the packager: ConfigMapPackager, not NeMo-Run's
    for f in dataclasses.fields(ex):
        if f.name in set_fields or not f.init:
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        assert getattr(ex, f.name) == default, f.name
    # Built back: what NeMo-Run's generic conversion of every field builds (init=False fields such as
    # experiment_dir, which assign() sets, are left out by both).
    from fiddle.experimental.dataclasses import convert_dataclasses_to_configs

    every = fdl.build(convert_dataclasses_to_configs(ex, allow_post_init=True))
    assert fdl.build(cfg) == every
    assert fdl.build(ZlibJSONSerializer().deserialize(ZlibJSONSerializer().serialize(cfg))) == every


def test_the_executor_yaml_nemo_run_writes_has_only_the_fields_set(tmp_path):
    from nemo_run.core.serialization.yaml import YamlSerializer

    text = YamlSerializer().serialize(ok(nodes=2).to_config())
    assert "nodes: 2" in text and "container_image:" in text
    assert "namespace:" not in text and "network_fabric:" not in text


def test_package_configs_returns_pod_paths(tmp_path):
    ex = ok()
    ex.assign("exp_1", str(tmp_path), "task", "task")
    [path] = ex.package_configs(("task_fn_or_script", "{}"))
    assert path == "/nemo_run/task/configs/task_fn_or_script"
    assert (tmp_path / "task" / "configs" / "task_fn_or_script").read_text() == "{}"


def test_torchrun_macros_point_at_pet_variables():
    macros = ok().macro_values()
    assert macros.head_node_ip_var == "PET_MASTER_ADDR" and macros.node_rank_var == "PET_NODE_RANK"


def test_configuration_reference_is_up_to_date():

    from tools.docgen import field_docs, render

    doc = DOCS / "executor.md"
    assert doc.read_text() == render(), "run: python -m tools.docgen > docs/executor.md"
    # Every user-facing field is documented.
    undocumented = [name for name, text in field_docs(KubeflowExecutor).items() if not text]
    assert undocumented == []


# --- image references (github.com/distribution/reference grammar) ---------------------------------
@pytest.mark.parametrize(
    "image",
    [
        "python:3.11",
        "busybox",
        "nvcr.io/nvidia/nemo:25.02",
        "localhost:5000/team/img:dev",
        "[::1]:5000/img",
        "MyRegistry.example.com/team/img",
        "ghcr.io/org/a__b/c-d--e.f:v1.2_x",
        "img@sha256:" + "a" * 64,
        "img:tag@sha512:" + "0" * 128,
        "us-docker.pkg.dev/gce-ai-infra/gpudirect-tcpxo/tcpgpudmarxd-dev:v1.0.21",
    ],
)
def test_valid_image_references_pass(image):
    ok(container_image=image).validate()


@pytest.mark.parametrize(
    "image, message",
    [
        ("Python:3.11", "the repository 'Python' must be lowercase (write 'python')"),
        ("docker.io/Library/python", "the repository 'Library/python' must be lowercase"),
        ("img@sha256:" + "A" * 64, "sha256 takes exactly 64 lowercase hex digits"),
        ("img@sha256:" + "a" * 63, "sha256 takes exactly 64 lowercase hex digits"),
        ("img@sha1:" + "a" * 40, "with algorithm one of sha256, sha384, sha512"),
        ("img@latest", "the digest 'latest' must be <algorithm>:<hex>"),
        ("img:" + "t" * 129, "the tag 'ttt"),
        ("img:.hidden", "the tag '.hidden'"),
        ("team//img", "the repository 'team//img'"),
        ("a___b", "the repository 'a___b'"),
        ("reg-.io/img", "registry 'reg-.io' is not a host name"),
        ("reg.io/" + "a" * 250, "at most 255 are allowed"),
    ],
)
def test_invalid_image_references_name_the_part_at_fault(image, message):
    with pytest.raises(ConfigError) as err:
        ok(container_image=image).validate()
    assert f"container_image={image!r}: " in str(err.value) and message in str(err.value)


def test_initializer_and_fabric_images_use_the_same_grammar():
    from kubeflow.trainer import HuggingFaceModelInitializer, Initializer

    from nemo_kubeflow.parts.fabrics import TCPXOConfig
    from nemo_kubeflow.parts.initializers import InitializerSettings

    ex = ok(
        gpus_per_node=8,
        nprocs_per_node=8,
        network_fabric="gke-tcpxo",
        tcpxo=TCPXOConfig(daemon_image="Daemon:1"),
        initializer=Initializer(model=HuggingFaceModelInitializer(storage_uri="hf://m")),
        initializer_settings=InitializerSettings(claim_name="c", model_image="ghcr.io/Kubeflow/init"),
    )
    with pytest.raises(ConfigError) as err:
        ex.validate()
    assert "tcpxo.daemon_image='Daemon:1': the repository 'Daemon' must be lowercase" in str(err.value)
    assert "initializer_settings.model_image='ghcr.io/Kubeflow/init': the repository" in str(err.value)


# --- types of the fields -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(gpus_per_node=True), "gpus_per_node=True: must be an integer, not bool"),
        (dict(gpus_per_node="8"), "gpus_per_node='8': must be an integer, not str (write 8, without quotes)"),
        (dict(container_image=["img"]), "container_image=['img']: must be a string, not list"),
        (dict(env_vars={"A": 1.5}), "env_vars['A']=1.5: must be a string, not float (quote it: '1.5')"),
        (dict(env_vars={1: "x"}), "env_vars key=1: must be a string, not int (quote it: '1')"),
        (dict(preflight=1), "preflight=1: must be True, False or a string, not int"),
        (dict(one_pod_per_node="no"), "one_pod_per_node='no': must be True or False, not str"),
        (dict(shm_size=True), "shm_size=True: must be a quantity (a string such as '8Gi', or a number), not bool"),
        (dict(extra_resources={"x.com/y": None}), "extra_resources['x.com/y']=None: must be a quantity"),
        (dict(secret_mounts=[{"secret_name": "s"}]), "secret_mounts[0]={'secret_name': 's'}: must be a SecretMount"),
        (dict(tolerations=["nvidia.com/gpu"]), "tolerations[0]='nvidia.com/gpu': must be a dict, not str"),
        (dict(active_deadline_seconds="600"), "active_deadline_seconds='600': must be an integer, not str (write 600,"),
        (dict(service_account=5), "service_account=5: must be a string, not int (quote it: '5')"),
        (
            dict(cpu_request=True),
            "cpu_request=True: must be a quantity (a string such as '8Gi', or a number), not bool",
        ),
        (
            dict(packager=ConfigMapPackager(include_pattern=["*.py", 3])),
            "packager.include_pattern[1]=3: must be a string",
        ),
        (dict(packager=ConfigMapPackager(use_git="yes")), "packager.use_git='yes': must be True or False, not str"),
        (dict(launcher=5), "launcher=5: must be a Launcher, a string or None, not int"),
    ],
)
def test_wrong_types_name_the_field_and_the_type_expected(kwargs, message):
    with pytest.raises(ConfigError) as err:
        ok(**kwargs).validate()
    assert message in str(err.value)


def test_numbers_are_quantities():
    ok(cpu_request=8, memory_limit=2**30, shm_size=1024, extra_resources={"x.com/y": 2}).validate()


def test_a_wrong_type_is_reported_once_and_the_other_problems_still_are():
    from nemo_kubeflow.parts.fabrics import TCPXOConfig

    with pytest.raises(ConfigError) as err:
        KubeflowExecutor(
            container_image=5,
            nodes="2",
            namespace="BAD",
            network_fabric="gke-tcpxo",
            gpus_per_node=8,
            nprocs_per_node=8,
            tcpxo=TCPXOConfig(nic_count="8"),
        ).validate()
    lines = str(err.value).splitlines()[1:]
    assert lines == [
        "  - nodes='2': must be an integer, not str (write 2, without quotes)",
        "  - container_image=5: must be a string, not int (quote it: '5')",
        "  - tcpxo.nic_count='8': must be an integer, not str (write 8, without quotes)",
        "  - namespace='BAD': must be a DNS-1123 label (lowercase letters, digits and '-', at most 63 characters)",
    ]
