"""``nemo_kubeflow.local``: the local cluster's old name, kept as an alias of ``nemo_kubeflow_local``.

The local cluster moved into a distribution of its own (``nemo-kubeflow-local``, in the repository's
``local/``; docs/local-cluster.md). ``from nemo_kubeflow.local import LocalCluster``, as older docs wrote it,
still gets it where that distribution is installed, and says how to install it where it is not. The product
never imports the local cluster (pyproject.toml's contract) and its wheel does not carry it: this alias looks
it up by name, only when one of its names is asked for.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

#: Where the local cluster lives now.
LOCAL_CLUSTER_PACKAGE = "nemo_kubeflow_local"


def __getattr__(name: str) -> Any:
    if name.startswith("__"):  # the import system's own questions (__path__, __spec__...): not the alias's
        raise AttributeError(name)
    try:
        package = import_module(LOCAL_CLUSTER_PACKAGE)
    except ModuleNotFoundError as error:
        if error.name != LOCAL_CLUSTER_PACKAGE:
            raise
        raise ImportError(
            f"nemo_kubeflow.local is now the distribution nemo-kubeflow-local (import {LOCAL_CLUSTER_PACKAGE}), "
            "which is not installed: install it from the repository with `pip install ./local` "
            "(`pip install -e ./local` to develop), then `from nemo_kubeflow_local import LocalCluster` "
            "(docs/local-cluster.md)",
            name=__name__,
        ) from None
    try:
        return getattr(package, name)
    except AttributeError:
        raise AttributeError(
            f"module {__name__!r} (an alias of {LOCAL_CLUSTER_PACKAGE}) has no attribute {name!r}"
        ) from None
