"""Rendered pods against the Pod Security Standards (baseline by default, restricted as an option)."""

import copy

import pss
import pytest
from torchx.specs import Role

from nemo_kubeflow import KubeflowExecutor, PVCMount, SecretMount
from nemo_kubeflow.build.plan import build_submission
from nemo_kubeflow.config.packager import BundleFile
from nemo_kubeflow.schema.validation import check_manifests

FILES = [BundleFile("code/train.py", b"print(1)\n")]


def pod_spec(**kw) -> dict:
    """The node pod as Trainer would build it: the runtime's pod, plus our runtime patch."""
    executor = KubeflowExecutor(
        **{"container_image": "img", "nodes": 2, "nprocs_per_node": 2, "experiment_id": "e", **kw}
    )
    sub = build_submission(
        executor, Role(name="t", image="", entrypoint="bash", args=["-c", "true"]), FILES, task_name="t"
    )
    check_manifests(sub.manifests())
    pod = copy.deepcopy(
        sub.runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    )
    patch = sub.trainjob["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    patch_spec = patch["template"]["spec"]["template"]["spec"]
    pod.setdefault("volumes", []).extend(patch_spec.get("volumes", []))
    return pod


EVERYTHING = dict(
    gpus_per_node=2,
    pvc_mounts=[PVCMount(claim_name="data", mount_path="/data")],
    secret_mounts=[SecretMount(secret_name="creds", mount_path="/creds")],
    tolerations=[{"key": "gpu", "operator": "Exists"}],
    image_pull_secrets=["ngc"],
    service_account="sa",
)


@pytest.mark.parametrize("kw", [{}, EVERYTHING], ids=["default", "everything-but-fabric"])
def test_default_pods_pass_baseline(kw):
    assert pss.baseline(pod_spec(**kw)) == []


def test_tcpxo_needs_privileges_and_says_so():
    problems = pss.baseline(pod_spec(gpus_per_node=8, nprocs_per_node=8, enable_tcpxo=True))
    assert any("hostPath" in p for p in problems) and any("NET_ADMIN" in p for p in problems)
    # The option's documentation carries the warning.
    from tools.docgen import field_docs

    assert "privileged" in field_docs(KubeflowExecutor)["enable_tcpxo"]


@pytest.mark.parametrize(
    "kw", [{}, EVERYTHING, dict(run_as_user=1000, fs_group=1000)], ids=["default", "everything-but-fabric", "uid"]
)
def test_restricted_option_passes_restricted(kw):
    spec = pod_spec(restricted_security=True, **kw)
    assert pss.restricted(spec) == []
    assert pss.restricted(pod_spec(**kw)) != []  # and it is the option that makes the difference
