"""The preflight init container in the rendered runtime and the per-task patch, and the settings refused
(test/test_preflight.py runs the packaged script here and on the local cluster)."""

import builders
import pss
import pytest

from nemo_kubeflow import ConfigError, KubeflowExecutor, PVCMount
from nemo_kubeflow.parts.templates import templates_dir
from nemo_kubeflow_local.kubelet.environment import expand

SCRIPT = templates_dir() / "preflight.sh"


def submission(**kw):
    ex = KubeflowExecutor(
        **{
            "container_image": "img",
            "nodes": 2,
            "nprocs_per_node": 4,
            "gpus_per_node": 4,
            "preflight": True,
            "experiment_id": "e",
            **kw,
        }
    )
    return builders.submission(ex, role=builders.bash_role("true", name="t"), task="t", check=True)


def node_pod(sub) -> dict:
    """The node pod's spec."""
    return builders.node_pod_template(sub)["spec"]


def test_preflight_is_an_init_container_that_gets_the_pet_variables():
    sub = submission(
        pvc_mounts=[
            PVCMount(claim_name="ckpt", mount_path="/ckpt"),
            PVCMount(claim_name="data", mount_path="/data", read_only=True),
        ],
        env_vars={"NCCL_SOCKET_IFNAME": "eth0", "PREFLIGHT_DNS_TIMEOUT": "600", "WANDB_PROJECT": "x"},
    )
    torch = sub.runtime["spec"]["mlPolicy"]["torch"]
    assert torch == {"envInjection": {"targets": [{"jobName": "node", "containerNames": ["preflight"]}]}}
    [init] = node_pod(sub)["initContainers"]
    assert init["name"] == "preflight" and init["image"] == "img"
    assert init["command"][:2] == ["bash", "-c"] and init["command"][3] == "preflight"
    # What bash runs, after the kubelet's $(VAR) expansion, is the packaged script as written.
    assert expand(init["command"][2], {"PET_NODE_RANK": "0"}) == SCRIPT.read_text()
    assert init["resources"] == {"requests": {"nvidia.com/gpu": "4"}, "limits": {"nvidia.com/gpu": "4"}}
    env = {e["name"]: e["value"] for e in init["env"]}
    assert env == {"PREFLIGHT_EXPECTED_GPUS": "4", "PREFLIGHT_WRITABLE_PATHS": "/ckpt"}
    assert [m["mountPath"] for m in init["volumeMounts"]] == ["/ckpt", "/data"]
    assert init["terminationMessagePolicy"] == "FallbackToLogsOnError"
    # The task's NCCL_*/FI_*/PREFLIGHT_* variables reach it through the per-task patch.
    patch = sub.trainjob["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    [patched] = patch["template"]["spec"]["template"]["spec"]["initContainers"]
    assert patched == {
        "name": "preflight",
        "env": [{"name": "NCCL_SOCKET_IFNAME", "value": "eth0"}, {"name": "PREFLIGHT_DNS_TIMEOUT", "value": "600"}],
    }


def test_a_command_of_your_own_is_kept_as_written():
    sub = submission(preflight='test "$(nproc)" -ge 1 && echo "rank $PET_NODE_RANK ok"')
    [init] = node_pod(sub)["initContainers"]
    assert init["command"][2] == 'test "$$(nproc)" -ge 1 && echo "rank $PET_NODE_RANK ok"'


@pytest.mark.parametrize("fabric", ["gke-tcpxo", "gke-rdma", "aws-efa", "infiniband"])
def test_preflight_sees_the_fabric_as_training_does(fabric):
    sub = submission(network_fabric=fabric)
    names = [c["name"] for c in node_pod(sub)["initContainers"]]
    assert names[-1] == "preflight" and names[:-1] == (["tcpxo-daemon"] if fabric == "gke-tcpxo" else [])
    [init] = [c for c in node_pod(sub)["initContainers"] if c["name"] == "preflight"]
    [node] = node_pod(sub)["containers"]
    assert [e for e in init["env"] if not e["name"].startswith("PREFLIGHT_")] == node["env"]
    assert set(sub.trainjob["spec"]["trainer"]["resourcesPerNode"]["limits"]) == set(init["resources"]["limits"])


def test_restricted_pods_with_preflight_pass_the_restricted_profile():
    assert pss.restricted(node_pod(submission(restricted_security=True, run_as_user=1000))) == []


def test_empty_command_is_refused():
    with pytest.raises(ConfigError, match="preflight='': give a bash command"):
        KubeflowExecutor(container_image="img", preflight="").validate()
