"""Network fabric profiles: one golden file per profile, offline validation, Pod Security, bad combinations.

Regenerate the golden files after an intended change with:
    NEMO_KUBEFLOW_UPDATE_GOLDEN=1 pytest test/unit/parts/test_fabrics.py
and review the diff.
"""

import dataclasses
import os

import builders
import pss
import pytest
import yaml
from locations import DOCS, GOLDEN

from nemo_kubeflow import ConfigError, KubeflowExecutor
from nemo_kubeflow.config.packager import BundleFile
from nemo_kubeflow.parts import fabrics
from nemo_kubeflow.parts.fabrics import EFAConfig, GKERDMAConfig, InfiniBandConfig, build_fabric
from nemo_kubeflow.parts.yamlio import dump_all
from nemo_kubeflow.schema.validation import check_manifests

IMAGE = "nvcr.io/nvidia/nemo:25.02"
FILES = [BundleFile("code/train.py", b"print('hello')\n", 0o644)]
GPU_NODE = dict(container_image=IMAGE, nodes=2, nprocs_per_node=8, gpus_per_node=8)

PROFILES = {
    "gke-rdma": dict(
        GPU_NODE, network_fabric="gke-rdma", node_selector={"cloud.google.com/gke-accelerator": "nvidia-h200-141gb"}
    ),
    "aws-efa": dict(GPU_NODE, network_fabric="aws-efa", aws_efa=EFAConfig(devices_per_node=32)),
    "infiniband": dict(
        GPU_NODE,
        network_fabric="infiniband",
        infiniband=InfiniBandConfig(resource_name="rdma/rdma_shared_device_a", hca="mlx5", gid_index=3),
    ),
}


def submission(**kw):
    return builders.submission(KubeflowExecutor(**kw, experiment_id="llama3_8b_1700000000"), files=FILES)


node_pod = builders.node_pod_template


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_golden_manifests(profile):
    text = dump_all(submission(**PROFILES[profile]).manifests())
    path = GOLDEN / f"{profile.replace('-', '_')}.yaml"
    if os.environ.get("NEMO_KUBEFLOW_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"manifests changed; see the module docstring to regenerate {path}"


@pytest.mark.parametrize("profile", list(fabrics.PROFILES))
def test_every_profile_passes_offline_validation(profile):
    check_manifests(submission(**dict(GPU_NODE, network_fabric=profile)).manifests())


def test_enable_tcpxo_is_an_alias_of_gke_tcpxo():
    old, new = submission(**GPU_NODE, enable_tcpxo=True), submission(**GPU_NODE, network_fabric="gke-tcpxo")
    assert old.runtime == new.runtime and old.launch.args == new.launch.args
    assert [c["name"] for c in node_pod(new)["spec"]["initContainers"]] == ["tcpxo-daemon"]


def test_gke_rdma_attaches_the_rdma_nics_and_the_gib_plugin():
    sub = submission(**PROFILES["gke-rdma"])
    pod = node_pod(sub)
    interfaces = yaml.safe_load(pod["metadata"]["annotations"]["networking.gke.io/interfaces"])
    assert [i["network"] for i in interfaces] == ["default", "gvnic-1"] + [f"rdma-{i}" for i in range(8)]
    assert [i["interfaceName"] for i in interfaces][-1] == "eth9"
    assert "initContainers" not in pod["spec"]  # no sidecar
    [node] = pod["spec"]["containers"]
    env = {e["name"]: e["value"] for e in node["env"]}
    assert env["NCCL_NET"] == "gIB" and env["NCCL_TUNER_CONFIG_PATH"].endswith("tuner_config_a3u.txtpb")
    assert {"name": "gib", "mountPath": "/usr/local/gib"} in node["volumeMounts"]
    assert (
        'export LD_LIBRARY_PATH=/usr/local/gib/lib64:/usr/local/nvidia/lib64"${LD_LIBRARY_PATH:+' in sub.launch.args[0]
    )
    # Custom networks and NCCL settings are parameters.
    a4 = submission(
        **dict(
            GPU_NODE,
            network_fabric="gke-rdma",
            gke_rdma=GKERDMAConfig(
                gvnic_network="", nic_count=2, network_names=["a", "b"], nccl_env={"NCCL_NET_GDR_LEVEL": "SYS"}
            ),
        )
    )
    [a4_node] = node_pod(a4)["spec"]["containers"]
    a4_env = {e["name"]: e["value"] for e in a4_node["env"]}
    assert a4_env["NCCL_SOCKET_IFNAME"] == "eth0" and a4_env["NCCL_NET_GDR_LEVEL"] == "SYS"
    interfaces = yaml.safe_load(node_pod(a4)["metadata"]["annotations"]["networking.gke.io/interfaces"])
    assert [(i["interfaceName"], i["network"]) for i in interfaces] == [
        ("eth0", "default"),
        ("eth1", "a"),
        ("eth2", "b"),
    ]


def test_aws_efa_requests_the_devices_per_node_and_sets_libfabric():
    sub = submission(**PROFILES["aws-efa"])
    resources = sub.trainjob["spec"]["trainer"]["resourcesPerNode"]
    assert resources["limits"] == resources["requests"] == {"nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "32"}
    [node] = node_pod(sub)["spec"]["containers"]
    env = {e["name"]: e["value"] for e in node["env"]}
    assert env["FI_PROVIDER"] == "efa"
    # Forcing device RDMA aborts on EFA devices without it; libfabric >= 1.18 uses it where it exists.
    assert "FI_EFA_USE_DEVICE_RDMA" not in env
    assert "resources" not in node  # the runtime keeps the SDK-readable shape (no EFA-only limits)
    assert "/opt/amazon/efa/lib" in sub.launch.args[0]


def test_infiniband_adds_ipc_lock_the_device_and_the_nccl_ib_settings():
    sub = submission(**PROFILES["infiniband"])
    [node] = node_pod(sub)["spec"]["containers"]
    assert node["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}
    env = {e["name"]: e["value"] for e in node["env"]}
    assert env == {"NCCL_IB_DISABLE": "0", "NCCL_IB_HCA": "mlx5", "NCCL_IB_GID_INDEX": "3"}
    assert sub.trainjob["spec"]["trainer"]["resourcesPerNode"]["limits"]["rdma/rdma_shared_device_a"] == "1"


@pytest.mark.parametrize(
    "profile, privileges",
    [
        ("gke-tcpxo", ["the NET_ADMIN capability", "host paths"]),
        ("gke-rdma", ["host paths"]),
        ("aws-efa", []),
        ("infiniband", ["the IPC_LOCK capability"]),
    ],
)
def test_privileges_match_the_pod_security_oracle(profile, privileges):
    executor = KubeflowExecutor(**dict(GPU_NODE, network_fabric=profile))
    assert build_fabric(executor).privileges() == privileges
    assert bool(pss.baseline(node_pod(submission(**dict(GPU_NODE, network_fabric=profile)))["spec"])) == bool(
        privileges
    )


def test_efa_pods_still_pass_the_restricted_profile():
    spec = node_pod(submission(**dict(GPU_NODE, network_fabric="aws-efa", restricted_security=True, run_as_user=1000)))
    assert pss.restricted(spec["spec"]) == []


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(network_fabric="gke-rdm"), "network_fabric='gke-rdm' is not a profile: did you mean 'gke-rdma'?"),
        (dict(network_fabric="efa"), "choose one of none, gke-tcpxo, gke-rdma, aws-efa, infiniband"),
        (
            dict(network_fabric="aws-efa", gpus_per_node=0, nprocs_per_node=1),
            "network_fabric='aws-efa' needs gpus_per_node > 0",
        ),
        (dict(network_fabric="aws-efa", enable_tcpxo=True), "enable_tcpxo=True contradicts network_fabric='aws-efa'"),
        (
            dict(network_fabric="infiniband", restricted_security=True),
            "restricted_security and network_fabric='infiniband' are exclusive: infiniband needs the IPC_LOCK capability",
        ),
        (dict(network_fabric="gke-rdma", restricted_security=True), "gke-rdma needs host paths"),
        (
            dict(network_fabric="aws-efa", extra_resources={"vpc.amazonaws.com/efa": "4"}),
            "extra_resources['vpc.amazonaws.com/efa']: network_fabric='aws-efa' already requests it",
        ),
        (
            dict(network_fabric="aws-efa", aws_efa=EFAConfig(devices_per_node=0)),
            "aws_efa.devices_per_node=0: must be an integer >= 1",
        ),
        (
            dict(network_fabric="infiniband", infiniband=InfiniBandConfig(resource_name="ib")),
            "infiniband.resource_name='ib'",
        ),
        (
            dict(network_fabric="gke-rdma", gke_rdma=GKERDMAConfig(network_names=["a"])),
            "gke_rdma.network_names has 1 names for nic_count=8: give one network per NIC",
        ),
        (
            dict(network_fabric="gke-rdma", pod_annotations={"networking.gke.io/interfaces": "[]"}),
            "pod_annotations['networking.gke.io/interfaces']: network_fabric='gke-rdma' sets this annotation",
        ),
        (
            dict(network_fabric="aws-efa", aws_efa=InfiniBandConfig()),
            "aws_efa: expected EFAConfig(...) for network_fabric='aws-efa', got InfiniBandConfig",
        ),
    ],
)
def test_invalid_combinations_are_named(kwargs, message):
    with pytest.raises(ConfigError) as err:
        KubeflowExecutor(**{**GPU_NODE, **kwargs}).validate()
    assert message in str(err.value)


def test_profile_settings_are_typo_proof():
    with pytest.raises(TypeError, match="devices_per_nod"):
        EFAConfig(devices_per_nod=4)


@pytest.mark.parametrize("profile, field, cls", [(p.name, p.field, p.settings) for p in fabrics.PROFILES.values()])
def test_unset_profile_settings_mean_the_profile_defaults(profile, field, cls):
    # None is the default (cheaper for NeMo-Run to serialise); it must render exactly as cls() does.
    unset = KubeflowExecutor(**GPU_NODE, network_fabric=profile)
    assert getattr(unset, field) is None
    explicit = dump_all(submission(**GPU_NODE, network_fabric=profile, **{field: cls()}).manifests())
    assert dump_all(submission(**GPU_NODE, network_fabric=profile).manifests()) == explicit


@pytest.mark.parametrize("profile", fabrics.PROFILES.values(), ids=list(fabrics.PROFILES))
def test_every_profile_is_a_field_of_the_executor_and_documented(profile):
    import typing

    from tools.docgen import fabrics_table, field_docs

    # Its settings field, defaulting to None (the profile's defaults), typed for NeMo-Run's CLI.
    [field] = [f for f in dataclasses.fields(KubeflowExecutor) if f.name == profile.field]
    assert field.default is None and typing.get_args(field.type) == (profile.settings, type(None))
    assert profile.name in field_docs(KubeflowExecutor)["network_fabric"]
    docs = DOCS
    assert fabrics_table() in (docs / "fabrics.md").read_text(), (
        "run: python -m tools.docgen --fabrics-table, and paste it over the table in docs/fabrics.md"
    )
    assert f"## {profile.settings.__name__}" in (docs / "executor.md").read_text()


@pytest.mark.parametrize("profile", fabrics.PROFILES.values(), ids=list(fabrics.PROFILES))
def test_every_profile_refuses_settings_of_another_profile(profile):
    other = next(p for p in fabrics.PROFILES.values() if p.settings is not profile.settings)
    with pytest.raises(ConfigError) as err:
        KubeflowExecutor(**GPU_NODE, network_fabric=profile.name, **{profile.field: other.settings()}).validate()
    assert (
        f"{profile.field}: expected {profile.settings.__name__}(...) for network_fabric={profile.name!r}, "
        f"got {other.settings.__name__}"
    ) in str(err.value)


@pytest.mark.parametrize(
    "accelerator, tuner_config, expected",
    [
        ("nvidia-h200-141gb", None, "/usr/local/gib/configs/tuner_config_a3u.txtpb"),  # A3 Ultra
        ("nvidia-b200", None, "/usr/local/gib/configs/tuner_config_a4.txtpb"),  # A4
        (None, None, "/usr/local/gib/configs/tuner_config_a3u.txtpb"),
        ("nvidia-b200", "/mine.txtpb", "/mine.txtpb"),  # given: used as is
    ],
)
def test_gke_rdma_tuner_config_follows_the_machine_the_node_selector_picks(accelerator, tuner_config, expected):
    selector = {"cloud.google.com/gke-accelerator": accelerator} if accelerator else {}
    sub = submission(
        **GPU_NODE, network_fabric="gke-rdma", node_selector=selector, gke_rdma=GKERDMAConfig(tuner_config=tuner_config)
    )
    [node] = node_pod(sub)["spec"]["containers"]
    assert {"name": "NCCL_TUNER_CONFIG_PATH", "value": expected} in node["env"]
