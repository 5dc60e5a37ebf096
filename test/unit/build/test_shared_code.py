"""Which files of a task go into the ConfigMap of code that tasks share (build_code_package's share_code)."""

from nemo_kubeflow.build.packaging import SHARE_MIN_BYTES, build_code_package, describe_package
from nemo_kubeflow.config.packager import BundleFile
from nemo_kubeflow.constants import SHARED_CODE_LABEL

#: Code just large enough to be shared.
CODE = [BundleFile("code/train.py", b"print('train')\n"), BundleFile("code/pkg/model.py", b"#" * SHARE_MIN_BYTES)]


def package(task: str, code=CODE, mode: str = "auto", executor_yaml: bytes = b"env_vars: {}\n"):
    own = [
        BundleFile("__main__.py", b"# experiment\n"),
        BundleFile(f"{task}/configs/{task}_executor.yaml", executor_yaml),
        BundleFile("scripts/run.sh", b"#!/bin/sh\n", mode=0o755),
    ]
    return build_code_package(
        [*code, *own], name=f"{task}-code", namespace="ns", labels={"task": task}, mode=mode, share_code=True
    )


def test_the_same_code_is_one_configmap_named_by_its_content_and_the_rest_stays_the_tasks():
    a, b = package("a"), package("b", executor_yaml=b"env_vars:\n  WANDB_KEY: <redacted>\n")
    assert a.configmaps[0] == b.configmaps[0]
    shared = a.configmaps[0]
    assert shared["metadata"]["name"].startswith("nemo-kubeflow-code-") and a.shared == (shared["metadata"]["name"],)
    # Only the code: nothing of one task (its labels, its configs, its executor's settings) in the shared one.
    assert shared["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "nemo-kubeflow", SHARED_CODE_LABEL: "true"}
    assert sorted(shared["data"]) == ["code_pkg_model.py.16fd6bcf5dc3", "code_train.py.f5a7fdedd2c0"]
    own = a.configmaps[1]
    assert own["metadata"]["name"] == "a-code" and own["metadata"]["labels"] == {"task": "a"}
    [source_shared, source_own] = a.volumes[0]["projected"]["sources"]
    assert sorted(i["path"] for i in source_shared["configMap"]["items"]) == ["code/pkg/model.py", "code/train.py"]
    assert {i["path"]: i["mode"] for i in source_own["configMap"]["items"]} == {
        "__main__.py": 0o644,
        "a/configs/a_executor.yaml": 0o644,
        "scripts/run.sh": 0o755,
    }
    assert describe_package(a) == "plain, 5 files, 64.0 KiB in 2 ConfigMaps (1 shared)"


def test_other_code_is_another_configmap():
    other = package("a", code=[BundleFile("code/train.py", b"print('other')\n")])
    assert other.configmaps[0]["metadata"]["name"] != package("a").configmaps[0]["metadata"]["name"]


def test_a_sharded_package_or_one_of_little_code_is_the_tasks_own():
    sharded = package("a", mode="sharded")
    assert sharded.shared == () and all(cm["metadata"]["name"].startswith("a-code-") for cm in sharded.configmaps)
    for code in ([], [BundleFile("code/train.py", b"#" * (SHARE_MIN_BYTES - 1))]):
        little = package("a", code=code)
        assert little.shared == () and [cm["metadata"]["name"] for cm in little.configmaps] == ["a-code"]


def test_the_tasks_of_a_sweep_hold_one_copy_of_the_code_in_manifests_of_their_own():
    a, b = package("a"), package("b")
    [key] = [k for k in a.configmaps[0]["data"] if k.startswith("code_pkg_model")]
    assert a.configmaps[0]["data"][key] is b.configmaps[0]["data"][key]
    assert a.configmaps[0]["data"] is not b.configmaps[0]["data"]
    assert a.configmaps[0]["metadata"] is not b.configmaps[0]["metadata"]
    assert (
        a.volumes[0]["projected"]["sources"][0]["configMap"]["items"][0]
        is not (b.volumes[0]["projected"]["sources"][0]["configMap"]["items"][0])
    )
