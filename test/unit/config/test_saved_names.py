"""Experiments saved by earlier layouts still load: NeMo-Run stores each task's executor as fiddle JSON, with
every class named by its module, so each module a class was saved under still imports as that class's module."""

import importlib

import fiddle as fdl
from fiddle._src.experimental import serialization

from nemo_kubeflow import ConfigMapPackager, KubeflowExecutor, TCPXOConfig
from nemo_kubeflow.parts.initializers import InitializerSettings

#: where a class lived in a layout a saved experiment may come from -> where it lives now
EARLIER_MODULES = {
    "nemo_kubeflow.build.packaging": "nemo_kubeflow.config.packager",  # the stage packages' first step
    "nemo_kubeflow.build.fabrics": "nemo_kubeflow.parts.fabrics",
    "nemo_kubeflow.packaging": "nemo_kubeflow.config.packager",  # the flat layout
    "nemo_kubeflow.fabrics": "nemo_kubeflow.parts.fabrics",
    "nemo_kubeflow.executor": "nemo_kubeflow.config.executor",
}


def test_an_executor_saved_under_each_earlier_module_loads_as_todays_classes():
    executor = KubeflowExecutor(
        container_image="img",
        nodes=2,
        gpus_per_node=8,
        nprocs_per_node=8,
        network_fabric="gke-tcpxo",
        tcpxo=TCPXOConfig(),
        packager=ConfigMapPackager(max_shards=4),
    )
    saved_now = serialization.dump_json(executor.to_config())
    for earlier, now in EARLIER_MODULES.items():
        saved = saved_now.replace(f'"module": "{now}"', f'"module": "{earlier}"')
        assert saved != saved_now, f"nothing of {now} in the saved executor"
        loaded = fdl.build(serialization.load_json(saved))
        assert isinstance(loaded, KubeflowExecutor)
        assert isinstance(loaded.packager, ConfigMapPackager) and loaded.packager.max_shards == 4
        assert isinstance(loaded.tcpxo, TCPXOConfig)


def test_initializer_settings_saved_under_the_build_package_load():
    assert importlib.import_module("nemo_kubeflow.build.initializers").InitializerSettings is InitializerSettings
