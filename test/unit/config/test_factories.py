"""The run.executor=kubeflow_* factories in this process: their arguments and nemo_run's overrides reach
every field, the lookups nemo_run makes, and kubeflow_local without a cluster (test/test_factories.py runs
the `nemo` console script in processes of their own)."""

import fiddle as fdl
import nemo_run as run
import pytest
from nemo_run.cli.api import RunContext

from nemo_kubeflow import KubeflowExecutor
from nemo_kubeflow.config.factories import (
    LOCAL_KUBECONFIG_ENV,
    LocalClusterNotConfiguredError,
    kubeflow_gpu,
    kubeflow_local,
)


def test_factory_arguments_and_run_executor_overrides_reach_every_field():
    executor = fdl.build(kubeflow_gpu(nodes=2, namespace="team", gpus_per_node=4, nprocs_per_node=4))
    assert (executor.nodes, executor.namespace, executor.gpus_per_node) == (2, "team", 4)

    # What `run.executor=kubeflow_tcpxo run.executor.<field>=...` does, through nemo_run's own parser.
    config = RunContext(name="t").parse_executor(
        "kubeflow_tcpxo",
        "nodes=3",
        "namespace=a3",
        "cpu_request=8",
        "tcpxo.nic_count=4",
        "packager.include_pattern=*.py",
        "node_selector={'pool': 'a3mega'}",
    )
    executor = fdl.build(config)
    assert isinstance(executor, KubeflowExecutor)
    assert (executor.nodes, executor.namespace, executor.cpu_request) == (3, "a3", "8")
    assert executor.tcpxo.nic_count == 4 and executor.enable_tcpxo
    assert executor.packager.include_pattern == "*.py"
    assert executor.node_selector == {"pool": "a3mega"}
    executor.validate()


def test_kubeflow_local_without_a_cluster_says_how_to_start_one(monkeypatch, tmp_path):
    monkeypatch.delenv(LOCAL_KUBECONFIG_ENV, raising=False)
    # Through nemo_run's executor lookup: a ValueError would be swallowed as "not found".
    with pytest.raises(LocalClusterNotConfiguredError, match="python -m nemo_kubeflow_local serve"):
        RunContext(name="t").parse_executor("kubeflow_local")
    monkeypatch.setenv(LOCAL_KUBECONFIG_ENV, str(tmp_path / "gone"))
    with pytest.raises(LocalClusterNotConfiguredError, match="still running"):
        kubeflow_local()


def test_run_executor_lookup_also_accepts_the_dotted_path():
    # For scripts that neither import nemo_kubeflow.config.factories nor run under `nemo`.
    config = RunContext(name="t").parse_executor("nemo_kubeflow.config.factories.kubeflow_cpu", "nodes=2")
    assert fdl.build(config).nodes == 2


def test_run_resolve_factory_lists_our_factories():
    names = {f.__name__ for f in run.cli.list_factories(run.Executor)}
    assert {"kubeflow_gpu", "kubeflow_cpu", "kubeflow_tcpxo", "kubeflow_local"} <= names
