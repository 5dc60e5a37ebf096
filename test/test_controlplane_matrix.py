"""The real control plane's Kubernetes version matrix (test/controlplane/versions.py, docs/real-control-plane.md):
another minor builds only kube-apiserver, kube-controller-manager and kube-scheduler, on top of the pinned build."""

import ast
import json
from pathlib import Path

import pytest
from controlplane import build, versions


def test_the_matrix_starts_with_the_pinned_release_and_the_environment_picks_an_entry():
    assert versions.KUBERNETES_MATRIX[0] == versions.KUBERNETES
    assert len(set(versions.KUBERNETES_MATRIX)) == len(versions.KUBERNETES_MATRIX) >= 3
    assert versions.selected_kubernetes({}) == versions.KUBERNETES
    assert versions.selected_kubernetes({versions.KUBERNETES_ENV: "v1.32.9"}) == "v1.32.9"
    with pytest.raises(
        ValueError,
        match=r"NEMO_KUBEFLOW_KUBERNETES=v1.30.0 is not in test/controlplane/versions.py's "
        r"KUBERNETES_MATRIX v1.36.3, v1.37.2, v1.32.9, v1.31.13: add it there",
    ):
        versions.selected_kubernetes({versions.KUBERNETES_ENV: "v1.30.0"})


def test_another_minor_builds_only_the_three_kubernetes_binaries_with_its_own_staging_modules_and_stamp():
    [kubernetes] = [c for c in build.components("v1.31.13") if c.name == "kubernetes"]
    assert sorted(kubernetes.binaries) == ["kube-apiserver", "kube-controller-manager", "kube-scheduler"]
    go_mod = build.generated_go_mod(
        "kubernetes", [(kubernetes, "go 1.22.0\nreplace k8s.io/api => ./staging/src/k8s.io/api\n")]
    )
    assert "\tk8s.io/kubernetes v1.31.13\n" in go_mod and "\tk8s.io/api => k8s.io/api v0.31.13\n" in go_mod
    assert "-X k8s.io/component-base/version.gitVersion=v1.31.13" in build.ldflags([kubernetes])
    assert "-X k8s.io/component-base/version.gitMinor=31" in build.ldflags([kubernetes])
    # the pinned build's components are unchanged (its cache folder, the versions hash, stays the same)
    assert [c.version for c in build.components() if c.name == "kubernetes"] == [versions.KUBERNETES]
    assert versions.pins()["kubernetes"] == versions.KUBERNETES and "matrix" not in json.dumps(versions.pins())


def test_a_built_minor_swaps_its_three_binaries_into_the_pinned_build(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv(build.CACHE_ENV, str(cache))
    names = ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "trainer-controller-manager"]
    base = {
        "binaries": {n: str(build.build_dir() / "bin" / n) for n in names},
        "components": {"kubernetes": {"version": versions.KUBERNETES, "module_dir": "k8s-1.36"}},
    }
    extra = build.kubernetes_dir("v1.37.2")
    extra.mkdir(parents=True)
    (extra / build.BUILD_INFO).write_text(
        json.dumps(
            {
                "kubernetes": "v1.37.2",
                "binaries": {n: f"{build.build_dir().name}/kubernetes-v1.37.2/bin/{n}" for n in names[1:4]},
                "components": {
                    "kubernetes": {"version": "v1.37.2", "module": "k8s.io/kubernetes", "module_dir": "k8s-1.37"}
                },
            }
        )
    )

    info = build.ensure_kubernetes("v1.37.2", base)

    assert info["kubernetes"] == "v1.37.2"
    assert info["binaries"]["etcd"] == base["binaries"]["etcd"]
    assert info["binaries"]["trainer-controller-manager"] == base["binaries"]["trainer-controller-manager"]
    for name in names[1:4]:
        assert info["binaries"][name] == str(extra / "bin" / name)
    assert info["components"]["kubernetes"]["module_dir"] == str(cache / "k8s-1.37")


def test_ci_runs_the_pinned_release_first_and_only_entries_of_the_matrix():
    assert versions.KUBERNETES_CI[0] == versions.KUBERNETES
    assert set(versions.KUBERNETES_CI) <= set(versions.KUBERNETES_MATRIX)


def _is_real(module: ast.Module, function: ast.FunctionDef) -> bool:
    """Marked `real` itself or by the module's pytestmark, or run on the `backend` fixture's real param."""
    marks = [ast.unparse(d) for d in function.decorator_list]
    marks += [
        ast.unparse(node.value)
        for node in module.body
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets)
    ]
    return any("mark.real" in mark for mark in marks) or "backend" in [a.arg for a in function.args.args]


def test_every_minor_sensitive_entry_names_a_real_test_and_conftest_marks_it(request):
    # what .ci/run selects on the other minors: a renamed or moved test must not drop out of the matrix silently
    root = Path(__file__).resolve().parent.parent
    for node_id in versions.MINOR_SENSITIVE:
        path, name = node_id.split("::")
        module = ast.parse((root / path).read_text())
        [function] = [f for f in module.body if isinstance(f, ast.FunctionDef) and f.name == name] or [None]
        assert function is not None, f"{node_id} (versions.MINOR_SENSITIVE) is not a test function"
        assert _is_real(module, function), f"{node_id} (versions.MINOR_SENSITIVE) is not a `real` test"

    class Item:  # what conftest's hook reads of a collected pytest item
        def __init__(self, nodeid):
            self.nodeid, self.markers = nodeid, []

        def add_marker(self, marker):
            self.markers.append(marker)

    # test/conftest.py as pytest loaded it (another folder's conftest.py may hold the module name `conftest`)
    conftest_path = str(Path(__file__).with_name("conftest.py"))
    [conftest] = [
        p for p in request.config.pluginmanager.get_plugins() if getattr(p, "__file__", None) == conftest_path
    ]
    listed, other = Item(next(iter(versions.MINOR_SENSITIVE)) + "[real]"), Item("test/test_x.py::test_y[real]")
    for item in (listed, other):
        conftest.pytest_itemcollected(item)
    assert listed.markers == ["minor_sensitive"] and other.markers == []


@pytest.mark.real
def test_the_real_api_server_is_the_selected_release_of_the_matrix(real_control_plane):
    assert real_control_plane.request("GET", "/version")["gitVersion"] == versions.selected_kubernetes()
