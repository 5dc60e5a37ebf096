"""Megatron-Bridge's plugin module, ``megatron.bridge.recipes.run_plugins``, as installed, without the packages
above it.

The module itself imports nemo_run, and ``megatron.bridge.utils.import_utils`` (torch, packaging): what the test
extra has. But ``import megatron.bridge.recipes.run_plugins`` first runs ``megatron/bridge/__init__.py``, which
imports every model bridge (megatron-core, transformer-engine, transformers <=5.12, NVRx >=0.5...), and
``megatron/bridge/recipes/__init__.py``, which imports every recipe: none of which the plugins use, and which pip's
``--no-deps`` install leaves out (megatron-core 0.19.2 alone then fails on NVRx 0.4.1, the `test` extra's pin).
So the two packages are entered here as bare packages over their installed folders (their ``__init__`` not run);
the plugin module and ``megatron.bridge.utils`` are imported from those folders unchanged. In NeMo's containers,
where megatron-bridge is installed with its dependencies, the plain import gives the same classes.
"""

import importlib
import importlib.util
import sys
import types
from pathlib import Path


def run_plugins() -> types.ModuleType:
    spec = importlib.util.find_spec("megatron.bridge")
    assert spec is not None and spec.submodule_search_locations, "pip install --no-deps megatron-bridge==0.6.2"
    root = Path(next(iter(spec.submodule_search_locations)))
    for name, folder in (("megatron.bridge", root), ("megatron.bridge.recipes", root / "recipes")):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(folder)]
            package.__file__ = str(folder / "__init__.py")
            sys.modules[name] = package
    return importlib.import_module("megatron.bridge.recipes.run_plugins")


def version() -> str:
    from importlib.metadata import version as installed

    return installed("megatron-bridge")
