"""``nemo_kubeflow.local``, the local cluster's old name (older docs: ``from nemo_kubeflow.local import
LocalCluster``): an alias of ``nemo_kubeflow_local`` where that distribution is installed, else an ImportError
that says how to install it."""

import sys

import pytest


def test_the_old_import_gets_the_local_cluster():
    import nemo_kubeflow_local
    from nemo_kubeflow.local import LocalCluster

    assert LocalCluster is nemo_kubeflow_local.LocalCluster


def test_without_the_local_cluster_the_old_import_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "nemo_kubeflow_local", None)  # as if not installed: import fails
    with pytest.raises(ImportError, match=r"nemo-kubeflow-local .*`pip install \./local`") as raised:
        from nemo_kubeflow.local import LocalCluster  # noqa: F401
    assert raised.value.name == "nemo_kubeflow.local"


def test_a_name_the_local_cluster_lacks_is_named():
    with pytest.raises(ImportError, match="cannot import name 'NoSuchThing'"):
        from nemo_kubeflow.local import NoSuchThing  # noqa: F401
